"""Two conditions compared: the log-rank test, differences and ratios of median crossings at every line and the
area between median curves, with percentile-bootstrap intervals over seeds (see `markov_interp.dynamics`)."""

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, Optional

import numpy as np
from jaxtyping import Float

from markov_interp._display import displayed
from markov_interp._plan import Need, planned, size
from markov_interp.config import check_int
from markov_interp.dynamics._runs import ESCAPE_FRACTION, MIN_RUNS, ExcessCurve, RunDynamics, StepInterval
from markov_interp.dynamics._survival import Quantile, _aligned, _estimate, _grid, _same_lines, survival

# numpy >= 2 names it trapezoid; numpy 1.x (the TransformerLens 2 tier) has only trapz
_trapezoid = getattr(np, "trapezoid", None) or np.trapz


def logrank_test(a: Sequence[StepInterval], b: Sequence[StepInterval]) -> tuple[float, float]:
    """(chi-square statistic, two-sided p-value) of the log-rank test that `a` and `b` share one crossing law,
    ties handled with the hypergeometric variance (Mantel 1966); a run censored at t is at risk at t.

    Valid for crossings on one common evaluation grid (discrete-time data; then it is the grouped log-rank
    test); a `ValueError` otherwise, since interval-censored data need another test.
    """
    if not a or not b:
        raise ValueError("logrank_test needs crossings in both groups")
    if not _aligned([*a, *b]):
        raise ValueError("the log-rank test needs the two conditions' crossings on one evaluation grid")
    observed_minus_expected, variance = 0.0, 0.0
    for t in sorted({x.by for x in (*a, *b) if x.by is not None}):
        n1 = sum(1 for x in a if x.step >= t)
        n2 = sum(1 for x in b if x.step >= t)
        d1 = sum(1 for x in a if x.by == t)
        d = d1 + sum(1 for x in b if x.by == t)
        n = n1 + n2
        observed_minus_expected += d1 - d * n1 / n
        if n > 1:
            variance += d * (n1 / n) * (n2 / n) * (n - d) / (n - 1)
    if variance == 0.0:
        return 0.0, 1.0  # no information (e.g. no crossings at all): no evidence of a difference
    chi2 = observed_minus_expected ** 2 / variance
    return chi2, math.erfc(math.sqrt(chi2 / 2))  # the chi-square(1) tail


Bounds = tuple[Optional[float], Optional[float]]


@displayed
@dataclasses.dataclass(frozen=True)
class FractionComparison:
    """Two conditions' crossings of one line: their median crossings (`Quantile`), the difference `b - a` and
    the ratio `b / a` of the medians' `by` steps with percentile-bootstrap intervals over seeds, and the
    log-rank test. `difference` / `ratio` None: a median not reached (`describe` gives the bound the budget
    allows). An interval None: fewer than `MIN_RUNS` runs in a condition; a bound None: more than its tail of
    resamples has a median beyond what the budgets show (or both medians so). `logrank_chi2` / `p_value` None:
    no common evaluation grid (not valid)."""

    fraction: float
    a: Quantile
    b: Quantile
    difference: Optional[float]
    difference_interval: Optional[Bounds]
    ratio: Optional[float]
    ratio_interval: Optional[Bounds]
    logrank_chi2: Optional[float]
    p_value: Optional[float]

    def _beyond(self, ratio: bool) -> str:
        """The point value where a median is not reached: a bound from the last step known, or '?'."""
        a, b = self.a.estimate, self.b.estimate
        if a.by is not None and b.by is None:  # b not reached by b.after: b - a > b.after - a.by
            return f">{b.after / a.by:.2g}x" if ratio else f">{b.after - a.by:+.0f}"
        if a.by is None and b.by is not None:  # a not reached by a.after
            return f"<{b.by / a.after:.2g}x" if ratio and a.after > 0 else "?" if ratio else f"<{b.by - a.after:+.0f}"
        return "? (neither median reached)"

    def ratio_text(self) -> str:
        """The ratio of the medians with its interval, e.g. '6.1x [3.2x, ?]' (?: a bound beyond the budgets)."""
        value = self._beyond(True) if self.ratio is None else f"{self.ratio:.2g}x"
        return f"{value} {_fmt_bounds(self.ratio_interval, 'x')}"

    def difference_text(self) -> str:
        """The difference of the medians in steps with its interval, e.g. '+1240 [+1010, ?]'."""
        value = self._beyond(False) if self.difference is None else f"{self.difference:+.0f}"
        return f"{value} {_fmt_bounds(self.difference_interval, '')}"

    def describe(self, names: tuple[str, str] = ("a", "b")) -> str:
        """E.g. 'b / a at 0.5: 6.1x [3.2x, not reached]; b - a: +1240 [+1010, not reached] steps; log-rank
        p = 4e-09'."""
        p = "not valid (grids differ)" if self.p_value is None else f"{self.p_value:.2g}"
        return (f"{names[1]} / {names[0]} at {self.fraction:g}: {self.ratio_text()}; {names[1]} - {names[0]}: "
                f"{self.difference_text()} steps; log-rank p = {p}")


def _fmt_bounds(bounds: Optional[Bounds], unit: str) -> str:
    """[lo, hi] of a bootstrap interval; ? for a bound beyond what the budgets show."""
    def one(x: Optional[float]) -> str:
        return "?" if x is None else f"{x:.2g}x" if unit == "x" else f"{x:+.0f}"

    return "[no interval]" if bounds is None else f"[{one(bounds[0])}, {one(bounds[1])}]"


@displayed(line=lambda a: f"area {a.area:+.3g} between the median curves over steps {a.span[0]}-{a.span[1]}")
@dataclasses.dataclass(frozen=True)
class AreaComparison:
    """The area between two conditions' median excess curves, ∫ (median_b - median_a) dt over `span` (the
    steps both evaluate; trapezoid rule), in (fraction of the plateau excess) x steps: > 0 when b has more of
    its excess left. `interval`: percentile bootstrap over seeds (None: fewer than `MIN_RUNS` runs; a bound
    None: too many resamples with a median curve not finite)."""

    span: tuple[int, int]
    area: float
    interval: Optional[Bounds]

    @property
    def mean_gap(self) -> float:
        """The area over the span's length: the mean difference of the fractions left."""
        return self.area / (self.span[1] - self.span[0])

    def text(self) -> str:
        """The area with its interval, e.g. '+131 [+112, +149]' ('no interval', '?': a bound not known).

        >>> AreaComparison((10, 500), 131.2, (112.4, None)).text()
        '+131 [+112, ?]'
        """
        if self.interval is None:
            return f"{self.area:+.3g} [no interval]"
        return f"{self.area:+.3g} [" + ", ".join("?" if x is None else f"{x:+.3g}" for x in self.interval) + "]"


@displayed
@dataclasses.dataclass(frozen=True)
class Comparison:
    """Two conditions compared at every line (`fractions`) and by the area between their median curves."""

    fractions: dict[float, FractionComparison]
    area: Optional[AreaComparison]  # None: fewer than two shared evaluation steps
    confidence: float
    n_boot: int
    seed: int

    @property
    def escape(self) -> FractionComparison:
        return self.fractions[ESCAPE_FRACTION]

    def describe(self, names: tuple[str, str] = ("a", "b")) -> str:
        lines = [c.describe(names) for c in self.fractions.values()]
        if self.area is not None:
            lines.append(f"area between median curves ({names[1]} - {names[0]}, steps {self.area.span[0]}-"
                         f"{self.area.span[1]}): {self.area.text()} (mean gap {self.area.mean_gap:+.3f})")
        return "\n".join(lines)


def _median_by(found: Sequence[StepInterval]) -> float:
    """The `by` step of the median crossing (inf: not reached), without a band."""
    intervals, surv, _ = _estimate(found)
    return next((float(x.by) for x, s in zip(intervals, surv) if s <= 0.5 + 1e-12 and x.by is not None), math.inf)


def _bootstrap_medians(found: Sequence[StepInterval], draws: Any) -> Float[np.ndarray, " boot"]:
    """`_median_by` of every resample (rows of run indices). On a common grid every resample is on it too,
    and Kaplan-Meier is done for all resamples at once from the multiplicity of each run in each."""
    if not _aligned(found):
        return np.array([_median_by([found[i] for i in row]) for row in draws])
    times = np.array(sorted({x.by for x in found if x.by is not None}), dtype=float)
    if not len(times):
        return np.full(len(draws), math.inf)
    steps = np.array([x.step for x in found], dtype=float)
    bys = np.array([math.inf if x.by is None else x.by for x in found])
    counts = np.zeros((len(draws), len(found)))
    np.add.at(counts, (np.repeat(np.arange(len(draws)), draws.shape[1]), draws.ravel()), 1.0)
    at_risk = counts @ (steps[:, None] >= times[None, :])
    events = counts @ (bys[:, None] == times[None, :])
    with np.errstate(invalid="ignore", divide="ignore"):
        factor = np.where(at_risk > 0, 1.0 - events / at_risk, 1.0)
    reached = np.cumprod(factor, axis=1) <= 0.5 + 1e-12
    return np.where(reached.any(axis=1), times[np.argmax(reached, axis=1)], math.inf)


def _percentile(values: list[float], undefined: int, confidence: float) -> Bounds:
    """Percentile-bootstrap bounds; None where the bound is not finite or too many resamples are undefined."""
    n_boot = len(values) + undefined
    tail = (1 - confidence) / 2
    if undefined > tail * n_boot or not values:
        return None, None
    ordered = sorted(values)

    def bound(q: float) -> Optional[float]:
        x = ordered[min(len(ordered) - 1, max(0, math.floor(q * len(ordered))))]
        return None if math.isinf(x) else float(x)

    return bound(tail), bound(1 - tail)


def _shift(ma: float, mb: float) -> tuple[Optional[float], Optional[float]]:
    """(b - a, b / a) of two median steps; inf where only b is not reached, -inf where only a (the ratio too: it
    is somewhere in (0, b / a's budget), not 0, so it reads as a bound, never as '0x'); None where both are not
    reached (nothing known)."""
    if math.isinf(ma) and math.isinf(mb):
        return None, None
    if math.isinf(mb):
        return math.inf, math.inf
    if math.isinf(ma):
        return -math.inf, -math.inf
    return mb - ma, (mb / ma if ma > 0 else None)


def _compare_at(a: Sequence[StepInterval], b: Sequence[StepInterval], fraction: float, draws: tuple,
                confidence: float) -> FractionComparison:
    sa, sb = survival(a, confidence=confidence), survival(b, confidence=confidence)
    qa, qb = sa.median(), sb.median()
    difference, ratio = _shift(*(math.inf if q.by is None else float(q.by) for q in (qa, qb)))
    difference_interval = ratio_interval = None
    if min(len(a), len(b)) >= MIN_RUNS:
        diffs, ratios, undefined = [], [], 0
        for ma, mb in zip(_bootstrap_medians(a, draws[0]), _bootstrap_medians(b, draws[1])):
            d, r = _shift(float(ma), float(mb))
            if d is None or r is None:
                undefined += 1
            else:
                diffs.append(d)
                ratios.append(r)
        difference_interval, ratio_interval = (_percentile(diffs, undefined, confidence),
                                               _percentile(ratios, undefined, confidence))
    chi2 = p = None
    if _aligned([*a, *b]):
        chi2, p = logrank_test(a, b)
    finite = (lambda x: None if x is None or math.isinf(x) else float(x))
    return FractionComparison(float(fraction), qa, qb, finite(difference), difference_interval, finite(ratio),
                              ratio_interval, chi2, p)


def _boot_needs(a: Any) -> list[Need]:
    """The resampled seed indices: n_boot x (len(a) + len(b)) (int64, and the statistics over them)."""
    runs = sum(len(a[name]) if hasattr(a.get(name), "__len__") else 0 for name in ("a", "b"))
    return [Need.of("the bootstrap draws", size(a, "n_boot") * max(runs, 1) * 16, [("n_boot", size(a, "n_boot"))])]


def _draws(na: int, nb: int, n_boot: int, seed: int) -> tuple:
    """The bootstrap resamples of both conditions' runs (indices), shared by every statistic of a comparison."""
    check_int("n_boot", n_boot, minimum=1)
    rng = np.random.default_rng(seed)
    return rng.integers(0, na, size=(n_boot, na)), rng.integers(0, nb, size=(n_boot, nb))


@planned(_boot_needs)
def compare_crossings(a: Sequence[StepInterval], b: Sequence[StepInterval], *, fraction: float = ESCAPE_FRACTION,
                      confidence: float = 0.95, n_boot: int = 2000, seed: int = 0) -> FractionComparison:
    """Two conditions' crossings of one line compared (`FractionComparison`); `fraction` only labels it.

    Args:
        a, b: one crossing per run of each condition.
        fraction: the line the crossings are of.
        confidence: of every interval.
        n_boot: bootstrap resamples (seeds resampled within each condition).
        seed: of the resamples (`numpy.random.default_rng`): the same seed gives the same intervals.

    Returns:
        The `FractionComparison`.
    """
    if not a or not b:
        raise ValueError("compare needs runs in both conditions")
    return _compare_at(a, b, fraction, _draws(len(a), len(b), n_boot, seed), confidence)


def _compare_area(a: Sequence[ExcessCurve], b: Sequence[ExcessCurve], draws: tuple,
                  confidence: float) -> Optional[AreaComparison]:
    steps = set(a[0].steps)
    for c in (*a, *b):
        steps &= set(c.steps)
    if len(steps) < 2:
        return None
    grid, left_a = _grid(a, sorted(steps))
    _, left_b = _grid(b, grid)
    x = np.array(grid, dtype=float)

    def area(ma: Float[np.ndarray, "*boot step"], mb: Float[np.ndarray, "*boot step"]) -> Any:
        with np.errstate(invalid="ignore"):  # inf - inf: a resample whose median curve is not finite
            return _trapezoid(mb - ma, x, axis=-1)

    value = float(area(np.median(left_a, axis=0), np.median(left_b, axis=0)))
    interval = None
    if min(len(a), len(b)) >= MIN_RUNS:
        boot = area(np.median(left_a[draws[0]], axis=1), np.median(left_b[draws[1]], axis=1))
        finite = [float(v) for v in boot if math.isfinite(v)]
        interval = _percentile(finite, len(boot) - len(finite), confidence)
    return AreaComparison((grid[0], grid[-1]), value, interval)


@planned(_boot_needs)
def compare(a: Sequence[RunDynamics], b: Sequence[RunDynamics], *, confidence: float = 0.95, n_boot: int = 2000,
            seed: int = 0) -> Comparison:
    """Compare two conditions (e.g. an intervention `b` against the free run `a`) at every line both were
    measured at, and by the area between their median excess curves.

    Args:
        a, b: each condition's runs (`RunDynamics`, one per seed).
        confidence: of every interval.
        n_boot: bootstrap resamples of the seeds, shared by every statistic.
        seed: of the resamples (`numpy.random.default_rng`).

    Returns:
        A `Comparison`: per line a `FractionComparison` (medians, difference and ratio with bootstrap intervals,
        log-rank where valid) and the `AreaComparison`.
    """
    fa, _ = _same_lines(a)
    fb, _ = _same_lines(b)
    draws = _draws(len(a), len(b), n_boot, seed)
    fractions = {f: _compare_at([r.crossings[f] for r in a], [r.crossings[f] for r in b], f, draws, confidence)
                 for f in fa if f in fb}
    area = _compare_area([r.curve for r in a], [r.curve for r in b], draws, confidence)
    return Comparison(fractions, area, confidence, n_boot, seed)
