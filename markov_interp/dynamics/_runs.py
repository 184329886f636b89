"""One run's dynamics: its excess curve, its crossings of each line as step intervals (right-censored where
not confirmed), and their JSON form (see `markov_interp.dynamics`)."""

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, Optional

from markov_interp._display import displayed
from markov_interp.config import check_int

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
    check_int("dwell (evaluations in a row below the line)", dwell, minimum=1)


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


