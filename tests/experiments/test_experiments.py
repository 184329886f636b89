"""experiments: the three intervention experiments of issue 14, on tiny budgets (the code path, not the science:
docs/reproduction/interventions/ holds the 16-seed results). The shared budget / summary path and the registry:
tests/experiments/test_experiment_path.py."""

import dataclasses
import json

import pytest

from markov_interp import experiments as registry
from markov_interp import clamps
from markov_interp.experiments import interventions as experiments

@pytest.mark.parametrize("name", experiments.EXPERIMENTS)
def test_every_arm_is_a_valid_run_whose_first_arm_is_free(name):
    base, arms = experiments.experiment_arms(name, experiments.FULL)
    assert arms[0].name == "free" and arms[0].interventions == ()
    assert len(arms) >= 2 and all(arm.interventions for arm in arms[1:])
    for arm in arms[1:]:
        run = dataclasses.replace(base, train=dataclasses.replace(base.train, interventions=arm.interventions))
        items = run.train.interventions
        assert all(isinstance(i, (clamps.Freeze, clamps.Clamp)) for i in items)
        clamps.check_interventions(items, run.model)  # names valid for this model
    assert experiments.FULL.seeds >= 16


def test_unknown_experiment_lists_the_valid_ones():
    with pytest.raises(ValueError, match="previous-token-clamp"):
        experiments.experiment_arms("no-such-experiment", experiments.FULL)


@pytest.mark.slow
def test_experiments_run_share_the_free_arm_and_write_their_summary(tmp_path):
    code = registry.main(["--only", "interventions", "--out", str(tmp_path), "--quick", "--n-seeds", "2",
                          "--set", "parts=previous-token-clamp,reader-frozen"])
    assert code == 0
    out = tmp_path / "interventions"
    # experiments 1 and 2 share the random-kernel task's free arm: trained once
    task = out / "runs" / "random-kernels"
    assert sorted(p.name for p in task.iterdir()) == sorted(
        ["free", "free-prefix", "layer-0-clamped-to-previous-token", "layer-0-clamped-to-previous-token-until-20",
         "layer-1-frozen-until-20", "layer-1-frozen-until-20-prefix", "layer-1-frozen-throughout",
         "layer-1-frozen-throughout-prefix"])
    written = json.loads((out / "results.json").read_text())
    assert written["budget"]["seeds"] == 2 and written["budget"]["parts"] == ["previous-token-clamp", "reader-frozen"]
    assert written["provenance"]["command"].startswith("python -m markov_interp.experiments --only interventions")
    data = written["result"]
    assert set(data) == {"previous-token-clamp", "reader-frozen"}
    clamp = data["previous-token-clamp"]["arms"]
    assert set(clamp) == {"free", "layer 0 clamped to previous-token", "layer 0 clamped to previous-token until 20"}
    assert clamp["layer 0 clamped to previous-token until 20"]["interventions"][0]["end"] == 20
    free, clamped = clamp["free"], clamp["layer 0 clamped to previous-token"]
    assert len(free["escape_steps"]) == 2 and "logrank_p" in clamped and "logrank_p" not in free
    assert clamped["interventions"][0]["value"] == "previous_token"
    back = registry.load(out).result.to_json()  # read back, no training: the same statistics
    assert json.dumps(back, sort_keys=True, default=list) == json.dumps(data, sort_keys=True)
    assert free["final_eval_loss"] != clamped["final_eval_loss"]  # the clamp changes training
    # scores at the end are measured under the arm's clamps: a clamped layer 0 is a perfect previous-token head
    assert clamped["at_end"]["previous_token"] == pytest.approx([1.0, 1.0], abs=1e-6)
    assert max(free["at_end"]["previous_token"]) < 0.9  # 60 steps do not make one
    assert free["at_release"] is None and free["at_end"]["step"] == 60
    frozen = data["reader-frozen"]["arms"]["layer 1 frozen until 20"]["at_release"]
    assert len(frozen["previous_token"]) == 2 and frozen["step"] == 20
    assert 0.0 <= min(frozen["previous_token"]) <= max(frozen["previous_token"]) <= 1.0
    summary = (out / "summary.md").read_text()
    assert summary.startswith("# Interventions during training (quick)")
    assert "log-rank p" in summary and "after 20 updates: layer 0 previous-token" in summary
    assert "4 seeds, 60 steps" in summary  # the quick budget's cuts
    for name in ("curves-previous-token-clamp.png", "crossings-reader-frozen.png"):
        assert (out / name).stat().st_size > 10_000
    assert (out / "survival.png").stat().st_size > 10_000
    # a rerun loads the finished run folders and gives the same numbers
    again = experiments.run_experiment("previous-token-clamp", dataclasses.replace(experiments.QUICK, seeds=2), out)
    assert [a.final_losses for a in again.arms[:2]] == [tuple(free["final_eval_loss"]),
                                                        tuple(clamped["final_eval_loss"])]


@pytest.mark.parametrize("change, match", [({"seeds": 1}, "at least 2"), ({"release": 600}, "release"),
                                           ({"chain_steps": 0}, "chain_steps"), ({"eval_every": 0}, "eval_every"),
                                           ({"parts": ("reader-frozen", "nope")}, "nope"), ({"parts": ()}, "parts")])
def test_bad_budgets_are_refused(change, match):
    with pytest.raises(ValueError, match=match):
        experiments.FULL.replace(**change)
