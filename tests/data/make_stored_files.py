"""Files written by the code of main at 86ed974 (before the schemas of issue 33), which every later version must
still read as valid: `tests/faults/test_faults_stored.py` checks each of them against the package's stored-file schemas.

Run from the repository root with that code on the path (a worktree of 86ed974):

    git -C /work/main worktree add /tmp/main-86ed974 86ed974
    PYTHONPATH=/tmp/main-86ed974 python tests/data/make_stored_files.py

It writes tests/data/stored_86ed974/:

- sweeps/probed/: a probed sweep (binary source, tied and untied): "ok" records with probe columns, results.csv;
- sweeps/stacked/: random-kernel cells (fresh Dirichlet, a finite pool, zero diagonal) trained as stacks of two;
- sweeps/faults/: records of a failed cell, a diverged cell and a cell whose worker died on every try;
- runs/: run folders (config.json, metrics.jsonl, status.json of a diverged run, an intervention run);
- cache/references/: reference-loss cache entries (kernel expectations, in-context, pool, zero diagonal).

Weights and checkpoints are left out (their checks are the weights file's own, tested elsewhere); the records,
tables, metrics, statuses, configs and cache entries are what the schemas read.
"""
import json
import os
import shutil
import signal
import sys
from pathlib import Path

HERE = Path(__file__).parent
OUT = HERE / "stored_86ed974"

import torch  # noqa: E402

from markov_interp import sweep, training  # noqa: E402
from markov_interp.sweep import SweepSpec  # noqa: E402

TRAIN = {"steps": 6, "seq_len": 16, "batch_size": 4, "eval_every": 3, "eval_batches": 1, "n_checkpoints": 0,
         "log_every": 1}
MODEL = {"preset": "paper-1layer", "n_ctx": 16}


def spec(name: str, source: dict, **changes) -> SweepSpec:
    data = dict(name=name, base={"source": source, "model": MODEL, "train": TRAIN}, seeds=(0,), probe=False)
    data.update(changes)
    return SweepSpec(**data)


def faulty_cell(cell, runs_dir, *, probe):
    """Fails, kills its worker, or trains, as the cell's seed says."""
    if cell.params["seed"] == 1:
        raise RuntimeError("planted failure")
    if cell.params["seed"] == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    return sweep.run_cell(cell, runs_dir, probe=probe)


def strip(folder: Path) -> None:
    """Leave only what the schemas read: no weights, checkpoints or locks."""
    for path in sorted(folder.rglob("*"), reverse=True):
        if path.name in (".lock", "model.safetensors", "results.parquet") or path.suffix in (".pt", ".safetensors"):
            path.unlink()
        elif path.is_dir() and path.name == "checkpoints":
            shutil.rmtree(path)


def main() -> None:
    # set here, not at import: pytest's doctest collection imports this file, and an import-time setting sent
    # every later reference of that test process into the fixtures' cache
    os.environ["MARKOV_INTERP_CACHE"] = str(OUT / "cache")
    torch.set_num_threads(1)
    shutil.rmtree(OUT, ignore_errors=True)
    binary = {"kind": "binary", "p": 0.5, "q": 0.8}
    sweep.run(spec("probed", binary, grid={"model.tie_weights": [True, False]}, probe=True),
              OUT / "sweeps" / "probed", workers=1, progress=False)
    random = {"kind": "random", "vocab": 3, "alpha": 1.0}
    sweep.run([spec("fresh", random, seeds=(0, 1)),
               spec("pool", {**random, "pool_size": 4, "pool_seed": 2}, seeds=(0, 1)),
               spec("diagonal", {**random, "zero_diagonal": True}, seeds=(0, 1))],
              OUT / "sweeps" / "stacked", workers=1, group=2, progress=False)
    sweep.run([spec("faults", binary, seeds=(0, 1, 2)),
               spec("diverges", binary, base={"source": binary, "model": MODEL, "train": {**TRAIN, "lr": 1e9}})],
              OUT / "sweeps" / "faults", workers=2, progress=False, _cell_fn=faulty_cell)
    runs = OUT / "runs"
    base = sweep.SweepSpec(name="x", base={"source": binary, "model": MODEL, "train": TRAIN}).cells()[0].config
    training.train(base, runs / "binary", progress=False)
    training.train(base.replace(train=base.train.replace(n_checkpoints=2, interventions=(
        "blocks.0.hook_attn_out=mean@:4",))), runs / "intervention", progress=False)
    try:
        training.train(base.replace(train=base.train.replace(lr=1e9, n_checkpoints=3)), runs / "diverged",
                       progress=False)
    except training.TrainingDiverged:
        pass
    strip(OUT)


if __name__ == "__main__":
    if "--force" not in sys.argv and hasattr(sweep, "RECORD_SCHEMA"):
        sys.exit("run this with the code of main at 86ed974 (before the stored-file schemas)")
    main()
