"""The clamp factorial (`experiments.factorial`): its cells, arms, budgets, and one tiny run end to end."""

import json

import pytest
import torch

from markov_interp import experiments
from markov_interp.experiments import factorial
from markov_interp.models import heads_per_layer


def test_cells_vary_only_layer1_heads_and_the_data():
    budget = factorial.FULL
    one, two = factorial.cell_base(budget, "dirichlet", 1), factorial.cell_base(budget, "zero-diagonal", 2)
    assert one.model.heads_per_layer == (1, 1) and two.model.heads_per_layer == (1, 2)
    assert one.model.d_head == two.model.d_head == budget.d_head  # a second head adds width, not a split
    assert not one.source.zero_diagonal and two.source.zero_diagonal
    assert one.train == two.train and one.model.replace(n_heads=(1, 2)) == two.model
    tokens = two.source.build().sample(8, 32, torch.Generator().manual_seed(0))
    assert (tokens[:, 1:] != tokens[:, :-1]).all()  # the zero-diagonal cell's data never repeat a state


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
    ({"d_head": 0}, "d_head")])
def test_bad_budgets_are_refused(change, match):
    with pytest.raises(ValueError, match=match):
        factorial.QUICK.replace(**change)


def test_registered_with_a_quick_budget_that_says_what_it_cuts():
    experiment = experiments.get("factorial")
    assert experiment.budgets["quick"].arms == ("free", "clamped") and "150 steps" in experiment.budgets["quick"].cuts
    assert experiment.budgets["full"].seeds == 16 and experiment.budgets["full"].arms == factorial.ARMS


@pytest.mark.slow  # ~45 s on 2 loaded cores: six small stacks, scored at the end
def test_a_tiny_factorial_runs_scores_every_head_and_writes_its_summary(tmp_path):
    budget = factorial.QUICK.replace(name="tiny", seeds=2, steps=4, heads=(2,), data=("zero-diagonal",),
                                     arms=("free", "clamped", "head-start"), eval_every=2, eval_batches=1,
                                     cuts="a test")
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


def test_hooked_models_of_a_cell_have_the_heads_the_config_says():
    from markov_interp.models import build

    model = build(factorial.cell_base(factorial.QUICK, "dirichlet", 2).model, seed=0)
    assert heads_per_layer(model) == (1, 2)
