"""Reference quantities against independent computations: closed forms, eigenvectors, Monte Carlo."""

import itertools
import math

import numpy as np
import pytest
import torch

from markov_interp import sources, theory
from markov_interp.sources import BinaryChain, MarkovChain, RandomMarkov


def h(x: float) -> float:
    return 0.0 if x in (0.0, 1.0) else -x * math.log(x) - (1 - x) * math.log(1 - x)


PQ = [(0.2, 0.3), (0.5, 0.8), (0.9, 0.95), (0.05, 0.6), (1.0, 1.0), (0.0, 0.4)]


@pytest.mark.parametrize("p,q", PQ)
def test_binary_closed_forms(p, q):
    kernel = BinaryChain(p, q).kernel
    pi = theory.stationary_distribution(kernel)
    assert torch.allclose(pi, torch.tensor([q, p], dtype=torch.float64) / (p + q), atol=1e-12)
    assert theory.entropy_rate(kernel) == pytest.approx((q * h(p) + p * h(q)) / (p + q), abs=1e-12)
    assert theory.unigram_loss(kernel) == pytest.approx(h(p / (p + q)), abs=1e-12)


def test_paper_numbers():
    assert theory.entropy_rate(BinaryChain(0.2, 0.3).kernel) == pytest.approx(0.5446, abs=5e-5)
    assert theory.unigram_loss(BinaryChain(0.2, 0.3).kernel) == pytest.approx(0.6730, abs=5e-5)
    assert theory.entropy_rate(BinaryChain(0.5, 0.8).kernel) == pytest.approx(0.6190, abs=5e-5)
    assert theory.unigram_loss(BinaryChain(0.5, 0.8).kernel) == pytest.approx(0.6663, abs=5e-5)


def random_kernel(vocab: int, order: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(2 * torch.randn([vocab] * (order + 1), generator=g, dtype=torch.float64), -1)


@pytest.mark.parametrize("vocab,seed", [(3, 0), (4, 1), (6, 2)])
def test_stationary_law_is_left_eigenvector(vocab, seed):
    kernel = random_kernel(vocab, 1, seed)
    values, vectors = np.linalg.eig(kernel.numpy().T)
    top = vectors[:, np.argmin(np.abs(values - 1))].real
    expected = top / top.sum()
    assert np.allclose(theory.stationary_distribution(kernel).numpy(), expected, atol=1e-10)


def test_order_k_quantities_against_explicit_tuple_chain():
    # Build the chain on k-tuples by enumeration and compute pi and the entropy rate by matrix power.
    vocab, order = 2, 3
    kernel = random_kernel(vocab, order, 3)
    tuples = list(itertools.product(range(vocab), repeat=order))
    index = {t: i for i, t in enumerate(tuples)}
    big = np.zeros((len(tuples), len(tuples)))
    for t in tuples:
        for x in range(vocab):
            big[index[t], index[t[1:] + (x,)]] += kernel[t + (x,)].item()
    pi_tuples = np.linalg.matrix_power(big, 2000)[0]
    rate = sum(pi_tuples[index[t]] * -sum(p * math.log(p) for p in kernel[t].tolist()) for t in tuples)
    assert theory.entropy_rate(kernel) == pytest.approx(rate, abs=1e-10)
    marginal = np.zeros(vocab)
    for t in tuples:
        marginal[t[-1]] += pi_tuples[index[t]]
    assert np.allclose(theory.stationary_distribution(kernel).numpy(), marginal, atol=1e-10)
    assert theory.unigram_loss(kernel) == pytest.approx(-(marginal * np.log(marginal)).sum(), abs=1e-10)


def test_entropy_rate_matches_monte_carlo_log_likelihood():
    kernel = random_kernel(3, 2, 4)
    chain = MarkovChain(kernel, order=2)
    tokens = chain.sample(64, 2048, torch.Generator().manual_seed(5))
    ctx = tokens[:, :-2] * 3 + tokens[:, 1:-1]
    flat = kernel.reshape(9, 3)
    nll = -torch.log(flat[ctx, tokens[:, 2:]]).mean().item()
    assert nll == pytest.approx(theory.entropy_rate(kernel), abs=0.01)


def test_cross_entropy_and_kl():
    true = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)
    pred = torch.tensor([0.3, 0.3, 0.4], dtype=torch.float64)
    expected_ce = -sum(t * math.log(p) for t, p in zip(true.tolist(), pred.tolist()))
    assert theory.cross_entropy(pred, true).item() == pytest.approx(expected_ce)
    expected_kl = sum(t * math.log(t / p) for t, p in zip(true.tolist(), pred.tolist()))
    assert theory.kl_divergence(true, pred).item() == pytest.approx(expected_kl)
    assert theory.kl_divergence(true, true).item() == pytest.approx(0.0, abs=1e-15)


def add_beta_loop(row: list[int], vocab: int, order: int, beta: float) -> list[list[float]]:
    """Plain-Python add-beta estimator: counts only what the sequence has shown up to each position."""
    out = []
    for t in range(len(row)):
        if t < order - 1:
            out.append([1 / vocab] * vocab)
            continue
        ctx = tuple(row[t - order + 1 : t + 1])
        counts = [0] * vocab
        for u in range(order - 1, t):
            if tuple(row[u - order + 1 : u + 1]) == ctx:
                counts[row[u + 1]] += 1
        total = sum(counts)
        out.append([(c + beta) / (total + vocab * beta) for c in counts])
    return out


@pytest.mark.parametrize("vocab,order,beta", [(2, 1, 1.0), (3, 1, 0.5), (2, 2, 0.5), (3, 3, 1.0)])
def test_add_beta_matches_python_loop(vocab, order, beta):
    tokens = RandomMarkov(vocab, order=order).sample(3, 40, torch.Generator().manual_seed(6))
    fast = sources.add_beta_predictions(tokens, vocab, order=order, beta=beta)
    for b in range(3):
        slow = torch.tensor(add_beta_loop(tokens[b].tolist(), vocab, order, beta), dtype=torch.float64)
        assert torch.allclose(fast[b], slow, atol=1e-12)


def test_add_beta_is_bayes_posterior_predictive():
    # Under RandomMarkov(alpha=beta) with uniform start, the posterior predictive after a history equals the
    # ratio of Dirichlet-multinomial marginal likelihoods: check on every binary history of length 6.
    alpha = 0.5

    def marginal(seq: tuple) -> float:
        logp = 0.0
        for s in range(2):
            n = [sum(1 for a, b in zip(seq, seq[1:]) if a == s and b == x) for x in range(2)]
            logp += math.lgamma(2 * alpha) - math.lgamma(2 * alpha + sum(n))
            logp += sum(math.lgamma(alpha + c) - math.lgamma(alpha) for c in n)
        return math.exp(logp)

    for seq in itertools.product(range(2), repeat=6):
        pred = sources.add_beta_predictions(torch.tensor([seq]), 2, beta=alpha)[0, -1]
        bayes = marginal(seq + (1,)) / (marginal(seq + (0,)) + marginal(seq + (1,)))
        assert pred[1].item() == pytest.approx(bayes, abs=1e-12)


def test_add_beta_loss_approaches_entropy_rate():
    chain = BinaryChain(0.3, 0.6)
    curve = theory.in_context_loss_curve(chain, 512, beta=0.5, n_sequences=1024,
                                         generator=torch.Generator().manual_seed(7))
    rate = theory.entropy_rate(chain.kernel)
    early, late = curve[:8].mean().item(), curve[-128:].mean().item()
    assert late == pytest.approx(rate, abs=0.01)
    assert early > late + 0.02  # learning in context costs something at the start
    assert late >= rate - 0.01  # no estimator beats the entropy rate


def test_reference_losses_random_markov_ordering():
    refs = theory.reference_losses(RandomMarkov(3), 256, n_sequences=512)
    # the oracle that knows the kernel < the Bayes in-context predictor <= add-alpha < the in-context unigram
    # estimator; the oracle that knows pi beats the in-context unigram estimator
    assert refs.entropy_rate < refs.bayes_loss <= refs.add_alpha_loss < refs.unigram_loss
    assert refs.oracle_unigram_loss < refs.unigram_loss and refs.optimum == refs.bayes_loss
    # E[H(row)] for Dirichlet(1) on 3 states is psi(4) - psi(2) = 1/2 + 1/3; the entropy rate weights rows
    # by pi, which shifts it only slightly below that
    assert refs.entropy_rate == pytest.approx(5 / 6, abs=0.03)


def test_reference_losses_fixed_chain_exact():
    refs = theory.reference_losses(BinaryChain(0.2, 0.3), 1024)
    assert refs.as_row() == {"entropy_rate": pytest.approx(0.54459, abs=1e-5),
                             "unigram_loss": pytest.approx(0.67301, abs=1e-5)}
    assert refs.entropy_rate_se == refs.unigram_loss_se == 0 and refs.optimum == refs.entropy_rate
    assert refs.bayes_loss is None and refs.in_context_unigram_loss is None


def test_theory_refuses_bad_input():
    with pytest.raises(ValueError, match="sum to 1"):
        theory.entropy_rate([[0.5, 0.4], [0.5, 0.5]])
    with pytest.raises(ValueError, match="no unique stationary"):
        theory.stationary_distribution(torch.eye(2))
    with pytest.raises(ValueError, match="tokens must lie"):
        sources.add_beta_predictions(torch.tensor([[0, 3]]), 2)
    with pytest.raises(ValueError, match="beta"):
        sources.add_beta_predictions(torch.tensor([[0, 1]]), 2, beta=0)


def test_in_context_unigram_estimator_order_zero():
    tokens = RandomMarkov(3).sample(2, 30, torch.Generator().manual_seed(8))
    fast = sources.add_beta_predictions(tokens, 3, order=0, beta=0.5)
    for b in range(2):
        row = tokens[b].tolist()
        for t in range(30):
            counts = [row[: t + 1].count(x) for x in range(3)]
            expected = [(c + 0.5) / (t + 1 + 1.5) for c in counts]
            assert fast[b, t].tolist() == pytest.approx(expected, abs=1e-12)
