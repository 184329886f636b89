"""Deprecated: the run folder moved to `markov_interp.runs` (issue 34), so that reading a folder (`probe`,
`report`, sweeps) does not import the training package.

Every name this module had is still here, each access warning once per use with a `DeprecationWarning` naming
its new home: `markov_interp.runs` for the folder, its lock, metrics, status and checkpoints,
`markov_interp.training.resume` for `resume_step` / `metrics_complete`, `training.schedule` for `logged_steps`.
"""

import importlib
import warnings
from typing import Any

# old name -> the module that holds it now
_HOMES = {
    **{name: "markov_interp.runs.folder" for name in (
        "RunFolderError", "RunFolderBusy", "CheckpointDamaged", "TrainingDiverged", "lock", "holder",
        "remove_stale_tmp", "mark_diverged", "divergence", "diverged_message", "read_config", "prepare",
        "check_writable_dir", "check_contents", "check_single_link", "training_seq_len", "load_model",
        "load_metrics", "write_metrics", "MetricsLog", "LOCK_FILE", "STATUS_FILE", "OWN_FILES", "REPORT_FILE",
        "foreign_entries", "CONFIG_FILE", "METRICS_FILE", "CHECKPOINT_DIR", "WEIGHTS_FILE")},
    **{name: "markov_interp.runs.checkpoints" for name in (
        "weights_problem", "list_checkpoints", "checkpoint_paths", "save_checkpoint", "read_checkpoint",
        "read_newest_checkpoint")},
    "resume_step": "markov_interp.training.resume",
    "metrics_complete": "markov_interp.training.resume",
    "logged_steps": "markov_interp.training.schedule",
}

__all__ = list(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    public = "markov_interp.runs" if home.startswith("markov_interp.runs") else home
    warnings.warn(f"markov_interp.training.runfolder.{name} is deprecated: use {public}.{name}",
                  DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module(home), name)
