"""Classify every model trained by docs/circuits/train_models.py, at several training steps, and tabulate.

For each run folder <runs>/<setting>/seed<k> and each snapshot step (its checkpoints at those steps, or the final
weights), runs `probes.classify_mechanism` (probe batch 64 x the training length, seed 1; path patching on 16 of
those sequences) and writes one JSON line per model: the label, the law check, the graded gains with their SEs,
the kernel-swap in-context fraction, the kept edges, faithfulness, the previous-token -> induction K-edges and the
spread previous-token excess of every head. `--table` turns the lines into the markdown tables of
docs/circuits.md.

    nice python docs/circuits/measure.py --runs /path/to/runs --out docs/circuits/results.jsonl --steps 186 528 1500
    python docs/circuits/measure.py --table docs/circuits/results.jsonl
"""

import argparse
import json
import math
import statistics
import time
from collections import Counter, defaultdict
from pathlib import Path

import torch

from markov_interp import models, runfolder
from markov_interp.probes import classify_mechanism, spread_previous_token_excess


def snapshot(run_dir: Path, step: int):
    """The model of `run_dir` at `step` (a checkpoint's weights, or the final model at the last step)."""
    config = runfolder.read_config(run_dir)
    if step == config.train.steps and (run_dir / "model.safetensors").exists():
        return models.load(run_dir), config
    path = run_dir / "checkpoints" / f"step_{step:07d}.safetensors"
    if not path.exists():
        return None, config
    model = models.load(path)
    model.markov_train_seq_len = config.train.seq_len
    return model, config


def record(run_dir: Path, step: int) -> dict | None:
    model, config = snapshot(run_dir, step)
    if model is None:
        return None
    start = time.perf_counter()
    report = classify_mechanism(model, config.source.build(), seed=1)
    spread = spread_previous_token_excess(report.attention, config.source.order + 1)
    senders = {e.sender for e in report.induction.k_edges}
    heads = {f"L{l}H{h}": float(spread[l, h]) for l in range(spread.shape[0]) for h in range(spread.shape[1])
             if not math.isnan(float(spread[l, h]))}
    return {
        "setting": run_dir.parent.name, "seed": int(run_dir.name.removeprefix("seed")), "step": step,
        "source_order": config.source.order, "layers": config.model.n_layers, "heads": config.model.n_heads,
        "mechanism": report.mechanism, "order": report.order, "confident": report.confident,
        "law": report.law.law, "law_passed": report.law.passed, "fit": report.law.fit_ratio,
        "margin": report.law.margin_ratio, "eval_loss": report.eval_loss,
        "gains": {str(k): [v, report.gains.se[k]] for k, v in report.gains.items()},
        "in_context_fraction": report.in_context_fraction, "swap_se": report.kernel_swap.se,
        "kept": list(report.circuit.kept_names), "n_edges": len(report.circuit.edges),
        "faithfulness": report.circuit.faithfulness, "disagreements": len(report.circuit.disagreements),
        "induction_found": report.induction.found,
        "k_edges": {e.name: e.effect for e in report.induction.k_edges},
        "other_k_edges": {e.name: e.effect for e in report.induction.other_k_edges},
        "spread_excess": heads, "k_senders": sorted(senders), "reason": report.reasons[0],
        "seconds": time.perf_counter() - start,
    }


def measure(args: argparse.Namespace) -> None:
    out = Path(args.out)
    done = set()
    if out.exists():
        done = {(r["setting"], r["seed"], r["step"]) for r in map(json.loads, out.read_text().splitlines())}
    runs = sorted(p.parent for p in Path(args.runs).glob("*/seed*/config.json"))
    with out.open("a") as handle:
        for run_dir in runs:
            for step in args.steps:
                if (run_dir.parent.name, int(run_dir.name.removeprefix("seed")), step) in done:
                    continue
                row = record(run_dir, step)
                if row is not None:
                    handle.write(json.dumps(row) + "\n")
                    handle.flush()
                    print(f"{row['setting']} seed {row['seed']} step {step}: {row['mechanism']} "
                          f"{row['order'] or ''} {'' if row['confident'] else '(not confident) '}"
                          f"g_1 {row['gains']['1'][0]:.2f} f {row['in_context_fraction']:.2f} "
                          f"{row['seconds']:.0f} s", flush=True)


def _interval(values: list[float]) -> str:
    """median [min, max]."""
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} [{min(values):.2f}, {max(values):.2f}]"


def table(path: Path) -> str:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    groups = defaultdict(list)
    for r in rows:
        groups[r["setting"], r["step"]].append(r)
    lines = ["| setting | step | n | labels | g_1 median [min, max] | g_2 | in-context fraction | faithfulness | "
             "K-edge found |", "|---|---|---|---|---|---|---|---|---|"]
    for (setting, step), rs in sorted(groups.items()):
        labels = Counter(f"{r['mechanism']}{r['order'] or ''}{'' if r['confident'] else '?'}" for r in rs)
        label_text = ", ".join(f"{k} {v}" for k, v in sorted(labels.items(), key=lambda kv: -kv[1]))
        g = lambda k: [r["gains"][k][0] for r in rs if k in r["gains"]]  # noqa: E731
        faith = [r["faithfulness"] for r in rs if r["faithfulness"] is not None and math.isfinite(r["faithfulness"])]
        lines.append(f"| {setting} | {step} | {len(rs)} | {label_text} | {_interval(g('1'))} | {_interval(g('2'))} | "
                     f"{_interval([r['in_context_fraction'] for r in rs])} | {_interval(faith)} | "
                     f"{sum(r['induction_found'] for r in rs)}/{len(rs)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs")
    parser.add_argument("--out", default="docs/circuits/results.jsonl")
    parser.add_argument("--steps", type=int, nargs="+", default=[186, 528, 1500])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--table", default=None, help="print the tables of a results file and exit")
    args = parser.parse_args()
    if args.table:
        print(table(Path(args.table)))
        return
    torch.set_num_threads(args.threads)
    measure(args)


if __name__ == "__main__":
    main()
