"""Where a run resumes: the newest checkpoint whose metrics rows are all present (`resume_step`), and whether a
run's metrics are those of a finished run (`metrics_complete`). Both compare the rows against the logged steps
of the training schedule (`StepPlan`), so they are training's; the folder itself is `markov_interp.runs`'.
"""

import warnings
from pathlib import Path
from typing import Optional

from markov_interp.models import WEIGHTS_FILE
from markov_interp.runs.config import TrainConfig
from markov_interp.runs.folder import CHECKPOINT_DIR, METRICS_FILE, RunFolderError
from markov_interp.training.schedule import StepPlan

__all__ = ["resume_step", "metrics_complete"]

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
                final_weights: bool = False, damaged: Optional[str] = None) -> Optional[int]:
    """The checkpoint step a run in `run_dir` resumes from: the newest of `checkpoints` whose metrics rows
    (`rows`, as read from metrics.jsonl) are all present up to it; the resumed run rewrites the rows after it
    (and the final weights) bit-identically. None when there are no checkpoints (train from step 0).

    `final_weights`: the folder holds model.safetensors although its metrics are incomplete (a folder damaged
    by an unlocked second writer); it is repaired from a checkpoint, with a warning. `damaged`: why the final
    weights of a finished folder are unusable (`weights_problem`); they are restored from the newest checkpoint
    (the last step's when there is one), with a warning. Raises `RunFolderError` with the way to recover when
    the metrics reach no checkpoint, or there is none to repair final weights from.
    """
    last = max((r["step"] for r in rows if isinstance(r.get("step"), int)), default=0)
    weights = run_dir / WEIGHTS_FILE
    if not checkpoints:
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
    newest = max(checkpoints)
    for step in sorted(checkpoints, reverse=True):
        if _covered(rows, train_cfg, step):
            if damaged is not None:
                warnings.warn(f"{weights} is damaged ({damaged}); restoring it from the checkpoint of step {step}",
                              stacklevel=3)
            elif final_weights or step != newest:
                warnings.warn(f"{run_dir}: metrics.jsonl ends at step {last} (incomplete); resuming from the "
                              f"checkpoint of step {step} to rewrite the rest", stacklevel=3)
            return step
    raise RunFolderError(
        f"{run_dir}: metrics.jsonl has rows up to step {last} but lacks rows before every checkpoint "
        f"(steps {sorted(checkpoints)}), so training cannot resume consistently; delete {run_dir / CHECKPOINT_DIR} "
        f"and {weights} to retrain from step 0, or delete the folder"
    )


def metrics_complete(train_cfg: TrainConfig, rows: list[dict]) -> bool:
    """Whether `rows` hold exactly the metrics rows of a finished run (every logged step up to the last)."""
    expected = StepPlan.of(train_cfg).logged(train_cfg.steps)
    for row in rows:
        if row.get("step") != next(expected, None):
            return False
    return next(expected, None) is None
