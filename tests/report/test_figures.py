"""The landscape's figures (markov_interp.report.figures) and the dynamics figures of the experiments
(markov_interp.experiments) draw the data they are given; the reproduction's: tests/experiments/test_paper.py."""

import subprocess
import sys
import warnings

import numpy as np
import pytest
from matplotlib.colors import to_hex

from markov_interp import experiments, report
from markov_interp.report import figures


def test_landscape_figures_draw_the_maps_and_the_theory():
    from markov_interp import landscape

    rmap = landscape.regime_map_pq(e0=0.1, w0=0.1, n=6)
    ax = figures.regime_map_pq_figure(rmap).axes[0]
    mesh = ax.collections[0].get_array().reshape(6, 6)
    np.testing.assert_array_equal(np.asarray(mesh) > 0.5, rmap.bigram)
    init = landscape.regime_map_init(p=0.5, q=0.8, n_w=7, n_e=5, b0=None)
    ax = figures.regime_map_init_figure(init).axes[0]
    sep = [line for line in ax.lines if line.get_label() == "separatrix E = -h*"][0]
    np.testing.assert_allclose(sep.get_ydata(), landscape.separatrix(sep.get_xdata()))
    with pytest.raises(ValueError, match="kind 'init'"):
        figures.regime_map_init_figure(rmap)
    with pytest.raises(ValueError, match="n must be"):
        figures.landscape_figure(p=0.5, q=0.8, n=1)
    with pytest.raises(ValueError, match="p must be"):
        figures.landscape_figure(p=1.5, q=0.8, n=5)


def test_survival_figure_draws_each_curve_with_its_band_where_it_has_one():
    from markov_interp.dynamics import StepInterval, survival

    escaped = survival([StepInterval(t - 10, t) for t in (100, 200, 300, 300, 310)])
    censored = survival([StepInterval(140, 150), StepInterval(400, None), StepInterval(400, None)])
    fig = experiments.escape_survival_figure({"depth": {"1 layer": escaped, "fp16": censored}}, budget=400)
    ax = fig.axes[0]
    ends = [line.get_ydata()[-1] for line in ax.lines]
    assert ends[0] == pytest.approx(0.0) and ends[1] == pytest.approx(2 / 3)  # censored seeds keep the curve up
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["1 layer (n = 5)", "fp16 (n = 3)"]
    assert len(ax.collections) == 1  # a band for five runs, none for three


def test_crossing_and_excess_curve_figures_draw_every_line_and_condition():
    from markov_interp import dynamics

    def run(left):
        return dynamics.run_dynamics(dynamics.ExcessCurve((10, 20, 30, 40), tuple(0.1 * x for x in left), (0.1,) * 4))

    free = dynamics.condition([run([1.0, 0.6, 0.3, 0.1]), run([1.0, 0.8, 0.2, 0.1])])
    clamped = dynamics.condition([run([1.0, 0.7, 0.6, 0.6]), run([1.0, float("nan"), 0.6, 0.5])])
    fig = experiments.crossing_survival_figure({"free": free.survival, "clamped": clamped.survival}, budget=40)
    assert [ax.get_title() for ax in fig.axes] == [f"crossing {f:g} of the plateau excess left"
                                                  for f in dynamics.FRACTIONS]
    assert len(fig.axes[0].lines) == 2
    fig = experiments.excess_curves_figure({"free": free.curve, "clamped": clamped.curve})
    ax = fig.axes[0]
    medians = [line for line in ax.lines if "median" in line.get_label()]
    assert [list(line.get_ydata()) for line in medians][0] == pytest.approx([1.0, 0.7, 0.25, 0.1])
    assert len(ax.collections) == 2 and sum(line.get_linestyle() == ":" for line in ax.lines) == 4


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="has no attribute 'no_such_figure'"):
        figures.no_such_figure  # noqa: B018
    with pytest.raises(AttributeError, match="has no attribute 'no_such_figure'"):
        report.no_such_figure  # noqa: B018
    with pytest.raises(AttributeError, match="has no attribute 'no_such_figure'"):
        experiments.no_such_figure  # noqa: B018


def test_every_experiment_figure_name_resolves_to_its_module():
    for name, module in experiments._FIGURES.items():
        assert getattr(experiments, name) is getattr(__import__(f"markov_interp.experiments.{module}",
                                                                fromlist=[name]), name)
        assert name in experiments.__all__


def _imported_after(statement: str) -> set[str]:
    code = f"import sys\n{statement}\nprint('\\n'.join(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(done.stdout.split())


def test_importing_the_report_imports_no_experiment():
    """No arrow up: the report sits left of the experiments, the paper's reproduction among them
    (architecture.md)."""
    loaded = _imported_after("import markov_interp.report; from markov_interp.report import figures")
    assert "markov_interp.report.figures" in loaded  # the check sees the report's modules
    assert not {m for m in loaded if m.startswith("markov_interp.experiments")}


def test_importing_the_experiments_imports_no_matplotlib():
    """Their figures are loaded on first use, so listing or running experiments from the CLI imports none."""
    loaded = _imported_after("import markov_interp.experiments")
    assert "markov_interp.experiments._base" in loaded
    assert not {m for m in loaded if m.startswith(("matplotlib", "markov_interp.experiments._figures"))}
