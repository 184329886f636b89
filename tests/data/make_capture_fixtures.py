"""Fixtures written with the code of main before the optimiser kept its step counts on the device (commit e66b11a):
from this folder, `PYTHONPATH=/path/to/main-e66b11a python make_capture_fixtures.py` (it refuses to run on code
that has `TrainConfig.capture`).

- old_runs/before_capture/counter-adamw/: a finished run folder (AdamW, stream "counter-1", 12 steps, checkpoints);
- old_runs/before_capture/torch1-sgd/: the same with SGD, momentum and clipping on stream "torch-1".

tests/training/test_step.py resumes each from an intermediate checkpoint with this code and expects the same
final weights and metrics byte for byte.
"""
import dataclasses
import shutil
from pathlib import Path

from markov_interp import training
from markov_interp.models import preset
from markov_interp.sources import SourceConfig

HERE = Path(__file__).parent
RECIPES = {"counter-adamw": dict(), "torch1-sgd": dict(stream="torch-1", optimizer="sgd", momentum=0.9, grad_clip=0.5)}


def run_config(name: str) -> training.RunConfig:
    train = training.TrainConfig(steps=12, batch_size=4, seq_len=16, log_every=2, eval_every=4, eval_batches=1,
                                 n_checkpoints=3, device="cpu", seed=3, **RECIPES[name])
    return training.RunConfig(source=SourceConfig(kind="binary", p=0.5, q=0.8),
                              model=preset("paper-1layer", n_ctx=16), train=train)


if __name__ == "__main__":
    if any(f.name == "capture" for f in dataclasses.fields(training.TrainConfig)):
        raise SystemExit("run this with the code before device step counts (commit e66b11a)")
    for name in RECIPES:
        out = HERE / "old_runs" / "before_capture" / name
        shutil.rmtree(out, ignore_errors=True)
        training.train(run_config(name), out, progress=False)
