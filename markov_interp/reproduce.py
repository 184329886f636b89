"""The paper's headline findings, reproduced: five sweeps, one results table, a summary and phase diagrams.

Makkuva et al. ("Attention with Markov", arXiv 2402.04161) and the follow-up ("Local to Global", arXiv
2406.03072) claim, for transformers trained on first-order Markov chains:

1. one layer, **tied** embeddings, binary chain (p, q): for p + q > 1 training gets stuck at the unigram loss
   H(pi) (a bad local minimum of the landscape), for p + q < 1 it reaches the entropy rate;
2. the same **untied**: no bad local minimum, every cell reaches the entropy rate;
3. **depth** at p = 0.5, q = 0.8: one layer stays on the unigram plateau, two and four layers leave it;
4. the **random-kernel** (in-context) task: two layers form a previous-token + induction-head circuit, one
   layer cannot;
5. **initialisation and precision** decide the plateau: a canonical init with w0 < -1/sqrt(2) starts in the
   global basin, small inits with p + q > 1 in the unigram one, and fp16 autocast without loss scaling
   (what the reference code ran) keeps runs stuck that fp32 lets escape.

`reproduce(out_dir, quick=...)` runs these as `sweep` specs (restartable: a rerun only trains what is
missing), then writes `results.csv` (every cell), `summary.csv` / `summary.md` (per experiment: fraction of
seeds stuck, losses, the landscape's prediction, mechanism counts) and the figures `phase_pq.png`,
`depth.png`, `mechanisms.png`, `init_precision.png` and `survival.png` (Kaplan-Meier curves of the escape step)
into `out_dir`. The theory column is
`landscape.predict_outcome` for the canonical reduced model: "unigram" or "bigram" (= reaches the entropy
rate); for the standard (small Gaussian) init it is evaluated at a small init e0 = w0 = 0.05, where the
prediction does not depend on the sign of w0.
"""

import dataclasses
import json
import math
import os
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from markov_interp._io import atomic_path, atomic_write
from markov_interp import dynamics, sweep
from markov_interp.sweep import Row, SweepResult, SweepSpec
from markov_interp.training import RunConfig

__all__ = ["Budget", "QUICK", "FULL", "experiment_specs", "reproduce", "summarise", "THEORY_SMALL_INIT"]

THEORY_SMALL_INIT = 0.05  # (e0, w0) at which the landscape's prediction stands for the standard init
_PQ = 0.5, 0.8  # the paper's depth / precision chain


@dataclasses.dataclass(frozen=True, kw_only=True)
class Budget:
    """How much compute the reproduction spends; `cuts` says what differs from the paper's setup."""

    name: str
    seq_len: int  # training sequence length (the paper: 1024 for the (p, q) grid, 512 for depth)
    grid_values: tuple  # values of p and of q (cells with p + q = 1 are left out: both solutions coincide)
    grid_seeds: int
    grid_steps: int
    depth_layers: tuple
    depth_seeds: int
    depth_steps: int
    random_seeds: int
    random_steps: int
    random_lr: float  # the random-kernel task's learning rate, constant (the paper's 2e-3 forms the circuit slowly)
    random_vocab: int = 3  # states of the random-kernel task
    random_seq_len: int = 32  # short sequences, big batches: the circuit forms in a few hundred steps on a CPU
    random_batch: int = 64
    init_seeds: int
    init_steps: int
    eval_batches: int = 8
    cuts: str = ""


QUICK = Budget(
    name="quick",
    seq_len=128,
    grid_values=(0.1, 0.3, 0.5, 0.7, 0.9),
    grid_seeds=2,
    grid_steps=250,
    depth_layers=(1, 2, 4),
    depth_seeds=3,
    depth_steps=300,
    random_seeds=3,
    random_steps=600,
    random_lr=1e-2,
    init_seeds=3,
    init_steps=250,
    cuts="sequences of 128 states instead of 512-1024; 250-300 optimiser steps instead of 400-1000; 2-3 seeds "
    "per cell instead of 5-8; a 5 x 5 (p, q) grid (0.1 ... 0.9); depths 1, 2, 4 (no 8); the random-kernel task "
    "on 3 states with sequences of 32, batch 64, 600 steps at a constant lr 1e-2; evaluation on 8 fresh batches "
    "of 16",
)

FULL = Budget(
    name="full",
    seq_len=512,
    grid_values=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9),
    grid_seeds=4,
    grid_steps=500,
    depth_layers=(1, 2, 4, 8),
    depth_seeds=8,
    depth_steps=500,
    random_seeds=6,
    random_steps=2000,
    random_lr=1e-2,
    random_seq_len=64,
    init_seeds=8,
    init_steps=500,
    cuts="sequences of 512 states instead of 1024 for the (p, q) grid; 4 seeds per (p, q) cell; the "
    "random-kernel task on 3 states, sequences of 64, batch 64, constant lr 1e-2",
)


def _train_base(budget: Budget, steps: int) -> dict:
    # paired evaluations at a cadence of 1/20 of the budget plus 8 log-spaced early ones: escape times to 5%
    return {"steps": steps, "seq_len": budget.seq_len, "eval_every": max(steps // 20, 1), "eval_log_points": 8,
            "eval_batches": budget.eval_batches, "n_checkpoints": 0, "log_every": 10}


def experiment_specs(budget: Budget) -> list[SweepSpec]:
    """The five sweeps of the reproduction at `budget` (names: pq-tied, pq-untied, depth, random, init-precision)."""
    values = list(budget.grid_values)
    iid = [{"source.p": p, "source.q": q} for p in values for q in values if abs(p + q - 1) < 1e-9]
    model = {"preset": "paper-1layer", "n_ctx": budget.seq_len}
    binary = {"kind": "binary", "p": _PQ[0], "q": _PQ[1]}
    grid_train = _train_base(budget, budget.grid_steps)
    return [
        SweepSpec(name="pq-tied", base={"source": {"kind": "binary", "p": 0.5, "q": 0.5}, "model": model,
                                        "train": grid_train},
                  grid={"source.p": values, "source.q": values}, exclude=iid, seeds=_seeds(budget.grid_seeds)),
        SweepSpec(name="pq-untied", base={"source": {"kind": "binary", "p": 0.5, "q": 0.5},
                                          "model": {**model, "tie_weights": False}, "train": grid_train},
                  grid={"source.p": values, "source.q": values}, exclude=iid, seeds=_seeds(budget.grid_seeds)),
        SweepSpec(name="depth", base={"source": binary, "model": model,
                                      "train": _train_base(budget, budget.depth_steps)},
                  grid={"model.n_layers": list(budget.depth_layers)}, seeds=_seeds(budget.depth_seeds)),
        SweepSpec(name="random", base={"source": {"kind": "random", "vocab": budget.random_vocab, "alpha": 1.0},
                                       "model": {"preset": "attn-only-2layer", "n_ctx": budget.random_seq_len},
                                       "train": {**_train_base(budget, budget.random_steps),
                                                 "seq_len": budget.random_seq_len,
                                                 "batch_size": budget.random_batch,
                                                 "lr": budget.random_lr, "schedule": "constant"}},
                  grid={"model.n_layers": [1, 2]}, seeds=_seeds(budget.random_seeds)),
        SweepSpec(name="init-precision", base={"source": binary, "model": model,
                                               "train": _train_base(budget, budget.init_steps)},
                  grid={"model.init": ["standard", "canonical"], "model.canonical_w": [0.1, -1.0],
                        "train.precision": ["fp32", "fp16"]},
                  exclude=[{"model.init": "standard", "model.canonical_w": -1.0}], seeds=_seeds(budget.init_seeds)),
    ]


def _seeds(n: int) -> list[int]:
    return list(range(n))


# ----------------------------------------------------------------------------------------------- theory
def _theory(row: Row) -> Optional[str]:
    """The canonical model's predicted outcome for a one-layer binary-chain cell, or None where the theory is
    silent (deeper models, random kernels)."""
    from markov_interp import landscape

    source, model = row.config.source, row.config.model
    if source.kind != "binary" or model.n_layers != 1:
        return None
    p, q, tied = source.p, source.q, model.tie_weights
    if model.init == "canonical":
        return landscape.predict_outcome(model.canonical_e, model.canonical_w, model.canonical_b, p=p, q=q, tied=tied)
    return landscape.predict_outcome(THEORY_SMALL_INIT, THEORY_SMALL_INIT, None, p=p, q=q, tied=tied)


def _theory_exact(row: Row) -> Optional[bool]:
    """Whether the canonical (e, w, b) reduction behind `_theory` is exact for this cell: a one-layer model without
    normalisation started at the canonical init. With LayerNorm (the paper's model) or a Gaussian init the
    prediction is a heuristic (see `landscape.projection`)."""
    if _theory(row) is None:
        return None
    model = row.config.model
    return model.normalization is None and model.init == "canonical"


# ---------------------------------------------------------------------------------------------- summary
def _mean(values: list) -> Optional[float]:
    values = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return sum(values) / len(values) if values else None


def _group(rows: list[Row], sweep_name: str, key: Callable[[RunConfig], tuple]) -> dict:
    """The rows of one sweep grouped by `key(config)` (a tuple of setting values), in sorted order."""
    groups: dict = defaultdict(list)
    for row in rows:
        if row.sweep == sweep_name:
            groups[key(row.config)].append(row)
    return dict(sorted(groups.items(), key=lambda kv: tuple(str(x) for x in kv[0])))


def _mechanism_label(probe: Optional[sweep.ProbeColumns]) -> str:
    """The classified mechanism (`classify_mechanism`'s labels; "?" when the cell was not probed). A model
    that follows an in-context k-gram law without a confirmed circuit is already "other" there."""
    return probe.mechanism if probe is not None and probe.mechanism else "?"


def _probe_mean(results: list[sweep.CellResult], name: str) -> Optional[float]:
    return _mean([getattr(r.probe, name) for r in results if r.probe is not None])


def _summary_row(experiment: str, setting: dict, cells: list[Row]) -> dict:
    """One summary row; `mechanisms` is a {label: count} dict (written as "label n, ..." only in tables)."""
    ok = [r.result for r in cells if r.status == "ok"]
    stuck = [r.stuck_at_unigram for r in ok if r.stuck_at_unigram is not None]
    mechanisms = Counter(_mechanism_label(r.probe) for r in ok)
    references = ok[0] if ok else None
    escapes = [dynamics.EscapeTime(r.escape_step, r.censored) for r in ok if r.censored is not None]
    spread = dynamics.summarise(escapes) if escapes else None
    return {
        "experiment": experiment,
        **setting,
        "seeds": len(cells),
        "failed": sum(r.status not in ("ok", "diverged") for r in cells),
        "diverged": sum(r.status == "diverged" for r in cells),  # non-finite loss: neither stuck nor escaped
        "stuck_fraction": (sum(stuck) / len(stuck)) if stuck else None,
        "above_unigram": sum(r.outcome == "above" for r in ok),
        "final_loss": _mean([r.final_eval_loss for r in ok]),
        "entropy_rate": references.entropy_rate if references else None,
        "unigram_loss": references.unigram_loss if references else None,
        "bayes_loss": _mean([r.bayes_loss for r in ok]),
        "escape_step": _mean([r.escape_step for r in ok]),
        # escape times with censoring (paired evaluation; `dynamics`): Kaplan-Meier median, Wilson interval
        "median_escape": spread.median if spread else None,
        "median_escape_ci": spread.median_interval if spread else None,
        "censored_ci": spread.censored_interval if spread else None,
        "escape_curve": spread.curve if spread else None,  # for the survival figure (not a table column)
        "theory": _theory(cells[0]),
        "theory_exact": _theory_exact(cells[0]),
        "p_hat": _probe_mean(ok, "p_hat"),
        "mechanisms": dict(sorted(mechanisms.items())),
        "previous_token_excess": _probe_mean(ok, "previous_token_excess"),
        "induction_excess": _probe_mean(ok, "induction_excess"),
        "circuit_confirmed": sum(bool(r.probe and r.probe.circuit_confirmed) for r in ok),
    }


def summarise(rows: list[Row]) -> list[dict]:
    """One summary row per setting of each experiment (over seeds): fraction stuck at the unigram loss (see
    `sweep.stuck_at_unigram`), mean final loss beside the references, mean plateau-escape step, the landscape's
    prediction, the mean learned P(1|0) ("p_hat"), mechanism counts and mean head scores."""
    out = []
    for name in ("pq-tied", "pq-untied"):
        for (p, q), cells in _group(rows, name, lambda c: (c.source.p, c.source.q)).items():
            out.append(_summary_row(name, {"p": p, "q": q, "tied": name == "pq-tied"}, cells))
    for (layers,), cells in _group(rows, "depth", lambda c: (c.model.n_layers,)).items():
        out.append(_summary_row("depth", {"p": _PQ[0], "q": _PQ[1], "n_layers": layers}, cells))
    for (layers,), cells in _group(rows, "random", lambda c: (c.model.n_layers,)).items():
        out.append(_summary_row("random", {"n_layers": layers}, cells))
    for (init, w, precision), cells in _group(
            rows, "init-precision", lambda c: (c.model.init, c.model.canonical_w, c.train.precision)).items():
        label = "standard N(0, 0.02)" if init == "standard" else f"canonical w0={w}"
        out.append(_summary_row("init-precision", {"p": _PQ[0], "q": _PQ[1], "init": label, "precision": precision},
                                cells))
    return out


_SUMMARY_COLUMNS = ("experiment", "p", "q", "tied", "n_layers", "init", "precision", "seeds", "failed",
                    "diverged", "stuck_fraction", "above_unigram", "final_loss", "entropy_rate", "unigram_loss",
                    "bayes_loss", "escape_step", "median_escape", "median_escape_ci", "censored_ci", "theory",
                    "theory_exact", "p_hat", "mechanisms", "previous_token_excess", "induction_excess",
                    "circuit_confirmed")


def _fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    if isinstance(value, dict):  # mechanism counts
        return ", ".join(f"{k} {n}" for k, n in value.items())
    if isinstance(value, tuple):  # an interval; None: beyond the budget
        return "[" + ", ".join(">budget" if v is None else _fmt(v, digits) for v in value) + "]"
    return str(value)


_DIGITS = {"stuck_fraction": 2, "p": 2, "q": 2, "escape_step": 0, "p_hat": 3, "censored_ci": 2}


def _markdown(summary: list[dict], experiment: str, columns: tuple) -> str:
    rows = [r for r in summary if r["experiment"] == experiment]
    if not rows:
        return "(no cells)\n"
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        lines.append("| " + " | ".join(_fmt(r.get(c), _DIGITS.get(c, 4)) for c in columns) + " |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------- figures
def _save(fig: Any, path: Path) -> Path:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
    return path


def _depth_curves(rows: list[Row], work_dir: Path) -> tuple[dict, dict]:
    """The depth experiment's training curves ({n_layers: [(steps, losses) per finished seed]}) and the
    chain's reference losses, read from the run folders, for `report.figures.reproduction_depth_figure`."""
    from markov_interp.training import load_metrics

    curves, refs = defaultdict(list), {}
    for r in rows:
        if r.sweep != "depth" or r.status != "ok":
            continue
        metrics = [m for m in load_metrics(work_dir / r.run_dir) if "train_loss" in m]
        curves[r.config.model.n_layers].append(([m["step"] for m in metrics], [m["train_loss"] for m in metrics]))
        refs = {"entropy_rate": r.result.entropy_rate, "unigram_loss": r.result.unigram_loss}
    return dict(curves), refs


def _mechanism_counts(summary: list[dict], name: str) -> list[tuple[str, dict]]:
    """(n_layers, {mechanism: seeds}) per setting of one experiment, from the summary's "mechanisms" counts."""
    return [(str(r["n_layers"]), dict(r["mechanisms"])) for r in summary if r["experiment"] == name]


def _figures(summary: list[dict], rows: list[Row], work: Path, budget: Budget) -> dict:
    """The reproduction's four figures (drawn by `markov_interp.report.figures`), by file name."""
    from markov_interp.report import figures

    def experiment(name):
        return [r for r in summary if r["experiment"] == name]

    curves, refs = _depth_curves(rows, work)
    phase = {"one layer, tied": experiment("pq-tied"), "one layer, untied": experiment("pq-untied")}
    mechanisms = {f"binary chain p={_PQ[0]}, q={_PQ[1]}": _mechanism_counts(summary, "depth"),
                  "random kernels (in-context task)": _mechanism_counts(summary, "random")}
    return {
        "phase_pq.png": figures.reproduction_phase_figure(phase, budget.grid_values),
        "depth.png": figures.reproduction_depth_figure(curves, refs, p=_PQ[0], q=_PQ[1]),
        "mechanisms.png": figures.reproduction_mechanism_figure(mechanisms),
        "init_precision.png": figures.reproduction_init_precision_figure(experiment("init-precision"),
                                                                         p=_PQ[0], q=_PQ[1]),
        "survival.png": figures.escape_survival_figure({
            f"depth at p = {_PQ[0]}, q = {_PQ[1]} ({budget.depth_steps} steps)": {
                f"{r['n_layers']} layer(s)": r["escape_curve"] for r in experiment("depth") if r["escape_curve"]},
            f"init and precision ({budget.init_steps} steps)": {
                f"{r['init']}, {r['precision']}": r["escape_curve"] for r in experiment("init-precision")
                if r["escape_curve"]},
        }, budget={f"depth at p = {_PQ[0]}, q = {_PQ[1]} ({budget.depth_steps} steps)": budget.depth_steps,
                   f"init and precision ({budget.init_steps} steps)": budget.init_steps}),
    }


# -------------------------------------------------------------------------------------------- reproduce
def reproduce(
    out_dir: "str | os.PathLike",
    *,
    quick: bool = False,
    work_dir: "str | os.PathLike | None" = None,
    backend: str = "local",
    workers: Optional[int] = None,
    progress: bool = True,
    command: Optional[str] = None,
) -> dict:
    """Run the five experiments and write the reproduction's tables and figures into `out_dir`.

    Training runs live in `work_dir` (default runs/reproduce-quick or runs/reproduce; a rerun skips finished
    cells). Writes results.csv (every cell: config, losses, references, stuck flag, mechanism, probe scores),
    summary.csv and summary.md (per setting over seeds, beside the landscape's prediction; the command and the
    budget's cuts stated at the top) and phase_pq.png, depth.png, mechanisms.png, init_precision.png,
    survival.png.
    Returns {"summary": rows, "files": paths, "seconds": wall time, "failed": n}.
    """
    budget = QUICK if quick else FULL
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(work_dir) if work_dir is not None else Path("runs") / ("reproduce-quick" if quick else "reproduce")
    start = time.perf_counter()
    result = sweep.run(experiment_specs(budget), work, backend=backend, workers=workers, progress=progress)
    seconds = time.perf_counter() - start
    rows = result.rows
    summary = summarise(rows)
    files = [_copy_table(work, out)]
    files.append(_write_csv(out / "summary.csv", summary, _SUMMARY_COLUMNS))
    files += [_save(fig, out / name) for name, fig in _figures(summary, rows, work, budget).items()]
    command = command or "markov-interp reproduce" + (" --quick" if quick else "") + f" --out {out_dir}"
    text = _summary_markdown(summary, budget, command, seconds, result, work)
    atomic_write(out / "summary.md", text)
    files.append(out / "summary.md")
    return {"summary": summary, "files": files, "seconds": seconds, "failed": result.n_failed}


def _copy_table(work: Path, out: Path) -> Path:
    text = (work / "results.csv").read_text()
    atomic_write(out / "results.csv", text)
    return out / "results.csv"


def _write_csv(path: Path, rows: list[dict], columns: tuple) -> Path:
    import csv
    import io

    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({c: _cell(row.get(c)) for c in columns})
    atomic_write(path, buffer.getvalue())
    return path


def _cell(value: Any) -> Any:
    """A summary value as a CSV cell: None empty, mechanism counts as "label n, ..."."""
    if value is None:
        return ""
    if isinstance(value, tuple):  # an interval, as JSON (null: beyond the budget)
        return json.dumps(list(value))
    return ", ".join(f"{k} {n}" for k, n in value.items()) if isinstance(value, dict) else value


def _training_span(work: Path, rows: list[Row]) -> tuple[Optional[float], float]:
    """(wall-clock minutes from the first cell's start to the last cell's end of training, summed minutes of
    the cells' trainings), read from the run folders (config.json written at the start, model.safetensors at
    the end): the time the training took, also when this call reused or only re-probed the cells."""
    starts, ends = [], []
    for row in rows:
        config = work / row.run_dir / "config.json"
        weights = work / row.run_dir / "model.safetensors"
        if config.exists() and weights.exists():
            starts.append(config.stat().st_mtime)
            ends.append(weights.stat().st_mtime)
    if not starts:
        return None, 0.0
    return (max(ends) - min(starts)) / 60, sum(e - s for s, e in zip(starts, ends)) / 60


def _summary_markdown(summary: list[dict], budget: Budget, command: str, seconds: float, result: SweepResult,
                      work: Path) -> str:
    import platform

    import torch

    span, train_minutes = _training_span(work, result.rows)
    grid_cols = ("p", "q", "seeds", "stuck_fraction", "censored_ci", "median_escape", "above_unigram", "final_loss",
                 "entropy_rate", "unigram_loss", "theory", "theory_exact", "p_hat", "mechanisms")
    return "\n".join([
        f"# Reproduction ({budget.name})",
        "",
        f"Made by `{command}` on {platform.machine()} with {os.cpu_count()} CPU cores, torch {torch.__version__}, "
        f"Python {sys.version.split()[0]}: {len(result.rows)} cells ({result.n_failed} failed)"
        + (f", trained within {span:.1f} minutes of wall-clock time ({train_minutes:.1f} process-minutes of "
           "training; probing comes on top)" if span is not None else "")
        + f". This call took {seconds / 60:.1f} minutes, executed {result.n_run} cells (a finished training run "
        f"is loaded, not retrained; probes re-run when their code changed) and reused {result.n_skipped} results "
        f"from {work}.",
        "",
        f"Budget: {budget.cuts}." if budget.cuts else "",
        "",
        "\"Stuck\" = censored at the budget: every evaluation is paired (the model's loss beside the true "
        "predictor's and the plateau predictor's on the same tokens) and a run escapes at the first evaluation from "
        "which its excess stays below half the plateau's (`dynamics.escape_from_metrics`); stuck_fraction is the "
        "fraction censored, censored_ci its 95% Wilson interval, median_escape the Kaplan-Meier median escape step "
        "with its 95% interval (median_escape_ci; >budget: not reached); \"above_unigram\" = seeds whose final "
        "loss is still above the unigram band (not trained even to pi); \"theory\" = `landscape.predict_outcome` "
        f"for the canonical one-layer model (standard init evaluated at e0 = w0 = {THEORY_SMALL_INIT}); it is exact "
        "only where theory_exact says yes (no normalisation, canonical init): for the paper's LayerNorm models it is "
        "a heuristic; "
        "\"p_hat\" = the learned P(1|0) read from the model's predictions (`probes.kernel_readout`); "
        "mechanisms = `probes.classify_mechanism` counts over seeds (\"other\": no candidate law fits, or an "
        "in-context k-gram law without a confirmed circuit); escape_step = the mean of the seeds' escape steps "
        "(the budget for censored ones); losses in nats.",
        "",
        "## 1. One layer, tied: fraction of seeds stuck at the unigram loss over (p, q)",
        "",
        _markdown(summary, "pq-tied", grid_cols),
        "## 2. One layer, untied",
        "",
        _markdown(summary, "pq-untied", grid_cols),
        "![phase diagram](phase_pq.png)",
        "",
        f"## 3. Depth at p = {_PQ[0]}, q = {_PQ[1]} (tied)",
        "",
        _markdown(summary, "depth", ("n_layers", "seeds", "stuck_fraction", "censored_ci", "median_escape",
                                     "median_escape_ci", "above_unigram", "final_loss", "entropy_rate", "unigram_loss",
                                     "mechanisms", "previous_token_excess",
                                     "induction_excess")),
        "![depth](depth.png)",
        "",
        f"## 4. Random kernels (in-context task, {budget.random_vocab} states, Dirichlet(1) rows): one vs two "
        "attention-only layers",
        "",
        _markdown(summary, "random", ("n_layers", "seeds", "final_loss", "bayes_loss", "unigram_loss",
                                      "mechanisms", "previous_token_excess", "induction_excess",
                                      "circuit_confirmed")),
        "![mechanisms](mechanisms.png)",
        "",
        f"## 5. Initialisation and precision at p = {_PQ[0]}, q = {_PQ[1]} (one layer, tied)",
        "",
        _markdown(summary, "init-precision", ("init", "precision", "seeds", "stuck_fraction", "censored_ci",
                                              "median_escape", "median_escape_ci", "above_unigram", "final_loss", "theory",
                                              "theory_exact", "p_hat", "mechanisms")),
        "![init and precision](init_precision.png)",
        "",
        "![escape times](survival.png)",
        "",
    ])
