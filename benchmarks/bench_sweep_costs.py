"""What a sweep costs beyond its training: a small grid of the example spec run by `sweep.run`, against the same
cells trained by `training.train` one after another in this process (the reference), then the same sweep again
(a resume with nothing left to do) and once more after the probe settings change (probes only, training reused).

    python benchmarks/bench_sweep_costs.py [--steps 200] [--seq-len 128] [--seeds 0,1] [--workers 1]

Prints wall seconds and ratios against the reference, measured in this process; quote the load average with them.
"""

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch

from markov_interp import sweep, training
from markov_interp.sweep import SweepSpec, runner

EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "examples" / "pq-tying.toml"


def spec_for(args: argparse.Namespace, probe: bool) -> SweepSpec:
    """The example spec, cut to two grid points (p = 0.2, q = 0.5, tied and untied) at a smaller budget."""
    data = sweep.load_spec(EXAMPLE).to_dict()
    data["base"]["train"].update(steps=args.steps, seq_len=args.seq_len)
    data["base"]["model"]["n_ctx"] = args.seq_len
    data["base"]["source"].update(p=0.2, q=0.5)
    data["grid"] = {"model.tie_weights": [True, False]}
    data["exclude"] = []
    data["seeds"] = [int(s) for s in args.seeds.split(",")]
    data["probe"] = probe
    data["name"] = "bench-probe" if probe else "bench"
    return SweepSpec.from_dict(data)


def timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        cells = spec_for(args, probe=False).cells()
        # warm-up: the first run in a process pays for imports and first-call set-up; neither side should
        sweep.run(spec_for(args, True), tmp / "warm", workers=1, progress=False)
        ref, _ = timed(lambda: [training.train(c.config, tmp / "ref" / c.cell_id, progress=False) for c in cells])
        plain, done = timed(lambda: sweep.run(spec_for(args, False), tmp / "plain", workers=args.workers,
                                              progress=False))
        probed, rows = timed(lambda: sweep.run(spec_for(args, True), tmp / "probe", workers=args.workers,
                                               progress=False))
        again, rerun = timed(lambda: sweep.run(spec_for(args, True), tmp / "probe", workers=args.workers,
                                               progress=False))
        real = runner.probe_settings
        runner.probe_settings = lambda: {**real(), "probes_source": "changed"}  # as after editing the probes
        reprobe, redone = timed(lambda: sweep.run(spec_for(args, True), tmp / "probe", workers=args.workers,
                                                  progress=False))
        runner.probe_settings = real
    assert done.n_failed == rows.n_failed == 0 and rerun.n_run == 0 and redone.n_run == len(cells)
    n = len(cells)

    def per_cell(result: sweep.SweepResult) -> float:
        return sum(r.result.seconds for r in result.rows) / n

    print(f"{n} cells ({args.steps} steps, seq {args.seq_len}, one torch thread, {args.workers} worker(s)), "
          f"load average {os.getloadavg()[0]:.1f}, torch {torch.__version__}:")
    print(f"  train() one after another (reference) {ref:7.2f} s  ({ref / n:.2f} s a cell)")
    print(f"  sweep.run, probe = false              {plain:7.2f} s  ({plain / ref:.2f}x the reference; "
          f"{per_cell(done):.2f} s a cell inside)")
    print(f"  sweep.run, probed                     {probed:7.2f} s  ({probed / ref:.2f}x the reference; "
          f"{per_cell(rows):.2f} s a cell inside, training and probes)")
    print(f"  the same sweep again (resume, no-op)  {again:7.2f} s  ({again / ref:.3f}x the reference)")
    print(f"  again after the probes changed        {reprobe:7.2f} s  ({reprobe / ref:.2f}x the reference: "
          "probes only, the training reused)")


if __name__ == "__main__":
    main()
