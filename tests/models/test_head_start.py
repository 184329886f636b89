"""The attention head-start init (`ModelConfig.init_attention`): layer 0 starts as a previous-token head and is
trained freely."""

import json
import math

import pytest
import torch

from markov_interp import models, probes
from markov_interp.sources import RandomMarkov, SourceConfig
from markov_interp.models import initial_state, preset
from markov_interp.models.init import position_frequencies
from markov_interp.training import RunConfig, TrainConfig, train


def cfg_of(init_attention, **kw):
    return preset("attn-only-2layer", n_ctx=32, d_vocab=3, init_attention=init_attention, **kw)


def _scores(cfg, seed, tokens):
    return probes.attention_scores(models.build(cfg, seed=seed), tokens)


@pytest.mark.parametrize("heads", [1, (1, 2)])
def test_layer0_is_a_previous_token_head_at_step_0(heads):
    tokens = probes.sample_batch(RandomMarkov(3), n_sequences=32, seq_len=32, seed=3).tokens
    for seed in range(3):
        start = _scores(cfg_of("previous_token", n_heads=heads, d_head=16), seed, tokens)
        control = _scores(cfg_of("position_code", n_heads=heads, d_head=16), seed, tokens)
        assert float(start.previous_token[0, 0]) > 0.95
        # the control (same positions and embeddings, standard Q/K) and layer 1 stay at uniform attention's level
        assert abs(float(control.previous_token[0, 0]) - start.previous_token_chance) < 0.01
        assert abs(float(start.previous_token[1, 0]) - start.previous_token_chance) < 0.01


def test_only_positions_embeddings_and_layer0_qk_change():
    plain, start = initial_state(cfg_of(None), 4), initial_state(cfg_of("previous_token"), 4)
    code = initial_state(cfg_of("position_code"), 4)
    changed = {n for n in plain if not torch.equal(plain[n], start[n])}
    assert changed == {"pos_embed.weight", "embed.weight", "blocks.0.attn.q.weight", "blocks.0.attn.k.weight"}
    assert {n for n in plain if not torch.equal(plain[n], code[n])} == {"pos_embed.weight", "embed.weight"}
    assert torch.equal(start["pos_embed.weight"], code["pos_embed.weight"])
    # the code is centred (LayerNorm's centring leaves it) and the states are off its subspace
    pos = start["pos_embed.weight"]
    assert pos.sum(-1).abs().max() < 1e-5
    basis = torch.linalg.svd(pos, full_matrices=False).Vh[:6]
    assert (start["embed.weight"] @ basis.T).abs().max() < 1e-6
    # the rows of Q / K beyond the code keep their standard draws
    assert torch.equal(start["blocks.0.attn.q.weight"][6:], plain["blocks.0.attn.q.weight"][6:])


def test_frequencies_have_the_margin_they_claim():
    theta, margin = position_frequencies(32)
    lags = torch.tensor([m for m in range(-1, 32) if m != 0], dtype=torch.float64)
    angles = torch.outer(lags, torch.tensor(theta, dtype=torch.float64))
    assert margin == pytest.approx(3 - float(torch.cos(angles).sum(1).max()))
    assert margin > 1.5 and len(theta) == 3


def test_the_head_start_is_trained_not_clamped(tmp_path):
    run = RunConfig(source=SourceConfig(kind="random", vocab=3),
                    model=cfg_of("previous_token"),
                    train=TrainConfig(steps=20, seq_len=32, batch_size=16, lr=1e-2, schedule="constant", eval_every=10,
                                      eval_batches=1, n_checkpoints=0, device="cpu"))
    result = train(run, progress=False)
    before = initial_state(run.model, 0)
    after = models.state_dict_for_save(result.model)
    for name in ("blocks.0.attn.q.weight", "blocks.0.attn.k.weight"):
        assert (after[name] - before[name]).abs().max() > 1e-3, name  # layer 0's Q / K get gradient steps
    tokens = probes.sample_batch(RandomMarkov(3), n_sequences=32, seq_len=32, seed=3).tokens
    assert float(probes.attention_scores(result.model, tokens).previous_token[0, 0]) > 0.5
    assert json.loads(run.to_json())["model"]["init_attention"] == "previous_token"
    assert "init_attention" not in json.loads(RunConfig.from_json(run.to_json()).model.replace(
        init_attention=None).to_json())


@pytest.mark.parametrize("kw, message", [
    (dict(init_attention="next_token"), "init_attention must be one of"),
    (dict(init_attention="previous_token", positional="rotary"), "needs init='standard' and learned positions"),
    (dict(init_attention="previous_token", d_model=8), "needs d_head >= 6 and d_model >= 10"),
])
def test_bad_head_start_options_are_refused(kw, message):
    with pytest.raises(ValueError, match=message):
        preset("attn-only-2layer", n_ctx=32, d_vocab=3, **kw)
    assert math.isfinite(position_frequencies(8)[1])
