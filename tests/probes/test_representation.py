"""Representation probes on models whose contents are known by construction.

`induction_model(3)` (tests/handbuilt.py): layer 0's previous-token head L0H1 copies x_{t-1} into its own slot of
the residual stream; the induction head L1H0's query holds x_t and its key x_{t-1}. On sequences of independent
uniform states (nothing in x_t or t predicts x_{t-1}), the lag-1 state is readable after layer 0 and from the
induction head's keys, and at chance from the embeddings; a random model adds nothing over its control.
"""

import json

import pytest
import torch

from handbuilt import induction_model
from markov_interp import probes
from markov_interp.sources import MarkovChain, RandomMarkov
from markov_interp.models import build, preset
from markov_interp.probes.representation import ProbeSite, probe_site, residual_sites, site_activations

UNIFORM = MarkovChain(torch.full((3, 3), 1 / 3))  # independent uniform states


@pytest.fixture(scope="module")
def model():
    return induction_model(3, n_ctx=32)


@pytest.fixture(scope="module")
def batch():
    return probes.sample_batch(UNIFORM, n_sequences=96, seq_len=32, seed=0)


def test_the_previous_state_is_readable_after_layer_0_and_not_from_the_embeddings(model, batch):
    lag1 = probes.probe_target("state", batch, lag=1)
    table = probes.probe_layers(model, batch, lag1)
    assert table.sites == ("L0.resid_pre", "L0.resid_post", "L1.resid_post")
    embed = table["L0.resid_pre"]
    assert abs(embed.score - 1 / 3) < 0.03 and abs(embed.selectivity) < 0.03  # chance, as its control
    for site in ("L0.resid_post", "L1.resid_post"):
        assert table[site].score == 1.0 and table[site].selectivity > 0.6
        assert table[site].selectivity_ci[0] > 0.6
    assert table.best.site in ("L0.resid_post", "L1.resid_post")
    current = probes.probe_layers(model, batch, "state")  # the current state is in the embedding already
    assert all(fit.score == 1.0 for fit in current.fits)


def test_heads_outputs_and_inputs(model, batch):
    lag1 = probes.probe_target("state", batch, lag=1)
    # the previous-token head's output (before W_O and its write into the stream) is x_{t-1}, not x_t
    assert probes.linear_probe(model, batch, "L0H1", lag1).score == 1.0
    assert probes.linear_probe(model, batch, ("result", 0, 1), lag1).score == 1.0
    assert abs(probes.linear_probe(model, batch, "L0H1", "state").score - 1 / 3) < 0.03
    # the decoy L0H0 attends to itself with no value: its output is zero, read as the majority class
    for where in (("z", 0, 0), ("result", 0, 0)):
        decoy = probes.linear_probe(model, batch, where, "state")
        assert decoy.score == decoy.chance and abs(decoy.score - 1 / 3) < 0.03
    # the induction head's key input carries the previous state, its query the current one
    assert probes.linear_probe(model, batch, "L1H0.k", lag1).score == 1.0
    assert abs(probes.linear_probe(model, batch, "L1H0.k", "state").score - 1 / 3) < 0.03
    assert probes.linear_probe(model, batch, "L1H0.q", "state").score == 1.0
    assert abs(probes.linear_probe(model, batch, "L1H0.q", lag1).score - 1 / 3) < 0.03


def test_a_head_result_is_its_write_into_the_residual_stream(model, batch):
    """The heads' writes (z_h W_O[h], "result") add up to the attention layer's output (no b_O here)."""
    sites = [probe_site(model, ("result", 0, h)) for h in range(2)] + [probe_site(model, ("attn_out", 0))]
    acts = site_activations(model, batch, sites)
    assert torch.allclose(acts[sites[0]] + acts[sites[1]], acts[sites[2]], atol=1e-5)


@pytest.mark.parametrize("source", [UNIFORM, RandomMarkov(2)], ids=["uniform", "random-kernels"])
def test_a_random_models_lag_1_probe_stays_near_its_control(source):
    """An untrained model: on independent states the lag-1 probe stays at its control at every depth; on random
    kernels (where x_t tells something of x_{t-1}) no layer reads more than the embeddings do."""
    vocab = source.vocab
    model = build(preset("attn-only-2layer", d_vocab=vocab, n_ctx=64), seed=0)
    batch = probes.sample_batch(source, n_sequences=256, seq_len=64, seed=1)
    table = probes.probe_layers(model, batch, probes.probe_target("state", batch, lag=1))
    for fit in table.fits:
        if source is UNIFORM:
            assert abs(fit.selectivity) < 0.03 and abs(fit.score - 1 / 3) < 0.03, fit
        else:
            assert abs(fit.score - table["L0.resid_pre"].score) < 0.03, fit


def test_sites_by_every_name(model):
    same = {
        ProbeSite("resid_post", 0): ["blocks.0.hook_resid_post", ("resid_post", 0), "L0.resid_post"],
        ProbeSite("resid_pre", 1): ["L1.resid", "blocks.1.hook_resid_pre", probes.Component.parse("L1.resid")],
        ProbeSite("z", 0, 1): ["L0H1", ("z", 0, 1), "L0H1.z"],
        ProbeSite("k", 1, 0): ["L1H0.k", ("k", 1, 0)],
        ProbeSite("z", 1): ["blocks.1.attn.hook_z", ("z", 1)],
        ProbeSite("result", 1, 0): [("result", 1, 0), "L1H0.result"],
        ProbeSite("embed"): ["embed", "hook_embed", ("embed",)],
        ProbeSite("pos_embed"): ["pos", "hook_pos_embed", "pos_embed"],
        ProbeSite("attn_out", 0): ["L0.attn", "blocks.0.hook_attn_out"],
    }
    for site, names in same.items():
        for name in names:
            assert probe_site(model, name) == site, name
    assert residual_sites(build(preset("paper-2layer"), seed=0)) == (
        ProbeSite("resid_pre", 0), ProbeSite("resid_mid", 0), ProbeSite("resid_post", 0), ProbeSite("resid_mid", 1),
        ProbeSite("resid_post", 1))


def test_bad_sites_and_targets_are_refused(model, batch):
    for where, message in [
        ("blocks.0.hook_resid_psot", "unknown probe site 'blocks.0.hook_resid_psot'"),
        (("resid_post", 2), "L2.resid_post: the model has only 2 layers"),
        ("L1H2", "layer 1 has only 2 heads"),
        (("resid_post", 0, 1), "has no head axis"),
        (("pattern", 0), "the pattern has no per-position features"),
        ("L0.mlp", "the model has no hook 'blocks.0.hook_mlp_out'"),
        (("result", 0), "give \\('result', layer, head\\)"),
        ("blocks.0.attn.hook_result", "name one head"),
        (3, "a probe site must be"),
    ]:
        with pytest.raises(ValueError, match=message):
            probes.linear_probe(model, batch, where, "state")
    with pytest.raises(ValueError, match=r"given on \(8, 32\) \(batch, pos\) but the activations are \(96, 32\)"):
        probes.linear_probe(model, batch, "embed", probes.probe_target("state", batch.tokens[:8], vocab=3))
    with pytest.raises(ValueError, match="at least 4 sequences"):
        probes.linear_probe(model, batch.tokens[:3], "embed", "state")
    with pytest.raises(ValueError, match="lag 32 reaches beyond the sequences"):
        probes.probe_target("state", batch, lag=32)
    with pytest.raises(TypeError, match="probe_layers: .*'lag'.*fit_probe"):
        probes.probe_layers(model, batch, "state", lag=1)
    with pytest.raises(ValueError, match="sites is empty"):
        probes.probe_layers(model, batch, "state", sites=[])


def test_one_forward_pass_and_a_given_cache(model, batch, monkeypatch):
    sites = residual_sites(model)
    names = [site.hook for site in sites]
    _, cache = model.run_with_cache(batch.tokens, names_filter=names)
    fresh = probes.probe_layers(model, batch, "state", n_bootstrap=50)
    calls = []
    monkeypatch.setattr(model, "run_with_cache", lambda *a, **k: calls.append(k) or (None, cache))
    cached = probes.probe_layers(model, batch, "state", cache=cache, n_bootstrap=50)
    assert not calls and json.dumps(cached.to_dict()) == json.dumps(fresh.to_dict())
    probes.probe_layers(model, batch, "state", n_bootstrap=50)  # no cache: one run, over exactly these hooks
    assert len(calls) == 1 and calls[0]["names_filter"] == names


def test_the_table_and_the_fit_display(model, batch):
    table = probes.probe_layers(model, batch, probes.probe_target("state", batch, lag=1), n_bootstrap=100)
    text = repr(table)
    assert text.startswith("<ProbeTable: state (lag 1) at 3 sites: accuracy from") and "\n" not in text
    frame = table.to_dataframe()
    assert list(frame.index) == list(table.sites) and frame.loc["L0.resid_post", "score"] == 1.0
    assert {"control", "selectivity_low", "selectivity_high", "chance"} <= set(frame.columns)
    assert len(table.summary().splitlines()) == 4 and "<table" in table._repr_html_()
    fit = table["L0.resid_post"]
    assert repr(fit).startswith("<ProbeFit: L0.resid_post -> state (lag 1): accuracy 1.000 [1.000, 1.000], control")
    assert list(fit.to_dataframe().index) == ["0", "1", "2"]
    json.dumps(table.to_dict(), allow_nan=False)
    with pytest.raises(KeyError, match="no site 'L5.resid_post'"):
        table["L5.resid_post"]
