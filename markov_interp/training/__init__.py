"""Training: the paper's recipe on fresh Markov batches, one engine for one run and for many, reproducibly.

Read left to right, each module importing only those before it:

- `schedule`: the learning-rate schedule, evaluation, logging and checkpoint steps (`StepPlan`, by arithmetic);
- `plan`: the plan check, refusing runs that cannot fit (memory, disk, open files) before anything is written;
- `resume`: which checkpoint or resume point a run folder resumes from, and when a resume point is due (the folder
  itself, its lock, metrics and checkpoints: `markov_interp.runs`);
- `results`: `TrainResult` and its typed `FinalLosses`;
- `batches`: a run's data streams (`derive_seed`, `member_sampler`);
- `loop`: `train_many(runs)` (one stack) and `train(run)` (a stack of one), evaluation.

`from markov_interp.training import train, train_many, RunConfig, TrainConfig, default_run` is the public face (the
configs re-exported from their home, `markov_interp.runs.config`, which reads a run folder without this package).
"""

from markov_interp.runs import (
    CHECKPOINT_DIR,
    CONFIG_FILE,
    METRICS_FILE,
    RunFolderBusy,
    RunFolderError,
    TrainingDiverged,
    list_checkpoints,
    load_metrics,
)
from markov_interp.runs.config import (
    RunConfig,
    TrainConfig,
    build_run,
    default_run,
    override_run,
    resolve_device,
    run_options,
    split_key,
)
from markov_interp.training import batches, loop, plan, results, resume, schedule  # noqa: F401
from markov_interp.training.loop import (
    PAIRED_KEYS,
    check_compatible,
    evaluate,
    evaluate_paired,
    paired_row,
    stack_key,
    train,
    train_many,
)
from markov_interp.training.plan import PlanTooLarge
from markov_interp.training.results import FinalLosses, TrainResult
from markov_interp.training.schedule import checkpoint_steps, evaluation_steps, lr_at, one_cycle_lr

__all__ = [
    "TrainConfig",
    "RunConfig",
    "TrainResult",
    "FinalLosses",
    "default_run",
    "build_run",
    "override_run",
    "split_key",
    "run_options",
    "train",
    "train_many",
    "check_compatible",
    "stack_key",
    "TrainingDiverged",
    "PlanTooLarge",
    "RunFolderBusy",
    "RunFolderError",
    "one_cycle_lr",
    "lr_at",
    "checkpoint_steps",
    "evaluation_steps",
    "evaluate",
    "evaluate_paired",
    "paired_row",
    "PAIRED_KEYS",
    "resolve_device",
    "load_metrics",
    "list_checkpoints",
    "CONFIG_FILE",
    "METRICS_FILE",
    "CHECKPOINT_DIR",
]
