"""The report's panel that sets a sweep run against its condition (`report._condition`): the sentence, the
figure, and the section of a real sweep run's report."""

import dataclasses

import pytest

from markov_interp import dynamics, sweep


def test_condition_sentence_from_a_hand_made_distribution(tmp_path):
    from markov_interp.report._condition import ConditionEscapes, condition_escapes

    escapes = [dynamics.StepInterval(90, 100), dynamics.StepInterval(190, 200), dynamics.StepInterval(290, 300),
               dynamics.StepInterval(390, None)]
    s = dynamics.survival(escapes)
    # Kaplan-Meier by hand: S = 3/4 after 100, 2/4 after 200 -> the median is in (190, 200]; 4 seeds: no interval
    assert s.median().estimate == dynamics.StepInterval(190, 200)
    found = ConditionEscapes(sweep_dir=tmp_path, sweep_name="x", cell_id="c", escape=escapes[2], summary=s,
                             budget=400)
    text = found.sentence()
    assert text.startswith("escaped in (290, 300]; the condition's median escape is (190, 200] (no interval: 4 runs")
    assert text.endswith("over 4 seeds, 1 censored")
    censored = dataclasses.replace(found, escape=escapes[3]).sentence()
    assert censored.startswith("no confirmed escape (censored after step 390 of 400)")
    # a run folder outside a sweep (no <sweep>/results.csv beside runs/) has no panel
    (tmp_path / "runs" / "abc").mkdir(parents=True)
    assert condition_escapes(tmp_path / "runs" / "abc") is None


@pytest.mark.slow
def test_report_panel_for_a_sweep_run(tmp_path):
    from markov_interp import report
    from markov_interp.report._condition import condition_escapes

    spec = sweep.SweepSpec(name="tiny", base={
        "source": {"kind": "binary", "p": 0.5, "q": 0.8}, "model": {"preset": "paper-1layer", "n_ctx": 32},
        "train": {"steps": 12, "seq_len": 32, "eval_every": 3, "n_checkpoints": 0, "eval_batches": 1}},
        grid={"source.q": [0.3, 0.8]}, seeds=(0, 1, 2), probe=False)
    result = sweep.run(spec, tmp_path / "sw", workers=1, group=3, progress=False)
    assert result.n_failed == 0
    row = next(r for r in result.rows if r.params["source.q"] == 0.8 and r.params["seed"] == 1)
    run_dir = tmp_path / "sw" / row.run_dir
    found = condition_escapes(run_dir)
    # the condition is the three seeds of q = 0.8, not the q = 0.3 cells
    same = [r for r in result.rows if r.params["source.q"] == 0.8]
    assert found.summary.n == 3 and found.summary.n_censored == sum(r.result.censored for r in same)
    assert found.escape == row.result.crossing() and found.escape.censored == row.result.censored
    assert found.budget == 12
    built = report.build(run_dir, n_sequences=4, max_checkpoints=2)
    section = built.section("condition")
    assert found.sentence() in section.parts[0].replace("&#x27;", "'").replace("&gt;", ">")
    assert "condition" in built.html and "Escape time against its condition" in built.html


def test_run_escape_figure_marks_the_run_on_its_condition_curve():
    from markov_interp.report import figures

    escapes = [dynamics.StepInterval(s - 10, s) for s in (100, 200, 300)] + [dynamics.StepInterval(390, None)]
    curve = dynamics.survival(escapes)
    ax = figures.run_escape_figure(curve, budget=400, crossing=escapes[1]).axes[0]
    marker = [line for line in ax.lines if line.get_label().startswith("this run")]
    assert len(marker) == 1 and marker[0].get_label() == "this run: escaped in (190, 200]"
    assert list(marker[0].get_xdata()) == [200] and list(marker[0].get_ydata()) == [pytest.approx(0.5)]
    ax = figures.run_escape_figure(curve, budget=400, crossing=escapes[3]).axes[0]
    assert any("censored after step 390" in line.get_label() for line in ax.lines)
