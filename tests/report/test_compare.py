"""Tests of markov_interp.report.compare: several runs (and a sweep folder) side by side in one offline file.

Every number the page shows is checked against the run's own probe results, read independently here (the kept
edges of each run's graph, the head scores' excess, the grouping of seeds by their configuration).
"""

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from markov_interp import report, runs, sweep, training
from markov_interp.cli import main as cli_main
from markov_interp.report import _compare as compare_module
from markov_interp.report._compare import COMPARE_FILE, COMPARE_SECTION_IDS, run_folders, seed_groups

from tests.report.test_report import network_references


def _train(out: Path, seed: int, lr: float = 1e-2) -> Path:
    torch.set_num_threads(1)
    run = training.default_run(kind="random", vocab=3, steps=12, n_ctx=16, seq_len=16, batch_size=8, eval_every=3,
                               eval_batches=1, n_checkpoints=2, device="cpu", seed=seed, lr=lr)
    training.train(run, out, progress=False)
    return out


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    """A sweep folder's layout: three seeds of one config and one run at another learning rate under runs/,
    beside results.csv, plus a run that has not finished (no weights)."""
    root = tmp_path_factory.mktemp("compare") / "sweep"
    for i in range(3):
        _train(root / sweep.RUNS_DIR / f"cell-a-seed{i}", seed=i)
    _train(root / sweep.RUNS_DIR / "cell-b-seed0", seed=0, lr=3e-3)
    unfinished = root / sweep.RUNS_DIR / "cell-c-seed0"
    unfinished.mkdir()
    (unfinished / runs.CONFIG_FILE).write_text((root / sweep.RUNS_DIR / "cell-b-seed0" / runs.CONFIG_FILE).read_text())
    (root / sweep.TABLE).write_text("cell_id\n")
    return root


@pytest.fixture(scope="module")
def seen(sweep_dir):
    return report.compare([sweep_dir], n_sequences=8, device="cpu")


def test_a_sweep_folder_stands_for_its_finished_runs(sweep_dir):
    folders = run_folders([sweep_dir])
    assert [p.name for p in folders] == ["cell-a-seed0", "cell-a-seed1", "cell-a-seed2", "cell-b-seed0"]
    again = run_folders([sweep_dir / sweep.RUNS_DIR / "cell-b-seed0", sweep_dir])  # each once, as first named
    assert [p.name for p in again] == ["cell-b-seed0", "cell-a-seed0", "cell-a-seed1", "cell-a-seed2"]
    with pytest.raises(ValueError, match="neither a run folder"):
        run_folders([sweep_dir / "nothing"])
    with pytest.raises(ValueError, match="a list"):
        run_folders(str(sweep_dir))


def test_comparison_sections_and_file(seen, sweep_dir, tmp_path):
    assert [s.id for s in seen.sections] == list(COMPARE_SECTION_IDS)
    assert len(seen.runs) == 4 and "4 runs" in repr(seen)
    path = seen.save()
    assert path == sweep_dir / COMPARE_FILE and path.read_text(encoding="utf-8") == seen.html
    assert not network_references(seen.html)
    data = seen.to_dict()
    assert {k for r in data["runs"] for k in r["config"]} == {"train.seed", "train.lr"}


def test_verdicts_name_each_runs_mechanism_and_what_differs(seen):
    body = seen.section("verdicts").body()
    for r in seen.runs:
        row = re.search(rf"<tr><td>{re.escape(r.label)}</td>(.*?)</tr>", body).group(1)
        assert f"<td>{r.mechanism.mechanism}" in row
        assert f"{len(r.mechanism.graph.kept)} of {len(r.mechanism.graph.edges)}" in row
    assert "<th>train.lr</th>" in body and "<th>train.seed</th>" in body


def test_edges_table_is_each_runs_kept_set(seen):
    body = seen.section("edges").body()
    names = re.findall(r'<th class="edge">(.*?)</th>', body)
    kept_anywhere = {e.name.replace(">", "&gt;") for r in seen.runs for e in r.mechanism.graph.kept}
    assert set(names) == kept_anywhere
    for r in seen.runs:
        row = re.search(rf"<tr><th>{re.escape(r.label)}</th>(.*?)</tr>", body).group(1)
        cells = re.findall(r'<td class="(kept|absent)">', row)
        shown = {n for n, c in zip(names, cells) if c == "kept"}
        assert shown == {e.name.replace(">", "&gt;") for e in r.mechanism.graph.kept}, r.label


def test_head_scores_figure_draws_each_runs_excess(seen):
    fig = compare_module.head_scores_figure(seen.runs)
    for ax, kind in zip(fig.axes[:2], ("previous_token", "induction")):
        grid = np.asarray(ax.images[0].get_array(), dtype=float)
        expected = np.stack([r.mechanism.attention.excess(kind).flatten().numpy() for r in seen.runs])
        np.testing.assert_allclose(grid, expected, rtol=1e-6, atol=1e-7)


def test_seeds_of_one_config_are_grouped_and_drawn(seen):
    groups = seed_groups(seen.runs)
    assert [[r.label for r in g] for g in groups] == [["cell-a-seed0", "cell-a-seed1", "cell-a-seed2"]]
    fig = compare_module.seed_distribution_figure(groups, ["A"])
    loss_panel = fig.axes[0]
    expected = [r.mechanism.eval_loss - r.refs().entropy_rate for r in groups[0]]
    np.testing.assert_allclose(loss_panel.lines[0].get_ydata(), expected)
    kept_panel = fig.axes[1]
    assert list(kept_panel.lines[0].get_ydata()) == [len(r.mechanism.graph.kept) for r in groups[0]]
    assert "config A" in seen.section("seeds").body()


def test_runs_of_different_configs_have_no_distribution(sweep_dir):
    folders = run_folders([sweep_dir])
    two = report.compare([folders[0], folders[3]], n_sequences=8, device="cpu")
    assert "no distribution over seeds" in two.section("seeds").body()
    with pytest.raises(ValueError, match="pass the path"):
        two.save()


def test_loss_overlay_draws_every_runs_curve_and_the_references(seen):
    fig = compare_module.loss_overlay_figure(seen.runs)
    labels = [line.get_label() for line in fig.axes[0].lines]
    assert [r.label for r in seen.runs] == labels[:4]
    for r, line in zip(seen.runs, fig.axes[0].lines):
        assert list(line.get_ydata()) == [row["eval_loss"] for row in r.metrics if "eval_loss" in row]
    assert any(label.startswith("entropy rate") for label in labels[4:])
    legend = fig.axes[0].get_legend()
    assert legend.get_bbox_to_anchor().x0 > fig.axes[0].get_window_extent().x1 - 1  # outside the data


def test_cli_compares_runs_and_sweeps(sweep_dir, tmp_path, capsys):
    a, b = run_folders([sweep_dir])[:2]
    assert cli_main(["report", str(a), str(b), "--n-sequences", "8", "--device", "cpu"]) == 2
    assert "needs --out" in capsys.readouterr().err
    out = tmp_path / "two.html"
    assert cli_main(["report", str(a), str(b), "--out", str(out), "--n-sequences", "8", "--device", "cpu"]) == 0
    assert "2 runs" in capsys.readouterr().out and "Verdicts side by side" in out.read_text(encoding="utf-8")
