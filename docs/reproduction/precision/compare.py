"""bf16 against fp32 on the paper's chain: do the escape-time distributions differ? (issue 29, item 4)

Before a grid trains in bf16 (about twice the model-steps per second of fp32 on a GPU, docs/speed.md), its
statistics must be those of fp32: fp16 without loss scaling was not (13/16 censored against 1/16 on a GPU,
/work/shared/gpu-findings.md). This script trains the paper's one-layer tied model on p = 0.5, q = 0.8 with
the package's defaults otherwise (paper-1layer, batch 16, AdamW, lr 2e-3 one-cycle), 16 seeds per precision,
each precision one stack (`training.train_many`, run folders under --work so an interrupted call resumes),
and compares the two conditions with `markov_interp.dynamics`: the crossing of every line (0.9, 0.75, 0.5,
0.25 of the plateau's excess left), censoring, medians with bootstrap intervals and the log-rank test.
Writes summary.md, results.json and crossings.png (`experiments.crossing_survival_figure`) to --out.

    python docs/reproduction/precision/compare.py --device cpu --seq-len 512 --steps 500   # what is committed
    python docs/reproduction/precision/compare.py --device cuda --seq-len 1024 --steps 1000 --out gpu-precision

A result on one device says nothing certain about another: CPU autocast and CUDA autocast run other kernels
(the fp16 effect of gpu-findings.md did not show on the CPU at all).
"""

import argparse
import json
import math
import platform
import time
from pathlib import Path

import torch

from markov_interp import dynamics, training
from markov_interp._io import atomic_path, atomic_write
from markov_interp.sources import SourceConfig
from markov_interp.models import preset
from markov_interp.training import RunConfig, TrainConfig

PRECISIONS = ("fp32", "bf16")


def runs_for(precision: str, args: argparse.Namespace) -> list[RunConfig]:
    """The condition's runs: one per seed, the package's defaults but for the budget and the evaluation grid."""
    base = RunConfig(
        source=SourceConfig(kind="binary", p=0.5, q=0.8),
        model=preset("paper-1layer", n_ctx=args.seq_len),
        train=TrainConfig(steps=args.steps, seq_len=args.seq_len, precision=precision, device=args.device,
                          eval_every=args.eval_every, eval_batches=args.eval_batches, log_every=args.eval_every,
                          n_checkpoints=4, compile=args.compile),
    )
    return [base.replace(train=base.train.replace(seed=s)) for s in range(args.seeds)]


def train_condition(precision: str, args: argparse.Namespace) -> tuple[list, float]:
    """Every seed of one precision as one stack (resuming what --work holds); (results, seconds)."""
    runs = runs_for(precision, args)
    outs = [Path(args.work) / precision / f"seed-{r.train.seed}" for r in runs]
    start = time.perf_counter()
    results = training.train_many(runs, outs, progress=not args.no_progress, models_out=False)
    return results, time.perf_counter() - start


def _verdict(comparison: dynamics.Comparison, signs: dict, device: str) -> str:
    """What the numbers say, and what the package's budgets do about it."""
    logrank = [c.p_value for c in comparison.fractions.values() if c.p_value is not None]
    paired = {f: s for f, s in signs.items() if s[3] < 0.05}
    if not paired and all(p >= 0.05 for p in logrank):
        found = ("No difference is detected at these seeds: the log-rank test at every line has p >= 0.05 and, paired "
                 "by seed, bf16 is not systematically later or earlier.")
    else:
        shifts = "; ".join(f"at {f:g}, {s[0]} later and {s[1]} earlier (p = {s[3]:.2g})" for f, s in paired.items())
        found = (f"Unpaired, the two distributions are not told apart (log-rank p from {min(logrank):.2g} to "
                 f"{max(logrank):.2g}); paired by seed they differ: {shifts}. bf16 shifts a seed's escape, so it is "
                 "**not shown equal** to fp32.")
    return (f"{found} On {device} only: CPU autocast is not CUDA autocast (fp16 without loss scaling changed the "
            "escapes on a GPU and not on the CPU), so this does not establish the GPU's bf16. The package's budgets "
            "train in fp32 (every registered experiment and GPU budget); a grid may use bf16 only after this comparison "
            "on its device shows no difference (`--device cuda`).")


def _shown(argv: list[str]) -> list[str]:
    """The command line without --work / --out and their values (where files went is not part of the result)."""
    out, skip = [], False
    for item in argv:
        if skip:
            skip = False
        elif item in ("--work", "--out"):
            skip = True
        elif not item.startswith(("--work=", "--out=")):
            out.append(item)
    return out


def paired_signs(a: list, b: list, fraction: float) -> tuple[int, int, int, float]:
    """Seed by seed (same seed: same initial weights and data streams in both precisions), whether b's crossing of
    `fraction` comes later, earlier or on the same evaluation as a's (a censored crossing is later than any seen);
    (later, earlier, same, two-sided sign-test p over the seeds that differ)."""
    def when(run):
        crossing = run.crossings[fraction]
        return math.inf if crossing.censored else crossing.by

    later = sum(1 for x, y in zip(a, b) if when(y) > when(x))
    earlier = sum(1 for x, y in zip(a, b) if when(y) < when(x))
    n = later + earlier
    tail = sum(math.comb(n, i) for i in range(min(later, earlier) + 1)) / 2**n if n else 1.0
    return later, earlier, len(a) - n, min(1.0, 2 * tail)


def summarise(found: dict[str, list], args: argparse.Namespace, seconds: dict[str, float]) -> tuple[str, dict, dict]:
    """(summary.md text, results.json dict, {fraction: {precision: Survival}} for the figure)."""
    runs = {name: [dynamics.from_metrics(r.metrics) for r in results] for name, results in found.items()}
    for name, rows in runs.items():
        assert all(r is not None for r in rows), f"{name}: a run without paired evaluations"
    conditions = {name: dynamics.condition(rows) for name, rows in runs.items()}
    comparison = dynamics.compare(runs["fp32"], runs["bf16"], seed=0)
    device = (torch.cuda.get_device_name() if args.device.startswith("cuda")
              else f"cpu ({platform.processor() or platform.machine()})")
    lines = [
        "# bf16 against fp32: escape times on the paper's chain",
        "",
        f"p = 0.5, q = 0.8, paper-1layer (tied), seq {args.seq_len}, batch 16, {args.steps} steps (one-cycle, lr "
        f"2e-3), {args.seeds} seeds per precision, evaluation every {args.eval_every} steps on {args.eval_batches} "
        f"fresh batches; device {device}, torch {torch.__version__}, compile {args.compile!r}, one process "
        f"(one torch thread); training took {seconds['fp32'] / 60:.1f} min (fp32) and {seconds['bf16'] / 60:.1f} "
        "min (bf16) of wall time on a shared machine.",
        "",
        "Command: `python docs/reproduction/precision/compare.py " + " ".join(_shown(args.argv)) + "`",
        "",
        "| line (fraction of the plateau excess left) | fp32: median crossing, censored | bf16: median crossing, "
        "censored | bf16 / fp32 median [95% bootstrap] | log-rank p |",
        "|---|---|---|---|---|",
    ]
    for fraction, c in comparison.fractions.items():
        a, b = conditions["fp32"].survival[fraction], conditions["bf16"].survival[fraction]
        p = "not valid" if c.p_value is None else f"{c.p_value:.2g}"
        lines.append(f"| {fraction:g} | {a.median().describe()}, {a.n_censored}/{a.n} | {b.median().describe()}, "
                     f"{b.n_censored}/{b.n} | {c.ratio_text()} | {p} |")
    lines += ["", "Paired by seed (the same seed has the same initial weights and data streams in both precisions): "
              "does bf16 cross later or earlier than fp32? Sign test over the seeds that differ.", "",
              "| line | bf16 later | bf16 earlier | same evaluation | sign-test p (two-sided) |", "|---|---|---|---|---|"]
    signs = {f: paired_signs(runs["fp32"], runs["bf16"], f) for f in comparison.fractions}
    for fraction, (later, earlier, same, p) in signs.items():
        lines.append(f"| {fraction:g} | {later} | {earlier} | {same} | {p:.2g} |")
    lines += ["", "Per seed (escape = crossing of 0.5; `> s`: censored after step s):", "",
              "| seed | fp32 escape | bf16 escape | fp32 final eval loss | bf16 final eval loss |",
              "|---|---|---|---|---|"]
    for s in range(args.seeds):
        lines.append(f"| {s} | {runs['fp32'][s].escape} | {runs['bf16'][s].escape} | "
                     f"{found['fp32'][s].final.eval_loss:.4f} | {found['bf16'][s].final.eval_loss:.4f} |")
    lines += ["", comparison.describe(("fp32", "bf16")), "", "## Reading", "", _verdict(comparison, signs, device), ""]
    record = {
        "settings": {k: v for k, v in vars(args).items() if k != "argv"}, "device": device,
        "torch": torch.__version__, "seconds": seconds,
        "conditions": {name: {"crossings": [r.to_json() for r in rows],
                              "final_eval_loss": [r.final.eval_loss for r in found[name]],
                              "censored": {str(f): s.n_censored for f, s in conditions[name].survival.items()}}
                       for name, rows in runs.items()},
        "comparison": {str(f): {"fp32_median": str(c.a.estimate), "bf16_median": str(c.b.estimate),
                                "ratio": c.ratio, "ratio_interval": c.ratio_interval,
                                "difference": c.difference, "difference_interval": c.difference_interval,
                                "logrank_chi2": c.logrank_chi2, "logrank_p": c.p_value}
                       for f, c in comparison.fractions.items()},
        "paired": {str(f): dict(zip(("bf16_later", "bf16_earlier", "same", "sign_test_p"), v))
                   for f, v in signs.items()},
    }
    return "\n".join(lines), record, {name: c.survival for name, c in conditions.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seeds", type=int, default=16)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--eval-batches", type=int, default=2)
    parser.add_argument("--compile", default="off", choices=["off", "default", "max"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--work", default="runs/precision", help="run folders (a rerun resumes them)")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent))
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args()
    import sys

    args.argv = sys.argv[1:]
    torch.set_num_threads(args.threads)
    found, seconds = {}, {}
    for precision in PRECISIONS:
        found[precision], seconds[precision] = train_condition(precision, args)
        print(f"{precision}: {seconds[precision] / 60:.1f} min", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    previous = out / "results.json"
    if all(r.already_done for results in found.values() for r in results) and previous.exists():
        seconds = json.loads(previous.read_text())["seconds"]  # loaded, not trained: the training call's times
    text, record, survival = summarise(found, args, seconds)
    atomic_write(out / "summary.md", text)
    atomic_write(out / "results.json", json.dumps(record, indent=1, default=str))
    from markov_interp.experiments import crossing_survival_figure

    fig = crossing_survival_figure(survival, budget=args.steps,
                                   title=f"p = 0.5, q = 0.8, tied, seq {args.seq_len}: fp32 against bf16")
    with atomic_path(out / "crossings.png") as tmp:
        fig.savefig(tmp, dpi=110, bbox_inches="tight", format="png")
    print(text)


if __name__ == "__main__":
    main()
