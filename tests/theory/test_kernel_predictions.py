"""The one true-next-state-law computation (`sources.kernel_predictions`) that a fixed chain's `predictive` and
the probes' `kernel_probs` share, and the one stationary-law broadcast behind `plateau_predictions`
and `stationary_probs`, against brute force: P(x_{t+1} | x_0..x_t) by summing the joint law of every sequence
of a short window, with stationary laws found by power iteration in plain Python."""

import dataclasses
import itertools

import pytest
import torch

from markov_interp import sources, theory
from markov_interp.sources import MarkovChain, RandomMarkov
from markov_interp.probes import sample_batch
from markov_interp.probes._common import kernel_probs, stationary_laws, stationary_probs

K2 = [[[0.5, 0.3, 0.2], [0.1, 0.8, 0.1], [0.3, 0.3, 0.4]],
      [[0.7, 0.2, 0.1], [0.25, 0.25, 0.5], [0.05, 0.15, 0.8]],
      [[0.2, 0.2, 0.6], [0.6, 0.3, 0.1], [0.9, 0.05, 0.05]]]  # order 2 on 3 states, rows [x_{t-1}][x_t]
MU = [0.3, 0.05, 0.1, 0.0, 0.2, 0.05, 0.1, 0.1, 0.1]  # a non-stationary first-context law (one context never)


def _power_stationary(flat: list, vocab: int) -> list:
    """Stationary law over contexts of the chain on contexts, by 5000 steps of power iteration."""
    n = len(flat)
    law = [1.0 / n] * n
    for _ in range(5000):
        new = [0.0] * n
        for c, row in enumerate(flat):
            for x, p in enumerate(row):
                new[(c * vocab + x) % n] += law[c] * p
        law = new
    return law


def _brute_conditionals(flat: list, mu: list, vocab: int, order: int, seq: list) -> list:
    """[P(x_{t+1} = . | x_0..x_t) for t < len(seq)] for the states `seq`, by summing the joint law of every
    sequence one state longer (the first `order` states from mu, then the kernel)."""
    length = len(seq) + 1
    joint: dict = {}
    for ys in itertools.product(range(vocab), repeat=length):
        ctx = sum(y * vocab ** (order - 1 - i) for i, y in enumerate(ys[:order]))
        p = mu[ctx]
        for t in range(order, length):
            ctx = sum(y * vocab ** (order - 1 - i) for i, y in enumerate(ys[t - order:t]))
            p *= flat[ctx][ys[t]]
        joint[ys] = p
    out = []
    for t in range(len(seq)):
        mass = [sum(p for ys, p in joint.items() if list(ys[: t + 1]) == seq[: t + 1] and ys[t + 1] == v)
                for v in range(vocab)]
        out.append([m / sum(mass) for m in mass])
    return out


def _flat(kernel) -> list:
    return torch.as_tensor(kernel, dtype=torch.float64).reshape(-1, torch.as_tensor(kernel).shape[-1]).tolist()


@pytest.mark.parametrize("initial", ["stationary", MU], ids=["stationary", "given"])
def test_fixed_order_two_chain_matches_brute_force(initial):
    chain = MarkovChain(K2, order=2, initial=initial)
    flat = _flat(K2)
    mu = _power_stationary(flat, 3) if initial == "stationary" else MU
    tokens = chain.sample(6, 4, generator=torch.Generator().manual_seed(0))
    probs = sources.kernel_predictions(torch.tensor(flat, dtype=torch.float64)[None], tokens, chain.initial_context_law[None])
    for b in range(6):
        expected = _brute_conditionals(flat, mu, 3, 2, tokens[b].tolist())
        assert probs[b].tolist() == [pytest.approx(row, abs=1e-9) for row in expected]
    # position 0 is the marginal of x_1 given x_0, not the stationary law nor a kernel row
    assert not torch.allclose(probs[:, 0], theory.stationary_distribution(chain.kernel).expand(6, -1))


def test_order_three_prefix_of_two_states_matches_brute_force():
    kernel = RandomMarkov(2, order=3).sample_kernels(1, torch.Generator().manual_seed(5))[0]
    mu = torch.tensor([0.2, 0.1, 0.05, 0.15, 0.1, 0.1, 0.2, 0.1], dtype=torch.float64)
    tokens = MarkovChain(kernel.reshape(2, 2, 2, 2), order=3, initial=mu).sample(
        8, 5, generator=torch.Generator().manual_seed(6))
    probs = sources.kernel_predictions(kernel[None], tokens, mu[None])
    for b in range(8):
        expected = _brute_conditionals(kernel.tolist(), mu.tolist(), 2, 3, tokens[b].tolist())
        assert probs[b].tolist() == [pytest.approx(row, abs=1e-9) for row in expected]


def test_per_sequence_random_kernels_match_brute_force():
    source = RandomMarkov(3, order=2, alpha=0.7)
    batch = sample_batch(source, n_sequences=4, seq_len=4, seed=1)
    probs = kernel_probs(batch)
    for b in range(4):
        flat = batch.kernels[b].tolist()
        expected = _brute_conditionals(flat, _power_stationary(flat, 3), 3, 2, batch.tokens[b].tolist())
        assert probs[b].tolist() == [pytest.approx(row, abs=1e-9) for row in expected]
        pi = _power_stationary(flat, 3)
        assert stationary_laws(batch)[b].tolist() == pytest.approx([sum(pi[3 * a + x] for a in range(3))
                                                                    for x in range(3)], abs=1e-9)


def test_random_kernels_with_a_given_initial_law_use_it():
    source = RandomMarkov(3, order=2, initial=MU)
    batch = sample_batch(source, n_sequences=4, seq_len=4, seed=2)
    assert torch.equal(batch.initial, torch.tensor(MU, dtype=torch.float64).expand(4, -1))
    probs = kernel_probs(batch)
    for b in range(4):
        expected = _brute_conditionals(batch.kernels[b].tolist(), MU, 3, 2, batch.tokens[b].tolist())
        assert probs[b].tolist() == [pytest.approx(row, abs=1e-9) for row in expected]


@pytest.mark.parametrize("initial", ["stationary", "uniform", MU], ids=["stationary", "uniform", "given"])
def test_probes_and_theory_agree_on_a_fixed_order_two_chain(initial):
    chain = MarkovChain(K2, order=2, initial=initial)
    batch = sample_batch(chain, n_sequences=16, seq_len=12, seed=3)
    assert torch.equal(kernel_probs(batch), chain.predictive(batch.tokens))
    assert torch.equal(stationary_probs(batch), theory.plateau_predictions(chain, batch.tokens))


def test_a_batch_without_initial_laws_uses_the_stationary_context_law():
    chain = MarkovChain(K2, order=2)
    batch = sample_batch(chain, n_sequences=8, seq_len=6, seed=4)
    bare = dataclasses.replace(batch, initial=None)
    assert torch.allclose(kernel_probs(bare), kernel_probs(batch), atol=1e-12)


def test_bad_inputs_are_refused():
    flat = torch.tensor(_flat(K2))[None]
    no_one = torch.tensor([[0.4, 0.3, 0.3, 0, 0, 0, 0, 0, 0]])  # no sequence starts in state 1
    with pytest.raises(ValueError, match="probability 0"):
        sources.kernel_predictions(flat, torch.tensor([[1, 0, 2]]), no_one)
    with pytest.raises(ValueError, match="power"):
        sources.kernel_predictions(torch.full((1, 5, 3), 1 / 3), torch.tensor([[0, 1]]), torch.full((1, 5), 0.2))
    with pytest.raises(ValueError, match="tokens"):
        sources.kernel_predictions(flat, torch.tensor([[0, 3]]), torch.tensor([MU]))
