"""Whether a condition's seeds cross a line at one typical time or split into two groups.

A median crossing summarises a condition well when its seeds cross around one time. When they split (some seeds
escape early, the rest much later), the median falls in or beside the gap, a ratio of medians can move by a factor
of two with the median's definition, and the honest summary is the seeds' crossings themselves. `modes` reads that
off the crossings with the **Engelman-Hartigan test for two clusters** (Engelman & Hartigan 1969, "Percentage
points of a test for clusters", JASA 64): on the sorted log crossing steps x_1..x_n, the statistic is the largest
share of the total sum of squares that one cut between two groups explains,

    R = max_k  k (n - k) / n (mean(x_1..x_k) - mean(x_k+1..x_n))^2  /  sum_i (x_i - mean x)^2,

over the cuts that leave at least `MIN_GROUP` seeds on each side (one late seed is an outlier, not a mode), and its
p-value is the share of `n_null` normal samples of the same size (one mode: no clusters; drawn from an explicit
seed) whose R is at least as large. The seeds are read as **two modes** when p < `MODES_ALPHA`. Steps are taken in
logs because crossing times are right-skewed (a lognormal spread is one mode); a censored seed counts at its
censoring step, a lower bound, so seeds stuck at the end of the budget form a group of their own, as they do.
"""

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from markov_interp._plan import Need, planned, size
from markov_interp.config import check_int
from markov_interp.dynamics._runs import StepInterval

MODES_ALPHA = 0.05  # two modes when the test's p-value is below this
MIN_GROUP = 2  # seeds each group needs (cuts leaving fewer are not tried, in the data nor in the null)
N_NULL = 2000  # normal samples behind the p-value

__all__ = ["MODES_ALPHA", "MIN_GROUP", "N_NULL", "Modes", "cluster_statistic", "modes"]


def cluster_statistic(values: "Sequence[float] | np.ndarray", *, min_group: int = MIN_GROUP) -> tuple[Any, Any]:
    """The Engelman-Hartigan statistic R of each sample (module docstring) and where its best cut falls.

    Args:
        values: [n] one sample, or [samples, n] several of the same size (each sorted here).
        min_group: the fewest values on either side of a cut.

    Returns:
        (R, k) for one sample: R in [0, 1] (NaN with no spread), the best cut after the k smallest values; for
        several, R as an array and k as an array.

    >>> cluster_statistic([1.0, 1.1, 0.9, 5.0, 5.1, 4.9])[1]  # the cut after the three small values
    3
    """
    x = np.sort(np.asarray(values, dtype=float), axis=-1)
    n = x.shape[-1]
    if n < 2 * min_group:
        raise ValueError(f"{n} values cannot form two groups of at least {min_group} (min_group)")
    k = np.arange(min_group, n - min_group + 1)
    csum = np.cumsum(x, axis=-1)
    left = csum[..., k - 1] / k
    right = (csum[..., -1:] - csum[..., k - 1]) / (n - k)
    between = k * (n - k) / n * (left - right) ** 2
    total = ((x - x.mean(-1, keepdims=True)) ** 2).sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = between.max(-1) / total
    cut = k[between.argmax(-1)]
    return (float(r), int(cut)) if x.ndim == 1 else (r, cut)


@dataclasses.dataclass(frozen=True)
class Modes:
    """A condition's crossings of one line as a distribution: every seed's step (sorted; a censored seed at its
    censoring step), how many are censored, the test's statistic and p-value, whether p < `MODES_ALPHA`, and the
    two groups of the best cut ((first, last) step of each)."""

    steps: tuple[int, ...]
    censored: int
    statistic: float
    p_value: float
    bimodal: bool
    split: tuple[tuple[int, int], tuple[int, int]]

    def groups(self) -> str:
        """The two groups of the best cut, e.g. '8 at 40-90, 8 at 210-1000'."""
        (a0, a1), (b0, b1) = self.split
        low = sum(s <= a1 for s in self.steps)
        return f"{low} at {a0}-{a1}, {len(self.steps) - low} at {b0}-{b1}"

    def describe(self) -> str:
        """E.g. 'two modes (p 0.002): 8 at 40-90, 8 at 210-1000 steps' or 'one mode (p 0.41; ...)'."""
        groups = f"{self.groups()} steps" + (f" ({self.censored} censored)" if self.censored else "")
        if self.bimodal:
            return f"two modes (p {self.p_value:.2g}): {groups}"
        return f"one mode (p {self.p_value:.2g}; best cut: {groups})"


def _null_needs(a: Any) -> list[Need]:
    """The null's normal samples: n_null x the crossings (float64, and their sorted copy)."""
    return [Need.of("the null samples", size(a, "n_null") * max(_length(a.get("crossings")), 1) * 16,
                    [("n_null", size(a, "n_null"))])]


def _length(value: Any) -> int:
    try:
        return len(value)
    except TypeError:
        return 0


@planned(_null_needs)
def modes(crossings: Sequence[StepInterval], *, n_null: int = N_NULL, seed: int = 0) -> Modes:
    """The crossings of one line by a condition's seeds, read as one mode or two (module docstring).

    Args:
        crossings: one `StepInterval` per seed (escaped at `by`, censored at `after`), at least 2 * `MIN_GROUP`.
        n_null: normal samples behind the p-value.
        seed: their generator's seed (same seed, same p-value).

    Returns:
        `Modes`.

    >>> m = modes([StepInterval(s - 10, s) for s in (40, 50, 60, 70, 80, 90, 300, 500, 700, 900)])
    >>> m.bimodal, m.split
    (True, ((40, 90), (300, 900)))
    """
    check_int("n_null", n_null, minimum=1)
    steps = sorted(max(c.step, 1) for c in crossings)
    r, cut = cluster_statistic(np.log(steps))
    null, _ = cluster_statistic(np.random.default_rng(seed).standard_normal((n_null, len(steps))))
    p = (1 + int(np.sum(null >= r))) / (1 + n_null) if not math.isnan(r) else 1.0
    return Modes(steps=tuple(steps), censored=sum(c.censored for c in crossings), statistic=r, p_value=p,
                 bimodal=p < MODES_ALPHA, split=((steps[0], steps[cut - 1]), (steps[cut], steps[-1])))
