"""Classify every model trained by docs/circuits/train_models.py, at several training steps, and tabulate.

For each run folder <runs>/<setting>/seed<k> and each snapshot step (its checkpoints at those steps, or the final
weights), runs `probes.classify_mechanism` (probe batch `--n-sequences` (512) x the training length, seed 1; path
patching on the first `--circuit-sequences` (64) of them) and writes one JSON line per model: the label with its
qualifier, the two axes (circuit: kind, order, lags, kept edges, faithfulness, completeness, cancelling sets,
position edges; law: raw and temperature-fitted checks, the temperature, status), the graded gains with their
SEs, the kernel-swap in-context fraction, the previous-token -> induction K-edges, the spread previous-token
excess of every head, and (`--verify`) whether `discover_circuit(method="attribution+verify")` keeps the same
edges as the exact method on the same batch. `--table` turns the lines into the markdown tables of
docs/circuits.md; `--compare OLD.jsonl` counts the labels that changed against another results file (the same
models probed by an older classifier) and lists why.

    nice python docs/circuits/measure.py --runs /path/to/runs --out docs/circuits/results.jsonl --steps 186 528 1500
    python docs/circuits/measure.py --table docs/circuits/results.jsonl [--compare old.jsonl]
"""

import argparse
import json
import math
import statistics
import time
from collections import Counter, defaultdict
from pathlib import Path

import torch

from markov_interp import runs
from markov_interp.probes import classify_mechanism, discover_circuit
from markov_interp.probes.circuit import spread_previous_token_excess


def snapshot(run_dir: Path, step: int):
    """The model of `run_dir` at `step` (a checkpoint's weights, or the final model at the last step)."""
    config = runs.read_config(run_dir)
    if step == config.train.steps and (run_dir / "model.safetensors").exists():
        return runs.load_model(run_dir), config
    path = run_dir / "checkpoints" / f"step_{step:07d}.safetensors"
    if not path.exists():
        return None, config
    return runs.load_model(path), config  # probed at the training length its file (or the run's config) records


def record(run_dir: Path, step: int, args: argparse.Namespace) -> dict | None:
    model, config = snapshot(run_dir, step)
    if model is None:
        return None
    source = config.source.build()
    start = time.perf_counter()
    report = classify_mechanism(model, source, seed=1, n_sequences=args.n_sequences,
                                circuit_sequences=args.circuit_sequences, method="exact", progress=False)
    seconds = time.perf_counter() - start
    spread = spread_previous_token_excess(report.attention, config.source.order + 1)
    senders = {e.sender for e in report.induction.k_edges}
    heads = {f"L{l}H{h}": float(spread[l, h]) for l in range(spread.shape[0]) for h in range(spread.shape[1])
             if not math.isnan(float(spread[l, h]))}
    law, graph, circuit = report.law, report.graph, report.circuit
    row = {
        "setting": run_dir.parent.name, "seed": int(run_dir.name.removeprefix("seed")), "step": step,
        "source_order": config.source.order, "layers": config.model.n_layers, "heads": config.model.n_heads,
        "mechanism": report.mechanism, "order": report.order, "confident": report.confident,
        "qualifier": report.qualifier, "circuit_kind": circuit.kind, "circuit_order": circuit.order,
        "lags": list(circuit.lags), "head_lags": {h: list(v) for h, v in circuit.head_lags.items()},
        "law": law.law, "law_passed": law.passed, "law_status": law.status, "fit": law.fit_ratio,
        "margin": law.margin_ratio, "near": law.near, "temperature": law.temperature,
        "fitted_law": law.fitted.law, "fitted_passed": law.fitted.passed, "fitted_fit": law.fitted.fit_ratio,
        "fitted_margin": law.fitted.margin_ratio,
        "raw_law": law.raw.law, "raw_passed": law.raw.passed, "raw_fit": law.raw.fit_ratio,
        "raw_margin": law.raw.margin_ratio, "law_losses": dict(report.strategies.losses),
        "eval_loss": report.eval_loss,
        "gains": {str(k): [v, report.gains.se[k]] for k, v in report.gains.items()},
        "in_context_fraction": report.in_context_fraction, "swap_se": report.kernel_swap.se,
        "kept": list(graph.kept_names), "n_edges": len(graph.edges), "faithfulness": graph.faithfulness,
        "completeness": graph.completeness,
        "position_faithfulness": None if graph.position is None else graph.position.faithfulness,
        "position_kept": [e.name for e in graph.position_edges],
        "cancelling": [c.to_dict() for c in graph.cancelling], "disagreements": len(graph.disagreements),
        "induction_found": report.induction.found,
        "k_edges": {e.name: [e.effect, e.se] for e in report.induction.k_edges},
        "other_k_edges": {e.name: [e.effect, e.se] for e in report.induction.other_k_edges},
        "spread_excess": heads, "k_senders": sorted(senders), "reason": report.reasons[0],
        "n_sequences": report.n_sequences, "circuit_sequences": graph.n_sequences, "seconds": seconds,
    }
    if args.verify:
        batch = probes_batch(report, model, source, args)
        start = time.perf_counter()
        fast = discover_circuit(model, source, batch=batch, n_sequences=args.circuit_sequences, seed=1,
                                method="attribution+verify", progress=False)
        row["verify"] = {"kept": list(fast.kept_names), "agrees": set(fast.kept_names) == set(graph.kept_names),
                         "n_verified": fast.n_verified, "seconds": time.perf_counter() - start}
    return row


def probes_batch(report, model, source, args):
    """The probe batch `classify_mechanism` drew for `report` (same seed, length and size)."""
    from markov_interp.probes import sample_batch

    return sample_batch(source, n_sequences=args.n_sequences, seq_len=report.seq_len, seed=1)


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
                row = record(run_dir, step, args)
                if row is not None:
                    handle.write(json.dumps(row) + "\n")
                    handle.flush()
                    print(f"{row['setting']} seed {row['seed']} step {step}: {row['mechanism']} "
                          f"{row['order'] or ''} {row['qualifier'] or ''} "
                          f"{'' if row['confident'] else '(not confident) '}"
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
        labels = Counter(_label(r) for r in rs)
        label_text = ", ".join(f"{k} {v}" for k, v in sorted(labels.items(), key=lambda kv: -kv[1]))
        g = lambda k: [r["gains"][k][0] for r in rs if k in r["gains"]]  # noqa: E731
        faith = [r["faithfulness"] for r in rs if r["faithfulness"] is not None and math.isfinite(r["faithfulness"])]
        lines.append(f"| {setting} | {step} | {len(rs)} | {label_text} | {_interval(g('1'))} | {_interval(g('2'))} | "
                     f"{_interval([r['in_context_fraction'] for r in rs])} | {_interval(faith)} | "
                     f"{sum(r['induction_found'] for r in rs)}/{len(rs)} |")
    return "\n".join(lines)


def _labels(rs: list[dict]) -> str:
    counts = Counter(_label(r) for r in rs)
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def condensed(path: Path) -> str:
    """One row per setting: labels at step 186 and at the last step, and the last step's evidence."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    lines = []
    for setting in sorted({r["setting"] for r in rows}):
        mine = [r for r in rows if r["setting"] == setting]
        last = max(r["step"] for r in mine)
        at = {step: [r for r in mine if r["step"] == step] for step in (186, last)}
        end = at[last]
        faith = [r["faithfulness"] for r in end if math.isfinite(r["faithfulness"])]
        lines.append(f"| {setting} | {_labels(at[186])} | {last} | {_labels(end)} | "
                     f"{_interval([r['gains']['1'][0] for r in end])} | "
                     f"{_interval([r['in_context_fraction'] for r in end])} | {_interval(faith)} | "
                     f"{sum(r['induction_found'] for r in end)}/{len(end)} |")
    return "\n".join(lines)


def _quantiles(values: list[float]) -> str:
    values = sorted(v for v in values if v is not None and math.isfinite(v))
    if not values:
        return "-"
    pick = lambda q: values[min(len(values) - 1, int(q * (len(values) - 1) + 0.5))]  # noqa: E731
    return f"{pick(0):.2f} / {pick(0.1):.2f} / {pick(0.5):.2f} / {pick(0.9):.2f} / {pick(1):.2f} (n={len(values)})"


def evidence(path: Path) -> str:
    """The distributions the thresholds are read from, and a check of every label against its gains."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    lines = ["| quantity | models | min / 10% / median / 90% / max |", "|---|---|---|"]
    law = [r for r in rows if r["law_passed"]]
    between = [r for r in rows if not r["law_passed"]]
    for name, group in (("law check passed", law), ("law check failed", between)):
        lines.append(f"| fit ratio | {name} | {_quantiles([r['fit'] for r in group])} |")
        lines.append(f"| margin ratio | {name} | {_quantiles([r['margin'] for r in group])} |")
    fixed = [r for r in rows if r["setting"].startswith("fixed")]
    random_ = [r for r in rows if not r["setting"].startswith("fixed")]
    lines.append(f"| kernel-swap in-context fraction | fixed chains | "
                 f"{_quantiles([r['in_context_fraction'] for r in fixed])} |")
    lines.append(f"| kernel-swap in-context fraction | random kernels | "
                 f"{_quantiles([r['in_context_fraction'] for r in random_])} |")
    senders, others = [], []
    for r in rows:
        kedge = {e.split("->")[0] for e in [*r["k_edges"], *r["other_k_edges"]]}
        for head, value in r["spread_excess"].items():
            if int(head[1:].split("H")[0]) < r["layers"] - 1:
                (senders if head in kedge else others).append(value)
    lines.append(f"| spread previous-token excess | senders of kept K-edges | {_quantiles(senders)} |")
    lines.append(f"| spread previous-token excess | other heads below the last layer | {_quantiles(others)} |")
    lines.append(f"| faithfulness | all | {_quantiles([r['faithfulness'] for r in rows])} |")
    lines.append(f"| seconds per classify_mechanism | all | {_quantiles([r['seconds'] for r in rows])} |")
    return "\n".join(lines) + "\n\n" + _gain_check(rows)


def _state_gain(r: dict) -> float:
    """g_1 of the state-and-counts law itself (its share of the unigram -> bigram step)."""
    losses = r["law_losses"]
    unigram, bigram = losses["in_context_unigram"], losses["in_context_bigram"]
    return (unigram - losses["state_and_counts"]) / (unigram - bigram)


def _gain_check(rows: list[dict]) -> str:
    """Each label against the gains: induction of order k has g_k > 0; state_and_counts is closer to that law's
    own g_1 than to the bigram law's (1); in_context_unigram and uniform have g_1 below 1/2; kernel (fixed chains)
    has f below 1/2."""
    bad = []
    for r in rows:
        g = {int(k): v[0] for k, v in r["gains"].items()}
        mech, k = r["mechanism"], r["order"]
        ok = {"induction": lambda: g.get(k, 0) > 0, "kernel": lambda: r["in_context_fraction"] < 0.5,
              "state_and_counts": lambda: g[1] < (1 + _state_gain(r)) / 2, "in_context_unigram": lambda: g[1] < 0.5,
              "uniform": lambda: g[1] < 0.5}.get(mech, lambda: True)()
        if not ok:
            bad.append(f"{r['setting']} seed {r['seed']} step {r['step']}: {mech} {k} with g {g}")
    head = f"{len(rows) - len(bad)} of {len(rows)} labels agree with their gains"
    return head + (":\n" + "\n".join(bad) if bad else ".")


def _label(r: dict) -> str:
    """"induction1", "induction1 partial?", "state_and_counts?" (? = not confident); older rows have no qualifier."""
    qualifier = f" {r['qualifier']}" if r.get("qualifier") else ""
    return f"{r['mechanism']}{r['order'] or ''}{qualifier}{'' if r['confident'] else '?'}"


def compare(path: Path, old_path: Path) -> str:
    """How many labels of `old_path`'s models changed in `path` (same setting, seed, step), and the transitions."""
    new = {(r["setting"], r["seed"], r["step"]): r for r in map(json.loads, path.read_text().splitlines())}
    old = {(r["setting"], r["seed"], r["step"]): r for r in map(json.loads, old_path.read_text().splitlines())}
    both = sorted(set(new) & set(old))
    mech = Counter((old[k]["mechanism"], new[k]["mechanism"]) for k in both if old[k]["mechanism"] != new[k]["mechanism"])
    full = sum(_label(old[k]) != _label(new[k]) for k in both)
    lines = [f"{len(both)} models in both files; mechanism changed in {sum(mech.values())}, label (with order, "
             f"qualifier, confidence) in {full}", "", "| old mechanism | new mechanism | models |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {n} |" for (a, b), n in sorted(mech.items(), key=lambda kv: -kv[1])]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs")
    parser.add_argument("--out", default="docs/circuits/results.jsonl")
    parser.add_argument("--steps", type=int, nargs="+", default=[186, 528, 1500])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--n-sequences", type=int, default=512, help="probe batch (the SEs are over it)")
    parser.add_argument("--circuit-sequences", type=int, default=64, help="sequences path patching runs on")
    parser.add_argument("--verify", action="store_true", help="also run attribution+verify and compare kept sets")
    parser.add_argument("--table", default=None, help="print the tables of a results file and exit")
    parser.add_argument("--compare", default=None, help="with --table: count label changes against this file")
    args = parser.parse_args()
    if args.table:
        path = Path(args.table)
        print(condensed(path) + "\n\n" + table(path) + "\n\n" + evidence(path))
        if args.compare:
            print("\n" + compare(path, Path(args.compare)))
        return
    torch.set_num_threads(args.threads)
    measure(args)


if __name__ == "__main__":
    main()
