"""Training dynamics as statistics: escape times with censoring, Kaplan–Meier curves, intervals over seeds.

A one-layer model on a binary chain with p + q > 1 often sits on the unigram plateau for a while before it
learns the kernel (Makkuva et al., arXiv 2402.04161). Whether a run is "stuck" is then a statement about the
*budget*: a run that has not escaped by its last evaluation is **right-censored** at that step, not trapped.
This module turns evaluation curves into escape times and escape times over seeds into distributions:

- `escape_time`: the first evaluation after which the model's excess loss (its loss minus the true predictor's
  on the same tokens) stays below a fraction (½) of the plateau's excess (the stationary law's, or the
  in-context unigram estimator's, on the same tokens); censored when that never happens within the budget.
  "Stuck" is exactly "censored at the budget": one definition for both.
- `kaplan_meier`: the product-limit estimate of P(not yet escaped at step t) with Greenwood's variance and a
  log–log confidence band; `median_escape` reads the median and its interval off that band
  (Brookmeyer–Crowley style, as R's `survfit` does).
- `wilson_interval`: the interval for a fraction (e.g. the fraction of seeds censored at the budget).
- `summarise`: all of the above for one condition, as a frozen `EscapeSummary`.
- `logrank_test` and `compare`: two conditions (an intervention against the free run): the log-rank test,
  which uses the censored runs, and the difference of medians with a bootstrap interval.

Nothing here trains or plots: figures are in `markov_interp.report`.
"""

import dataclasses
import math
from statistics import NormalDist
from collections.abc import Mapping, Sequence
from typing import Any, Optional

__all__ = [
    "EscapeTime",
    "KaplanMeier",
    "EscapeSummary",
    "escape_time",
    "escape_from_metrics",
    "kaplan_meier",
    "median_escape",
    "wilson_interval",
    "summarise",
    "EscapeComparison",
    "logrank_test",
    "compare",
]


@dataclasses.dataclass(frozen=True)
class EscapeTime:
    """When a run left the plateau. `step` is the escape step, or the budget when `censored` (the run had not
    escaped by its last evaluation; the true escape time, if any, is later)."""

    step: int
    censored: bool

    @property
    def escaped(self) -> bool:
        return not self.censored


def escape_time(
    steps: Sequence[int],
    excess: Sequence[float],
    plateau_excess: Sequence[float],
    *,
    fraction: float = 0.5,
) -> EscapeTime:
    """Escape step from paired excess losses at the evaluation `steps`.

    `excess[i]` is the model's loss minus the true predictor's loss on the evaluation tokens of step
    `steps[i]`; `plateau_excess[i]` the same for the plateau predictor (stationary law for fixed chains, the
    in-context unigram estimator for random kernels). The escape step is the first evaluation from which on
    every `excess` is below `fraction * plateau_excess`; a run with no such evaluation is censored at its last
    step. Pairing on the same tokens removes most evaluation noise from the comparison.

    >>> escape_time([10, 20, 30, 40], [0.05, 0.04, 0.001, 0.0], [0.05, 0.05, 0.05, 0.05])
    EscapeTime(step=30, censored=False)
    >>> escape_time([10, 20], [0.05, 0.05], [0.05, 0.05])
    EscapeTime(step=20, censored=True)
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"fraction must lie in (0, 1), got {fraction}")
    if not (len(steps) == len(excess) == len(plateau_excess)) or not steps:
        raise ValueError(
            f"steps, excess and plateau_excess must be non-empty and of one length, got "
            f"{len(steps)}, {len(excess)}, {len(plateau_excess)}")
    if any(b <= a for a, b in zip(steps, steps[1:])):
        raise ValueError("evaluation steps must increase")
    if any(p <= 0 for p in plateau_excess):
        raise ValueError("plateau_excess must be positive: the plateau predictor must be worse than the true one")
    escaped_from: Optional[int] = None
    for step, ex, plateau in zip(steps, excess, plateau_excess):
        below = math.isfinite(ex) and ex < fraction * plateau
        if below and escaped_from is None:
            escaped_from = step
        elif not below:
            escaped_from = None
    if escaped_from is None:
        return EscapeTime(step=int(steps[-1]), censored=True)
    return EscapeTime(step=int(escaped_from), censored=False)


def escape_from_metrics(rows: Sequence[Mapping[str, Any]], *, fraction: float = 0.5,
                        min_gap: float = 1e-3) -> Optional[EscapeTime]:
    """`escape_time` from a run's metrics rows (the evaluation rows with "eval_loss", "eval_true_loss" and
    "eval_plateau_loss", which `training.evaluate_paired` logs); None when the run logged no paired evaluation,
    or when the plateau is not worse than the true predictor by `min_gap` nats at every evaluation (p + q = 1:
    both laws coincide and there is nothing to escape from)."""
    evals = [r for r in rows if all(k in r for k in ("eval_loss", "eval_true_loss", "eval_plateau_loss"))]
    if not evals:
        return None
    plateau = [r["eval_plateau_loss"] - r["eval_true_loss"] for r in evals]
    if min(plateau) < min_gap:
        return None
    excess = [r["eval_loss"] - r["eval_true_loss"] for r in evals]
    return escape_time([int(r["step"]) for r in evals], excess, plateau, fraction=fraction)


@dataclasses.dataclass(frozen=True)
class KaplanMeier:
    """Product-limit estimate of the plateau's survival S(t) = P(escape step > t).

    `times` are the distinct escape steps; `survival[i]` is S just after `times[i]`; `at_risk[i]` the runs not
    escaped and not censored before `times[i]`; `events[i]` the escapes at `times[i]`; `lower`/`upper` the
    pointwise confidence band (log–log transform, Greenwood variance) at `confidence`.
    """

    times: tuple[int, ...]
    survival: tuple[float, ...]
    at_risk: tuple[int, ...]
    events: tuple[int, ...]
    lower: tuple[float, ...]
    upper: tuple[float, ...]
    confidence: float
    n: int = 0  # runs in all (escaped and censored)

    def at(self, t: int | float) -> float:
        """S(t): the fraction of runs still on the plateau after step t."""
        s = 1.0
        for time, surv in zip(self.times, self.survival):
            if time > t:
                break
            s = surv
        return s


def _z(confidence: float) -> float:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def kaplan_meier(escapes: Sequence[EscapeTime], *, confidence: float = 0.95) -> KaplanMeier:
    """Kaplan–Meier curve of escape times, censoring included (a run censored at t is at risk at t).

    >>> km = kaplan_meier([EscapeTime(1, False), EscapeTime(2, False), EscapeTime(2, True),
    ...                    EscapeTime(3, False), EscapeTime(4, True)])
    >>> km.times, [round(s, 3) for s in km.survival]
    ((1, 2, 3), [0.8, 0.6, 0.3])
    """
    if not escapes:
        raise ValueError("kaplan_meier needs at least one escape time")
    z = _z(confidence)
    event_steps = sorted({e.step for e in escapes if not e.censored})
    s, greenwood = 1.0, 0.0
    times, surv, risk, events, lower, upper = [], [], [], [], [], []
    for t in event_steps:
        n = sum(1 for e in escapes if e.step >= t)
        d = sum(1 for e in escapes if e.step == t and not e.censored)
        s *= 1.0 - d / n
        greenwood = greenwood + d / (n * (n - d)) if n > d else math.inf
        lo, hi = _loglog_band(s, greenwood, z)
        times.append(t), surv.append(s), risk.append(n), events.append(d), lower.append(lo), upper.append(hi)
    return KaplanMeier(tuple(times), tuple(surv), tuple(risk), tuple(events), tuple(lower), tuple(upper),
                       confidence, n=len(escapes))


def _loglog_band(s: float, greenwood: float, z: float) -> tuple[float, float]:
    # Kalbfleisch–Prentice: a symmetric interval for log(-log S) stays inside [0, 1]
    if s <= 0.0 or s >= 1.0 or not math.isfinite(greenwood):
        return (0.0, 1.0) if s > 0.0 else (0.0, 0.0)
    half = z * math.sqrt(greenwood) / abs(math.log(s))
    return s ** math.exp(half), s ** math.exp(-half)


def _first_at_or_below(times: Sequence[int], values: Sequence[float], level: float) -> Optional[int]:
    return next((t for t, v in zip(times, values) if v <= level), None)


def median_escape(km: KaplanMeier) -> tuple[Optional[int], Optional[int], Optional[int]]:
    """(median, lower, upper) of the escape step; `None` where the curve (or its band) never reaches ½ within
    the observed steps, i.e. the median or that bound lies beyond the budget.

    >>> km = kaplan_meier([EscapeTime(t, False) for t in (10, 20, 30, 40, 50)])
    >>> median_escape(km)[0]
    30
    """
    median = _first_at_or_below(km.times, km.survival, 0.5)
    lo = _first_at_or_below(km.times, km.lower, 0.5)
    hi = _first_at_or_below(km.times, km.upper, 0.5)
    return median, lo, hi


def wilson_interval(successes: int, n: int, *, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial fraction `successes / n` (e.g. seeds censored at the budget).

    >>> [round(x, 4) for x in wilson_interval(0, 10)]
    [0.0, 0.2775]
    """
    if n <= 0 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n and n > 0, got successes={successes}, n={n}")
    z = _z(confidence)
    phat = successes / n
    denom = 1 + z * z / n
    centre = (phat + z * z / (2 * n)) / denom
    half = z * math.sqrt(phat * (1 - phat) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclasses.dataclass(frozen=True)
class EscapeSummary:
    """One condition's escape-time distribution over seeds, at a stated budget."""

    n: int
    n_censored: int
    budget: int
    censored_fraction: float
    censored_interval: tuple[float, float]
    median: Optional[int]
    median_interval: tuple[Optional[int], Optional[int]]
    curve: KaplanMeier

    def describe(self) -> str:
        """One line: e.g. 'median escape 130 [90, 240]; censored at 250: 5/20 (11%–47%)'."""
        def fmt(x: Optional[int]) -> str:
            return f">{self.budget}" if x is None else str(x)
        lo, hi = self.censored_interval
        return (f"median escape {fmt(self.median)} [{fmt(self.median_interval[0])}, "
                f"{fmt(self.median_interval[1])}]; censored at {self.budget}: {self.n_censored}/{self.n} "
                f"({lo:.0%}–{hi:.0%})")


def summarise(escapes: Sequence[EscapeTime], *, budget: Optional[int] = None,
              confidence: float = 0.95) -> EscapeSummary:
    """Kaplan–Meier curve, median escape with its interval and the censored fraction with a Wilson interval.
    `budget` defaults to the largest step seen (the budget of runs that share one)."""
    km = kaplan_meier(escapes, confidence=confidence)
    n_cens = sum(e.censored for e in escapes)
    median, lo, hi = median_escape(km)
    return EscapeSummary(
        n=len(escapes), n_censored=n_cens, budget=budget if budget is not None else max(e.step for e in escapes),
        censored_fraction=n_cens / len(escapes),
        censored_interval=wilson_interval(n_cens, len(escapes), confidence=confidence),
        median=median, median_interval=(lo, hi), curve=km)


# ------------------------------------------------------------------------------------------ two conditions
@dataclasses.dataclass(frozen=True)
class EscapeComparison:
    """Two conditions' escape times compared (e.g. an intervention against the free run): the log-rank test
    (censoring included) and the difference of Kaplan–Meier medians `b - a` with a bootstrap interval."""

    a: EscapeSummary
    b: EscapeSummary
    logrank_chi2: float
    p_value: float
    median_difference: Optional[int]  # None where either median lies beyond the budget
    difference_interval: tuple[Optional[int], Optional[int]]  # None: that bound is beyond what the budget shows

    def describe(self, names: tuple[str, str] = ("a", "b")) -> str:
        def fmt(x: Optional[int]) -> str:
            return "beyond the budget" if x is None else f"{x:+d}"
        lo, hi = self.difference_interval
        return (f"median {names[1]} - {names[0]}: {fmt(self.median_difference)} steps "
                f"[{fmt(lo)}, {fmt(hi)}]; log-rank chi2 = {self.logrank_chi2:.2f}, p = {self.p_value:.3g}")


def logrank_test(a: Sequence[EscapeTime], b: Sequence[EscapeTime]) -> tuple[float, float]:
    """(chi-square statistic, two-sided p-value) of the log-rank test that `a` and `b` share one escape-time
    law, ties handled with the hypergeometric variance (Mantel 1966). A run censored at t is at risk at t."""
    if not a or not b:
        raise ValueError("logrank_test needs escape times in both groups")
    observed_minus_expected, variance = 0.0, 0.0
    for t in sorted({e.step for e in (*a, *b) if not e.censored}):
        n1 = sum(1 for e in a if e.step >= t)
        n2 = sum(1 for e in b if e.step >= t)
        d1 = sum(1 for e in a if e.step == t and not e.censored)
        d = d1 + sum(1 for e in b if e.step == t and not e.censored)
        n = n1 + n2
        observed_minus_expected += d1 - d * n1 / n
        if n > 1:
            variance += d * (n1 / n) * (n2 / n) * (n - d) / (n - 1)
    if variance == 0.0:
        return 0.0, 1.0  # no information (e.g. no escapes at all): no evidence of a difference
    chi2 = observed_minus_expected ** 2 / variance
    return chi2, math.erfc(math.sqrt(chi2 / 2))  # the chi-square(1) tail


def compare(a: Sequence[EscapeTime], b: Sequence[EscapeTime], *, budget: Optional[int] = None,
            confidence: float = 0.95, n_boot: int = 2000, seed: int = 0) -> EscapeComparison:
    """Compare two conditions: both summaries, the log-rank test and the difference of medians `b - a` with a
    percentile bootstrap interval (seeds resampled within each condition; `seed` fixes the resamples). A bound
    is None when more than its tail of resamples has a median beyond the budget."""
    import random

    sa, sb = (summarise(x, budget=budget, confidence=confidence) for x in (a, b))
    chi2, p = logrank_test(a, b)
    rng = random.Random(seed)
    diffs, undefined = [], 0
    for _ in range(n_boot):
        ma = median_escape(kaplan_meier([rng.choice(a) for _ in a]))[0]
        mb = median_escape(kaplan_meier([rng.choice(b) for _ in b]))[0]
        if ma is None and mb is None:
            undefined += 1  # both medians beyond the budget: the difference is unknown either way
        else:  # one median beyond the budget: the difference is unbounded on that side
            diffs.append(math.inf if ma is not None and mb is None else -math.inf if mb is not None and ma is None
                         else mb - ma)
    diffs.sort()
    tail = (1 - confidence) / 2

    def bound(q: float) -> Optional[int]:
        if undefined > tail * n_boot or not diffs:
            return None
        x = diffs[min(len(diffs) - 1, max(0, math.floor(q * len(diffs))))]
        return None if math.isinf(x) else int(x)

    lo, hi = bound(tail), bound(1 - tail)
    difference = None if sa.median is None or sb.median is None else sb.median - sa.median
    return EscapeComparison(sa, sb, chi2, p, difference, (lo, hi))
