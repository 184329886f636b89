"""A report across runs: the runs of a sweep, or seeds of one config, side by side in one offline HTML file.

`compare([run_dir, ...])` probes every run folder (a sweep folder stands for its runs, `<sweep>/runs/*`) with the
same probe batch settings as `report.build` (`report._build._probe`: one batch, one forward, one
`classify_mechanism` per run) and lays out what a researcher reads after a sweep:

- the verdicts side by side, with the configuration keys in which the runs differ;
- the loss curves overlaid, against each configuration's reference losses (logged by training from `theory`);
- the kept edges of every run's circuit as a runs x edges table (effect in nats where kept);
- the per-head attention scores (excess over chance) per run;
- for runs that are seeds of one configuration (equal but for `train.seed`), the distribution over seeds of the
  loss above the entropy rate, the circuit's size and faithfulness, the in-context fraction, the induction head's
  excess and the escape step (`dynamics`), with how many seeds reach each verdict.

Nothing here computes a probe number; every number comes from `probes`, `dynamics` or the run's metrics.
"""

import collections
import dataclasses
import functools
import html
import json
import math
import os
from pathlib import Path
from collections.abc import Sequence
from typing import Any, Optional

import numpy as np
from matplotlib.figure import Figure

from markov_interp import dynamics, probes, runs
from markov_interp._display import displayed
from markov_interp.config import check_int
from markov_interp.devices import resolve_device
from markov_interp.report._html import (Section, atomic_write_text, document, iframe,
                                          paragraph, section_by_id, table)
from markov_interp.report.figures import REFERENCE_STYLE, annotation_format, effect_text
from markov_interp.runs import RunConfig
from markov_interp.theory import ReferenceLosses

__all__ = ["COMPARE_FILE", "COMPARE_SECTION_IDS", "ComparedRun", "Comparison", "compare", "run_folders"]

COMPARE_FILE = "compare.html"  # a sweep folder's default (`Comparison.save`)


@dataclasses.dataclass(frozen=True, eq=False)
class ComparedRun:
    """One run of a comparison: its folder, label, configuration, verdict (`MechanismReport`), metrics rows and
    the reference losses training logged (None when no evaluation logged them)."""

    label: str
    run_dir: Path
    config: RunConfig
    mechanism: probes.MechanismReport
    metrics: tuple
    references: Optional[ReferenceLosses]

    @functools.cached_property
    def condition(self) -> str:
        """The configuration without its seed (runs with equal conditions are seeds of one config), as a sweep
        run's condition is read (`report._condition`)."""
        from markov_interp.report._condition import _condition_key

        return _condition_key(self.config)

    @functools.cached_property
    def escape(self) -> Optional[dynamics.StepInterval]:
        """The escape from the plateau (`dynamics.escape_from_metrics`), None where there is no plateau."""
        return dynamics.escape_from_metrics(list(self.metrics))

    def refs(self) -> ReferenceLosses:
        return self.references or self.mechanism.references


def _line(c: "Comparison") -> str:
    counts = collections.Counter(r.mechanism.mechanism for r in c.runs)
    return f"{len(c.runs)} runs: " + ", ".join(f"{n} {m}" for m, n in counts.most_common())


@displayed(line=_line)
@dataclasses.dataclass(frozen=True, eq=False)
class Comparison:
    """Several runs side by side (module docstring): the `runs`, the report `sections` and the whole document
    (`html`); `save(path)` writes it atomically (default `<sweep>/compare.html` for a sweep folder)."""

    title: str
    runs: tuple[ComparedRun, ...]
    sections: tuple[Section, ...]
    default_path: Optional[Path] = None

    @functools.cached_property
    def html(self) -> str:
        intro = paragraph(f"{len(self.runs)} runs: " + ", ".join(f"{r.label} ({r.run_dir})" for r in self.runs)
                          + ". Every run probed on the same batch settings; this file opens without a network.")
        return document(self.title, self.sections, intro=intro, lead=1)

    def section(self, section_id: str) -> Section:
        """The section called `section_id` (one of `COMPARE_SECTION_IDS`)."""
        return section_by_id(self.sections, section_id)

    def save(self, path: "str | os.PathLike | None" = None) -> Path:
        """Write the HTML file atomically to `path` (default: `<sweep>/compare.html` for one sweep folder)."""
        if path is None:
            if self.default_path is None:
                raise ValueError("a comparison of run folders has no default file; pass the path to save it to")
            path = self.default_path
        return atomic_write_text(path, self.html)

    def _repr_html_(self) -> str:
        return iframe(self.html)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: per run its folder, label, the configuration keys that differ and the verdict."""
        diff = _differing([r.config for r in self.runs])
        return {"title": self.title, "sections": [s.id for s in self.sections],
                "runs": [{"label": r.label, "run_dir": str(r.run_dir), "config": diff[i],
                          "mechanism": r.mechanism.to_dict()} for i, r in enumerate(self.runs)]}


# ------------------------------------------------------------------------------------------------ folders
def _sweep_runs(path: Path) -> Path:
    """The runs folder a sweep folder `path` would hold (imported here: reading run folders imports nothing of
    training, which `sweep` does)."""
    from markov_interp.sweep import RUNS_DIR

    return path / RUNS_DIR


def run_folders(paths: "Sequence[str | os.PathLike]") -> list[Path]:
    """The run folders `paths` name: a run folder (it has `config.json`) stands for itself, a sweep folder
    (`results.csv` beside `runs/`) for its runs that hold final weights, in name order.

    Args:
        paths: run folders and sweep folders.

    Returns:
        The run folders, each once, in the order given.
    """
    if isinstance(paths, (str, os.PathLike)):
        raise ValueError(f"compare takes a list of run or sweep folders, got the single path {str(paths)!r}")
    found: list[Path] = []
    for given in paths:
        path = Path(given)
        if (path / runs.CONFIG_FILE).is_file():
            found.append(path)
        elif _sweep_runs(path).is_dir():
            found += sorted(p for p in _sweep_runs(path).iterdir() if (p / runs.WEIGHTS_FILE).is_file())
        else:
            raise ValueError(f"{path} is neither a run folder (no {runs.CONFIG_FILE}) nor a sweep folder (no "
                             f"{_sweep_runs(path).name}/)")
    unique: dict[Path, Path] = {}
    for p in found:  # each folder once, as first named
        unique.setdefault(p.resolve(), p.absolute())
    if not unique:  # a sweep whose runs have not finished
        raise ValueError(f"no finished runs in {[str(p) for p in paths]} (a sweep's runs need {runs.WEIGHTS_FILE})")
    return list(unique.values())


def _labels(folders: list[Path]) -> list[str]:
    """Short, distinct names: the folder name, with its parent where two runs share a name."""
    names = [p.name for p in folders]
    if len(set(names)) == len(names):
        return names
    return [f"{p.parent.name}/{p.name}" if names.count(p.name) > 1 else p.name for p in folders]


def _flat(data: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _differing(configs: Sequence[RunConfig]) -> list[dict[str, Any]]:
    """Per config, the flattened keys whose values are not the same in every config."""
    flats = [_flat(c.to_dict()) for c in configs]
    keys = sorted({k for f in flats for k in f})
    differ = [k for k in keys if len({json.dumps(f.get(k), sort_keys=True, default=str) for f in flats}) > 1]
    return [{k: f.get(k) for k in differ} for f in flats]


# ---------------------------------------------------------------------------------------------- sections
def _verdict_section(rs: Sequence[ComparedRun]) -> tuple:
    diff = _differing([r.config for r in rs])
    keys = sorted({k for d in diff for k in d})
    rows = []
    for r, d in zip(rs, diff):
        m, graph = r.mechanism, r.mechanism.graph
        rows.append((r.label, *(_short(d.get(k)) for k in keys),
                     f"{m.mechanism}{'' if m.confident else ' (not confident)'}",
                     m.circuit.kind + (f" (order {m.circuit.order})" if m.circuit.order is not None else ""),
                     m.law.describe(), m.eval_loss, f"{len(graph.kept)} of {len(graph.edges)}", graph.faithfulness))
    header = ("run", *keys, "mechanism", "circuit (kind)", "law the outputs reach", "eval loss (probe batch, "
              "nats)", "kept edges", "faithfulness")
    counts = collections.Counter(r.mechanism.mechanism for r in rs)
    text = paragraph("Verdicts: " + ", ".join(f"{m} in {n} of {len(rs)} runs" for m, n in counts.most_common())
                     + (f". The runs differ in: {', '.join(keys)}." if keys else ". The runs share one config."))
    return (text, f'<div class="wide">{table(rows, header=header)}</div>')


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def _colours(n: int) -> list:
    import matplotlib

    cmap = matplotlib.colormaps["tab10" if n <= 10 else "viridis"]
    return [cmap(i if n <= 10 else i / max(n - 1, 1)) for i in range(n)]


def loss_overlay_figure(rs: Sequence[ComparedRun]) -> Figure:
    """Every run's evaluation loss over optimiser steps, one colour per run, against the reference losses of each
    distinct configuration (one set of lines when the runs share them); the legend sits outside the data."""
    fig = Figure(figsize=(9, 4.4))
    ax = fig.add_subplot()
    everything = []
    for r, colour in zip(rs, _colours(len(rs))):
        evals = [(row["step"], row["eval_loss"]) for row in r.metrics if "eval_loss" in row]
        if evals:
            ax.plot(*zip(*evals), "-", color=colour, linewidth=1.3, alpha=0.85, label=r.label)
            everything += [v for _, v in evals if math.isfinite(v)]
    seen: dict[tuple, str] = {}
    for r in rs:
        row = r.refs().as_row()
        key = tuple(round(row.get(k) or math.nan, 4) for k in REFERENCE_STYLE)
        where = "logged by training" if r.references is not None else "probe batch"
        seen.setdefault(key, f"{r.label}'s config, {where}" if len(rs) > 1 else where)
    for i, (key, label) in enumerate(seen.items()):
        for (name, (what, colour, style)), value in zip(REFERENCE_STYLE.items(), key):
            if math.isfinite(value):
                tag = f"{what} {value:.4f} ({label if len(seen) > 1 else label.split(', ')[-1]})"
                ax.axhline(value, color=colour, linestyle=style, linewidth=1.1, alpha=1.0 - 0.5 * (i > 0), label=tag)
                everything.append(value)
    if everything:
        tail = sorted(everything)
        low, high = tail[0], float(np.percentile(tail, 90))
        pad = 0.1 * (high - low) + 0.01
        ax.set_ylim(low - pad, high + 2 * pad)
    ax.set_xlabel("optimiser step")
    ax.set_ylabel("eval loss (nats; fresh batches during training)")
    ax.set_title(f"Loss during training: {len(rs)} runs")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    ax.grid(alpha=0.25)
    return fig


def _loss_section(rs: Sequence[ComparedRun]) -> tuple:
    text = paragraph("Evaluation loss during training (the run's metrics.jsonl), one colour per run, against the "
                     "reference losses training logged from markov_interp.theory (one set of lines per distinct "
                     "configuration).")
    return (text, loss_overlay_figure(rs))


def _edge_order(rs: Sequence[ComparedRun]) -> list[str]:
    """Every edge kept in some run, by the number of runs that keep it, then by its mean effect."""
    kept = collections.Counter(e.name for r in rs for e in r.mechanism.graph.kept)
    effect: dict[str, list[float]] = collections.defaultdict(list)
    for r in rs:
        for e in r.mechanism.graph.kept:
            effect[e.name].append(e.effect)
    return sorted(kept, key=lambda n: (-kept[n], -float(np.mean(effect[n])), n))


def _edges_section(rs: Sequence[ComparedRun]) -> tuple:
    names = _edge_order(rs)
    if not names:
        return (paragraph("No run kept an edge.", cls="note"),)
    head = "".join(f"<th class=\"edge\">{html.escape(n)}</th>" for n in names)
    body = []
    for r in rs:
        kept = {e.name: e for e in r.mechanism.graph.kept}
        cells = "".join(f'<td class="kept">{effect_text(kept[n].effect)}</td>' if n in kept else '<td class="absent">·</td>'
                        for n in names)
        body.append(f"<tr><th>{html.escape(r.label)}</th>{cells}</tr>")
    share = "".join(f"<td>{sum(n in r.mechanism.graph.kept_names for r in rs)}/{len(rs)}</td>" for n in names)
    text = paragraph(f"Edges kept by path patching in each run ({len(names)} distinct): the cell is the edge's "
                     "effect in nats where the run keeps it, · where it does not; the last row counts the runs.")
    return (text, f'<div class="wide"><table class="edges"><tr><th>run</th>{head}</tr>{"".join(body)}'
                  f'<tr><th>kept in</th>{share}</tr></table></div>')


def head_scores_figure(rs: Sequence[ComparedRun], kinds: Sequence[str] = ("previous_token", "induction")) -> Figure:
    """Runs x heads heatmaps of each attention score's excess over chance (`AttentionScores.excess`), annotated
    at the colour scale's precision (`annotation_format`) where the grid is small; heads a run lacks are blank."""
    heads = sorted({(l, h) for r in rs for l, h in np.ndindex(*r.mechanism.attention.previous_token.shape)})
    labels = [f"L{l}H{h}" for l, h in heads]
    fig = Figure(figsize=(max(4.5, 0.7 * len(heads) + 2.5) * len(kinds), 0.38 * len(rs) + 1.6))
    axes = fig.subplots(1, len(kinds), squeeze=False)[0]
    for ax, kind in zip(axes, kinds):
        grid = np.full((len(rs), len(heads)), np.nan)
        for i, r in enumerate(rs):
            excess = r.mechanism.attention.excess(kind)
            for j, (l, h) in enumerate(heads):
                if l < excess.shape[0] and h < excess.shape[1]:
                    grid[i, j] = float(excess[l, h])
        lim = float(np.nanmax(np.abs(grid))) if np.isfinite(grid).any() and np.nanmax(np.abs(grid)) > 0 else 1.0
        image = ax.imshow(grid, cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto")
        ax.set_xticks(range(len(heads)), labels, fontsize=8, rotation=45)
        ax.set_yticks(range(len(rs)), [r.label for r in rs], fontsize=8)
        ax.set_title(f"{kind.replace('_', '-')} score: excess over chance", fontsize=9)
        if grid.size <= 120:
            for (i, j), v in np.ndenumerate(grid):
                if math.isfinite(v):
                    ax.text(j, i, annotation_format(lim).format(v), ha="center", va="center", fontsize=8,
                            color="white" if abs(v) > 0.6 * lim else "black")
        fig.colorbar(image, ax=ax, fraction=0.04)
    fig.tight_layout()
    return fig


def _heads_section(rs: Sequence[ComparedRun]) -> tuple:
    text = paragraph("Per-head attention scores of each run, as excess over chance (the same score for uniform "
                     "causal attention on the same tokens; Olsson et al.).")
    return (text, head_scores_figure(rs))


# the numbers whose spread over seeds is drawn: (label, value of one run or NaN)
SEED_QUANTITIES = (
    ("eval loss - entropy rate (nats)", lambda r: r.mechanism.eval_loss - (r.refs().entropy_rate or math.nan)),
    ("kept edges", lambda r: float(len(r.mechanism.graph.kept))),
    ("faithfulness", lambda r: r.mechanism.graph.faithfulness),
    ("in-context fraction (kernel swap)", lambda r: r.mechanism.in_context_fraction),
    ("largest induction excess", lambda r: float(r.mechanism.attention.excess("induction").max())),
    ("escape step (by; censored: x)", lambda r: math.nan if r.escape is None or r.escape.by is None
     else float(r.escape.by)),
)


def seed_groups(rs: Sequence[ComparedRun]) -> list[list[ComparedRun]]:
    """The runs grouped by condition (config without its seed), groups of two or more seeds, in first-seen order."""
    groups: dict[str, list[ComparedRun]] = collections.defaultdict(list)
    for r in rs:
        groups[r.condition].append(r)
    return [g for g in groups.values() if len(g) >= 2]


def seed_distribution_figure(groups: Sequence[Sequence[ComparedRun]], names: Sequence[str]) -> Figure:
    """One panel per `SEED_QUANTITIES`: each group's seeds as points (spread sideways by seed order, no random
    jitter) with the median as a bar; censored escapes are drawn as x at the last evaluation."""
    fig = Figure(figsize=(3.0 * 3, 2.6 * 2 + 0.3))
    axes = fig.subplots(2, 3).ravel()
    for ax, (label, value) in zip(axes, SEED_QUANTITIES):
        for g, (group, colour) in enumerate(zip(groups, _colours(len(groups)))):
            values = np.array([value(r) for r in group], dtype=float)
            offsets = g + np.linspace(-0.25, 0.25, len(group))
            ax.plot(offsets, values, "o", color=colour, markersize=4, alpha=0.8)
            if label.startswith("escape"):
                censored = [(o, r.escape.after) for o, r in zip(offsets, group) if r.escape and r.escape.by is None]
                if censored:
                    ax.plot(*zip(*censored), "x", color=colour, markersize=6)
            if np.isfinite(values).any():
                ax.hlines(float(np.nanmedian(values)), g - 0.35, g + 0.35, color="#222", linewidth=1.5)
        ax.set_xticks(range(len(groups)), names, fontsize=8)
        ax.set_title(label, fontsize=9)
        ax.grid(alpha=0.25, axis="y")
    fig.tight_layout()
    return fig


def _seeds_section(rs: Sequence[ComparedRun]) -> tuple:
    groups = seed_groups(rs)
    if not groups:
        return (paragraph("No two runs are seeds of one configuration (equal but for train.seed): no distribution "
                          "over seeds to draw.", cls="note"),)
    names = [f"config {chr(65 + i)}" if i < 26 else f"config {i}" for i in range(len(groups))]
    diff = _differing([g[0].config for g in groups]) if len(groups) > 1 else [{}]
    rows = []
    for name, group, d in zip(names, groups, diff):
        counts = collections.Counter(r.mechanism.mechanism for r in group)
        escapes = [r.escape for r in group]
        escaped = [e for e in escapes if e is not None and e.by is not None]
        rows.append((name, len(group), ", ".join(f"{k}={_short(v)}" for k, v in d.items()) or "(the only config)",
                     ", ".join(f"{m} {n}/{len(group)}" for m, n in counts.most_common()),
                     f"{len(escaped)}/{len(group)}" + (f", median by step {int(np.median([e.by for e in escaped]))}"
                                                        if escaped else "")))
    text = paragraph("Runs that are seeds of one configuration (equal but for train.seed), each as a point; the "
                     "bar is the median over seeds. Escape: the first evaluation from which the paired excess loss "
                     f"stays below {dynamics.ESCAPE_FRACTION} of the plateau's (`dynamics`); x: no escape by the "
                     "last evaluation (censored).")
    return (text, table(rows, header=("group", "seeds", "config", "verdicts", "escaped")),
            seed_distribution_figure(groups, names))


SECTIONS = (
    ("verdicts", "Verdicts side by side", _verdict_section),
    ("loss", "Loss curves against the references", _loss_section),
    ("edges", "Kept edges: runs x edges", _edges_section),
    ("heads", "Head scores per run", _heads_section),
    ("seeds", "Distribution over seeds", _seeds_section),
)
COMPARE_SECTION_IDS = tuple(s[0] for s in SECTIONS)


# --------------------------------------------------------------------------------------------------- build
def _probe_run(run_dir: Path, label: str, *, n_sequences: int, seq_len: Optional[int], seed: int,
               device: Any) -> ComparedRun:
    from markov_interp.report._build import _load_run, _logged_references, _probe

    run = _load_run(run_dir)
    model = runs.load_model(run_dir, device=device, expect=run.model)
    _, mech, _ = _probe(model, run.source.build(), n_sequences=n_sequences, seq_len=seq_len, seed=seed)
    metrics = runs.load_metrics(run_dir)
    return ComparedRun(label=label, run_dir=run_dir, config=run, mechanism=mech, metrics=tuple(metrics),
                       references=_logged_references(metrics))


def compare(
    paths: "Sequence[str | os.PathLike]",
    *,
    n_sequences: int = 64,
    seq_len: Optional[int] = None,
    seed: int = 0,
    device: Any = "auto",
    title: Optional[str] = None,
    progress: bool = False,
) -> Comparison:
    """Probe several runs and lay them out side by side (module docstring); nothing is written (`.save()`).

    Args:
        paths: run folders and sweep folders (a sweep folder stands for its finished runs).
        n_sequences, seq_len, seed: the probe batch of every run (as `report.build`).
        device: where the models are probed ("auto", "cpu", "cuda", ...).
        title: the page title.
        progress: a progress bar over the runs (tqdm).

    Returns:
        A `Comparison`; `save(path)` writes it (a single sweep folder defaults to `<sweep>/compare.html`).

    >>> seen = compare([run_dir], n_sequences=8)  # compare([run_a, run_b, ...]) or compare([sweep_dir])
    >>> [s.id for s in seen.sections] == list(COMPARE_SECTION_IDS), len(seen.runs)
    (True, 1)
    """
    from tqdm.auto import tqdm

    check_int("n_sequences", n_sequences, minimum=2)
    folders = run_folders(paths)
    device = resolve_device(device)
    probed = []
    with tqdm(total=len(folders), desc="compare", unit="run", disable=not progress, leave=False) as bar:
        for folder, label in zip(folders, _labels(folders)):
            probed.append(_probe_run(folder, label, n_sequences=n_sequences, seq_len=seq_len, seed=seed,
                                     device=device))
            bar.update()
    sections = tuple(Section(sid, name, tuple(make(probed))) for sid, name, make in SECTIONS)
    given = [Path(p) for p in paths]
    default = given[0] / COMPARE_FILE if len(given) == 1 and _sweep_runs(given[0]).is_dir() else None
    name = given[0].resolve().name if len(given) == 1 else f"{len(probed)} runs"
    return Comparison(title=title or f"markov-interp comparison: {name}", runs=tuple(probed), sections=sections,
                      default_path=default)
