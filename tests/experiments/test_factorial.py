"""The clamp factorial (`experiments.factorial`): its cells, arms, budgets, and one tiny run end to end."""

import dataclasses
import json
import math

import pytest
import torch

from markov_interp import clamps, dynamics, experiments, probes
from markov_interp.sources import RandomMarkov
from markov_interp.experiments import _arms, factorial
from markov_interp.models import build, heads_per_layer
from markov_interp.experiments import _figures_factorial as figures  # scores over training (was report.figures)
from markov_interp.training import checkpoint_steps
from tests.handbuilt import induction_circuit, intended_induction_edges

_CLAMP0 = ({"clamp": "blocks.0.attn.hook_pattern", "value": "previous_token"},)

# a single edge is measured in one pass that moves the residual stream by the sender's change and takes it out
# again (`probes.paths`): an edge that changes nothing measures floating-point rounding, not exactly 0 (nats)
ROUNDING = 1e-9


def test_cells_vary_only_layer1_heads_and_the_data():
    budget = factorial.FULL
    one, two = factorial.cell_base(budget, "dirichlet", 1), factorial.cell_base(budget, "zero-diagonal", 2)
    assert one.model.heads_per_layer == (1, 1) and two.model.heads_per_layer == (1, 2)
    assert one.model.d_head == two.model.d_head == budget.d_head  # a second head adds width, not a split
    assert not one.source.zero_diagonal and two.source.zero_diagonal
    assert one.train == two.train and one.model.replace(n_heads=(1, 2)) == two.model
    tokens = two.source.build().sample(8, 32, torch.Generator().manual_seed(0))
    assert (tokens[:, 1:] != tokens[:, :-1]).all()  # the zero-diagonal cell's data never repeat a state


def test_recipes_cross_the_factors_and_change_only_what_they_name():
    budget = factorial.RECIPES
    cells = factorial.cells_of(budget)
    assert len(cells) == len(budget.heads) * 8 and len({(h, r) for _, h, r in cells}) == len(cells)
    package = factorial.Recipe()
    assert factorial.recipes(budget)[0] == package and package.suffix == ""  # the package's recipe first
    base = factorial.cell_base(budget, "dirichlet", 1)
    assert base == factorial.cell_base(budget, "dirichlet", 1, package)
    other = factorial.cell_base(budget, "dirichlet", 1, factorial.Recipe("plain", "uniform", "none"))
    assert factorial.Recipe("plain", "uniform", "none").suffix == "-plain-uniform-noLN"
    assert (other.model.init, other.model.normalization, other.source.initial) == ("plain", None, "uniform")
    assert other.model.replace(init="standard", normalization="LN") == base.model
    assert other.source.replace(initial="stationary") == base.source and other.train == base.train
    tokens = other.source.build().sample(4000, 2, torch.Generator().manual_seed(0))
    assert abs((tokens[:, 0] == 0).float().mean().item() - 1 / 3) < 0.03  # the uniform first state
    with pytest.raises(ValueError, match="norms"):
        factorial.FULL.replace(norms=("LN", "RMS"))


def test_arms_change_what_their_names_say():
    arms = {a.name: a for a in factorial.cell_arms(factorial.FULL)}
    assert list(arms) == list(factorial.ARMS) and arms["free"].interventions == () and arms["free"].model == ()
    assert arms["clamped"].interventions[0]["value"] == "previous_token"
    assert arms["mixed"].interventions[0]["value"] == "mixed"
    assert dict(arms["head-start"].model) == {"init_attention": "previous_token"}
    assert not arms["head-start"].interventions
    assert dict(arms["position-code"].model) == {"init_attention": "position_code"}


@pytest.mark.parametrize("change, match", [
    ({"arms": ("clamped", "free")}, "must start with 'free'"), ({"arms": ("free", "nope")}, "nope"),
    ({"data": ("dirichlet", "uniform")}, "uniform"), ({"heads": (2, 2)}, "repeat"), ({"seeds": 1}, "at least 2"),
    ({"d_head": 0}, "d_head"), ({"discovered": 6}, "discovered"), ({"score_checkpoints": -1}, "score_checkpoints")])
def test_bad_budgets_are_refused(change, match):
    with pytest.raises(ValueError, match=match):
        factorial.QUICK.replace(**change)


def test_registered_with_a_quick_budget_that_says_what_it_cuts():
    experiment = experiments.get("factorial")
    assert experiment.budgets["quick"].arms == ("free", "clamped") and "150 steps" in experiment.budgets["quick"].cuts
    assert experiment.budgets["full"].seeds == 16 and experiment.budgets["full"].arms == factorial.ARMS


@pytest.mark.slow  # ~20 s on 2 loaded cores: six small stacks, scored at 3 checkpoints, one circuit per arm
def test_a_tiny_factorial_runs_scores_every_head_and_writes_its_summary(tmp_path):
    budget = factorial.QUICK.replace(name="tiny", seeds=2, steps=4, heads=(2,), data=("zero-diagonal",),
                                     arms=("free", "clamped", "head-start"), eval_every=2, eval_batches=1,
                                     score_checkpoints=3, discovered=1, cuts="a test")
    done = experiments.run(experiments.get("factorial"), tmp_path, budget=budget)
    (cell,) = done.result.cells
    assert cell.name == "zero-diagonal-h2" and [a.arm.name for a in cell.arms] == ["free", "clamped", "head-start"]
    free, clamped, start = cell.arms
    # layer 1 has two heads here: the scores read only present heads, so none is NaN
    for arm in cell.arms:
        for values in (arm.at_end.previous_token, arm.at_end.induction, arm.at_end.same_token):
            assert len(values) == 2 and all(0.0 <= v <= 1.0 for v in values)
    assert clamped.at_end.previous_token == pytest.approx((1.0, 1.0), abs=1e-6)  # probed under its clamp
    assert min(start.at_end.previous_token) > max(free.at_end.previous_token)  # 4 steps keep the head start
    assert free.against_free is None and clamped.against_free is not None
    data = json.loads((tmp_path / "results.json").read_text())["result"]["zero-diagonal-h2"]["arms"]
    assert data["head-start"]["model"] == {"init_attention": "previous_token"}
    assert len(data["free"]["curves"]) == 2 and data["free"]["at_end"]["same_token"]
    assert (tmp_path / "overview.csv").read_text().splitlines()[0].startswith("cell,arm,")
    assert "## Overview" in (tmp_path / "summary.md").read_text()
    trained = tmp_path / "runs" / "zero-diagonal-h2"
    assert sorted(p.name for p in trained.iterdir()) == ["clamped", "free", "head-start"]
    _check_scores_over_training(cell, data, budget)
    _check_discovered_circuits(cell, data)
    summary = (tmp_path / "summary.md").read_text()
    assert "zero-diagonal-h2: attention scores over training" in summary and "| step 4 |" in summary
    assert "zero-diagonal-h2: circuits discovered at the end" in summary
    assert (tmp_path / "scores-zero-diagonal-h2.png").stat().st_size > 0
    # read back with no training (`experiments.load`): the same statistics from the recorded curves and scores
    back = experiments.load(tmp_path).result.to_json()["zero-diagonal-h2"]["arms"]
    for name, arm in data.items():
        mine = json.dumps({k: v for k, v in back[name].items() if k != "circuits"}, sort_keys=True, default=list)
        assert mine == json.dumps({k: v for k, v in arm.items() if k != "circuits"}, sort_keys=True), name


def _check_scores_over_training(cell, data, budget):
    """Scores at every checkpoint step; the last is the end-of-run score (`circuit_scores_at_end`)."""
    free, clamped, start = cell.arms
    for arm in cell.arms:
        assert [x.step for x in arm.over_training] == checkpoint_steps(budget.steps, budget.score_checkpoints)
        for x in arm.over_training:
            for values in (x.previous_token, x.induction, x.same_token):
                assert len(values) == budget.seeds and all(0.0 <= v <= 1.0 for v in values)
            lo, hi = x.induction_interval
            assert lo <= x.induction_mean <= hi
        last, end = dataclasses.asdict(arm.over_training[-1]), dataclasses.asdict(arm.at_end)
        assert last.keys() == end.keys()
        for key in last:
            assert last[key] == pytest.approx(end[key], abs=1e-6, nan_ok=True), key
        assert len(data[arm.arm.name]["over_training"]) == budget.score_checkpoints
    for x in clamped.over_training:  # read back from each checkpoint and probed under its clamp
        assert x.previous_token == pytest.approx((1.0, 1.0), abs=1e-6)
    assert start.over_training[0].previous_token_mean > free.over_training[0].previous_token_mean


def _check_discovered_circuits(cell, data):
    """One seed's circuit per arm (`discovered=1`); under the clamp layer 0's queries and keys carry nothing."""
    for arm in cell.arms:
        ((seed, graph),) = arm.circuits
        assert seed == 0 and graph.kept and 0.0 < graph.faithfulness <= 1.5
        stored = data[arm.arm.name]["circuits"]
        assert [c["run_seed"] for c in stored] == [0] and stored[0]["kept"] == list(graph.kept_names)
    (_, clamped), (_, free) = cell.arms[1].circuits[0], cell.arms[0].circuits[0]
    into_l0 = [e for e in clamped.edges if e.receiver == "L0H0" and e.input in ("q", "k")]
    # the token pass's gradient estimate has no value for a 'pos' sender (positions are not corrupted there): NaN
    assert into_l0 and all(abs(e.effect) <= ROUNDING and (e.attribution == 0.0 or (e.sender == "pos" and math.isnan(
        e.attribution))) for e in into_l0)
    assert any(abs(e.effect) > 1e-7 for e in free.edges if e.receiver == "L0H0" and e.input in ("q", "k"))


def test_hooked_models_of_a_cell_have_the_heads_the_config_says():
    from markov_interp.models import build

    model = build(factorial.cell_base(factorial.QUICK, "dirichlet", 2).model, seed=0)
    assert heads_per_layer(model) == (1, 2)


def test_budget_sets_the_checkpoints_scored_and_over_training_scores_need_run_folders():
    assert factorial.cell_base(factorial.FULL, "dirichlet", 1).train.n_checkpoints == factorial.FULL.score_checkpoints
    none = factorial.QUICK.replace(score_checkpoints=0, discovered=0)
    assert factorial.cell_base(none, "dirichlet", 1).train.n_checkpoints == 0
    base = factorial.cell_base(factorial.QUICK, "dirichlet", 1)
    with pytest.raises(ValueError, match="out_dir"):  # refused before any training
        _arms.run_arms("x", base, factorial.cell_arms(factorial.QUICK), factorial.QUICK, None, task="x",
                       over_training=True)


def test_discovery_under_a_clamp_gives_layer_0_queries_and_keys_nothing():
    """The factorial discovers clamped arms' circuits under their clamp: a random model's layer-0 Q/K edges
    matter a little free and nothing clamped (up to `ROUNDING`; their gradient estimate exactly 0), and a hand-built induction
    circuit whose layer 0 already is a previous-token head keeps its intended edges under the same clamp."""
    model = build(factorial.cell_base(factorial.QUICK, "dirichlet", 1).model, seed=0)
    source = RandomMarkov(3)
    free = probes.discover_circuit(model, source, seq_len=32, n_sequences=16)
    with clamps.applied(model, _CLAMP0, 0):
        clamped = probes.discover_circuit(model, source, seq_len=32, n_sequences=16)
    qk = [e.name for e in free.edges if e.receiver == "L0H0" and e.input in ("q", "k")]
    assert qk and any(abs(free.edge(n).effect) > 1e-7 for n in qk)
    assert all(abs(clamped.edge(n).effect) <= ROUNDING and abs(clamped.edge(n).position_effect) <= ROUNDING
               for n in qk)  # both passes
    # the gradient estimate is of the token pass, whose corruption leaves "pos" alone (NaN: not estimated)
    assert all(clamped.edge(n).attribution == 0.0 for n in qk if n.startswith("embed"))
    hand = induction_circuit(3, n_ctx=32)
    with clamps.applied(hand, _CLAMP0, 0):
        graph = probes.discover_circuit(hand, source, seq_len=32, n_sequences=16)
    # (with the induction head's position read where the |effect| rule keeps it: it pushes key 0 away)
    extra = set(graph.kept_names) - intended_induction_edges(1, prev={1: ["L0H0"]}, induction=("L1H0",))
    assert set(graph.kept_names) >= intended_induction_edges(1, prev={1: ["L0H0"]}, induction=("L1H0",))
    assert extra <= {"pos->L1H0.k"} and all(abs(graph.edge(e).position_effect) >= graph.position.threshold
                                           for e in extra)


def _scores(step, prev, ind, same):
    def around(v):
        return (v - 0.05, v + 0.05)
    return _arms.CircuitScores(
        step=step, previous_token=(prev,), previous_token_mean=prev, previous_token_interval=around(prev),
        induction=(ind,), induction_mean=ind, induction_interval=around(ind), previous_token_chance=0.1,
        induction_chance=0.4, same_token=(same,), same_token_mean=same, same_token_interval=around(same),
        same_token_chance=0.4)


def test_scores_over_training_figure_draws_one_line_per_arm_and_score():
    arms = {"free": [_scores(s, 0.1 + 0.1 * i, 0.4, 0.4) for i, s in enumerate((1, 10, 100))],
            "clamped": [_scores(s, 1.0, 0.4 - 0.1 * i, 0.5) for i, s in enumerate((1, 10, 100))]}
    fig = figures.scores_over_training_figure(arms, title="cell")
    axes = fig.axes
    assert len(axes) == 3 and [ax.get_title() for ax in axes] == list(figures.SCORES_OVER_TRAINING.values())
    prev = {line.get_label(): list(line.get_ydata()) for line in axes[0].get_lines()}
    assert prev["free"] == pytest.approx([0.1, 0.2, 0.3]) and prev["clamped"] == [1.0, 1.0, 1.0]
    assert list(axes[1].get_lines()[1].get_xdata()) == [1, 10, 100] and axes[1].get_xscale() == "log"
    assert math.isclose(axes[2].get_lines()[-1].get_ydata()[0], 0.4)  # the chance line
    with pytest.raises(ValueError, match="CircuitScores"):
        figures.scores_over_training_figure({"free": [{"step": 1}]})


def _results(n, failed=(), out_dir=None):
    """`TrainResult`s of untrained cell models (seed k: model seed k), runs `failed` marked diverged."""
    from markov_interp.theory import ReferenceLosses
    from markov_interp.training import FinalLosses, TrainResult

    run = factorial.cell_base(factorial.QUICK, "dirichlet", 1)
    final = FinalLosses(step=0, eval_loss=math.nan, train_loss=math.nan,
                        references=ReferenceLosses(entropy_rate=math.nan, unigram_loss=math.nan))
    return [TrainResult(model=None if k in failed else build(run.model, seed=k), metrics=[], final=final,
                        config=run.replace(train=run.train.replace(seed=k)), out_dir=out_dir,
                        failed="diverged at step 3: test" if k in failed else None) for k in range(n)]


def test_discovery_reads_the_first_finished_seeds_and_scores_at_a_step_need_its_checkpoint(tmp_path):
    found = _arms.discovered_circuits(_results(4, failed=(1,)), 2)
    assert [seed for seed, _ in found] == [0, 2] and all(g.seed == 10_000 + seed for seed, g in found)
    assert _arms.discovered_circuits(_results(2, failed=(0, 1)), 2) == ()
    with pytest.raises(ValueError, match="no checkpoint of step 5"):
        _arms.circuit_scores_at(_results(1, out_dir=tmp_path), 5)
    with pytest.raises(ValueError, match="no run folder"):
        _arms.circuit_scores_at(_results(1), 5)
    assert _arms.circuit_scores_over_training(_results(2)) == ()  # no run folders: nothing to read


def _runs(escape_steps):
    """Runs whose excess fraction falls from 1 to 0.1 at `step` (evaluated every 10 steps up to 600)."""
    steps = tuple(range(10, 601, 10))
    return [dynamics.run_dynamics(dynamics.ExcessCurve(steps, tuple(0.1 if s >= e else 1.0 for s in steps),
                                                       tuple(1.0 for _ in steps))) for e in escape_steps]


@pytest.mark.parametrize("free, clamped, effect", [
    ((100, 110, 120, 130, 140, 150), (300, 320, 340, 360, 380, 400), "slows"),
    ((300, 320, 340, 360, 380, 400), (100, 110, 120, 130, 140, 150), "speeds"),
    ((100, 200, 300, 400, 500, 150), (110, 190, 310, 390, 510, 160), "no clear effect"),
])
def test_clamp_effect_reads_the_comparison(free, clamped, effect):
    assert factorial.clamp_effect(dynamics.compare(_runs(free), _runs(clamped))) == effect
    assert factorial.clamp_effect(None) == "—"


@pytest.mark.parametrize("ratio, area, effect", [
    ((0.58, 0.89), (-79.1, 43.0), "no clear effect"),  # the ratio alone says faster: the old either-rule's "speeds"
    ((0.5, 4.4), (-119.0, -33.3), "no clear effect"),  # the area alone says faster
    ((2.2, None), (10.0, 30.0), "slows"),  # an open upper end does not stop a lower end above 1
    ((1.2, 2.0), (-50.0, -10.0), "mixed"),  # the two measures on opposite sides
    ((0.3, 0.6), (-90.0, -20.0), "speeds"),
    ((None, 0.9), None, "no clear effect"),  # no area interval: one measure alone names nothing
])
def test_clamp_effect_needs_both_measures_on_one_side(ratio, area, effect):
    base = dynamics.compare(_runs((100, 110, 120, 130, 140, 150)), _runs((100, 110, 120, 130, 140, 150)))
    half = dataclasses.replace(base.fractions[0.5], ratio_interval=ratio)
    comparison = dataclasses.replace(base, fractions={**base.fractions, 0.5: half},
                                     area=dataclasses.replace(base.area, interval=area))
    assert factorial.clamp_effect(comparison) == effect
