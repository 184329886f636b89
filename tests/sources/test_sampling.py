"""Markov sources: sampled statistics match the kernel; bad input is refused with a clear message."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from markov_interp import theory
from markov_interp.sources import BinaryChain, MarkovChain, RandomMarkov, SourceConfig, validate_kernel

# Sampled frequencies from ~16k transitions per row: 5 standard errors of a proportion near 0.5 is ~0.02.
FREQ_TOL = 0.02


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def empirical_kernel(tokens: torch.Tensor, vocab: int, order: int = 1) -> torch.Tensor:
    """Transition frequencies counted with a plain Python loop (independent of the vectorised sampler)."""
    counts = torch.zeros([vocab] * (order + 1), dtype=torch.float64)
    for row in tokens.tolist():
        for t in range(order, len(row)):
            counts[tuple(row[t - order : t + 1])] += 1
    return counts / counts.sum(-1, keepdim=True)


def test_binary_chain_kernel_and_shapes():
    chain = BinaryChain(0.2, 0.3)
    assert torch.equal(chain.kernel, torch.tensor([[0.8, 0.2], [0.3, 0.7]], dtype=torch.float64))
    tokens = chain.sample(3, 7, gen())
    assert tokens.shape == (3, 7) and tokens.dtype == torch.long
    assert set(tokens.unique().tolist()) <= {0, 1}
    assert chain.sample(5, 1, gen()).shape == (5, 1)


@pytest.mark.parametrize("p,q", [(0.2, 0.3), (0.5, 0.8), (0.95, 0.9), (0.05, 0.02)])
def test_binary_transition_frequencies_match_kernel(p, q):
    tokens = BinaryChain(p, q).sample(64, 512, gen(1))
    emp = empirical_kernel(tokens, 2)
    assert torch.allclose(emp, BinaryChain(p, q).kernel, atol=FREQ_TOL)


def test_first_state_follows_requested_law():
    chain = BinaryChain(0.2, 0.3)  # pi = (0.6, 0.4)
    first = chain.sample(20000, 2, gen(2))[:, 0].double().mean().item()
    assert abs(first - 0.4) < 0.015
    uniform = BinaryChain(0.2, 0.3, initial="uniform").sample(20000, 2, gen(2))[:, 0].double().mean().item()
    assert abs(uniform - 0.5) < 0.015
    given_law = BinaryChain(0.2, 0.3, initial=[0.9, 0.1]).sample(20000, 2, gen(2))[:, 0].double().mean().item()
    assert abs(given_law - 0.1) < 0.015


def test_marginal_stays_stationary_along_the_sequence():
    # Started from pi, every position has law pi: the reference code's wrong initial law breaks exactly this.
    tokens = BinaryChain(0.5, 0.8).sample(8000, 64, gen(3)).double()
    per_position = tokens.mean(0)
    assert (per_position - 0.5 / 1.3).abs().max() < 0.03


def test_multistate_chain_frequencies():
    kernel = torch.tensor([[0.1, 0.6, 0.3], [0.5, 0.25, 0.25], [0.0, 0.2, 0.8]], dtype=torch.float64)
    tokens = MarkovChain(kernel).sample(32, 1024, gen(4))
    assert torch.allclose(empirical_kernel(tokens, 3), kernel, atol=FREQ_TOL)


def test_order_two_chain_frequencies():
    kernel = torch.softmax(torch.randn(3, 3, 3, generator=gen(5), dtype=torch.float64) * 1.5, -1)
    chain = MarkovChain(kernel, order=2)
    tokens = chain.sample(64, 512, gen(6))
    emp = empirical_kernel(tokens, 3, order=2)
    weights = theory.stationary_context_distribution(kernel).reshape(3, 3)
    well_sampled = weights > 0.05
    assert torch.allclose(emp[well_sampled], kernel[well_sampled], atol=0.03)
    # flat [V**k, V] kernels are accepted too
    assert torch.equal(MarkovChain(kernel.reshape(9, 3), order=2).kernel, kernel)


def test_random_markov_each_row_follows_its_own_kernel():
    source = RandomMarkov(3, alpha=1.0)
    tokens, kernels = source.sample(4, 20000, gen(7), return_kernels=True)
    assert kernels.shape == (4, 3, 3)
    assert torch.allclose(kernels.sum(-1), torch.ones(4, 3, dtype=torch.float64))
    for row, kernel in zip(tokens, kernels):
        emp = empirical_kernel(row[None], 3)
        visits = torch.bincount(row[:-1], minlength=3)
        ok = visits > 2000
        assert torch.allclose(emp[ok], kernel[ok], atol=0.03)


def test_random_markov_dirichlet_moments():
    # Dirichlet(alpha) on V states: mean 1/V, variance (V-1) / (V^2 (V alpha + 1)).
    for alpha in (0.3, 1.0, 4.0):
        kernels = RandomMarkov(3, alpha=alpha).sample_kernels(20000, gen(8))
        entries = kernels[..., 0].flatten()
        var = 2 / (9 * (3 * alpha + 1))
        assert abs(entries.mean().item() - 1 / 3) < 0.01
        assert abs(entries.var().item() - var) < 0.1 * var


def test_random_markov_order_two_shapes():
    tokens, kernels = RandomMarkov(2, order=2).sample(3, 9, gen(), return_kernels=True)
    assert tokens.shape == (3, 9) and kernels.shape == (3, 4, 2)


def test_same_seed_same_samples_and_no_global_rng():
    torch.manual_seed(123)
    before = torch.rand(1)
    a = RandomMarkov(3).sample(4, 50, gen(9))
    torch.manual_seed(123)
    b = RandomMarkov(3).sample(4, 50, gen(9))
    assert torch.equal(a, b)
    torch.manual_seed(123)
    BinaryChain(0.3, 0.4).sample(4, 50, gen(9))
    assert torch.equal(torch.rand(1), before)  # the global generator was not touched


def test_sampler_matches_sequential_reference_in_distribution():
    # An independent per-position loop: two-sample test on the frequency of each 3-gram.
    kernel = torch.tensor([[0.7, 0.3], [0.45, 0.55]], dtype=torch.float64)
    g = gen(10)
    x = torch.zeros(4000, 6, dtype=torch.long)
    x[:, 0] = (torch.rand(4000, generator=g) < 0.3 / 0.75).long()
    for t in range(1, 6):
        x[:, t] = (torch.rand(4000, generator=g, dtype=torch.float64) < kernel[x[:, t - 1], 1]).long()
    y = MarkovChain(kernel).sample(4000, 6, gen(11))
    code = lambda s: s[:, 3] * 4 + s[:, 4] * 2 + s[:, 5]
    fx = torch.bincount(code(x), minlength=8).double() / 4000
    fy = torch.bincount(code(y), minlength=8).double() / 4000
    assert (fx - fy).abs().max() < 0.035


# ------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "kernel,message",
    [
        ([[0.5, 0.5, 0.0], [0.2, 0.8, 0.0]], "shape"),
        ([[0.5, 0.6], [0.2, 0.8]], "sum to 1"),
        ([[1.2, -0.2], [0.2, 0.8]], "negative"),
        ([[math.nan, 1.0], [0.2, 0.8]], "NaN"),
        ([[1.0]], "at least 2 states"),
        ("abc", "numeric"),
    ],
)
def test_bad_kernels_are_refused(kernel, message):
    with pytest.raises(ValueError, match=message):
        MarkovChain(kernel)


@pytest.mark.parametrize("p,q", [(-0.1, 0.5), (0.5, 1.5), (math.nan, 0.2), (0.3, math.inf)])
def test_p_q_outside_unit_interval(p, q):
    with pytest.raises(ValueError, match=r"\b[pq]\b"):
        BinaryChain(p, q)


def test_other_bad_arguments():
    with pytest.raises(ValueError, match="no unique stationary"):
        BinaryChain(0.0, 0.0)
    with pytest.raises(ValueError, match="no unique stationary"):
        MarkovChain(torch.eye(3))
    with pytest.raises(ValueError, match="vocab"):
        RandomMarkov(1)
    with pytest.raises(ValueError, match="alpha"):
        RandomMarkov(3, alpha=0)
    with pytest.raises(ValueError, match="seq_len"):
        BinaryChain(0.2, 0.3).sample(2, 0)
    with pytest.raises(ValueError, match="batch"):
        BinaryChain(0.2, 0.3).sample(0, 4)
    with pytest.raises(ValueError, match="initial"):
        BinaryChain(0.2, 0.3, initial="weird")
    with pytest.raises(ValueError, match="initial law"):
        BinaryChain(0.2, 0.3, initial=[0.5, 0.6])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.one_of(st.floats(-1, 2), st.just(math.nan)), min_size=3, max_size=3), min_size=3, max_size=3))
def test_validator_accepts_exactly_stochastic_matrices(rows):
    matrix = torch.tensor(rows, dtype=torch.float64)
    valid = bool(torch.isfinite(matrix).all() and (matrix >= 0).all() and ((matrix.sum(1) - 1).abs() <= 1e-6).all())
    if valid:
        assert torch.equal(validate_kernel(matrix), matrix)
    else:
        with pytest.raises(ValueError):
            validate_kernel(matrix)


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 5), st.integers(1, 3), st.integers(1, 40), st.integers(0, 2**31))
def test_random_kernels_are_valid_and_samples_in_range(vocab, order, seq_len, seed):
    tokens, kernels = RandomMarkov(vocab, order=order, alpha=0.5).sample(
        2, seq_len, gen(seed), return_kernels=True
    )
    validate_kernel(kernels[0], order=order)
    assert tokens.shape == (2, seq_len) and 0 <= tokens.min() and tokens.max() < vocab


def test_source_config_round_trip_and_errors():
    for cfg in (
        SourceConfig(kind="binary", p=0.5, q=0.8),
        SourceConfig(kind="random", vocab=3, alpha=0.5, order=2),
        SourceConfig(kind="markov", kernel=[[0.9, 0.1], [0.4, 0.6]], initial="uniform"),
    ):
        again = SourceConfig.from_dict(cfg.to_dict())
        assert again == cfg
        assert again.build().vocab == cfg.vocab_size
    with pytest.raises(ValueError, match="unknown SourceConfig keys"):
        SourceConfig.from_dict({"kind": "binary", "p": 0.1, "q": 0.1, "colour": "red"})
    with pytest.raises(ValueError, match=r"\bp\b"):
        SourceConfig(kind="binary", p=2.0, q=0.1)
    with pytest.raises(ValueError, match="kind"):
        SourceConfig(kind="ising")


@pytest.mark.parametrize("steps,states", [(1, 2), (31, 3), (32, 2), (33, 4), (100, 3), (1000, 2)])
def test_prefix_composition_matches_sequential(steps, states):
    from markov_interp.sources.sampling import _compose_prefix

    maps = torch.randint(0, states, (3, steps, states), generator=gen(12))
    out = _compose_prefix(maps)
    for b in range(3):
        acc = list(range(states))  # identity
        for t in range(steps):
            acc = [maps[b, t, s].item() for s in acc]  # F_t after everything before
            assert out[b, t].tolist() == acc


@pytest.mark.parametrize("steps", [1, 5, 100, 1023])
def test_binary_fast_path_equals_the_scan(steps):
    from markov_interp.sources.sampling import _apply_binary_maps, _compose_prefix

    maps = torch.randint(0, 2, (4, steps, 2), generator=gen(13))
    first = torch.tensor([0, 1, 0, 1])
    scan = torch.gather(_compose_prefix(maps), -1, first[:, None, None].expand(4, steps, 1))[..., 0]
    assert torch.equal(_apply_binary_maps(maps, first), scan)
