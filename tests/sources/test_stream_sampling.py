"""Sources drawn from the counter stream ("counter-1", `sources.stream_sampler`): a member's tokens alone and in
stacks of 4 and 16, bit for bit; the same for a step given as a tensor and from a source's own `sample_stream`;
the chains' statistics against their kernels, first-state laws and pools; a source without `sample_stream` drawn
from generators seeded by the stream; and a sampling pass that launches the same operations and reads nothing
on the host whatever the number of members."""

import math

import pytest
import torch
from scipy import stats

from markov_interp import streams
from markov_interp.sources import (BinaryChain, CyclicMarkov, MarkovChain, RandomMarkov, StreamSource, stacked_sampler,
                                   stream_sampler)
from tests.devicesim import host_work

SEEDS = [1000 + 7919 * k for k in range(16)]
KERNEL3 = [[0.7, 0.2, 0.1], [0.05, 0.9, 0.05], [0.3, 0.3, 0.4]]
ORDER2 = torch.softmax(torch.arange(8.0).reshape(2, 2, 2) * 0.7, -1).tolist()
SOURCES = [BinaryChain(0.2, 0.3), MarkovChain(KERNEL3, initial="uniform"), MarkovChain(ORDER2, order=2),
           RandomMarkov(3), RandomMarkov(2, order=2, alpha=0.5), RandomMarkov(3, alpha=2.5, pool_size=8),
           RandomMarkov(3, initial=[0.2, 0.3, 0.5]), RandomMarkov(4, alpha=0.3, zero_diagonal=True),
           CyclicMarkov(4, alpha=2.0)]
_P = 1e-4  # significance level of the statistical checks (deterministic: fixed keys)


def keys_of(seeds) -> torch.Tensor:
    return streams.member_keys(list(seeds))


@pytest.mark.parametrize("source", SOURCES, ids=repr)
def test_a_member_draws_the_same_alone_and_in_stacks_of_4_and_16(source):
    stack = stream_sampler([source] * 16, 8, 33, keys_of(SEEDS))
    for step in (0, 5):
        sixteen = stack(step)
        assert sixteen.shape == (16, 8, 33) and 0 <= sixteen.min() and sixteen.max() < source.vocab
        for k in (0, 6, 15):
            alone = stream_sampler([source], 8, 33, keys_of(SEEDS[k:k + 1]))(step)[0]
            lo = min(k, 12)
            four = stream_sampler([source] * 4, 8, 33, keys_of(SEEDS[lo:lo + 4]))(step)[k - lo]
            assert torch.equal(alone, sixteen[k]) and torch.equal(four, sixteen[k])
            assert torch.equal(source.sample_stream(8, 33, keys_of(SEEDS[k:k + 1]), torch.tensor(step))[0], alone)
    assert not torch.equal(stack(0), stack(1))  # a new step, new data


def test_members_of_other_sources_in_one_stack_draw_what_they_draw_alone():
    """Fixed chains, pools, fresh kernels of two alphas and two first-state laws, interleaved: each member's
    tokens are its own stream's, whatever the parts of the stack it is computed in."""
    sources = [RandomMarkov(3), RandomMarkov(3, pool_size=4), MarkovChain(KERNEL3), RandomMarkov(3, alpha=2.0),
               RandomMarkov(3, initial="uniform"), RandomMarkov(3), RandomMarkov(3, zero_diagonal=True)]
    tokens = stream_sampler(sources, 6, 20, keys_of(SEEDS[:7]))(3)
    for k, source in enumerate(sources):
        assert torch.equal(tokens[k], stream_sampler([source], 6, 20, keys_of(SEEDS[k:k + 1]))(3)[0]), source


def test_sources_of_other_orders_in_one_stack_draw_what_they_draw_alone():
    sources = [RandomMarkov(2), RandomMarkov(2, order=2), BinaryChain(0.5, 0.8)]
    tokens = stream_sampler(sources, 5, 17, keys_of(SEEDS[:3]))(2)
    for k, source in enumerate(sources):
        assert torch.equal(tokens[k], source.sample_stream(5, 17, keys_of(SEEDS[k:k + 1]), 2)[0])


def _empirical(tokens: torch.Tensor, vocab: int, order: int) -> torch.Tensor:
    """Transition counts [V**order, V], counted with a Python loop (independent of the sampler)."""
    counts = torch.zeros(vocab**order, vocab, dtype=torch.float64)
    for row in tokens.reshape(-1, tokens.shape[-1]).tolist():
        for t in range(order, len(row)):
            context = sum(x * vocab ** (order - 1 - i) for i, x in enumerate(row[t - order:t]))
            counts[context, row[t]] += 1
    return counts


def _chi_square_p(observed: torch.Tensor, expected: torch.Tensor) -> float:
    keep = expected > 0
    assert (observed[~keep] == 0).all(), "a transition of probability 0 was drawn"
    statistic = ((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum().item()
    return float(stats.chi2.sf(statistic, int(keep.sum()) - 1))


@pytest.mark.parametrize("source", [MarkovChain(KERNEL3), MarkovChain(ORDER2, order=2)], ids=repr)
def test_fixed_chains_have_their_kernels_transition_counts_and_first_law(source):
    tokens = stream_sampler([source] * 2, 64, 200, keys_of([3, 4]))(0)
    counts = _empirical(tokens, source.vocab, source.order)
    for row, kernel_row in zip(counts, source.pool[0]):
        assert _chi_square_p(row, row.sum() * kernel_row) > _P
    first = torch.stack([tokens[..., i] for i in range(source.order)], -1).reshape(-1, source.order)
    contexts = torch.bincount(first @ (source.vocab ** torch.arange(source.order - 1, -1, -1)),
                              minlength=source.vocab**source.order).double()
    assert _chi_square_p(contexts, first.shape[0] * source.initial_context_law) > _P


def test_pool_indices_are_uniform_and_each_sequence_follows_its_pool_kernel():
    """With a pool of two very different kernels (sticky, switching), every sequence is identified by its
    switch rate; both kernels come up about equally often, and each sequence's counts fit its kernel."""
    source = RandomMarkov(2, pool_size=2)
    sticky = torch.tensor([[0.95, 0.05], [0.05, 0.95]], dtype=torch.float64)
    switching = torch.tensor([[0.05, 0.95], [0.95, 0.05]], dtype=torch.float64)
    source.pool = torch.stack([sticky, switching])  # the cached pool, replaced before sampling
    source._pool_initial = source.initial_context_laws(source.pool)
    tokens = stream_sampler([source] * 4, 100, 120, keys_of(SEEDS[:4]))(7).reshape(-1, 120)
    switches = (tokens[:, 1:] != tokens[:, :-1]).double().mean(1)
    is_sticky = switches < 0.5
    assert ((switches < 0.2) | (switches > 0.8)).all()
    assert stats.binomtest(int(is_sticky.sum()), len(tokens)).pvalue > _P
    for kernel, rows in ((sticky, tokens[is_sticky]), (switching, tokens[~is_sticky])):
        for row, kernel_row in zip(_empirical(rows, 2, 1), kernel):
            assert _chi_square_p(row, row.sum() * kernel_row) > _P


def test_fresh_kernels_give_the_dirichlet_transition_law():
    """Averaged over fresh Dirichlet(alpha) kernels, the first transition out of the first state is uniform, and
    the chance that the second transition from a state repeats the first is (alpha + 1) / (V alpha + 1) (Polya
    urn), the in-context signal induction heads use."""
    vocab, alpha, n = 3, 0.5, 8000
    tokens = stream_sampler([RandomMarkov(vocab, alpha=alpha, initial="uniform")] * 2, n // 2, 2000,
                            keys_of([1, 2]))(0).reshape(n, -1)
    first_move = torch.bincount(tokens[:, 1], minlength=vocab).double()
    assert _chi_square_p(first_move, torch.full((vocab,), n / vocab, dtype=torch.float64)) > _P
    repeats, trials = 0, 0
    for row in tokens[:, :200].tolist():
        seen = {}
        for a, b in zip(row, row[1:]):
            if a in seen and seen[a] is not None:
                repeats += seen[a] == b
                trials += 1
                seen[a] = None
            elif a not in seen:
                seen[a] = b
    expected = (alpha + 1) / (vocab * alpha + 1)
    assert abs(repeats / trials - expected) < 5 * math.sqrt(expected * (1 - expected) / trials)


class _GeneratorOnly:
    """A source with only `sample` (no `sample_stream`): a binary chain's draws."""

    vocab, in_context = 2, False

    def __init__(self):
        self.chain = BinaryChain(0.3, 0.4)

    def sample(self, batch, seq_len, generator=None, *, device=None):
        return self.chain.sample(batch, seq_len, generator=generator, device=device)

    def predictive(self, tokens):
        return self.chain.predictive(tokens)


def test_a_source_without_sample_stream_draws_from_generators_seeded_by_the_stream():
    source = _GeneratorOnly()
    assert not isinstance(source, StreamSource)
    stack = stream_sampler([source] * 4, 5, 12, keys_of(SEEDS[:4]))
    words = streams.words(keys_of(SEEDS[:4]), 6, {"generator": 2})["generator"].tolist()
    for k, (low, high) in enumerate(words):
        expected = source.sample(5, 12, generator=torch.Generator().manual_seed(low + (high << 32)))
        assert torch.equal(stack(6)[k], expected)
        assert torch.equal(stream_sampler([source], 5, 12, keys_of(SEEDS[k:k + 1]))(6)[0], expected)


def test_refusals():
    with pytest.raises(ValueError, match="one \\[2\\] key per source"):
        stream_sampler([BinaryChain(0.2, 0.3)] * 2, 4, 8, keys_of([1]))
    with pytest.raises(ValueError, match="batch"):
        stream_sampler([BinaryChain(0.2, 0.3)], 0, 8, keys_of([1]))


# ------------------------------------------------------------------------------------------ host work
@pytest.mark.parametrize("source", [BinaryChain(0.5, 0.8), RandomMarkov(3), RandomMarkov(2, order=2, alpha=0.5),
                                    RandomMarkov(3, pool_size=8), CyclicMarkov(4)], ids=repr)
def test_a_sampling_pass_launches_the_same_operations_for_1_and_16_members_and_reads_nothing(source, monkeypatch):
    """The counter stream against the generator per member ("torch-1", the control: its draws grow with K)."""
    step = torch.tensor(3)
    samplers = {k: stream_sampler([source] * k, 8, 33, keys_of(SEEDS[:k])) for k in (1, 16)}
    samplers[1](step)  # the first call makes the counters' constants (once per layout and device)
    counts = {k: host_work(lambda k=k: samplers[k](step), monkeypatch) for k in (1, 16)}
    (ops1, reads1), (ops16, reads16) = counts[1], counts[16]
    assert ops1 == ops16 and reads1 == reads16 == 0
    generators = {k: stacked_sampler([source] * k, 8, 33, [torch.Generator().manual_seed(s) for s in range(k)])
                  for k in (1, 16)}
    torch1 = {k: host_work(generators[k], monkeypatch)[0] for k in (1, 16)}
    assert sum(torch1[16].values()) > sum(torch1[1].values())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_draws_the_cpus_tokens():
    """The words are integer arithmetic (the same on every device); a token can differ only where a uniform falls
    within a law's rounding (fresh kernels: libm's last bits), so fixed chains and pools draw the CPU's tokens and
    fresh kernels all but a vanishing fraction."""
    for source in SOURCES:
        host = stream_sampler([source] * 4, 16, 65, keys_of(SEEDS[:4]))(3)
        cuda = stream_sampler([source] * 4, 16, 65, keys_of(SEEDS[:4]).cuda())(torch.tensor(3, device="cuda"))
        differ = (cuda.cpu() != host).double().mean().item()
        assert differ == 0 if source.pool is not None else differ < 1e-3, (source, differ)
