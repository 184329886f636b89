"""Runs: what a run is (`RunConfig` = source + model + `TrainConfig`) and its folder, read and written.

Read left to right, each module importing only those before it:

- `config`: `TrainConfig`, `RunConfig`, dotted options (`split_key`, `build_run`, `default_run`, `override_run`);
- `folder`: the run folder's layout (config.json, metrics.jsonl, model.safetensors, status.json, the lock), its
  safety checks, the divergence record, reading its config, metrics and model (`load_model`);
- `checkpoints`: checkpoints/step_NNNNNNN.{safetensors,pt}, written, listed and read back checked (and the resume
  point's, the same files in resume/, which only training reads).

`probe`, `report`, sweeps and training all read and write run folders here; nothing here imports `training`
(which checkpoint a run resumes from needs the schedule: `training.resume`).
"""

from markov_interp.runs import checkpoints, config, folder  # noqa: F401  (submodules by name)
from markov_interp.runs.checkpoints import *  # noqa: F403
from markov_interp.runs.checkpoints import __all__ as _checkpoints_all
from markov_interp.runs.config import *  # noqa: F403
from markov_interp.runs.config import __all__ as _config_all
from markov_interp.runs.folder import *  # noqa: F403
from markov_interp.runs.folder import __all__ as _folder_all

__all__ = [*_config_all, *_folder_all, *_checkpoints_all]
