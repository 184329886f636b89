"""Where a run resumes: the newest checkpoint or resume point whose metrics rows are all present (`resume_step`),
when a resume point is due (`resume_point_due`), and whether a run's metrics are those of a finished run
(`metrics_complete`). They compare the rows against the logged steps of the training schedule (`StepPlan`), so they
are training's; the folder itself is `markov_interp.runs`'.

A resume point (`runs.checkpoints`, resume/) is a checkpoint's files written at a cadence that does not depend on
`n_checkpoints`, so a run with few or no checkpoints resumes near where it stopped, bit-identically.
"""

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from markov_interp.models import WEIGHTS_FILE
from markov_interp.runs.config import TrainConfig
from markov_interp.runs.folder import CHECKPOINT_DIR, METRICS_FILE, RESUME_DIR, RunFolderError
from markov_interp.training.schedule import StepPlan

__all__ = ["resume_step", "metrics_complete", "resume_point_due", "RESUME_SECONDS"]

RESUME_SECONDS = 300.0  # the default cadence of resume points (`TrainConfig.resume_every=None`): 5 minutes


def _covered(rows: list[dict], train_cfg: TrainConfig, step: int) -> bool:
    """Whether the rows up to `step` are exactly the logged steps up to it, compared as a stream against the
    generated steps (`StepPlan.logged`: nothing of size O(steps) is built)."""
    expected = StepPlan.of(train_cfg).logged(step)
    for row in rows:
        got = row.get("step")
        if isinstance(got, int) and got <= step and got != next(expected, None):
            return False
    return next(expected, None) is None


def resume_step(run_dir: Path, train_cfg: TrainConfig, checkpoints: list[int], rows: list[dict], *,
                final_weights: bool = False, damaged: Optional[str] = None,
                resume_points: Sequence[int] = ()) -> Optional[int]:
    """The step a run in `run_dir` resumes from: the newest of `checkpoints` and `resume_points` whose metrics
    rows (`rows`, as read from metrics.jsonl) are all present up to it; the resumed run rewrites the rows after it
    (and the final weights) bit-identically. None when there is neither (train from step 0).

    `final_weights`: the folder holds model.safetensors although its metrics are incomplete (a folder damaged
    by an unlocked second writer); it is repaired from a checkpoint, with a warning. `damaged`: why the final
    weights of a finished folder are unusable (`weights_problem`); they are restored from the newest checkpoint
    (the last step's when there is one), with a warning. Raises `RunFolderError` with the way to recover when
    the metrics reach no checkpoint, or there is none to repair final weights from.
    """
    last = max((r["step"] for r in rows if isinstance(r.get("step"), int)), default=0)
    weights = run_dir / WEIGHTS_FILE
    candidates = sorted(set(checkpoints) | set(resume_points), reverse=True)
    if not candidates:
        if damaged is not None:
            raise RunFolderError(
                f"{weights} is damaged ({damaged}) and {run_dir} has no checkpoint to restore it from; delete "
                f"{weights} and {run_dir / METRICS_FILE} to retrain from step 0 (the same weights), or delete the folder")
        if final_weights:
            raise RunFolderError(
                f"{run_dir} has final weights but its metrics.jsonl ends at step {last} of {train_cfg.steps} and "
                f"there is no checkpoint to repair it from; delete {weights} and "
                f"{run_dir / METRICS_FILE} to retrain, or delete the folder"
            )
        return None
    for step in candidates:
        if _covered(rows, train_cfg, step):
            what = "checkpoint" if step in checkpoints else "resume point"
            if damaged is not None:
                warnings.warn(f"{weights} is damaged ({damaged}); restoring it from the {what} of step {step}",
                              stacklevel=3)
            elif final_weights or step != candidates[0]:
                warnings.warn(f"{run_dir}: metrics.jsonl ends at step {last} (incomplete); resuming from the "
                              f"{what} of step {step} to rewrite the rest", stacklevel=3)
            return step
    raise RunFolderError(
        f"{run_dir}: metrics.jsonl has rows up to step {last} but lacks rows before every checkpoint and resume "
        f"point (steps {sorted(candidates)}), so training cannot resume consistently; delete "
        f"{run_dir / CHECKPOINT_DIR}{', ' + str(run_dir / RESUME_DIR) if resume_points else ''} "
        f"and {weights} to retrain from step 0, or delete the folder"
    )


def resume_point_due(train_cfg: TrainConfig, steps_since: int, seconds_since: float) -> bool:
    """Whether a run writes a resume point at a metrics row `steps_since` steps and `seconds_since` seconds of
    training after its last save (its start, a checkpoint or a resume point): `train_cfg.resume_every` steps, or
    with None `RESUME_SECONDS` of wall time (so a run killed loses at most about that much work, and a run
    shorter than that writes none); never with 0.

    Args:
        train_cfg: the run's training config.
        steps_since: steps since the last save.
        seconds_since: seconds of training since the last save.

    Returns:
        Whether a resume point is due.

    >>> resume_point_due(TrainConfig(resume_every=50), 50, 0.0), resume_point_due(TrainConfig(), 10**6, 1.0)
    (True, False)
    """
    every = train_cfg.resume_every
    if every is None:
        return seconds_since >= RESUME_SECONDS
    return every > 0 and steps_since >= every


def metrics_complete(train_cfg: TrainConfig, rows: list[dict]) -> bool:
    """Whether `rows` hold exactly the metrics rows of a finished run (every logged step up to the last)."""
    expected = StepPlan.of(train_cfg).logged(train_cfg.steps)
    for row in rows:
        if row.get("step") != next(expected, None):
            return False
    return next(expected, None) is None
