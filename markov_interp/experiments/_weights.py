"""The final weights of an experiment's runs, kept beside its results.json, so that the experiment can measure and
classify them again without training (`--remeasure`): its verdicts then follow the probes as they improve.

A run keeps two files, its `model.safetensors` and its `config.json` (a few kB for the models here), in
out/weights/NAME/, NAME the experiment's own name for the run; `runs.load_model` reads such a folder as it reads a
run folder.
"""

import shutil
from pathlib import Path

from markov_interp._io import atomic_path

__all__ = ["WEIGHTS_DIR", "KEPT_FILES", "keep", "kept"]

WEIGHTS_DIR = "weights"
KEPT_FILES = ("model.safetensors", "config.json")  # `models.WEIGHTS_FILE`, `runs.CONFIG_FILE`


def keep(run_dir: Path, out: Path, name: str) -> Path:
    """Copy the final weights and config of the finished run in `run_dir` to out/weights/`name` (each file
    written atomically; a file already there with the same bytes is left alone).

    Args:
        run_dir: a finished run folder.
        out: the experiment's folder (where its results.json goes).
        name: the run's name there.

    Returns:
        The folder of kept weights.
    """
    folder = Path(out) / WEIGHTS_DIR / name
    folder.mkdir(parents=True, exist_ok=True)
    for file in KEPT_FILES:
        source, target = Path(run_dir) / file, folder / file
        if target.exists() and target.read_bytes() == source.read_bytes():
            continue
        with atomic_path(target) as tmp:
            shutil.copyfile(source, tmp)
    return folder


def kept(out: Path, name: str) -> Path:
    """The folder of kept weights out/weights/`name`; FileNotFoundError naming it when a file is missing."""
    folder = Path(out) / WEIGHTS_DIR / name
    missing = [f for f in KEPT_FILES if not (folder / f).is_file()]
    if missing:
        raise FileNotFoundError(f"{folder}: no {' or '.join(missing)}: the run's weights were not kept beside "
                                "results.json, so it cannot be measured again without training")
    return folder
