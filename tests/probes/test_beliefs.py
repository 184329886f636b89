"""Belief probes (`probes.beliefs`): planted linear embeddings of the belief are read back exactly, activations
unrelated to it stay at the control, the simplex projection, and the causal test on a hand-built model whose
logits are a known linear function of the embedded belief (computed again here by hand)."""

import math

import pytest
import torch

from markov_interp import probes
from markov_interp.probes import beliefs
from markov_interp.sources import hmm_preset
from tests.handbuilt import BELIEF_KERNEL, belief_model, chain_hmm


def gen(seed):
    return torch.Generator().manual_seed(seed)


# --------------------------------------------------------------------------------------------------- probes
def test_a_planted_linear_embedding_of_the_beliefs_is_read_back_exactly():
    mess3 = hmm_preset("mess3")
    tokens = mess3.sample(64, 12, generator=gen(0))
    target = probes.beliefs.belief_target(mess3, tokens)
    assert target.outputs == ("s0", "s1", "s2") and torch.equal(target.values, mess3.belief_states(tokens))
    embed = torch.randn(3, 6, generator=gen(1), dtype=torch.float64)
    planted = torch.cat([target.values @ embed + 0.3, torch.randn(64, 12, 2, generator=gen(2))], dim=-1)
    noise = torch.randn(64, 12, 5, generator=gen(3))  # unrelated to the beliefs
    table = probes.beliefs.probe_beliefs({"planted": planted, "noise": noise}, target, n_bootstrap=200)
    assert table.sites == ("planted", "noise", probes.beliefs.ALL_LAYERS) and table.metric == "r2"
    fit = table["planted"]
    assert fit.score > 1 - 1e-6 and min(fit.per_output) > 1 - 1e-6 and fit.score_ci[0] > 1 - 1e-5
    assert fit.control_kind == "shuffle" and abs(fit.control) < 0.05 and fit.selectivity > 0.95
    assert table[probes.beliefs.ALL_LAYERS].score > 1 - 1e-5 and table[probes.beliefs.ALL_LAYERS].n_features == 13


def test_activations_unrelated_to_the_beliefs_stay_at_the_control():
    rrxor = hmm_preset("rrxor")
    tokens = rrxor.sample(80, 12, generator=gen(4))
    target = probes.beliefs.belief_target(rrxor, tokens)
    fit = probes.beliefs.probe_beliefs({"random": torch.randn(80, 12, 16, generator=gen(5))}, target, n_bootstrap=200)
    fit = fit["random"]
    assert abs(fit.score - fit.control) < 0.05 and fit.score < 0.05
    assert fit.selectivity_ci[0] < 0 < fit.selectivity_ci[1]


def test_a_belief_split_over_two_sites_needs_them_together():
    """RRXOR's five belief coordinates, the first two written at one site and the other three at another: each
    site alone reads part of the belief, the concatenation all of it (the reading of Shai et al.'s RRXOR claim)."""
    rrxor = hmm_preset("rrxor")
    tokens = rrxor.sample(96, 12, generator=gen(6))
    target = probes.beliefs.belief_target(rrxor, tokens)
    first = target.values[..., :2] @ torch.randn(2, 4, generator=gen(7), dtype=torch.float64)
    second = target.values[..., 2:] @ torch.randn(3, 4, generator=gen(8), dtype=torch.float64)
    table = probes.beliefs.probe_beliefs({"L0": first, "L1": second}, target, n_bootstrap=0)
    assert table["L0"].score < 0.9 and table["L1"].score < 0.9
    assert table[probes.beliefs.ALL_LAYERS].score > 1 - 1e-5


def test_belief_probes_read_every_layer_of_a_model():
    kernel, source = BELIEF_KERNEL, chain_hmm(BELIEF_KERNEL)
    model = belief_model(kernel)
    tokens = source.sample(48, 16, generator=gen(9))
    table = probes.beliefs.belief_probes(model, tokens, source, n_bootstrap=100)
    assert table.sites == ("L0.resid_pre", "L0.resid_post", probes.beliefs.ALL_LAYERS)
    assert all(fit.score > 1 - 1e-4 for fit in table.fits)  # the token one-hot is the belief, at every layer
    batch = probes.sample_batch(source, n_sequences=48, seq_len=16, seed=1)
    assert probes.beliefs.belief_probes(model, batch, source, n_bootstrap=0, concatenate=False).sites == (
        "L0.resid_pre", "L0.resid_post")


# -------------------------------------------------------------------------------------------------- simplex
def test_the_simplex_projection_is_barycentric_for_three_states_and_pca_beyond():
    corners = probes.beliefs.simplex_projection(torch.eye(3, dtype=torch.float64))
    assert corners.method == "barycentric" and corners.explained == 1.0
    expected = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.5, math.sqrt(3) / 2]], dtype=torch.float64)
    assert torch.allclose(corners(torch.eye(3)), expected)
    mix = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    assert torch.allclose(corners(mix), mix @ expected)  # barycentric: the mixture of the corners
    rrxor = hmm_preset("rrxor")
    points = rrxor.belief_states(rrxor.sample(50, 10, generator=gen(10))).reshape(-1, 5)
    plane = probes.beliefs.simplex_projection(points)
    assert plane.method == "pca" and plane.axes.shape == (5, 2)
    assert torch.allclose(plane.axes.T @ plane.axes, torch.eye(2, dtype=torch.float64), atol=1e-10)
    centred = points - points.mean(0)
    values = torch.linalg.eigvalsh(centred.T @ centred).flip(0)  # the covariance's spectrum, independently
    assert plane.explained == pytest.approx(float(values[:2].sum() / values.sum()))
    assert float((plane(points) ** 2).sum()) == pytest.approx(float(values[:2].sum()))
    with pytest.raises(ValueError, match="at least 2 rows"):
        probes.beliefs.simplex_projection(torch.ones(1, 3))


def test_held_out_beliefs_are_the_probes_test_points():
    mess3 = hmm_preset("mess3")
    tokens = mess3.sample(20, 8, generator=gen(11))
    target = probes.beliefs.belief_target(mess3, tokens)
    acts = target.values @ torch.randn(3, 5, generator=gen(12), dtype=torch.float64)
    fit = probes.beliefs.probe_beliefs({"x": acts}, target, n_bootstrap=0)["x"]
    true, predicted = probes.beliefs.held_out_beliefs(fit, acts, target)
    assert true.shape == (len(fit.test_sequences) * 8, 3) == predicted.shape
    assert torch.equal(true, target.values[list(fit.test_sequences)].reshape(-1, 3))
    assert torch.allclose(predicted, true, atol=1e-4)


# ---------------------------------------------------------------------------------------------- causal test
def test_patching_the_belief_subspace_moves_the_law_exactly_as_the_hand_built_model_says():
    """The model's logits are the embedded belief times log P plus nothing: replacing the probe's subspace with the
    counterfactual's puts the counterfactual's belief in, so the law moves to the counterfactual's Bayes prediction
    (effect 1 up to the sample covariance of token and position values the pattern is computed from: 0.999 on
    these 800 sequences, 0.978 on 100). The patched law is
    computed again here from the weights: softmax((x + (x_cf - x) Q Q^T) W_U + b)."""
    source, model = chain_hmm(BELIEF_KERNEL), belief_model(BELIEF_KERNEL)
    fit = probes.beliefs.belief_probes(model, source.sample(64, 16, generator=gen(13)), source, n_bootstrap=0,
                               sites=["L0.resid_post"], concatenate=False)["L0.resid_post"]
    tokens = source.sample(800, 16, generator=gen(14))  # fresh sequences
    patch = probes.beliefs.belief_patch(model, tokens, source, fit, n_bootstrap=300, seed=3)
    _, cache = model.run_with_cache(tokens)
    x = cache["blocks.0.hook_resid_post"].double()
    basis = probes.beliefs.probe_subspace(fit, x)
    assert patch.subspace == "pattern" and patch.dimension == basis.shape[1] == 2  # the one-hot's sum is fixed
    partner = probes.ablation.derangement(800, seed=3)
    patched = x + ((x[partner] - x) @ basis) @ basis.T
    w_u, b_u = model.W_U.double(), model.b_U.double()
    by_hand = torch.softmax(patched @ w_u + b_u, -1) - torch.softmax(x @ w_u + b_u, -1)
    q = source.predictive(tokens)
    move = q[partner] - q
    assert patch.effect == pytest.approx(float((by_hand * move).sum() / (move**2).sum()), abs=1e-6)
    assert patch.effect == pytest.approx(1.0, abs=0.005) and patch.effect_ci[0] > 0.99
    assert patch.control < 0.5 and patch.difference_ci[0] > 0.4
    assert patch.bayes_move == pytest.approx(float(move.norm(dim=-1).mean()))


def test_the_pattern_finds_the_belief_the_model_reads_where_the_decoder_does_not():
    """A second copy of the belief, 100 times smaller and not read by the unembedding: the ridge decoder (on
    standardised features) leans on the small copy, so patching the span of its weights barely moves the law;
    the activation pattern Cov(x) W lies along the large copy, which the model reads."""
    source, model = chain_hmm(BELIEF_KERNEL), belief_model(BELIEF_KERNEL, echo=0.01)
    fit = probes.beliefs.belief_probes(model, source.sample(64, 16, generator=gen(19)), source, n_bootstrap=0,
                               sites=["L0.resid_post"], concatenate=False)["L0.resid_post"]
    assert fit.score > 1 - 1e-4
    tokens = source.sample(40, 16, generator=gen(20))
    pattern = probes.beliefs.belief_patch(model, tokens, source, fit, n_bootstrap=0)
    weights = probes.beliefs.belief_patch(model, tokens, source, fit, subspace="weights", n_bootstrap=0)
    assert pattern.effect > 0.98 and abs(weights.effect) < 0.05
    x = model.run_with_cache(tokens)[1]["blocks.0.hook_resid_post"].double()
    decoder = probes.beliefs.probe_subspace(fit, kind="weights")
    assert float(decoder[3:6].norm()) > 0.99 * math.sqrt(2)  # the decoder's span: the small copy's dimensions
    assert float(probes.beliefs.probe_subspace(fit, x)[:3].norm()) > 0.99 * math.sqrt(2)  # the pattern's: the large copy


def test_a_model_that_does_not_read_the_subspace_is_not_moved():
    """The unembedding reads only the nuisance dimensions: the belief is there (the probe finds it) but patching
    it moves nothing (up to the pattern's finite-sample covariance with the nuisance values the model reads)."""
    source, model = chain_hmm(BELIEF_KERNEL), belief_model(BELIEF_KERNEL)
    with torch.no_grad():
        model.W_U[:3] = 0
        model.W_U[3:] = torch.randn(model.W_U[3:].shape, generator=gen(15))
    tokens = source.sample(64, 16, generator=gen(16))
    fit = probes.beliefs.belief_probes(model, tokens, source, n_bootstrap=0, concatenate=False)["L0.resid_post"]
    assert fit.score > 1 - 1e-4
    patch = probes.beliefs.belief_patch(model, source.sample(32, 16, generator=gen(17)), source, fit, n_bootstrap=100)
    assert abs(patch.effect) < 0.02  # the pattern's sample covariance with the position values: 0.006


def test_the_causal_test_refuses_what_it_cannot_patch():
    source, model = chain_hmm(BELIEF_KERNEL), belief_model(BELIEF_KERNEL)
    tokens = source.sample(32, 16, generator=gen(18))
    table = probes.beliefs.belief_probes(model, tokens, source, n_bootstrap=0)
    with pytest.raises(ValueError, match="patches one site"):
        probes.beliefs.belief_patch(model, tokens, source, table[probes.beliefs.ALL_LAYERS])
    with pytest.raises(TypeError, match="source"):
        probes.beliefs.belief_patch(model, tokens, hmm_preset, table["L0.resid_post"])
    with pytest.raises(ValueError, match="kind must be one of"):
        probes.beliefs.belief_patch(model, tokens, source, table["L0.resid_post"], subspace="decoder")
    with pytest.raises(ValueError, match="needs the site's activations"):
        probes.beliefs.probe_subspace(table["L0.resid_post"])
    assert beliefs.layer_sites(model)[-1].name == "L0.resid_post"
