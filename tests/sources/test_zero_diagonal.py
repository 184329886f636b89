"""The zero-diagonal random-kernel source (no self-transitions) and its exact references.

Independent computations: the kernel prior integrated by Gauss-Legendre quadrature (3 states, alpha = 1: each
row is one uniform number p_c, the probability of the first of its two other states), every sequence of a short
length enumerated; predictions by hand-written counting loops.
"""

import itertools
import json
import math

import numpy as np
import pytest
import torch
from scipy import stats

from markov_interp import sources, theory
from markov_interp.sources import RandomMarkov, Source, SourceConfig


def gen(seed):
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------------------------------ the exact prior
def _grid(n: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """Kernels [n^3, 3, 3] of a Gauss-Legendre rule over the prior (rows U(0, 1) over the two other states)."""
    x, w = np.polynomial.legendre.leggauss(n)
    u, w = (x + 1) / 2, w / 2
    p = np.stack([a.ravel() for a in np.meshgrid(u, u, u, indexing="ij")], 1)
    weights = np.einsum("i,j,k->ijk", w, w, w).ravel()
    kernels = np.zeros((len(weights), 3, 3))
    for c in range(3):
        first, second = [x for x in range(3) if x != c]
        kernels[:, c, first], kernels[:, c, second] = p[:, c], 1 - p[:, c]
    return kernels, weights


def _stationary(kernels: np.ndarray) -> np.ndarray:
    a = np.transpose(kernels, (0, 2, 1)) - np.eye(3)
    a[:, 2, :] = 1.0
    rhs = np.zeros((len(kernels), 3, 1))
    rhs[:, 2] = 1.0
    return np.linalg.solve(a, rhs)[..., 0]


def _sequences(length: int) -> list[tuple[int, ...]]:
    return [s for s in itertools.product(range(3), repeat=length) if all(a != b for a, b in zip(s, s[1:]))]


def _marginals(seqs, kernels, weights, first_law) -> np.ndarray:
    """P(sequence) = E over the prior of first_law(P)[x_0] prod P(x_t, x_{t+1}), for every sequence."""
    out = []
    for s in seqs:
        prob = first_law[:, s[0]].copy()
        for a, b in zip(s, s[1:]):
            prob *= kernels[:, a, b]
        out.append((weights * prob).sum())
    return np.array(out)


def _by_hand(seq, *, unigram: bool) -> list[np.ndarray]:
    """Add-one over the states allowed after the current one: transition counts from the current state, or (the
    plateau) state counts so far."""
    out = []
    for t in range(len(seq)):
        counts = np.zeros(3)
        if unigram:
            for x in seq[: t + 1]:
                counts[x] += 1
        else:
            for a, b in zip(seq[:t], seq[1: t + 1]):
                counts[b] += a == seq[t]
        weights = counts + 1.0
        weights[seq[t]] = 0.0
        out.append(weights / weights.sum())
    return out


# ---------------------------------------------------------------------------------------------- the source
def test_no_state_follows_itself_and_rows_are_dirichlet_over_the_others():
    source = RandomMarkov(3, zero_diagonal=True)
    tokens, kernels = source.sample(2000, 40, gen(0), return_kernels=True)
    assert not (tokens[:, 1:] == tokens[:, :-1]).any()
    assert torch.equal(kernels.diagonal(dim1=-2, dim2=-1), torch.zeros(2000, 3, dtype=torch.float64))
    assert torch.allclose(kernels.sum(-1), torch.ones(2000, 3, dtype=torch.float64))
    # alpha = 1 over two states: P(0 -> 1) is uniform on [0, 1]
    assert stats.kstest(kernels[:, 0, 1].numpy(), "uniform").pvalue > 1e-3
    assert isinstance(source, Source) and torch.equal(source.support, ~torch.eye(3, dtype=torch.bool))
    assert RandomMarkov(3).support is None
    pooled = RandomMarkov(4, zero_diagonal=True, pool_size=5)
    assert (pooled.pool.diagonal(dim1=-2, dim2=-1) == 0).all() and pooled.out_of_pool().zero_diagonal


def test_config_round_trip_and_old_json_unchanged():
    cfg = SourceConfig(kind="random", vocab=3, zero_diagonal=True)
    assert SourceConfig.from_json(cfg.to_json()) == cfg and json.loads(cfg.to_json())["zero_diagonal"] is True
    assert cfg.build().zero_diagonal
    assert "zero_diagonal" not in SourceConfig(kind="random", vocab=3).to_dict()


@pytest.mark.parametrize("kwargs, message", [
    (dict(vocab=2, zero_diagonal=True), "zero_diagonal=True needs order 1 and vocab >= 3"),
    (dict(vocab=3, order=2, zero_diagonal=True), "zero_diagonal=True needs order 1 and vocab >= 3"),
    (dict(vocab=3, zero_diagonal=1), "zero_diagonal must be True or False, got 1"),
])
def test_bad_options_are_refused(kwargs, message, without_annotation_checks):
    with pytest.raises(ValueError, match=message):
        SourceConfig(kind="random", **kwargs)
    with pytest.raises(ValueError, match=r"a binary source does not use \['zero_diagonal'\]"):
        SourceConfig(kind="binary", p=0.2, q=0.3, zero_diagonal=True)


# ------------------------------------------------------------------------------------------- predictions
def test_predictions_are_the_counting_rules_by_hand():
    source = RandomMarkov(3, zero_diagonal=True)
    tokens = source.sample(16, 12, gen(1))
    true, plateau = source.predictive(tokens), theory.plateau_predictions(source, tokens)
    for b in range(16):
        seq = tokens[b].tolist()
        assert np.allclose(true[b].numpy(), _by_hand(seq, unigram=False), atol=1e-12)
        assert np.allclose(plateau[b].numpy(), _by_hand(seq, unigram=True), atol=1e-12)
    with pytest.raises(ValueError, match=r"support must be a boolean tensor \[3, 3\]"):
        sources.add_beta_predictions(tokens, 3, support=torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="allows no state"):
        sources.add_beta_predictions(tokens, 3, support=torch.zeros(3, 3, dtype=torch.bool))


def test_add_alpha_over_the_support_is_the_exact_posterior_predictive_with_a_uniform_start():
    """With x_0 uniform (independent of the kernel) the posterior predictive, from the quadrature's marginals
    P(x_0..x_{t+1}) / P(x_0..x_t), is what the source's `predictive` gives."""
    kernels, weights = _grid(24)
    uniform = np.full((len(weights), 3), 1 / 3)
    source = RandomMarkov(3, zero_diagonal=True, initial="uniform")
    for length in (2, 3, 4, 5):
        seqs = _sequences(length)
        marginal = dict(zip(seqs, _marginals(seqs, kernels, weights, uniform)))
        prefix = dict(zip(_sequences(length - 1), _marginals(_sequences(length - 1), kernels, weights, uniform)))
        tokens = torch.tensor(seqs)
        predicted = source.predictive(tokens)[:, -2].numpy()
        for s, row in zip(seqs, predicted):
            assert row[s[-1]] == pytest.approx(marginal[s] / prefix[s[:-1]], abs=1e-9)


def test_reference_losses_against_the_exact_prior():
    """E[entropy rate], E[H(pi)], the Bayes loss (stationary first state: H(x_0..x_{T-1}) - H(x_0) over T - 1
    targets), the add-alpha and the (restricted) in-context unigram losses, all from the quadrature over every
    sequence of length 6, within 4 Monte Carlo standard errors."""
    length = 6
    kernels, weights = _grid(32)
    pi = _stationary(kernels)
    rows_h = -(np.where(kernels > 0, kernels * np.log(np.where(kernels > 0, kernels, 1.0)), 0.0)).sum(-1)
    rate, hpi = (weights * (pi * rows_h).sum(-1)).sum(), (weights * -(pi * np.log(pi)).sum(-1)).sum()
    seqs = _sequences(length)
    prob = _marginals(seqs, kernels, weights, pi)
    assert prob.sum() == pytest.approx(1.0, abs=1e-10)
    first = np.array([prob[[s[0] == x for s in seqs]].sum() for x in range(3)])
    bayes = (-(prob * np.log(prob)).sum() + (first * np.log(first)).sum()) / (length - 1)
    losses = {}
    for name, unigram in (("add_alpha_loss", False), ("unigram_loss", True)):
        per_seq = [np.mean([-math.log(p[s[t + 1]]) for t, p in enumerate(_by_hand(s, unigram=unigram)[:-1])])
                   for s in seqs]
        losses[name] = float((prob * np.array(per_seq)).sum())
    ref = theory.reference_losses(RandomMarkov(3, zero_diagonal=True), length, tol=5e-4)
    assert abs(ref.entropy_rate - rate) < 4 * ref.entropy_rate_se + 1e-6
    assert abs(ref.oracle_unigram_loss - hpi) < 4 * ref.oracle_unigram_loss_se + 1e-6
    assert abs(ref.bayes_loss - bayes) < 4 * ref.bayes_loss_se + 1e-6
    for name, value in losses.items():
        assert abs(getattr(ref, name) - value) < 4 * getattr(ref, name + "_se") + 1e-6, name
    assert bayes < losses["add_alpha_loss"] < losses["unigram_loss"]  # the first state says something about P
