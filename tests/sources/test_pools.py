"""Finite pools of kernels (`RandomMarkov(pool_size=N)`) and the `Source` protocol.

The pool-Bayes predictor and its loss are checked against brute force: every sequence of a short window is
enumerated and its probability under the pool (1/N sum_n mu_n(first k states) prod K_n) summed in plain Python,
with stationary laws from power iteration. The Monte Carlo values must cover the exact ones within 3 of their
standard errors (4 per position of a curve), as in test_references.
"""

import hashlib
import itertools
import json
import math

import pytest
import torch

from markov_interp import probes, sources, sweep, theory, training
from markov_interp.sources import BinaryChain, KernelSource, MarkovChain, RandomMarkov, Source, SourceConfig
# by power iteration, plain Python
from tests.theory.test_kernel_predictions import _power_stationary as power_stationary

MU2 = [0.4, 0.1, 0.2, 0.3]  # a non-stationary first-context law, order 2 on 2 states


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MARKOV_INTERP_CACHE", str(tmp_path / "cache"))
    theory._random_references.cache_clear()
    theory._kernel_expectations_cached.cache_clear()


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def covers(value: float, se: float, exact: float) -> bool:
    return abs(value - exact) <= 3 * se + 1e-9


# ------------------------------------------------------------------------------------ brute force (plain Python)
def context_of(states, vocab: int) -> int:
    return sum(s * vocab ** (len(states) - 1 - i) for i, s in enumerate(states))


def seq_prob(seq: tuple, flat: list, mu: list, vocab: int, order: int) -> float:
    """P(x_0..x_t) under one kernel: the first-context law summed over the states not yet drawn, then the rows."""
    if len(seq) < order:
        return sum(mu[context_of(seq + rest, vocab)] for rest in itertools.product(range(vocab), repeat=order - len(seq)))
    p = mu[context_of(seq[:order], vocab)]
    for t in range(order, len(seq)):
        p *= flat[context_of(seq[t - order:t], vocab)][seq[t]]
    return p


class BrutePool:
    """The pool's law over sequences, by enumeration."""

    def __init__(self, source: RandomMarkov, mu: list | None = None):
        self.vocab, self.order = source.vocab, source.order
        self.flats = [k.tolist() for k in source.pool]
        self.mus = [mu if mu is not None else power_stationary(f, self.vocab) for f in self.flats]

    def joint(self, seq: tuple) -> list:
        return [seq_prob(seq, f, m, self.vocab, self.order) for f, m in zip(self.flats, self.mus)]

    def prob(self, seq: tuple) -> float:
        return sum(self.joint(seq)) / len(self.flats)

    def predictive(self, seq: tuple) -> list:
        return [self.prob(seq + (v,)) / self.prob(seq) for v in range(self.vocab)]

    def expected_losses(self, length: int) -> list:
        """E[-log pool-Bayes prediction of x_{t+1}] at t = 0..length-2 under the pool's law."""
        out = [0.0] * (length - 1)
        for seq in itertools.product(range(self.vocab), repeat=length):
            p = self.prob(seq)
            for t in range(length - 1):
                out[t] += p * -math.log(self.predictive(seq[: t + 1])[seq[t + 1]])
        return out


CASES = [(2, 1, 1, 6), (2, 1, 3, 6), (3, 1, 2, 4), (3, 1, 3, 4), (2, 2, 2, 6), (2, 2, 3, 5), (3, 2, 2, 4)]


@pytest.mark.parametrize("vocab,order,n,length", CASES)
@pytest.mark.parametrize("initial", ["stationary", "given"])
def test_pool_bayes_predictions_match_brute_force(vocab, order, n, length, initial):
    mu = None
    if initial == "given":
        mu = MU2 if (vocab, order) == (2, 2) else [1 / vocab**order] * vocab**order
    source = RandomMarkov(vocab, order, alpha=0.7, pool_size=n, pool_seed=11,
                          initial="stationary" if mu is None else mu)
    brute = BrutePool(source, mu)
    tokens = torch.tensor(list(itertools.product(range(vocab), repeat=length)))
    laws = source.initial_context_laws(source.pool)
    probs = sources.pool_bayes_predictions(source.pool, laws, tokens)
    post = sources.pool_posterior(source.pool, laws, tokens)
    for row, seq in enumerate(tokens.tolist()):
        for t in range(length):
            expected = brute.predictive(tuple(seq[: t + 1]))
            assert probs[row, t].tolist() == pytest.approx(expected, abs=1e-10), (seq, t)
            joint = brute.joint(tuple(seq[: t + 1]))
            assert post[row, t].tolist() == pytest.approx([j / sum(joint) for j in joint], abs=1e-10)
    # the source's own predictor is the pool's Bayes predictor
    assert torch.allclose(source.predictive(tokens), probs, atol=1e-12)


def test_chunking_bounds_memory_and_changes_nothing(monkeypatch):
    source = RandomMarkov(3, order=2, pool_size=5)
    tokens = source.sample(37, 30, gen(3))
    laws = source.initial_context_laws(source.pool)
    whole = sources.pool_bayes_predictions(source.pool, laws, tokens)
    monkeypatch.setattr(sources.dirichlet, "_CHUNK_ELEMENTS", 30 * 27 * 2)  # two sequences per chunk
    assert torch.equal(sources.pool_bayes_predictions(source.pool, laws, tokens), whole)


def test_long_sequences_do_not_underflow():
    source = RandomMarkov(3, pool_size=4, alpha=0.3)
    tokens = source.sample(4, 4096, gen(4))
    probs = source.predictive(tokens)
    assert torch.isfinite(probs).all() and torch.allclose(probs.sum(-1), torch.ones(4, 4096, dtype=torch.float64))
    post = sources.pool_posterior(source.pool, source.initial_context_laws(source.pool), tokens)
    assert (post[:, -1].max(-1).values > 0.999).all()  # by then the posterior has found the kernel


def test_impossible_sequences_are_refused():
    pool = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[1.0, 0.0], [0.5, 0.5]]], dtype=torch.float64)
    with pytest.raises(ValueError, match="probability 0 under every kernel"):
        sources.pool_posterior(pool, torch.full((2, 2), 0.5, dtype=torch.float64), torch.tensor([[0, 1]]))
    # kernel 0 never moves from 0 to 1: after that transition only kernel 1 remains
    pool = torch.tensor([[[1.0, 0.0], [0.5, 0.5]], [[0.5, 0.5], [0.2, 0.8]]], dtype=torch.float64)
    post = sources.pool_posterior(pool, torch.tensor([[1.0, 0.0], [1.0, 0.0]], dtype=torch.float64),
                                 torch.tensor([[0, 0, 1, 1]]))
    expected = torch.tensor([[0.5, 0.5], [2 / 3, 1 / 3], [0.0, 1.0], [0.0, 1.0]], dtype=torch.float64)
    assert torch.allclose(post[0], expected, atol=1e-12)
    with pytest.raises(ValueError, match="tokens must lie"):
        sources.pool_bayes_predictions(pool, torch.full((2, 2), 0.5, dtype=torch.float64), torch.tensor([[0, 2]]))


# ------------------------------------------------------------------------------------------- a pool of one
@pytest.mark.parametrize("initial", ["stationary", MU2], ids=["stationary", "given"])
def test_a_pool_of_one_is_the_fixed_chain(initial):
    source = RandomMarkov(2, order=2, pool_size=1, pool_seed=3, initial=initial)
    chain = MarkovChain(source.pool[0], order=2, initial=initial)
    tokens = chain.sample(16, 12, gen(5))
    laws = source.initial_context_laws(source.pool)
    pool_bayes = sources.pool_bayes_predictions(source.pool, laws, tokens)
    assert torch.allclose(pool_bayes, chain.predictive(tokens), atol=1e-12)
    assert torch.allclose(pool_bayes, sources.kernel_predictions(chain.pool, tokens, chain.initial_context_laws(chain.pool)),
                          atol=1e-12)
    assert torch.allclose(source.predictive(tokens), pool_bayes, atol=1e-12)


def test_pool_of_one_loss_is_its_entropy_rate():
    source = RandomMarkov(3, pool_size=1, pool_seed=2)
    refs = theory.reference_losses(source, 12, n_sequences=512)
    exact = theory.entropy_rate(source.pool[0])
    assert refs.entropy_rate == pytest.approx(exact, abs=1e-12) and refs.entropy_rate_se == 0
    assert refs.pool_bayes_loss == pytest.approx(exact, abs=1e-12) and refs.pool_bayes_loss_se < 1e-12
    assert refs.optimum == refs.pool_bayes_loss


# ----------------------------------------------------------------------------------- pool-Bayes loss, exact
@pytest.mark.parametrize("vocab,order,n,length,mu", [(2, 1, 3, 8, None), (3, 1, 2, 5, None), (2, 2, 2, 7, None),
                                                     (3, 2, 3, 4, None), (2, 1, 3, 8, [0.9, 0.1]), (2, 2, 2, 7, MU2)])
def test_pool_references_match_exact_enumeration(vocab, order, n, length, mu):
    source = RandomMarkov(vocab, order, pool_size=n, pool_seed=7, initial="stationary" if mu is None else mu)
    brute = BrutePool(source, mu)
    exact = brute.expected_losses(length)
    refs = theory.reference_losses(source, length, n_sequences=4096)
    assert refs.pool_bayes_loss_se < 2e-3
    assert covers(refs.pool_bayes_loss, refs.pool_bayes_loss_se, sum(exact) / len(exact)), (refs.pool_bayes_loss, exact)
    for value, se, want in zip(refs.pool_bayes_curve, refs.pool_bayes_curve_se, exact):
        assert abs(value - want) <= 4 * se + 1e-9
    # entropy rate and E[H(pi)]: exact averages over the pool, from power-iteration stationary laws
    rates, hpis = [], []
    for flat in brute.flats:
        mu = power_stationary(flat, vocab)
        rates.append(sum(m * -sum(p * math.log(p) for p in row if p > 0) for m, row in zip(mu, flat)))
        pi = [sum(mu[c] for c in range(len(mu)) if c % vocab == x) for x in range(vocab)]
        hpis.append(-sum(p * math.log(p) for p in pi if p > 0))
    assert refs.entropy_rate == pytest.approx(sum(rates) / n, abs=1e-9) and refs.entropy_rate_se == 0
    assert refs.oracle_unigram_loss == pytest.approx(sum(hpis) / n, abs=1e-9)
    # the pool's Bayes predictor is the best predictor of the pool's sequences: no worse than the Dirichlet one
    assert refs.pool_bayes_loss <= refs.bayes_loss + 3 * (refs.bayes_loss_se + refs.pool_bayes_loss_se)
    assert refs.optimum == refs.pool_bayes_loss and "pool Bayes loss" in refs.describe()
    assert theory.ReferenceLosses.from_row(refs.as_row()).pool_bayes_loss == refs.pool_bayes_loss


@pytest.mark.slow
def test_pool_bayes_approaches_the_in_context_bayes_loss_as_the_pool_grows():
    """Monte Carlo, 2 states, 8 targets, 4096 sequences per pool. On the pool's own sequences (the two
    estimates share them) the in-context (Dirichlet) Bayes predictor's loss exceeds the pool-Bayes loss by a gap
    that closes as N grows: measured over pool seeds 0, 1, 2: 0.213 / 0.060 / 0.097 at N = 1, 0.010 / 0.006 /
    0.012 at N = 16, 0.0017 / 0.0008 / 0.0010 at N = 1024. And the pool-Bayes excess over the pool's entropy
    rate tends to the fresh-kernel source's Bayes excess (0.1102; at N = 1024: 0.1095 / 0.1097 / 0.1105), though
    not monotonically (0.1196 / 0.0874 / 0.1120 at N = 16: it depends on the pool drawn). Tolerance at N = 1024:
    0.004, about 3 standard errors of one estimate (~0.0013)."""
    length = 9
    fresh = theory.reference_losses(RandomMarkov(2), length)
    gaps, excess = {}, {}
    for n in (1, 16, 1024):
        refs = theory.reference_losses(RandomMarkov(2, pool_size=n), length, n_sequences=4096)
        gaps[n] = refs.bayes_loss - refs.pool_bayes_loss
        excess[n] = refs.pool_bayes_loss - refs.entropy_rate
    assert gaps[1] > 0.05 > gaps[16] > gaps[1024] and abs(gaps[1024]) < 0.004, gaps
    assert excess[1] == pytest.approx(0.0, abs=1e-12) and excess[16] > 0.05, excess
    assert excess[1024] == pytest.approx(fresh.bayes_loss - fresh.entropy_rate, abs=0.004), (excess, fresh)


def test_paired_losses_use_the_pool_bayes_predictor():
    """Training's paired evaluation (`theory.paired_losses`) on a pool: plain log-losses of sampled sequences
    average to the pool-Bayes and in-context unigram references."""
    source = RandomMarkov(3, pool_size=4, pool_seed=1)
    refs = theory.reference_losses(source, 17, n_sequences=2048)
    tokens = source.sample(8192, 17, gen(8))
    for law, value, se in ((source.predictive(tokens), refs.pool_bayes_loss, refs.pool_bayes_loss_se),
                           (theory.plateau_predictions(source, tokens), refs.unigram_loss, refs.unigram_loss_se)):
        per_seq = theory.target_log_loss(law, tokens).mean(1)
        assert abs(per_seq.mean().item() - value) <= 3 * (se + per_seq.std().item() / math.sqrt(8192))
    true, plateau = theory.paired_losses(source, tokens)
    assert true < refs.bayes_loss < plateau  # memorising four kernels beats estimating in context


# ------------------------------------------------------------------------------------------------ sampling
def test_pool_sequences_draw_the_pool_kernels_uniformly_and_follow_them():
    source = RandomMarkov(3, pool_size=3, pool_seed=5)
    tokens, kernels = source.sample(3000, 200, gen(6), return_kernels=True)
    which = (kernels[:, None] == source.pool[None]).flatten(2).all(-1)  # [batch, pool]
    assert (which.sum(1) == 1).all()  # every sequence's kernel is one of the pool's
    counts = which.sum(0)
    assert ((counts - 1000).abs() < 5 * math.sqrt(3000 * (1 / 3) * (2 / 3))).all(), counts
    for n in range(3):  # transitions of the sequences of kernel n follow kernel n
        rows = tokens[which[:, n]]
        pairs = torch.zeros(3, 3, dtype=torch.float64)
        pairs.index_put_((rows[:, :-1].flatten(), rows[:, 1:].flatten()), torch.ones(1, dtype=torch.float64),
                         accumulate=True)
        assert torch.allclose(pairs / pairs.sum(1, keepdim=True), source.pool[n], atol=0.02)


def test_the_pool_is_fixed_by_its_seed_alone():
    a = RandomMarkov(3, order=2, alpha=0.5, pool_size=4, pool_seed=9)
    torch.manual_seed(123)  # the global RNG plays no part
    b = RandomMarkov(3, order=2, alpha=0.5, pool_size=4, pool_seed=9)
    b.sample(8, 10, gen(1))
    assert torch.equal(a.pool, b.pool) and not torch.equal(a.pool, RandomMarkov(3, 2, 0.5, pool_size=4,
                                                                                    pool_seed=10).pool)
    assert torch.equal(a.sample(8, 10, gen(2)), b.sample(8, 10, gen(2)))  # same seed, same sequences
    assert torch.equal(RandomMarkov(3, pool_size=4).pool, RandomMarkov(3, pool_size=4, pool_seed=0).pool)


def test_pool_kernels_follow_the_dirichlet_prior():
    pool = RandomMarkov(3, alpha=0.5, pool_size=20000, pool_seed=1).pool  # 60000 rows
    rows = pool.reshape(-1, 3)
    var = (1 / 3) * (2 / 3) / (3 * 0.5 + 1)  # Dirichlet(0.5, 0.5, 0.5) marginal variance
    assert (rows.mean(0) - 1 / 3).abs().max() < 5 * math.sqrt(var / rows.shape[0])
    assert (rows.var(0) - var).abs().max() < 0.005


# Hashes of samples drawn at main 0433c0e, before pools existed: pool_size=None draws the same numbers.
GOLDEN = {"rm3": "b5c0aee2f02ff8a4", "rm3o2": ("723984808af239af", "eb56ce639e69f6a3"), "rm2u": "04d38e365cc534cb",
          "bin": "16be86fe5b3d8189", "mk": "70ad00fbc4ded92b"}


def _hash(t: torch.Tensor) -> str:
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()[:16]


def test_fresh_kernel_and_fixed_chain_samples_are_unchanged():
    assert _hash(RandomMarkov(3).sample(64, 50, gen(1))) == GOLDEN["rm3"]
    tokens, kernels = RandomMarkov(3, order=2, alpha=0.5).sample(64, 50, gen(2), return_kernels=True)
    assert (_hash(tokens), _hash(kernels)) == GOLDEN["rm3o2"]
    assert _hash(RandomMarkov(2, initial="uniform").sample(64, 50, gen(3))) == GOLDEN["rm2u"]
    assert _hash(BinaryChain(0.2, 0.3).sample(64, 50, gen(4))) == GOLDEN["bin"]
    chain = MarkovChain([[.5, .3, .2], [.1, .1, .8], [.3, .3, .4]])
    assert _hash(chain.sample(64, 50, gen(5))) == GOLDEN["mk"]
    tokens, kernels = chain.sample(64, 50, gen(5), return_kernels=True)
    assert _hash(tokens) == GOLDEN["mk"] and torch.equal(kernels, chain.pool.expand(64, -1, -1))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_pools_on_cuda():
    source = RandomMarkov(3, order=2, pool_size=8)
    tokens, kernels = source.sample(32, 40, torch.Generator(device="cuda").manual_seed(0), return_kernels=True)
    assert tokens.is_cuda and kernels.is_cuda
    assert ((kernels[:, None].cpu() == source.pool[None]).flatten(2).all(-1).sum(1) == 1).all()
    assert torch.allclose(source.predictive(tokens).cpu(), source.predictive(tokens.cpu()),
                          atol=1e-12)


# ------------------------------------------------------------------------------------- protocol, out of pool
def test_every_source_satisfies_the_protocol():
    for source, n in ((BinaryChain(0.2, 0.3), 1), (MarkovChain([[0.9, 0.1], [0.5, 0.5]]), 1),
                      (RandomMarkov(3), None), (RandomMarkov(3, pool_size=5), 5)):
        assert isinstance(source, Source)
        assert (source.pool is None) == (n is None) and (n is None or source.pool.shape == (n, source.vocab**source.order,
                                                                                            source.vocab))
        tokens, kernels = source.sample(4, 6, gen(0), return_kernels=True)
        assert tokens.shape == (4, 6) and kernels.shape == (4, source.vocab**source.order, source.vocab)
        laws = source.initial_context_laws(kernels)
        assert laws.shape == (4, source.vocab**source.order)
        assert torch.allclose(laws.sum(-1), torch.ones(4, dtype=torch.float64))
    assert BinaryChain(0.2, 0.3).alpha is None and RandomMarkov(3, alpha=2).alpha == 2.0
    assert not isinstance("chain", Source)


def test_out_of_pool_is_the_prior_without_the_pool():
    source = RandomMarkov(3, order=2, alpha=0.5, pool_size=4, pool_seed=2, initial="uniform")
    fresh = source.out_of_pool()
    assert fresh.pool is None and (fresh.vocab, fresh.order, fresh.alpha, fresh.initial) == (3, 2, 0.5, source.initial)
    _, kernels = fresh.sample(256, 4, gen(1), return_kernels=True)
    distance = (kernels[:, None] - source.pool[None]).abs().flatten(2).max(-1).values
    assert (distance > 1e-6).all()  # no fresh kernel is a pool kernel
    # the kernel-swap recipe of out_of_pool's docstring: a retrieving and an estimating predictor disagree there
    tokens = fresh.sample(64, 64, gen(2))
    retrieve, estimate = source.predictive(tokens), fresh.predictive(tokens)
    assert theory.kl_divergence(estimate, retrieve)[:, -1].mean() > 0.05


# ---------------------------------------------------------------------------------------------- config, errors
def test_pool_config_round_trip_and_build():
    cfg = SourceConfig(kind="random", vocab=3, order=2, alpha=0.5, pool_size=8, pool_seed=4)
    assert SourceConfig.from_json(cfg.to_json()) == cfg
    assert cfg.to_dict()["pool_size"] == 8 and cfg.to_dict()["pool_seed"] == 4
    source = cfg.build()
    assert (source.pool_size, source.pool_seed) == (8, 4)
    assert torch.equal(source.pool, RandomMarkov(3, 2, 0.5, pool_size=8, pool_seed=4).pool)
    assert "pool_seed" not in SourceConfig(kind="random", vocab=3, pool_size=8).to_dict()
    assert SourceConfig(kind="random", vocab=3, pool_size=8).build().pool_seed == 0
    assert cfg.replace(pool_size=None, pool_seed=None).build().pool is None


def test_configs_without_pools_serialise_as_before():
    """config.json and sweep cell ids of sources without the new keys are unchanged (values recorded at main
    0433c0e, before pools existed; on the random stream those runs had, "torch-1", which config.json leaves out:
    a run built from defaults now names "counter-1", another cell)."""
    old_stream = {"train.stream": "torch-1"}
    run = training.default_run(kind="random", vocab=3, **old_stream)
    assert run.source.to_json() == ('{"alpha": 1.0, "initial": "stationary", "kernel": null, "kind": "random", '
                                    '"order": 1, "p": null, "q": null, "vocab": 3}')
    assert sweep.cell_id(run) == "108aa4423c2f4573"
    other = training.default_run(kind="random", vocab=3, order=2, alpha=0.5, steps=7, **old_stream)
    assert sweep.cell_id(other) == "442dc70a5795921c"
    pooled = training.default_run(kind="random", vocab=3, **{"source.pool_size": 4}, **old_stream)
    assert sweep.cell_id(pooled) != sweep.cell_id(run) and json.loads(pooled.to_json())["source"]["pool_size"] == 4


@pytest.mark.parametrize("kwargs, message", [
    (dict(pool_size=0), "pool_size must be an integer >= 1, got 0"),
    (dict(pool_size=-3), "pool_size must be an integer >= 1, got -3"),
    (dict(pool_size=2.5), "pool_size must be an integer >= 1, got 2.5"),
    (dict(pool_size=4.0), "pool_size must be an integer >= 1, got 4.0"),
    (dict(pool_size=True), "pool_size must be an integer >= 1, got True"),
    (dict(pool_size="4"), "pool_size must be an integer >= 1, got '4'"),
    (dict(pool_seed=3), "pool_seed=3 is set without pool_size"),
    (dict(pool_size=4, pool_seed=-1), "pool_seed must be an integer in 0..9223372036854775807, got -1"),
    (dict(pool_size=4, pool_seed=1.5), "pool_seed must be an integer in 0..9223372036854775807, got 1.5"),
])
def test_bad_pool_options_are_refused(kwargs, message, without_annotation_checks):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        RandomMarkov(3, **kwargs)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        SourceConfig(kind="random", vocab=3, **kwargs)


@pytest.mark.parametrize("kind, fields", [("binary", dict(p=0.2, q=0.3)), ("markov", dict(kernel=[[0.5, 0.5], [0.5, 0.5]]))])
def test_fixed_chains_refuse_pool_options(kind, fields):
    for extra in (dict(pool_size=4), dict(pool_seed=1)):
        with pytest.raises(ValueError, match=rf"a {kind} source does not use \['{next(iter(extra))}'\]"):
            SourceConfig(kind=kind, **fields, **extra)
    with pytest.raises(TypeError):
        BinaryChain(0.2, 0.3, pool_size=4)


class Dirichlet2:
    """A random-kernel source of a class of its own: it satisfies the protocol without deriving from the package's
    sources. Its `predictive` is deliberately not the add-alpha law (uniform), so a caller that used it shows."""

    vocab, order, alpha, pool, support, initial, in_context = 2, 1, 1.0, None, None, "stationary", True

    def sample(self, batch, seq_len, generator=None, *, device=None, return_kernels=False):
        return RandomMarkov(2).sample(batch, seq_len, generator, device=device, return_kernels=return_kernels)

    def predictive(self, tokens):
        return torch.full((*tokens.shape, 2), 0.5, dtype=torch.float64)

    def initial_context_laws(self, kernels):
        return RandomMarkov(2).initial_context_laws(kernels)


def test_theory_dispatches_through_the_protocol():
    source, tokens = Dirichlet2(), RandomMarkov(2).sample(3, 9, gen(0))
    assert isinstance(source, KernelSource)
    assert theory.paired_losses(source, tokens)[0] == pytest.approx(math.log(2))  # the source's own predictive
    assert torch.equal(theory.plateau_predictions(source, tokens), sources.add_beta_predictions(tokens, 2, order=0))
    with pytest.raises(ValueError, match="keyed on the source.s config"):  # the Monte Carlo is keyed on its config
        theory.reference_losses(source, 8)
    with pytest.raises(ValueError, match="no single kernel"):
        theory.entropy_rate(RandomMarkov(2, pool_size=2))
    one = RandomMarkov(2, pool_size=1)
    assert theory.entropy_rate(one) == theory.entropy_rate(one.pool[0])


def test_probes_take_any_protocol_source():
    """`probes.sample_batch` goes through the protocol: a source of a class of its own gives the batch its
    equal RandomMarkov gives; theory's Monte Carlo references need the source's config and say so."""
    mine, theirs = (probes.sample_batch(s, n_sequences=6, seq_len=10, seed=2) for s in (Dirichlet2(), RandomMarkov(2)))
    assert isinstance(Dirichlet2(), KernelSource)
    assert torch.equal(mine.tokens, theirs.tokens) and torch.equal(mine.kernels, theirs.kernels)
    assert (mine.random_kernel, mine.beta) == (True, 1.0) and torch.equal(mine.initial, theirs.initial)
    with pytest.raises(ValueError, match="keyed on the source's config: Dirichlet2 has no `config`"):
        theory.reference_losses(Dirichlet2(), 8)
    with pytest.raises(TypeError, match="source must be a Markov source"):
        probes.sample_batch("binary", n_sequences=4, seq_len=4, seed=0)


# ------------------------------------------------------------------------------------------------- training
def test_the_cli_flag_and_set_give_the_same_run():
    from markov_interp.cli import _train_run, build_parser

    def run_of(*argv):
        return _train_run(build_parser().parse_args(["train", "--out", "x", "--source", "random", "--vocab", "3", *argv]))

    assert run_of("--pool-size", "4") == run_of("--set", "source.pool_size=4")
    assert run_of("--pool-size", "4").source.build().pool.shape == (4, 3, 3)
    assert run_of("--pool-size", "4", "--set", "source.pool_seed=2").source.pool_seed == 2


@pytest.mark.slow
def test_training_on_a_pool_through_the_api_and_the_cli(tmp_path):
    from markov_interp.cli import main
    from markov_interp.training import RunConfig, TrainConfig, train  # noqa: F401 (the public API)

    run = training.default_run(kind="random", vocab=3, **{
        "source.pool_size": 4, "model.n_ctx": 16, "train.steps": 6, "train.seq_len": 16, "train.batch_size": 4,
        "train.eval_every": 3, "train.eval_batches": 1, "train.log_every": 3, "train.device": "cpu"})
    result = train(run, tmp_path / "api")
    refs = theory.reference_losses(run.source.build(), run.train.seq_len + 1)
    evals = [r for r in result.metrics if "eval_loss" in r]
    assert evals and evals[-1]["pool_bayes_loss"] == round(refs.pool_bayes_loss, 12)
    assert math.isfinite(result.final.eval_loss) and math.isfinite(evals[-1]["eval_true_loss"])
    saved = json.loads((tmp_path / "api" / "config.json").read_text())
    assert saved["source"]["pool_size"] == 4 and "pool_seed" not in saved["source"]
    assert main(["train", "--source", "random", "--vocab", "3", "--set", "source.pool_size=4", "--steps", "3",
                 "--seq-len", "16", "--batch-size", "2", "--n-ctx", "16", "--out", str(tmp_path / "cli"),
                 "--no-progress"]) == 0
    cli_cfg = json.loads((tmp_path / "cli" / "config.json").read_text())
    assert cli_cfg["source"]["pool_size"] == 4
    assert main(["train", "--source", "binary", "--set", "source.pool_size=4", "--out", str(tmp_path / "bad"),
                 "--no-progress"]) == 2
