"""Fixtures written with the code of main before counter streams (commit 56ce8d7: every run on stream "torch-1",
one `torch.Generator` per member; config.json names no stream), so that tests/training/test_streams.py can check that
this code resumes such folders bit for bit. From this folder:

    mkdir /tmp/main-56ce8d7 && git archive 56ce8d7 markov_interp | tar -x -C /tmp/main-56ce8d7
    PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=/tmp/main-56ce8d7 python make_torch1_runs.py

(it refuses to run on code that knows `TrainConfig.stream`).

- old_runs/unfinished_resumed/: model.safetensors and metrics.jsonl of old_runs/unfinished (the solo loop's folder,
  a clamp's running mean in its checkpoint) resumed to the end by that code.
- old_runs/random_unfinished/: a two-layer attention-only run on fresh Dirichlet(0.5) kernels over 3 states (Gamma
  rejection rounds and the alpha < 1 boost from its generators), stack of one, checkpoints of steps 1 and 3 kept,
  metrics up to step 3: what a run killed after step 4 leaves; old_runs/random_final/: model.safetensors and
  metrics.jsonl of the same run trained without interruption.
"""

import dataclasses
import shutil
import sys
from pathlib import Path

import torch

from markov_interp import models, runs, training
from markov_interp.sources import SourceConfig

HERE = Path(__file__).parent


def random_run() -> training.RunConfig:
    train = training.TrainConfig(steps=8, batch_size=4, seq_len=8, log_every=1, eval_every=4, eval_batches=2,
                                 n_checkpoints=3, device="cpu", seed=2)
    return training.RunConfig(source=SourceConfig(kind="random", vocab=3, alpha=0.5),
                              model=models.preset("attn-only-2layer", n_ctx=8, d_vocab=3), train=train)


def keep_result(folder: Path, out: Path) -> None:
    out.mkdir(parents=True)
    for name in ("model.safetensors", "metrics.jsonl"):
        shutil.copy(folder / name, out / name)


def resumed_unfinished(old_runs: Path, tmp: Path) -> None:
    folder = tmp / "unfinished"
    shutil.copytree(old_runs / "unfinished", folder)
    training.train(runs.read_config(folder), folder, progress=False)
    keep_result(folder, old_runs / "unfinished_resumed")


def random_unfinished(old_runs: Path, tmp: Path) -> None:
    run = random_run()
    whole = tmp / "random"
    training.train(run, whole, progress=False)
    keep_result(whole, old_runs / "random_final")
    cut = old_runs / "random_unfinished"
    cut.mkdir()
    shutil.copy(whole / "config.json", cut / "config.json")
    (cut / "checkpoints").mkdir()
    for step, _ in runs.list_checkpoints(whole):
        if step <= 3:
            for path in (whole / "checkpoints").glob(f"step_{step:07d}.*"):
                shutil.copy(path, cut / "checkpoints" / path.name)
    rows = [r for r in runs.load_metrics(whole) if r["step"] <= 4]  # a kill after step 4: its row written
    runs.write_metrics(cut, rows)


if __name__ == "__main__":
    if "stream" in {f.name for f in dataclasses.fields(training.TrainConfig)}:
        sys.exit("run this with the code of main before counter streams (TrainConfig has no `stream` there)")
    torch.set_num_threads(1)
    import tempfile

    old_runs = HERE / "old_runs"
    for name in ("unfinished_resumed", "random_unfinished", "random_final"):
        shutil.rmtree(old_runs / name, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        resumed_unfinished(old_runs, Path(tmp))
        random_unfinished(old_runs, Path(tmp))
