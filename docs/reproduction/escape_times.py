"""Escape times over seeds for the paper's one-layer chain (p = 0.5, q = 0.8, tied), by precision and depth.

Each condition is one stack of seeds (`training.train_many`); each run logs paired evaluations (the model's
loss beside the true kernel's and the stationary law's on the same tokens) and `dynamics` turns them into
escapes, censored at the budget, summarised with a median (a grid interval, with its 95% interval) and a Wilson
interval for the fraction still on the plateau. Writes escape_times.json (every seed) and prints a markdown table.

    python docs/reproduction/escape_times.py --device cuda --seeds 16 --steps 2000 --out escape
    python docs/reproduction/escape_times.py --device cpu --seeds 4 --steps 60 --seq-len 64 --out /tmp/e  # smoke
    python docs/reproduction/escape_times.py --plot docs/reproduction/gpu/escape_times.json  # -> survival.png
"""

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch

from markov_interp import dynamics, training
from markov_interp.sources import SourceConfig
from markov_interp.models import preset
from markov_interp.training import RunConfig, TrainConfig

CONDITIONS = {  # name: (n_layers, precision, loss_scaling)
    "fp32": (1, "fp32", False),
    "fp16": (1, "fp16", False),  # autocast without loss scaling, as the reference code ran
    "fp16+scaling": (1, "fp16", True),
    "bf16": (1, "bf16", False),
    "2-layers": (2, "fp32", False),
    "4-layers": (4, "fp32", False),
    "8-layers": (8, "fp32", False),
}


def runs_for(name: str, args: argparse.Namespace) -> list[RunConfig]:
    layers, precision, scaling = CONDITIONS[name]
    base = RunConfig(
        source=SourceConfig(kind="binary", p=0.5, q=0.8),
        model=preset("paper-1layer", n_layers=layers, n_ctx=args.seq_len),
        train=TrainConfig(steps=args.steps, seq_len=args.seq_len, batch_size=16, precision=precision,
                          loss_scaling=scaling, device=args.device, eval_every=args.eval_every, eval_batches=2,
                          n_checkpoints=0, log_every=args.eval_every),
    )
    return [dataclasses.replace(base, train=dataclasses.replace(base.train, seed=s)) for s in range(args.seeds)]


def plot(path: Path) -> Path:
    """The Kaplan-Meier curves of a collected escape_times.json ({"conditions": {"name @ budget": ...}}),
    one panel per budget, as survival.png beside it."""
    from markov_interp.experiments import escape_survival_figure

    record = json.loads(path.read_text())
    every = record.get("settings", {}).get("eval_every", 20)  # the first file (no settings) says "eval every 20"
    panels: dict = {}
    for key, data in record["conditions"].items():
        name, _, budget = key.rpartition(" @ ")
        # this file holds escape steps only: each read as the grid interval (previous evaluation, step]
        grid = range(every, int(budget) + 1, every)
        escapes = [dynamics.recorded_escape(s, c, grid) for s, c in zip(data["escape_steps"], data["censored"])
                   if s is not None]
        panels.setdefault(int(budget), {})[name] = dynamics.survival(escapes)
    titles = {b: f"p = 0.5, q = 0.8, tied: budget {b} steps" for b in panels}
    fig = escape_survival_figure({titles[b]: panels[b] for b in sorted(panels, reverse=True)},
                                 budget={titles[b]: b for b in panels})
    out = path.with_name("survival.png")
    fig.savefig(out, dpi=110, bbox_inches="tight")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--seeds", type=int, default=16)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--eval-every", type=int, default=20)
    parser.add_argument("--conditions", default=",".join(CONDITIONS), help="comma-separated condition names")
    parser.add_argument("--out", default="escape")
    parser.add_argument("--plot", default=None, metavar="JSON", help="draw survival.png from a collected JSON")
    args = parser.parse_args()
    if args.plot:
        print(plot(Path(args.plot)))
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
    print(f"p = 0.5, q = 0.8, tied, seq {args.seq_len}, batch 16, {args.steps} steps (one-cycle), "
          f"{args.seeds} seeds per condition, eval every {args.eval_every} steps; device {device}, "
          f"torch {torch.__version__}\n")
    print("| condition | escaped | median escape [95% CI] | censored at budget [95% CI] | seconds |")
    print("|---|---|---|---|---|")
    record = {"settings": vars(args), "device": device, "conditions": {}}
    for name in args.conditions.split(","):
        start = time.perf_counter()
        results = training.train_many(runs_for(name, args), progress=False)
        seconds = time.perf_counter() - start
        escapes = [dynamics.escape_from_metrics(r.metrics) for r in results]
        s = dynamics.survival([e for e in escapes if e is not None])
        lo, hi = dynamics.wilson_interval(s.n_censored, s.n)
        print(f"| {name} | {s.n - s.n_censored}/{s.n} | {s.median().describe()} | {s.n_censored}/{s.n} "
              f"[{lo:.2f}, {hi:.2f}] | {seconds:.0f} |", flush=True)
        record["conditions"][name] = {
            "escape_steps": [e.step if e else None for e in escapes],
            "censored": [e.censored if e else None for e in escapes],
            "final_eval_loss": [r.final.eval_loss for r in results],
            "failed": [r.failed for r in results], "seconds": seconds}
        (out / "escape_times.json").write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
