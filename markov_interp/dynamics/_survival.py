"""Crossings over a condition's seeds: the interval-censored survival (Turnbull; Kaplan-Meier on a shared grid)
with its band and quantiles, Wilson intervals, the median excess curve and `condition` (see
`markov_interp.dynamics`)."""

import dataclasses
import math
from collections.abc import Sequence
from statistics import NormalDist
from typing import Optional

import numpy as np
from jaxtyping import Float

from markov_interp._display import displayed

from markov_interp.dynamics._runs import ESCAPE_FRACTION, MIN_RUNS, ExcessCurve, RunDynamics, StepInterval


def _z(confidence: float) -> float:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def _aligned(found: Sequence[StepInterval]) -> bool:
    """Whether no step that any run reports lies strictly inside an observed crossing interval. Then the
    crossing intervals form one grid and the NPMLE is the Kaplan-Meier estimate on it (events at `by`,
    censoring at `after`, a run censored at t at risk at t)."""
    points = np.array(sorted({x.after for x in found} | {x.by for x in found if x.by is not None}))
    return not any(np.any((points > x.after) & (points < x.by)) for x in found if x.by is not None)


def _kaplan_meier(found: Sequence[StepInterval]) -> tuple[list[StepInterval], list[float], list[float]]:
    """Kaplan-Meier on a grid: the crossing intervals, S after each and Greenwood's sum up to each."""
    intervals, surv, greenwood = [], [], []
    s, g = 1.0, 0.0
    for t in sorted({x.by for x in found if x.by is not None}):
        at_risk = sum(1 for x in found if x.step >= t)
        events = sum(1 for x in found if x.by == t)
        s *= 1.0 - events / at_risk
        g = g + events / (at_risk * (at_risk - events)) if at_risk > events else math.inf
        intervals.append(next(StepInterval(x.after, t) for x in found if x.by == t))
        surv.append(s)
        greenwood.append(g)
    return intervals, surv, greenwood


def turnbull(found: Sequence[StepInterval], *, tol: float = 1e-12,
             max_iter: int = 100_000) -> tuple[tuple[StepInterval, ...], Float[np.ndarray, " interval"]]:
    """Turnbull's nonparametric maximum-likelihood estimate for interval-censored crossings (self-consistency
    EM, Turnbull 1976): the innermost intervals (a left end followed by a right end with no end between) and
    the probability mass of each; a last interval with `by` None holds the mass beyond every observation.

    Args:
        found: crossings (after, by]; `by` None: right-censored.
        tol: stop when no mass moves by more than this in one iteration.
        max_iter: at most this many iterations.

    Returns:
        (innermost intervals, masses summing to 1).

    >>> inner, mass = turnbull([StepInterval(0, 10), StepInterval(5, 20), StepInterval(20, None)])
    >>> [str(x) for x in inner], [round(float(m), 3) for m in mass]
    (['(5, 10]', '> 20'], [0.667, 0.333])
    """
    if not found:
        raise ValueError("turnbull needs at least one crossing")
    lefts = sorted({x.after for x in found})
    rights = sorted({x.by for x in found if x.by is not None})
    inner = []
    for left in lefts:
        right = next((r for r in rights if r > left), None)  # None: infinity
        if not any(left < other and (right is None or other < right) for other in lefts):
            inner.append(StepInterval(left, right))
    inf = math.inf
    covers = np.array([[x.after <= j.after and (inf if j.by is None else j.by) <= (inf if x.by is None else x.by)
                        for j in inner] for x in found], dtype=float)
    return tuple(inner), _self_consistent(covers, tol=tol, max_iter=max_iter)


def _self_consistent(covers: Float[np.ndarray, "run interval"], *, tol: float,
                     max_iter: int) -> Float[np.ndarray, " interval"]:
    """The masses maximising sum_i log(covers_i . mass): Turnbull's self-consistency (EM) step, accelerated by
    SQUAREM (Varadhan & Roland 2008: an extrapolation along two EM steps, kept only when the likelihood does
    not fall), which the masses that go to zero otherwise approach sublinearly."""
    def step(mass: Float[np.ndarray, " interval"]) -> Float[np.ndarray, " interval"]:
        share = covers * mass
        return (share / share.sum(axis=1, keepdims=True)).mean(axis=0)

    def loglik(mass: Float[np.ndarray, " interval"]) -> float:
        with np.errstate(divide="ignore"):
            return float(np.log(covers @ mass).sum())

    mass = np.full(covers.shape[1], 1.0 / covers.shape[1])
    for _ in range(max_iter):
        one = step(mass)
        two = step(one)
        r, v = one - mass, two - 2 * one + mass
        if np.linalg.norm(v) > 0:
            alpha = min(-np.linalg.norm(r) / np.linalg.norm(v), -1.0)  # -1: the plain double step
            jump = np.clip(mass - 2 * alpha * r + alpha * alpha * v, 0.0, None)
            jump = step(jump / jump.sum())
            new = jump if loglik(jump) >= loglik(two) else two
        else:
            new = two
        done = np.max(np.abs(new - mass)) < tol
        mass = new
        if done:
            break
    return mass


def _estimate(found: Sequence[StepInterval]) -> tuple[list[StepInterval], list[float], Optional[list[float]]]:
    """The NPMLE of S as (intervals with mass, S after each, Greenwood sums or None): Kaplan-Meier on a common
    grid, Turnbull's EM otherwise (intervals of negligible mass dropped)."""
    if _aligned(found):
        return _kaplan_meier(found)
    inner, mass = turnbull(found)
    surv = 1.0 - np.cumsum(mass)
    keep = [k for k, (x, m) in enumerate(zip(inner, mass)) if x.by is not None and m > 1e-9]
    return [inner[k] for k in keep], [max(0.0, float(surv[k])) for k in keep], None


def _loglog_band(s: float, greenwood: float, z: float) -> tuple[float, float]:
    # Kalbfleisch-Prentice: a symmetric interval for log(-log S) stays inside [0, 1]; undefined (nan) at S = 0,
    # as scipy.stats.ecdf's, so a median's upper bound is "not reached" there rather than the last observation
    if s <= 0.0 or not math.isfinite(greenwood):
        return math.nan, math.nan
    if s >= 1.0:
        return 1.0, 1.0
    half = z * math.sqrt(greenwood) / abs(math.log(s))
    return s ** math.exp(half), s ** math.exp(-half)


@displayed
@dataclasses.dataclass(frozen=True)
class Quantile:
    """Where a condition's survival falls to 1 - p (p = ½: the median crossing), as the grid interval it is.

    `estimate` (after, by]: the first interval after which at most 1 - p of the runs have not crossed (by None:
    not reached by the last step anything is known at). `interval`: the `confidence` interval, read off the
    pointwise band (Brookmeyer-Crowley, as R's `survfit`): the quantile is after `interval.after` and by
    `interval.by`, by None meaning "not reached"; None when there is no band (`note` says why).
    """

    p: float
    estimate: StepInterval
    interval: Optional[StepInterval]
    confidence: float
    note: str = ""

    @property
    def by(self) -> Optional[int]:
        """The step by which the quantile is reached (None: not reached)."""
        return self.estimate.by

    def describe(self) -> str:
        """E.g. '(170, 180], 95% CI (150, 200]', '> 500, 95% CI (480, not reached)', '180 (no interval: 3 runs
        ...)'."""
        if self.interval is None:
            return f"{self.estimate} (no interval: {self.note})"
        lo, hi = self.interval.after, self.interval.by
        return f"{self.estimate}, {self.confidence:.0%} CI ({lo}, {'not reached)' if hi is None else f'{hi}]'}"


@displayed(line=lambda s: f"{s.n} runs, {s.n_censored} censored; median crossing {s.median().describe()}")
@dataclasses.dataclass(frozen=True)
class Survival:
    """One condition's S(t) = P(a run's crossing comes after step t), estimated over its runs.

    `intervals[k]` (after, by] holds estimated crossing mass; S is `survival[k]` from `by` until the next
    interval's `after` and is not identified inside an interval (`at` reads it as reached at `by`). `lower` /
    `upper`: the pointwise log-log band (Greenwood) at `confidence`, nan where undefined (S = 0); None without a
    common evaluation grid or with fewer than `MIN_RUNS` runs (`note`). `last`: the last step any run is
    known at (S beyond it is not estimated).
    """

    intervals: tuple[StepInterval, ...]
    survival: tuple[float, ...]
    lower: Optional[tuple[float, ...]]
    upper: Optional[tuple[float, ...]]
    n: int
    n_censored: int
    last: int
    aligned: bool
    confidence: float
    note: str = ""

    @property
    def times(self) -> tuple[int, ...]:
        """The `by` step of each interval (where the estimate drops)."""
        return tuple(int(x.by) for x in self.intervals if x.by is not None)

    def at(self, t: "int | float") -> float:
        """S(t): the fraction of runs that have not crossed by step t."""
        s = 1.0
        for x, value in zip(self.intervals, self.survival):
            if x.by is None or x.by > t:
                break
            s = value
        return s

    def quantile(self, p: float = 0.5) -> Quantile:
        """The step interval by which a fraction `p` of the runs has crossed, with its interval (`Quantile`)."""
        if not 0.0 < p < 1.0:
            raise ValueError(f"p must lie in (0, 1), got {p}")
        level = 1.0 - p + 1e-12  # S falling to exactly 1 - p reaches it
        hit = next((k for k, s in enumerate(self.survival) if s <= level), None)
        estimate = StepInterval(self.last, None) if hit is None else self.intervals[hit]
        if self.lower is None or self.upper is None:
            return Quantile(p, estimate, None, self.confidence, self.note)
        lo = next((k for k, s in enumerate(self.lower) if not s > level), None)  # nan (S = 0): reached
        hi = next((k for k, s in enumerate(self.upper) if s <= level), None)  # nan: not reached
        interval = StepInterval(self.last if lo is None else self.intervals[lo].after,
                                None if hi is None else self.intervals[hi].by)
        return Quantile(p, estimate, interval, self.confidence)

    def median(self) -> Quantile:
        """`quantile(0.5)`: the median crossing."""
        return self.quantile(0.5)


def survival(found: Sequence[StepInterval], *, confidence: float = 0.95) -> Survival:
    """The survival of a condition's crossings (one line, one run each) with its band and censoring counts.

    Args:
        found: each run's crossing at one line (`crossing`); `by` None: censored.
        confidence: of the pointwise band and the quantiles' intervals.

    Returns:
        A `Survival`: Kaplan-Meier on the common evaluation grid with a Greenwood log-log band (from `MIN_RUNS`
        runs), or Turnbull's NPMLE without a band when the runs' grids differ.

    >>> s = survival([StepInterval(0, 10), StepInterval(10, 20), StepInterval(10, 20), StepInterval(20, None)])
    >>> s.survival, str(s.median().estimate), s.median().note
    ((0.75, 0.25), '(10, 20]', '4 runs: no interval from fewer than 5')
    """
    if not found:
        raise ValueError("survival needs at least one crossing")
    z = _z(confidence)
    intervals, surv, greenwood = _estimate(found)
    n = len(found)
    lower = upper = None
    if greenwood is None:
        note = "the runs' evaluation grids differ: no pointwise band (compare conditions with `compare`)"
    elif n < MIN_RUNS:
        note = f"{n} runs: no interval from fewer than {MIN_RUNS}"
    else:
        note = ""
        band = [_loglog_band(s, g, z) for s, g in zip(surv, greenwood)]
        lower, upper = tuple(b[0] for b in band), tuple(b[1] for b in band)
    return Survival(tuple(intervals), tuple(surv), lower, upper, n=n, n_censored=sum(x.censored for x in found),
                    last=max(x.step for x in found), aligned=greenwood is not None, confidence=confidence, note=note)


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


# ------------------------------------------------------------------------------------------- curves
@displayed(line=lambda m: f"median over {m.n} runs at {len(m.steps)} steps; fraction of the plateau excess left at "
                          f"the last {m.median[-1]:.3f}")
@dataclasses.dataclass(frozen=True)
class MedianCurve:
    """A condition's median excess curve: at each evaluation step all its runs share, the median over runs of
    the fraction of the plateau's excess left, and the runs' `band` quantiles (a spread across seeds, not a
    confidence interval). A run whose loss is not finite counts as above every line (inf)."""

    steps: tuple[int, ...]
    median: tuple[float, ...]
    lower: tuple[float, ...]
    upper: tuple[float, ...]
    band: tuple[float, float]
    n: int


def _grid(curves: Sequence[ExcessCurve], steps: Optional[Sequence[int]] = None
          ) -> tuple[list[int], Float[np.ndarray, "run step"]]:
    """The steps every curve evaluates (or the given ones) and the [run, step] fractions left (nan -> inf)."""
    if not curves:
        raise ValueError("need at least one excess curve")
    shared = set(curves[0].steps) if steps is None else set(steps)
    for c in curves:
        shared &= set(c.steps)
    grid = sorted(shared)
    if not grid:
        raise ValueError("the runs share no evaluation step")
    rows = []
    for c in curves:  # each curve's fractions computed once (not once per step: that was quadratic)
        left = dict(zip(c.steps, c.left))
        rows.append([left[s] for s in grid])
    return grid, np.nan_to_num(np.array(rows, dtype=float), nan=math.inf)


def median_curve(curves: Sequence[ExcessCurve], *, band: tuple[float, float] = (0.25, 0.75)) -> MedianCurve:
    """The median excess curve of a condition's runs with a band across seeds.

    Args:
        curves: one `ExcessCurve` per run.
        band: the quantiles of the runs drawn around the median (default: the interquartile range); the lower
            one taken at or below, the upper at or above (no interpolation).

    Returns:
        A `MedianCurve` on the steps every run evaluates.

    >>> m = median_curve([ExcessCurve((10, 20), (0.05, 0.01), (0.05, 0.05)),
    ...                   ExcessCurve((10, 20), (0.04, 0.03), (0.05, 0.05))])
    >>> m.steps, [round(x, 2) for x in m.median]
    ((10, 20), [0.9, 0.4])
    """
    if not 0.0 <= band[0] <= 0.5 <= band[1] <= 1.0:
        raise ValueError(f"band must be two quantiles lo <= 0.5 <= hi in [0, 1], got {band}")
    grid, left = _grid(curves)
    return MedianCurve(tuple(grid), tuple(float(x) for x in np.median(left, axis=0)),
                       tuple(float(x) for x in np.quantile(left, band[0], axis=0, method="lower")),
                       tuple(float(x) for x in np.quantile(left, band[1], axis=0, method="higher")),
                       (float(band[0]), float(band[1])), len(curves))


@displayed
@dataclasses.dataclass(frozen=True)
class ConditionDynamics:
    """One condition over its runs: survival of the crossing at each line and the median excess curve."""

    n: int
    dwell: int
    survival: dict[float, Survival]
    curve: MedianCurve

    @property
    def escape(self) -> Survival:
        """The survival at `ESCAPE_FRACTION`."""
        return self.survival[ESCAPE_FRACTION]

    def describe(self) -> str:
        """One line per line f: the median crossing with its interval and how many runs are censored."""
        return "\n".join(f"{f:g} of the plateau excess left: median crossing {s.median().describe()}; censored "
                         f"{s.n_censored}/{s.n}" for f, s in self.survival.items())


def _same_lines(runs: Sequence[RunDynamics]) -> tuple[tuple[float, ...], int]:
    if not runs:
        raise ValueError("need at least one run")
    fractions, dwell = tuple(runs[0].crossings), runs[0].dwell
    if any(tuple(r.crossings) != fractions or r.dwell != dwell for r in runs):
        raise ValueError("runs of a condition must share their lines and dwell, got "
                         f"{sorted({(tuple(r.crossings), r.dwell) for r in runs})}")
    return fractions, dwell


def condition(runs: Sequence[RunDynamics], *, confidence: float = 0.95,
              band: tuple[float, float] = (0.25, 0.75)) -> ConditionDynamics:
    """A condition's `ConditionDynamics`: `survival` at each line its runs were measured at, `median_curve`.

    Args:
        runs: the condition's runs (one per seed), sharing lines and dwell.
        confidence: of the survival bands and the quantiles' intervals.
        band: the median curve's band (quantiles across seeds).

    Returns:
        A `ConditionDynamics`.
    """
    fractions, dwell = _same_lines(runs)
    return ConditionDynamics(
        n=len(runs), dwell=dwell,
        survival={f: survival([r.crossings[f] for r in runs], confidence=confidence) for f in fractions},
        curve=median_curve([r.curve for r in runs], band=band))


