"""Training dynamics as statistics: excess curves, crossings at several fractions, interval censoring, survival
over seeds, intervals and comparisons. The one home of "escape" and "stuck".

A model trained on a Markov chain often sits on a plateau (the stationary law for a fixed chain, the in-context
unigram estimator for random kernels; Makkuva et al., arXiv 2402.04161; Edelman et al. 2024) before it learns
the transitions. Every evaluation is *paired* (`training.evaluate_paired`): the model's loss beside the true
law's and the plateau's on the same tokens. From those rows:

- **excess curve** (`ExcessCurve`, `curve_from_metrics`): at each evaluation the fraction of the plateau's
  excess that is left, (model - true) / (plateau - true): 1 on the plateau, 0 at the true law.
- **crossing** (`crossing`, `crossings`): when that fraction falls below a line f, for each f in `FRACTIONS`
  (0.9, 0.75, 0.5, 0.25). The crossing is the first evaluation that starts `dwell` consecutive evaluations
  below f. Evaluations are discrete, so it is known only to lie in (previous evaluation, that evaluation]: a
  `StepInterval`. A run that has no such evaluation is **right-censored** after the last evaluation whose
  verdict is known (the `dwell`-th from the end): a crossing among the last `dwell - 1` evaluations cannot be
  confirmed, so the rule gets no easier near the end of the budget, and a longer budget never moves a crossing
  a shorter one saw. **Escape** is the crossing at `ESCAPE_FRACTION` (½); **stuck** means censored there.
- **survival** (`survival`): P(crossing after step t) over a condition's seeds, the nonparametric maximum
  likelihood estimate for interval-censored data (Turnbull 1976). When every run shares the evaluation grid
  (the usual case) it is the Kaplan-Meier estimate on that grid, with Greenwood's variance and a log-log band
  (the `scipy.stats.ecdf` one); medians are reported as the grid intervals they are (`Quantile`), with an
  interval only from `MIN_RUNS` runs up and an upper bound "not reached" where the band never falls to ½.
- **median excess curve** (`median_curve`) with a band across seeds, and `condition` (all of it per condition).
- **comparisons** (`compare`): two conditions at every fraction (difference and ratio of median crossings) and
  by the area between their median curves, with percentile-bootstrap intervals over seeds (explicit seed);
  the log-rank test where it is valid (a common evaluation grid).

Nothing here trains or plots: figures are in `markov_interp.report.figures`.
"""

import dataclasses
import math
from collections.abc import Mapping, Sequence
from statistics import NormalDist
from typing import Any, Optional

import numpy as np
from jaxtyping import Float

from markov_interp._display import displayed

__all__ = [
    "FRACTIONS", "ESCAPE_FRACTION", "DWELL", "MIN_RUNS", "MIN_GAP",
    "StepInterval", "ExcessCurve", "curve_from_metrics",
    "crossing", "crossings", "RunDynamics", "run_dynamics", "from_metrics", "escape_from_metrics",
    "crossings_to_json", "crossings_from_json", "recorded_escape",
    "Quantile", "Survival", "survival", "turnbull", "wilson_interval",
    "MedianCurve", "median_curve", "ConditionDynamics", "condition",
    "logrank_test", "FractionComparison", "AreaComparison", "Comparison", "compare", "compare_crossings",
]

FRACTIONS: tuple[float, ...] = (0.9, 0.75, 0.5, 0.25)  # lines: the fraction of the plateau's excess left
ESCAPE_FRACTION = 0.5  # "escape" is the crossing of this line; "stuck" is being censored at it
DWELL = 2  # evaluations in a row below a line for a crossing: one noisy evaluation is not a crossing
MIN_RUNS = 5  # fewer runs give no interval (a band from 3 runs is not a 95% interval)
MIN_GAP = 1e-3  # nats: a plateau no worse than the true law by this (p + q = 1) leaves nothing to escape from
_PAIRED = ("eval_loss", "eval_true_loss", "eval_plateau_loss")  # what `training.evaluate_paired` logs


# ------------------------------------------------------------------------------------------------ one run
@dataclasses.dataclass(frozen=True)
class StepInterval:
    """Steps (after, by]: an event seen by step `by` and not by step `after` (evaluations are discrete, so
    that is all one knows). `by` None: not seen by the end, i.e. right-censored after `after`. An exact step
    t is (t - 1, t].

    >>> str(StepInterval(170, 180)), str(StepInterval(179, 180)), str(StepInterval(490, None))
    ('(170, 180]', '180', '> 490')
    """

    after: int
    by: Optional[int]

    def __post_init__(self) -> None:
        if self.by is not None and not self.by > self.after:
            raise ValueError(f"a step interval (after, by] needs by > after, got ({self.after}, {self.by}]")

    @property
    def censored(self) -> bool:
        return self.by is None

    @property
    def escaped(self) -> bool:
        return self.by is not None

    @property
    def step(self) -> int:
        """`by`, or the censoring step `after` (what older tables called the escape step)."""
        return self.after if self.by is None else self.by

    def __str__(self) -> str:
        if self.by is None:
            return f"> {self.after}"
        return str(self.by) if self.by == self.after + 1 else f"({self.after}, {self.by}]"


@displayed(line=lambda c: f"{len(c.steps)} evaluations, steps {c.steps[0]}..{c.steps[-1]}; fraction of the plateau "
                          f"excess left at the last {c.left[-1]:.3f}")
@dataclasses.dataclass(frozen=True)
class ExcessCurve:
    """A run's paired excess losses (nats) at its evaluation `steps`: `excess[i]` = model - true law and
    `plateau_excess[i]` = plateau - true law, on the tokens of evaluation i."""

    steps: tuple[int, ...]
    excess: tuple[float, ...]
    plateau_excess: tuple[float, ...]

    def __post_init__(self) -> None:
        if not (len(self.steps) == len(self.excess) == len(self.plateau_excess)) or not self.steps:
            raise ValueError(f"steps, excess and plateau_excess must be non-empty and of one length, got "
                             f"{len(self.steps)}, {len(self.excess)}, {len(self.plateau_excess)}")
        if any(b <= a for a, b in zip(self.steps, self.steps[1:])):
            raise ValueError(f"evaluation steps must increase, got {list(self.steps)}")
        if not all(p > 0 for p in self.plateau_excess):  # also refuses nan
            raise ValueError("plateau_excess must be positive: the plateau predictor must be worse than the true "
                             f"one, got {list(self.plateau_excess)}")

    @property
    def left(self) -> tuple[float, ...]:
        """The fraction of the plateau's excess left at each evaluation (nan where the model's loss is not
        finite; such an evaluation is above every line)."""
        return tuple(e / p if math.isfinite(e) else math.nan for e, p in zip(self.excess, self.plateau_excess))


def curve_from_metrics(rows: Sequence[Mapping[str, Any]], *, min_gap: float = MIN_GAP) -> Optional[ExcessCurve]:
    """The excess curve of a run's metrics rows (those with "eval_loss", "eval_true_loss" and
    "eval_plateau_loss"). None when the run logged no paired evaluation, or when the plateau is not worse than
    the true law by `min_gap` nats at every evaluation (p + q = 1: the laws coincide, nothing to escape from).

    Args:
        rows: metrics rows (`training.load_metrics`, `TrainResult.metrics`); other rows are skipped.
        min_gap: the smallest plateau excess (nats) for which a curve is defined.

    Returns:
        The `ExcessCurve`, or None.
    """
    evals = [r for r in rows if all(k in r for k in _PAIRED)]
    if not evals:
        return None
    plateau = tuple(r["eval_plateau_loss"] - r["eval_true_loss"] for r in evals)
    if not min(plateau) >= min_gap:
        return None
    return ExcessCurve(tuple(int(r["step"]) for r in evals), tuple(r["eval_loss"] - r["eval_true_loss"] for r in evals),
                       plateau)


def _check_fraction(fraction: float) -> None:
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"a line must be a fraction of the plateau excess in (0, 1), got {fraction!r}")


def _check_dwell(dwell: int) -> None:
    if isinstance(dwell, bool) or not isinstance(dwell, int) or dwell < 1:
        raise ValueError(f"dwell must be an integer >= 1 (evaluations in a row below the line), got {dwell!r}")


def crossing(curve: ExcessCurve, fraction: float, *, dwell: int = DWELL) -> StepInterval:
    """When a run's excess curve crossed the line `fraction` (of the plateau's excess left).

    The crossing is the first evaluation i whose `dwell` evaluations i, i+1, ... all lie below the line; the
    curve was above it at evaluation i - 1, so the crossing lies in (step i-1, step i] (before the first
    evaluation the run counts as above every line from step 0). Without one the run is censored after the
    `dwell`-th evaluation from the end, the last whose verdict is known.

    Args:
        curve: the run's `ExcessCurve`.
        fraction: the line, in (0, 1).
        dwell: evaluations in a row below the line (1: the first evaluation below it).

    Returns:
        A `StepInterval`; `by` None when censored.

    >>> c = ExcessCurve((10, 20, 30, 40, 50), (0.05, 0.02, 0.04, 0.01, 0.005), (0.05,) * 5)
    >>> crossing(c, 0.5, dwell=1), crossing(c, 0.5, dwell=2)
    (StepInterval(after=10, by=20), StepInterval(after=30, by=40))
    >>> crossing(c, 0.1, dwell=2)  # below 0.1 only at the last evaluation: not confirmed
    StepInterval(after=40, by=None)
    """
    _check_fraction(fraction)
    _check_dwell(dwell)
    steps, left = curve.steps, curve.left
    run = 0
    for j, value in enumerate(left):
        run = run + 1 if value < fraction else 0  # nan compares False: above the line
        if run == dwell:
            i = j - dwell + 1
            return StepInterval(steps[i - 1] if i > 0 else min(0, steps[0] - 1), steps[i])
    known = len(steps) - dwell  # the last evaluation whose window fits in the curve
    return StepInterval(steps[known] if known >= 0 else min(0, steps[0] - 1), None)


def crossings(curve: ExcessCurve, fractions: Sequence[float] = FRACTIONS, *,
              dwell: int = DWELL) -> dict[float, StepInterval]:
    """`crossing` at each line: {fraction: StepInterval}, the one mapping of a run's crossings.

    >>> c = ExcessCurve((10, 20, 30, 40), (0.05, 0.04, 0.02, 0.0), (0.05,) * 4)
    >>> {f: str(x) for f, x in crossings(c, dwell=1).items()}
    {0.9: '(10, 20]', 0.75: '(20, 30]', 0.5: '(20, 30]', 0.25: '(30, 40]'}
    """
    return {float(f): crossing(curve, f, dwell=dwell) for f in fractions}


@displayed(line=lambda r: f"escape {r.escape} (dwell {r.dwell}); crossings "
                          + ", ".join(f"{f:g}: {x}" for f, x in r.crossings.items()))
@dataclasses.dataclass(frozen=True)
class RunDynamics:
    """One run: its excess curve and its crossing of each line (`crossings`) under one `dwell`."""

    curve: ExcessCurve
    dwell: int
    crossings: dict[float, StepInterval]

    @property
    def escape(self) -> StepInterval:
        """The crossing at `ESCAPE_FRACTION` (escaped or censored: "stuck")."""
        return self.crossings[ESCAPE_FRACTION]

    def to_json(self) -> dict:
        """The crossings as JSON (`crossings_to_json`)."""
        return crossings_to_json(self.crossings, dwell=self.dwell)


def run_dynamics(curve: ExcessCurve, *, fractions: Sequence[float] = FRACTIONS, dwell: int = DWELL) -> RunDynamics:
    """A run's `RunDynamics` from its excess curve (crossings at `fractions` under `dwell`)."""
    if ESCAPE_FRACTION not in fractions:
        raise ValueError(f"fractions must include the escape line {ESCAPE_FRACTION}, got {tuple(fractions)}")
    return RunDynamics(curve, dwell, crossings(curve, fractions, dwell=dwell))


def from_metrics(rows: Sequence[Mapping[str, Any]], *, fractions: Sequence[float] = FRACTIONS, dwell: int = DWELL,
                 min_gap: float = MIN_GAP) -> Optional[RunDynamics]:
    """`run_dynamics` of a run's metrics rows; None where `curve_from_metrics` is (no paired evaluation, or no
    plateau to escape from)."""
    curve = curve_from_metrics(rows, min_gap=min_gap)
    return None if curve is None else run_dynamics(curve, fractions=fractions, dwell=dwell)


def escape_from_metrics(rows: Sequence[Mapping[str, Any]], *, dwell: int = DWELL,
                        min_gap: float = MIN_GAP) -> Optional[StepInterval]:
    """The escape (the crossing at `ESCAPE_FRACTION`) of a run's metrics rows, or None (see `from_metrics`).

    >>> rows = [{"step": s, "eval_loss": 0.62 + d, "eval_true_loss": 0.62, "eval_plateau_loss": 0.67}
    ...         for s, d in ((10, 0.05), (20, 0.04), (30, 0.001), (40, 0.0))]
    >>> escape_from_metrics(rows)
    StepInterval(after=20, by=30)
    """
    found = from_metrics(rows, fractions=(ESCAPE_FRACTION,), dwell=dwell, min_gap=min_gap)
    return None if found is None else found.escape


def crossings_to_json(found: Mapping[float, StepInterval], *, dwell: int) -> dict:
    """{"dwell": K, "0.9": [after, by], ...} with by null when censored (a sweep table's "crossings" column).

    >>> crossings_to_json({0.5: StepInterval(20, 30), 0.25: StepInterval(40, None)}, dwell=2)
    {'dwell': 2, '0.5': [20, 30], '0.25': [40, None]}
    """
    return {"dwell": dwell, **{repr(float(f)): [x.after, x.by] for f, x in found.items()}}


def crossings_from_json(data: Mapping[str, Any]) -> tuple[dict[float, StepInterval], int]:
    """`crossings_to_json` read back: ({fraction: StepInterval}, dwell)."""
    try:
        found = {float(k): StepInterval(int(v[0]), None if v[1] is None else int(v[1]))
                 for k, v in data.items() if k != "dwell"}
        return found, int(data["dwell"])
    except (KeyError, TypeError, ValueError, IndexError) as err:
        raise ValueError(f"not a crossings record ({{'dwell': K, '0.5': [after, by], ...}}): {data!r}") from err


def recorded_escape(step: int, censored: bool, evaluations: Optional[Sequence[int]] = None) -> StepInterval:
    """An escape recorded only as one evaluation step and a censoring flag (files written before runs kept
    their crossings: the first session's results.csv, escape_times.json and interventions/long), read back.

    Such a file says the run was below the line at `step` (an evaluation) and not before it; with the run's
    `evaluations` known (`training.evaluation_steps`) that is the grid interval (the evaluation before `step`,
    `step`], without them the exact step (step - 1, step], which claims more than the file knows. A censored
    run is censored after `step`. (These escapes follow the rule of their day, not `DWELL`: a rerun is what
    moves them onto the current rule.)

    Args:
        step: the recorded escape step (its censoring step when censored).
        censored: the recorded flag.
        evaluations: the run's evaluation steps, when known.

    Returns:
        The `StepInterval`.

    >>> recorded_escape(240, False, range(20, 2001, 20)), recorded_escape(31, False)
    (StepInterval(after=220, by=240), StepInterval(after=30, by=31))
    >>> recorded_escape(2000, True, range(20, 2001, 20))
    StepInterval(after=2000, by=None)
    """
    if censored:
        return StepInterval(int(step), None)
    if evaluations is None:
        return StepInterval(int(step) - 1, int(step))
    if step not in set(evaluations):
        raise ValueError(f"a recorded escape step must be one of the run's evaluations, got {step} (evaluations "
                         f"{sorted(evaluations)[:5]}...)")
    return StepInterval(max((s for s in evaluations if s < step), default=0), int(step))


# --------------------------------------------------------------------------------------------- over seeds
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


# --------------------------------------------------------------------------------------- two conditions
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


def _draws(na: int, nb: int, n_boot: int, seed: int) -> tuple:
    """The bootstrap resamples of both conditions' runs (indices), shared by every statistic of a comparison."""
    if isinstance(n_boot, bool) or not isinstance(n_boot, int) or n_boot < 1:
        raise ValueError(f"n_boot must be a positive integer, got {n_boot!r}")
    rng = np.random.default_rng(seed)
    return rng.integers(0, na, size=(n_boot, na)), rng.integers(0, nb, size=(n_boot, nb))


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
            return np.trapezoid(mb - ma, x, axis=-1)

    value = float(area(np.median(left_a, axis=0), np.median(left_b, axis=0)))
    interval = None
    if min(len(a), len(b)) >= MIN_RUNS:
        boot = area(np.median(left_a[draws[0]], axis=1), np.median(left_b[draws[1]], axis=1))
        finite = [float(v) for v in boot if math.isfinite(v)]
        interval = _percentile(finite, len(boot) - len(finite), confidence)
    return AreaComparison((grid[0], grid[-1]), value, interval)


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
