"""The paper's reproduction (the experiment `paper`, which `markov-interp reproduce` runs): its budgets, its
exact-reduction experiment, its summary text and its figures."""

import dataclasses
from collections import Counter
from pathlib import Path

import pytest
import torch

from matplotlib.colors import to_hex

from markov_interp import dynamics, experiments, sweep
from markov_interp.experiments import _figures_paper as figures
from markov_interp.experiments import paper as rep
from markov_interp.sweep import Row


def _rows(specs):
    """Rows without results (status ok) for seed 0 of every condition of `specs`: what the theory columns need
    (the theory integrates a flow per row: one seed per condition keeps this fast)."""
    return [Row(sweep=s.name, cell_id=c.cell_id, status="ok", error=None, params={}, config=c.config, result=None,
                run_dir=f"runs/{c.cell_id}") for s in specs for c in s.cells() if c.config.train.seed == 0]


def condition(**fields):
    """A `paper.ConditionSummary` with `fields` and neutral values elsewhere (for the figures' tests)."""
    base = {f.name: None for f in dataclasses.fields(rep.ConditionSummary)}
    base.update(experiment="pq-line", seeds=4, failed=0, diverged=0, budget=400, n_runs=4, n_censored=0,
                above_unigram=0, mechanisms=(), circuit_confirmed=0)
    return rep.ConditionSummary(**{**base, **fields})


def _seeds_per_condition(spec, key):
    return Counter(key(c.config) for c in spec.cells())


@pytest.mark.parametrize("budget", [rep.QUICK, rep.FULL], ids=["quick", "full"])
def test_key_conditions_have_16_seeds(budget):
    specs = {s.name: s for s in rep.experiment_specs(budget)}
    assert set(specs) == {"pq-tied", "pq-untied", "pq-line", "depth", "random", "precision", "exact"}
    precision = _seeds_per_condition(specs["precision"], lambda c: (c.train.precision, c.train.loss_scaling))
    assert set(precision) == {("fp32", False), ("fp16", False), ("fp16", True)}
    assert min(precision.values()) >= 16
    assert all((c.config.source.p, c.config.source.q) == (0.5, 0.8) and c.config.model.tie_weights
               for c in specs["precision"].cells() + specs["depth"].cells())
    depth = _seeds_per_condition(specs["depth"], lambda c: c.model.n_layers)
    assert {1, 2, 4} <= set(depth) and min(depth.values()) >= 16
    line = _seeds_per_condition(specs["pq-line"], lambda c: (c.source.p, c.source.q, c.model.tie_weights))
    assert min(line.values()) >= 16 and budget.seeds >= 16
    for tied in (True, False):  # the line crosses p + q = 1 on both sides, tied and untied
        sums = {p + q for (p, q, t) in line if t is tied}
        assert min(sums) < 1 < max(sums)
    # the coarse grid leaves out p + q = 1 and has both sides too
    grid = [c.config.source for c in specs["pq-tied"].cells()]
    assert all(abs(s.p + s.q - 1) > 1e-9 for s in grid) and {s.p + s.q > 1 for s in grid} == {True, False}
    assert not any(c.config.model.tie_weights for c in specs["pq-untied"].cells())
    # the key conditions' budget is one number, stated in cuts for the quick budget
    steps = {c.config.train.steps for name in ("precision", "depth", "pq-line", "exact") for c in specs[name].cells()}
    assert steps == {budget.steps}
    assert budget.cuts


def test_full_budget_reaches_2000_steps_and_depth_8_and_quick_says_what_it_cuts():
    assert rep.FULL.steps >= 2000 and 8 in rep.FULL.depth_layers
    assert 8 not in rep.QUICK.depth_layers and "depth 8 is missing" in rep.QUICK.cuts
    for stated in ("128 states", "400 optimiser steps", "16 seeds", "3 seeds", "8 seeds"):
        assert stated in rep.QUICK.cuts, stated
    assert rep.QUICK.seq_len == 128 and rep.QUICK.steps == 400


def test_exact_experiment_straddles_the_basin_boundary_and_is_exact_only_on_the_family():
    specs = rep.experiment_specs(rep.QUICK)
    rows = _rows(specs)
    exact = [r for r in rows if r.sweep == "exact"]
    # free AdamW training leaves the (e, w, b) family: exact at the start only
    assert exact and all(rep._theory_exact(r) is False for r in exact)
    on_family = [dataclasses.replace(r, config=dataclasses.replace(r.config, train=r.config.train.replace(
        optimizer="sgd", weight_decay=0.0, reduction="canonical"))) for r in exact]
    assert all(rep._theory_exact(r) is True for r in on_family)
    released = on_family[0].config.train.replace(release=["positions"])
    assert rep._theory_exact(dataclasses.replace(on_family[0], config=dataclasses.replace(
        on_family[0].config, train=released))) is False
    assert all(r.config.model.normalization is None and r.config.model.init == "canonical" for r in exact)
    # both predicted outcomes are tested: small w0 -> unigram, w0 < -1/sqrt(2) -> bigram (`predict_outcome`)
    predicted = {r.config.model.canonical_w: rep._theory(r) for r in exact}
    assert predicted[0.1] == "unigram" and predicted[-1.0] == "bigram"
    # the paper's LayerNorm models: the column is a heuristic there
    for name in ("pq-tied", "pq-untied", "pq-line", "precision"):
        assert all(rep._theory_exact(r) is False for r in rows if r.sweep == name), name
    # deeper models and random kernels: no theory at all
    assert all(rep._theory(r) is None and rep._theory_exact(r) is None for r in rows
               if r.sweep == "random" or (r.sweep == "depth" and r.config.model.n_layers > 1))
    # one structural change undoes exactness: a value matrix that attention can use (refused on the family)
    r = on_family[0]
    with pytest.raises(ValueError, match="zero value matrix"):
        dataclasses.replace(r.config, model=r.config.model.replace(canonical_v_std=0.1))


def test_summary_states_where_the_precision_runs_ran(monkeypatch):
    monkeypatch.setattr(rep, "_precision_device", lambda: "cpu")
    text = rep._precision_note()
    assert "ran on cpu" in text and "docs/reproduction/gpu/" in text
    assert "H200" in text and "torch 2.11.0+cu130" in text and "16 seeds" in text and "2000 steps" in text
    monkeypatch.setattr(rep, "_precision_device", lambda: "cuda (NVIDIA H100)")
    text = rep._precision_note()
    assert "ran on cuda (NVIDIA H100)" in text and "docs/reproduction/gpu/" not in text


def _tiny_budget():
    return rep.QUICK.replace(seq_len=32, steps=4, seeds=2, depth_layers=(1, 2), line_q=(0.2, 0.8),
                               line_seeds=2, grid_values=(0.2, 0.9), grid_seeds=1, grid_steps=4, exact_w=(0.1, -1.0),
                               exact_seeds=2, random_seeds=1, random_steps=4, eval_batches=1)


@pytest.mark.slow
def test_reproduce_tiny_budget(tmp_path, monkeypatch):
    tiny = _tiny_budget()
    monkeypatch.setattr(rep, "_precision_device", lambda: "cpu")
    out = tmp_path / "report"
    finished = experiments.run(rep.EXPERIMENT, out, budget=tiny, command="markov-interp reproduce --quick",
                               work=tmp_path / "work", workers=2)
    assert finished.failed == 0 and finished.budget is tiny
    for name in ("results.csv", "summary.csv", "summary.md", "results.json", "phase_pq.png", "boundary.png",
                 "depth.png", "mechanisms.png", "survival.png"):
        assert (out / name).stat().st_size > 0, name
    conditions = finished.result.conditions
    summary = {(r.experiment, r.p, r.q, r.tied, r.n_layers, r.init, r.precision): r for r in conditions}
    assert summary[("pq-tied", 0.2, 0.9, True, None, None, None)].theory == "unigram"
    assert summary[("pq-tied", 0.2, 0.2, True, None, None, None)].theory == "bigram"
    assert summary[("pq-untied", 0.2, 0.9, False, None, None, None)].theory == "bigram"
    assert summary[("pq-tied", 0.2, 0.9, True, None, None, None)].theory_exact is False
    assert summary[("depth", 0.5, 0.8, None, 2, None, None)].theory_exact is None
    exact = [r for r in conditions if r.experiment == "exact"]
    assert len(exact) == 2 and all(r.theory_exact is False for r in exact)  # free training: exact at the start
    # at 4 steps every seed is on the plateau: censored 2/2, agreement only where "unigram" was predicted
    for r in exact:
        assert r.censored == "2/2" and r.theory_agreement == ("2/2" if r.theory == "unigram" else "0/2")
    precision = {r.precision: r for r in conditions if r.experiment == "precision"}
    assert set(precision) == {"fp32", "fp16", "fp16 + loss scaling"}
    depth1 = summary[("depth", 0.5, 0.8, None, 1, None, None)]
    assert depth1.seeds == 2 and depth1.budget == 4 and depth1.median_escape is None
    assert depth1.censored_ci == pytest.approx(dynamics.wilson_interval(2, 2))
    text = (out / "summary.md").read_text()
    assert text.startswith("# Reproduction (quick)\n\n**smoke: does not test the claims.**")
    assert text.split("\n\n")[2].startswith("Made by `markov-interp reproduce --quick")
    assert tiny.cuts in text and f"torch {torch.__version__}" in text and "wall time" in text
    assert "ran on cpu" in text and "docs/reproduction/gpu/" in text and "theory_exact = no" in text
    # summary.csv: one line per condition, the columns of the typed summary
    lines = (out / "summary.csv").read_text().splitlines()
    assert lines[0].startswith("experiment,p,q,tied,n_layers") and len(lines) == len(conditions) + 1
    data = __import__("json").loads((out / "results.json").read_text())
    assert data["budget"]["seeds"] == 2 and len(data["result"]["conditions"]) == len(conditions)
    assert data["provenance"]["command"].startswith("markov-interp reproduce --quick")
    # the seeds of a condition trained as stacks (group 16 on a CPU); one engine: a stacked cell's weights are
    # those its run gets alone (`training.train`), bit for bit
    stacked = [r for r in result_rows(tmp_path / "work") if r.stack_size and r.stack_size > 1 and r.status == "ok"]
    assert stacked
    from markov_interp import models, training

    alone = models.state_dict_for_save(training.train(stacked[-1].config, progress=False).model)
    _, cell = models.read_weights(tmp_path / "work" / stacked[-1].run_dir)
    assert alone.keys() == cell.keys() and all(torch.equal(alone[k], cell[k]) for k in alone)


def result_rows(work: Path) -> list:
    return sweep.read_table(work / "results.csv")


def test_boundary_figure_draws_medians_and_censored_fractions():
    def row(q, tied, median, censored, n=16):
        return condition(q=q, tied=tied, median_escape=median, median_escape_ci=(None if median is None else
                         (median - 10, None)), n_runs=n, n_censored=censored,
                         censored_ci=dynamics.wilson_interval(censored, n), budget=400)

    rows = [row(0.2, True, 30, 0), row(0.8, True, None, 12), row(0.2, False, 20, 0), row(0.8, False, 25, 0)]
    rows.append(dataclasses.replace(row(0.5, False, 22, 0, n=3), median_escape_ci=None))  # 3 seeds: no bar
    left, right = figures.reproduction_boundary_figure(rows, p=0.5).axes
    tied_line = next(line for line in left.lines if line.get_label() == "tied")
    # a median beyond the budget is drawn at the budget
    assert list(tied_line.get_ydata()) == [30, 400]
    fractions = [c for c in right.containers]
    assert len(fractions) == 2  # tied and untied error bars
    tied_points = fractions[0].lines[0].get_ydata()
    assert list(tied_points) == pytest.approx([0.0, 12 / 16])


def test_phase_figure_colours_cells_by_fraction_stuck_and_marks_the_theory():
    rows = [condition(p=0.1, q=0.3, stuck_fraction=0.0, theory="bigram"),
            condition(p=0.5, q=0.7, stuck_fraction=1.0, theory="unigram"),
            condition(p=0.9, q=0.7, stuck_fraction=None, theory="unigram")]
    fig = figures.reproduction_phase_figure({"tied": rows, "untied": rows[:1]}, (0.1, 0.3, 0.5, 0.7, 0.9))
    tied, untied = fig.axes[:2]
    assert [t.get_text() for t in tied.texts if t.get_text()[0] in "0n1"] == ["0.00", "1.00", "n/a"]
    cells = [p for p in tied.patches]
    assert len(cells) == 3 and len(untied.patches) == 1
    assert to_hex(cells[2].get_facecolor()) == "#bbbbbb"  # no finished seed
    assert cells[0].get_width() == pytest.approx(0.2)
    marks = [line for line in tied.lines if line.get_marker() == "x" and len(line.get_xdata())]
    assert sorted(float(m.get_xdata()[0]) for m in marks) == [0.5, 0.9]  # the predicted unigram cells
    assert "tied: fraction" in tied.get_title()


def test_depth_figure_draws_one_line_per_seed_and_the_references():
    curves = {1: [([0, 10, 20], [0.7, 0.68, 0.67])], 2: [([0, 10], [0.7, 0.62]), ([0, 10], [0.7, 0.63])]}
    fig = figures.reproduction_depth_figure(curves, {"entropy_rate": 0.619, "unigram_loss": 0.6663},
                                                      p=0.5, q=0.8)
    ax = fig.axes[0]
    ys = [tuple(line.get_ydata()) for line in ax.lines]
    assert (0.7, 0.68, 0.67) in ys and (0.7, 0.62) in ys and (0.7, 0.63) in ys
    assert ax.get_ylim() == pytest.approx((0.599, 0.7063))
    labels = ax.get_legend_handles_labels()[1]
    assert labels[:2] == ["1 layer", "2 layers"] and any("0.6663" in label for label in labels)
    assert len(figures.reproduction_depth_figure({}, {}, p=0.5, q=0.8).axes[0].lines) == 0


def test_mechanism_figure_stacks_the_counts():
    panels = {"binary": [("1", {"unigram": 1, "kernel": 2}), ("2", {"kernel": 3})],
              "random": [("1", {"in_context_unigram": 3}), ("2", {"induction": 2, "?": 1})]}
    fig = figures.reproduction_mechanism_figure(panels)
    binary, random = fig.axes
    bars = sorted((b.get_y(), b.get_height()) for b in binary.patches if b.get_height() > 0)
    assert bars == [(0, 1), (0, 3), (1, 2)]  # kernel stacked on unigram at 1 layer
    assert sum(b.get_height() for b in random.patches) == 6
    assert {"in_context_unigram", "induction", "?"} <= set(random.get_legend_handles_labels()[1])


def test_init_precision_figure_draws_the_fractions():
    rows = [condition(init="standard", precision="fp32", stuck_fraction=2 / 3, theory="unigram"),
            condition(init="standard", precision="fp16", stuck_fraction=1.0, theory="unigram"),
            condition(init="canonical w0=-1", precision="fp32", stuck_fraction=0.0, theory="bigram")]
    ax = figures.reproduction_init_precision_figure(rows, p=0.5, q=0.8).axes[0]
    assert sorted(b.get_height() for b in ax.patches) == pytest.approx([0.0, 2 / 3, 1.0])
    assert {t.get_text() for t in ax.texts} >= {"theory: unigram", "theory: bigram", "0.67", "1.00"}
