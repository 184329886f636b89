"""The one engine on a GPU (issue 20): does a run give the same weights alone and in stacks there too, and what
do stacks give per step. One short script for a lent GPU (about 3 minutes on an H100):

    python -m pytest -q tests/test_stacked.py -k cuda && python benchmarks/gpu_engine_check.py

1. The same run (paper-1layer, p = 0.5, q = 0.8, seq 256, batch 16, 60 steps, fp32 and bf16) trained alone
   (a stack of one) and as member 3 of stacks of 8 and of 64 (other seeds): prints whether its weights and
   metrics are bit-identical, else the largest weight difference. On the CPU this is tested bit for bit
   (tests/test_engine.py); cuBLAS may pick other kernels for other batch counts, so the GPU answer is measured.
2. Seconds per step of a stack of 1, 8 and 64 (marginal, two run lengths) and the anchor loop
   (../shared/anchors/stacked_loop.py, if present) at K = 64, seq 1024, batch 16.
"""

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import torch

from markov_interp import models, training
from markov_interp.data import SourceConfig
from markov_interp.models import preset
from markov_interp.training import RunConfig, TrainConfig


def _run(seed: int, steps: int, seq_len: int, precision: str = "fp32") -> RunConfig:
    return RunConfig(source=SourceConfig(kind="binary", p=0.5, q=0.8), model=preset("paper-1layer", n_ctx=seq_len),
                     train=TrainConfig(steps=steps, seq_len=seq_len, batch_size=16, eval_every=0, n_checkpoints=0,
                                       device="cuda", seed=seed, precision=precision))


def invariance(precision: str) -> None:
    run = _run(0, 60, 256, precision)
    alone = training.train_many([run], progress=False)[0]
    weights = models.state_dict_for_save(alone.model)
    for k in (8, 64):
        runs = [dataclasses.replace(run, train=dataclasses.replace(run.train, seed=s)) for s in range(100, 100 + k)]
        runs[3] = run
        member = training.train_many(runs, progress=False)[3]
        theirs = models.state_dict_for_save(member.model)
        diff = max((weights[n] - theirs[n]).abs().max().item() for n in weights)
        same = diff == 0 and alone.metrics == member.metrics
        print(f"{precision}: alone vs member of a stack of {k}: {'bit-identical' if same else f'max |dw| {diff:.3g}'}")


def per_step(k: int, seq_len: int, short: int = 10, long: int = 40) -> float:
    runs = [_run(s, long, seq_len) for s in range(k)]

    def timed(steps: int) -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        training.train_many([dataclasses.replace(r, train=dataclasses.replace(r.train, steps=steps)) for r in runs],
                            progress=False, models_out=False)
        torch.cuda.synchronize()
        return time.perf_counter() - start

    timed(3)
    return (timed(long) - timed(short)) / (long - short)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--anchor-dir", default=str(Path(__file__).resolve().parents[2] / "shared" / "anchors"))
    args = parser.parse_args()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    for precision in ("fp32", "bf16"):
        invariance(precision)
    for k in (1, 8, 64):
        seconds = per_step(k, 1024)
        print(f"stack of {k:2d}, seq 1024, batch 16: {seconds * 1e3:7.2f} ms/step  {k / seconds:8.1f} model-steps/s")
    if (Path(args.anchor_dir) / "stacked_loop.py").exists():
        sys.path.insert(0, args.anchor_dir)
        from stacked_loop import time_stacked

        seconds = time_stacked(64, steps=30, seq_len=1024, batch=16, device="cuda")
        print(f"anchor K=64, seq 1024, batch 16: {seconds * 1e3:7.2f} ms/step  {64 / seconds:8.1f} model-steps/s")


if __name__ == "__main__":
    main()
