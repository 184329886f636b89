"""The shared arm loop (`experiments._arms`): what it does is decided by the arms and the source, never by an
experiment's name or a source's kind string. A cyclic source (in context, but with no `p` or `q`) is scored at the
end like a Dirichlet one and its run folders go where the experiment says; an arm asks for its own release score."""

import dataclasses

import pytest

from markov_interp.sources import SourceConfig
from markov_interp.experiments import Budget, _arms
from markov_interp.models import preset
from markov_interp.runs import RunConfig, TrainConfig

BUDGET = Budget(name="tiny", seeds=2, steps=6, cuts="2 seeds, 6 steps: the code path")


def _base(source: SourceConfig, *, n_checkpoints: int = 0) -> RunConfig:
    return RunConfig(source=source, model=preset("attn-only-2layer", n_ctx=24, d_vocab=source.vocab_size),
                     train=TrainConfig(steps=6, seq_len=24, batch_size=32, lr=1e-2, schedule="constant", eval_every=3,
                                       eval_batches=2, log_every=3, n_checkpoints=n_checkpoints, device="cpu"))


@pytest.mark.parametrize("source", [SourceConfig(kind="cyclic", vocab=3), SourceConfig(kind="random", vocab=3),
                                    SourceConfig(kind="binary", p=0.5, q=0.8)], ids=["cyclic", "random", "binary"])
def test_in_context_sources_are_scored_at_the_end_and_folders_follow_the_task(tmp_path, source):
    arms = [_arms.Arm("free"), _arms.Arm("pattern uniform", ({"clamp": "blocks.0.attn.hook_pattern",
                                                               "value": "uniform"},))]
    result = _arms.run_arms("x", _base(source), arms, BUDGET, tmp_path, task="my-task")
    folders = sorted(p.relative_to(tmp_path).as_posix() for p in (tmp_path / "runs").glob("*/*/*"))
    assert folders == ["runs/my-task/free/seed0", "runs/my-task/free/seed1", "runs/my-task/pattern-uniform/seed0",
                       "runs/my-task/pattern-uniform/seed1"]  # never chain-pNone-qNone
    assert source.in_context == source.build().in_context == (source.kind != "binary")
    for arm in result.arms:
        assert arm.failed == 0 and arm.at_release is None
        if source.in_context:
            assert arm.at_end is not None and arm.at_end.step == 6 and len(arm.at_end.induction) == 2
        else:
            assert arm.at_end is None
    clamped = result.arms[1].at_end
    if clamped is not None:  # scored under its clamp: layer 0 attends uniformly, a previous-token score at chance
        assert clamped.previous_token_mean == pytest.approx(clamped.previous_token_chance, abs=1e-6)


def test_an_arm_scored_at_its_release_trains_the_prefix_again():
    arms = [_arms.Arm("free", score_at_release=3), _arms.Arm("frozen", ({"freeze": "blocks.1.*", "end": 3},))]
    result = _arms.run_arms("x", _base(SourceConfig(kind="cyclic", vocab=3)), arms, BUDGET, None, task="t")
    free, frozen = result.arms
    assert free.at_release is not None and free.at_release.step == 3 and frozen.at_release is None
    assert free.at_end.step == 6 and len(free.at_release.previous_token) == 2
    # the prefix's scores are the scores of a 3-step run: the same arm trained for 3 steps alone
    short = _arms.run_arms("x", dataclasses.replace(_base(SourceConfig(kind="cyclic", vocab=3)),
                                                    train=_base(SourceConfig(kind="cyclic", vocab=3)).train.replace(
                                                        steps=3)),
                           [_arms.Arm("free")], BUDGET, None, task="t")
    assert short.arms[0].at_end.previous_token == free.at_release.previous_token
