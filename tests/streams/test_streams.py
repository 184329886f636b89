"""The counter-based stream: the hash against its published answers and an independent implementation, the words'
uniformity and independence (across neighbouring counters, members and steps), the same numbers for a member alone
and in any stack, the derived draws against their laws, and Markov chains sampled from it against their kernels.

Every statistical check uses fixed keys (so it is deterministic) and a threshold at a small significance level of
the test's own null distribution (chi-square, normal or Kolmogorov-Smirnov): a correct stream passes with
probability 1 - 1e-4 or more per check, a biased one fails.
"""

import functools
import math

import pytest
import torch
from scipy import stats

from devicesim import DEVICE, SimulatedDevice
from markov_interp import streams
from markov_interp.streams import below, categorical, gamma, member_keys, normal, philox, uniform, words

_MASK = 0xFFFFFFFF
_P = 1e-4  # significance level of every statistical check


def reference_philox(counter: list[int], key: list[int], rounds: int = 10) -> list[int]:
    """Philox4x32 in Python integers, from the algorithm's definition (Salmon et al. 2011, Random123)."""
    c, k = list(counter), list(key)
    for _ in range(rounds):
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [((p1 >> 32) ^ c[1] ^ k[0]) & _MASK, p1 & _MASK, ((p0 >> 32) ^ c[3] ^ k[1]) & _MASK, p0 & _MASK]
        k = [(k[0] + 0x9E3779B9) & _MASK, (k[1] + 0xBB67AE85) & _MASK]
    return c


def _philox_of(counters: list[list[int]], keys: list[list[int]]) -> list[list[int]]:
    c = torch.tensor(counters, dtype=torch.long).T
    k = torch.tensor(keys, dtype=torch.long).T
    return philox(list(c), list(k)).tolist()


# ------------------------------------------------------------------------------------------------- the hash
def test_philox_gives_the_published_known_answers():
    """Random123's kat_vectors for philox4x32 with 10 rounds (zeros, all ones, digits of pi)."""
    counters = [[0] * 4, [_MASK] * 4, [0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344]]
    keys = [[0, 0], [_MASK, _MASK], [0xA4093822, 0x299F31D0]]
    assert _philox_of(counters, keys) == [[0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8],
                                          [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD],
                                          [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]]


def test_philox_equals_a_python_implementation_on_random_counters():
    g = torch.Generator().manual_seed(0)
    counters = torch.randint(0, 2**32, (200, 4), generator=g).tolist()
    keys = torch.randint(0, 2**32, (200, 2), generator=g).tolist()
    assert _philox_of(counters, keys) == [reference_philox(c, k) for c, k in zip(counters, keys)]
    for rounds in (1, 7):
        c = torch.tensor(counters[:20]).T
        k = torch.tensor(keys[:20]).T
        assert philox(list(c), list(k), rounds=rounds).tolist() == [
            reference_philox(a, b, rounds) for a, b in zip(counters[:20], keys[:20])]


def test_words_are_blocks_of_philox_at_their_counters():
    """Word i of a purpose is lane i % 4 of Philox at (i // 4, step, purpose id, 0) under the member's key."""
    keys = member_keys([2**40 + 17, 5])
    got = words(keys, 9, {"steps": 10, "first": 3})
    for m, key in enumerate(keys.tolist()):
        for purpose, n in (("steps", 10), ("first", 3)):
            expected = [reference_philox([i // 4, 9, streams.PURPOSES[purpose], 0], key)[i % 4] for i in range(n)]
            assert got[purpose][m].tolist() == expected


def test_member_keys_split_seeds_and_refuse_what_does_not_fit():
    assert member_keys([2**64 - 1]).tolist() == [[_MASK, _MASK]]
    with pytest.raises(ValueError, match="stream seed"):
        member_keys([2**64])
    with pytest.raises(ValueError, match="step"):
        words(member_keys([1]), -1, {"steps": 4})
    with pytest.raises(ValueError, match="purpose"):
        words(member_keys([1]), 0, {"noise": 4})


# ------------------------------------------------------------------------------------------ the same numbers
def test_a_member_draws_the_same_alone_and_in_stacks_of_4_and_16():
    seeds = [1000 + 7919 * k for k in range(16)]
    sizes = {"first": 33, "steps": 33 * 127, "pool": 33}
    stack = words(member_keys(seeds), 5, sizes)
    gammas = {alpha: gamma(member_keys(seeds), 5, alpha, (33, 3, 3)) for alpha in (0.4, 1.0, 2.5)}
    for k in (0, 3, 15):
        alone = words(member_keys([seeds[k]]), 5, sizes)
        four = words(member_keys(seeds[k:k + 4] if k + 4 <= 16 else seeds[k - 3:k + 1]), 5, sizes)
        at = 0 if k + 4 <= 16 else 3
        for purpose in sizes:
            assert torch.equal(alone[purpose][0], stack[purpose][k])
            assert torch.equal(four[purpose][at], stack[purpose][k])
        for alpha, draws in gammas.items():
            assert torch.equal(gamma(member_keys([seeds[k]]), 5, alpha, (33, 3, 3))[0], draws[k])


def test_words_are_deterministic_and_independent_of_the_other_purposes_drawn():
    keys = member_keys([3, 4])
    a = words(keys, 2, {"steps": 100})
    b = words(keys, 2, {"first": 7, "steps": 100, "pool": 1})
    assert torch.equal(a["steps"], b["steps"])
    assert torch.equal(words(keys, 2, {"steps": 100})["steps"], a["steps"])
    assert torch.equal(words(keys, 2, {"steps": 40})["steps"], a["steps"][:, :40])  # a prefix is a prefix
    assert not torch.equal(words(keys, 3, {"steps": 100})["steps"], a["steps"])
    step = torch.tensor(2)  # a step held as a tensor (what a captured step updates in place) gives the same
    assert torch.equal(words(keys, step, {"steps": 100})["steps"], a["steps"])


def test_steps_drawn_at_once_are_the_steps_drawn_one_by_one():
    keys = member_keys([3, 4, 5])
    steps = torch.tensor([0, 1, 7])
    at_once = words(keys, steps, {"first": 5, "steps": 30})
    for alpha in (0.5, 1.0, 2.5):
        draws = gamma(keys, steps, alpha, (6, 2))
        assert draws.shape == (3, 3, 6, 2)
        for i, step in enumerate(steps.tolist()):
            assert torch.equal(draws[:, i], gamma(keys, step, alpha, (6, 2)))
    for i, step in enumerate(steps.tolist()):
        one = words(keys, step, {"first": 5, "steps": 30})
        assert all(torch.equal(at_once[p][:, i], one[p]) for p in one)


def test_words_on_a_device_are_the_host_words():
    keys = member_keys([11, 12])
    host = words(keys, 4, {"steps": 50})["steps"]
    with SimulatedDevice():
        on_device = words(keys.to(DEVICE), torch.tensor(4).to(DEVICE), {"steps": 50})["steps"]
        assert on_device.device == DEVICE
        assert torch.equal(on_device.cpu(), host)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_words_and_uniforms_equal_the_cpu_bit_for_bit():
    keys = member_keys([1, 2**62 + 3, 99])
    host = words(keys, 17, {"steps": 4097, "first": 5})
    cuda = words(keys.cuda(), 17, {"steps": 4097, "first": 5})
    for purpose in host:
        assert torch.equal(cuda[purpose].cpu(), host[purpose])
        assert torch.equal(uniform(cuda[purpose]).cpu(), uniform(host[purpose]))
    draws = gamma(keys.cuda(), 3, 2.5, (64, 3)).cpu()
    torch.testing.assert_close(draws, gamma(keys, 3, 2.5, (64, 3)), rtol=1e-12, atol=0)


# ------------------------------------------------------------------------------------- uniform, independent
def _chi_square_p(observed: torch.Tensor, expected: torch.Tensor) -> float:
    statistic = ((observed.double() - expected) ** 2 / expected).sum().item()
    return float(stats.chi2.sf(statistic, observed.numel() - 1))


def test_uniforms_are_uniform_over_bins_and_in_every_bit():
    w = words(member_keys([0, 1, 2, 3]), 0, {"steps": 2**16})["steps"].flatten()
    u = uniform(w)
    assert 0 < u.min() and u.max() < 1
    counts = torch.bincount((u * 256).long(), minlength=256)
    assert _chi_square_p(counts, torch.full((256,), w.numel() / 256)) > _P
    ones = torch.stack([(w >> b) & 1 for b in range(32)]).double().mean(1)  # each bit's frequency of 1
    assert ((ones - 0.5).abs() < 4.5 * 0.5 / math.sqrt(w.numel())).all()
    u32 = uniform(w, dtype=torch.float32)
    assert u32.dtype == torch.float32 and 0 <= u32.min() and u32.max() < 1
    assert torch.equal(u32.double(), (w >> 8).double() / 2**24)


def _corr_bound(n: int) -> float:
    return stats.norm.isf(_P / 2) / math.sqrt(n)  # |corr| of independent uniforms, two-sided, at level _P


def _neighbour_correlations() -> dict[str, float]:
    """The largest |correlation| / its bound between the uniforms of neighbouring words, blocks, members (keys
    0..15, neighbouring integers: the hardest case for a weak mixer) and steps."""
    n, seeds = 2**15, list(range(16))
    stack = uniform(words(member_keys(seeds), 0, {"steps": n})["steps"])
    later = uniform(words(member_keys(seeds), 1, {"steps": n})["steps"])
    pairs = {"next word": (stack[:, :-1], stack[:, 1:]), "next block": (stack[:, :-4], stack[:, 4:]),
             "next member": (stack[:-1], stack[1:]), "next step": (stack, later)}
    worst = {}
    for name, (a, b) in pairs.items():
        rows = [torch.corrcoef(torch.stack([x, y]))[0, 1].abs().item() / _corr_bound(x.numel())
                for x, y in zip(a[:4], b[:4])]
        worst[name] = max(rows)
    return worst


def _pair_chi_square_ps() -> list[float]:
    """Chi-square p-values over 16 x 16 cells of (u_i, u_next) for neighbouring words, members and steps: a
    dependence that correlation misses (a non-linear one) shows here."""
    n, seeds = 2**16, [5, 6]
    base = uniform(words(member_keys(seeds), 3, {"steps": n})["steps"])
    later = uniform(words(member_keys(seeds), 4, {"steps": n})["steps"])
    out = []
    for a, b in ((base[0, :-1], base[0, 1:]), (base[0], base[1]), (base[0], later[0])):
        counts = torch.bincount((a * 16).long() * 16 + (b * 16).long(), minlength=256)
        out.append(_chi_square_p(counts, torch.full((256,), a.numel() / 256)))
    return out


def test_neighbouring_counters_members_and_steps_are_uncorrelated():
    assert max(_neighbour_correlations().values()) < 1, _neighbour_correlations()


def test_pairs_of_neighbouring_uniforms_fill_the_square_evenly():
    assert min(_pair_chi_square_ps()) > _P


@pytest.mark.parametrize("rounds", [3, 5])
def test_the_independence_checks_catch_a_weak_mixer(monkeypatch, rounds):
    """The control: Philox with too few rounds (below the 7 that pass BigCrush) fails both checks above."""
    monkeypatch.setattr(streams, "philox", functools.partial(philox, rounds=rounds))
    assert max(_neighbour_correlations().values()) > 1
    assert min(_pair_chi_square_ps()) < _P


# ---------------------------------------------------------------------------------------------- the draws
def test_below_and_categorical_draw_their_laws():
    w = words(member_keys([21]), 0, {"pool": 60000})["pool"][0]
    counts = torch.bincount(below(w, 7), minlength=7)
    assert counts.numel() == 7 and _chi_square_p(counts, torch.full((7,), w.numel() / 7)) > _P
    law = torch.tensor([0.1, 0.0, 0.6, 0.3], dtype=torch.float64)
    drawn = categorical(law.cumsum(0), w)
    counts = torch.bincount(drawn, minlength=4)
    assert counts[1] == 0  # a state of probability 0 is never drawn
    kept = law > 0
    assert _chi_square_p(counts[kept], w.numel() * law[kept]) > _P


def test_normals_are_standard_normal():
    w = words(member_keys([8]), 0, {"steps": 2 * 50000})["steps"][0]
    z = normal(w[0::2], w[1::2])
    assert stats.kstest(z.numpy(), "norm").pvalue > _P
    assert abs(z.mean().item()) < 4 / math.sqrt(z.numel())


@pytest.mark.parametrize("alpha", [0.3, 1.0, 2.5, 7.0])
def test_gamma_draws_follow_the_gamma_law(alpha):
    """Kolmogorov-Smirnov against Gamma(alpha)'s CDF (scipy), and the first three moments against theory
    (mean alpha, variance alpha, third central moment 2 alpha) within 5 standard errors."""
    draws = gamma(member_keys([31, 32]), 0, alpha, (20000,)).flatten()
    assert stats.kstest(draws.numpy(), "gamma", args=(alpha,)).pvalue > _P
    n = draws.numel()
    centred = draws - alpha
    # standard errors from Gamma's central moments: var(X) = a, var((X - a)^2) = mu4 - a^2 with mu4 = 3a^2 + 6a
    checks = [(draws.mean(), alpha, math.sqrt(alpha / n)),
              ((centred ** 2).mean(), alpha, math.sqrt((3 * alpha**2 + 6 * alpha - alpha**2) / n)),
              ((centred ** 3).mean(), 2 * alpha, math.sqrt(stats.gamma(alpha).moment(6) / n) * 2)]
    for got, expected, se in checks:
        assert abs(got.item() - expected) < 5 * se, (got.item(), expected, se)


def test_gamma_takes_the_first_accepted_round_as_the_sequential_algorithm_does():
    """Marsaglia-Tsang written as a loop over rounds in Python floats on the same words: the same draws; with
    one round the rejected draws take the fallback a - 1/3; more rounds change no draw accepted earlier."""
    alpha, keys, n = 2.5, member_keys([77]), 400
    d, c = alpha - 1 / 3, 1 / math.sqrt(9 * (alpha - 1 / 3))
    expected, rejected_first = [], 0
    for i in range(n):
        for r in range(streams.GAMMA_ROUNDS):
            w = reference_philox([i, 0, streams.PURPOSES["gamma"], r], keys[0].tolist())
            u1, u2, u3 = ((x + 0.5) / 2**32 for x in w[:3])
            z = math.sqrt(-2 * math.log(u1)) * math.cos(2 * math.pi * u2)
            v = (1 + c * z) ** 3
            if v > 0 and math.log(u3) < 0.5 * z * z + d - d * v + d * math.log(v):
                expected.append(d * v)
                rejected_first += r > 0
                break
    got = gamma(keys, 0, alpha, (n,))[0]
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=0)
    assert rejected_first > 0  # the check saw later rounds
    one = gamma(keys, 0, alpha, (n,), rounds=1)[0]
    first_round = one != d
    assert (~first_round).sum() == rejected_first
    assert torch.equal(one[first_round], got[first_round])


def test_dirichlet_kernels_from_gamma_draws_have_the_dirichlet_moments():
    """Rows of normalised Gamma(alpha) draws over 3 states: mean 1/3 and variance (1/3)(2/3) / (3 alpha + 1)
    per entry, and negative covariance -1/9 / (3 alpha + 1) between entries."""
    for alpha in (0.5, 1.0, 3.0):
        g = gamma(member_keys([5, 6, 7]), 2, alpha, (4000, 3)).flatten(0, 1)
        rows = g / g.sum(-1, keepdim=True)
        n, a0 = rows.shape[0], 3 * alpha
        var = (1 / 3) * (2 / 3) / (a0 + 1)
        assert ((rows.mean(0) - 1 / 3).abs() < 5 * math.sqrt(var / n)).all()
        cov = torch.cov(rows.T)
        assert ((cov.diagonal() - var).abs() < 0.1 * var).all()
        assert abs(cov[0, 1].item() + (1 / 9) / (a0 + 1)) < 0.1 * (1 / 9) / (a0 + 1)


# ---------------------------------------------------------------------------------- chains from the stream
def test_chains_sampled_from_the_stream_have_their_kernels_transition_counts():
    """Sequences of a 3-state chain drawn step by step from the stream's words (first state from the stationary
    law, each step by `categorical`), for two members; each row's transition counts against its kernel
    (chi-square given the visits)."""
    kernel = torch.tensor([[0.7, 0.2, 0.1], [0.05, 0.9, 0.05], [0.3, 0.3, 0.4]], dtype=torch.float64)
    evals, evecs = torch.linalg.eig(kernel.T)
    stationary = evecs[:, evals.real.argmax()].real
    stationary = stationary / stationary.sum()
    batch, length = 64, 400
    drawn = words(member_keys([1, 2]), 0, {"first": batch, "steps": batch * (length - 1)})
    states = [categorical(stationary.cumsum(0), drawn["first"])]
    steps = drawn["steps"].view(2, batch, length - 1)
    cdf = kernel.cumsum(-1)
    for t in range(length - 1):
        states.append(categorical(cdf[states[-1]], steps[..., t]))
    chain = torch.stack(states, dim=-1)  # [member, batch, pos]
    for member in chain:
        pairs = torch.bincount((member[:, :-1] * 3 + member[:, 1:]).flatten(), minlength=9).view(3, 3)
        for row in range(3):
            assert _chi_square_p(pairs[row], pairs[row].sum() * kernel[row]) > _P
        first = torch.bincount(member[:, 0], minlength=3)
        assert _chi_square_p(first, batch * stationary) > _P
