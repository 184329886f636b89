"""The cyclic random-kernel source (`CyclicMarkov`, kind "cyclic"): a source kind added through the `Source`
protocol alone (data.py, and theory's kernel expectations for its prior's support).

Independent computations: the closed forms of a cyclic chain (pi_x proportional to 1 / (1 - s_x), entropy rate
sum_x pi_x h(s_x)), the Beta-Binomial marginal likelihood, a Gauss-Legendre rule over the prior (3 states, alpha
= 1: every s_x uniform on (0, 1)) and every sequence of a short length enumerated; predictions by hand-written
counting loops.
"""

import itertools
import math

import numpy as np
import pytest
import torch

from markov_interp import probes, theory, training
from markov_interp.sources import CyclicMarkov, Source, SourceConfig, source_kinds


def gen(seed):
    return torch.Generator().manual_seed(seed)


def _h(s: np.ndarray) -> np.ndarray:
    return -(s * np.log(s) + (1 - s) * np.log1p(-s))


def _closed_form(stay: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(pi [..., V], entropy rate [...]) of cyclic chains with stay probabilities `stay` [..., V]."""
    weight = 1 / (1 - stay)
    pi = weight / weight.sum(-1, keepdims=True)
    return pi, (pi * _h(stay)).sum(-1)


# ---------------------------------------------------------------------------------------- kernels and sampler
def test_kernels_are_cyclic_with_beta_stay_probabilities():
    source = CyclicMarkov(5, alpha=0.7)
    assert isinstance(source, Source) and "cyclic" in source_kinds()
    kernels = source.sample_kernels(20000, gen(0))
    allowed = source.support
    assert allowed.int().sum(-1).tolist() == [2] * 5 and (kernels[:, ~allowed] == 0).all()
    assert torch.allclose(kernels.sum(-1), torch.ones(20000, 5, dtype=torch.float64))
    stay = torch.diagonal(kernels, dim1=1, dim2=2).numpy()
    # Beta(0.7, 0.7): mean 1/2, variance 1 / (4 (2 alpha + 1)), the five states independent
    se = math.sqrt(1 / (4 * 2.4) / stay.size)
    assert abs(stay.mean() - 0.5) < 5 * se
    assert abs(stay.var() - 1 / (4 * 2.4)) < 0.005
    assert abs(np.corrcoef(stay[:, 0], stay[:, 1])[0, 1]) < 0.03


def test_stationary_law_and_entropy_rate_match_the_closed_forms():
    kernels = CyclicMarkov(4, alpha=0.5).sample_kernels(64, gen(1))
    pi, rate = _closed_form(torch.diagonal(kernels, dim1=1, dim2=2).numpy())
    assert np.allclose(theory.stationary_context_laws(kernels).numpy(), pi, atol=1e-10)
    for k in range(8):
        assert theory.entropy_rate(kernels[k]) == pytest.approx(rate[k], abs=1e-10)
        assert theory.unigram_loss(kernels[k]) == pytest.approx(-(pi[k] * np.log(pi[k])).sum(), abs=1e-10)


def test_sequences_follow_their_kernels_from_a_stationary_first_state():
    tokens, kernels = CyclicMarkov(3, alpha=1.0).sample(4000, 64, gen(2), return_kernels=True)
    steps = (tokens[:, 1:] - tokens[:, :-1]) % 3
    assert set(steps.unique().tolist()) <= {0, 1}  # stay or move on by one
    stay = torch.diagonal(kernels, dim1=1, dim2=2)
    expected = torch.gather(stay, 1, tokens[:, :-1])  # P(stay) at every step given the kernel
    residual = ((steps == 0).double() - expected).mean(1)
    assert abs(residual.mean()) < 5 * residual.std() / math.sqrt(4000)
    pi, _ = _closed_form(stay.numpy())
    first = (torch.nn.functional.one_hot(tokens[:, 0], 3).double().numpy() - pi)  # x_0 ~ pi of its own kernel
    assert (np.abs(first.mean(0)) < 5 * first.std(0) / math.sqrt(4000)).all()


# ------------------------------------------------------------------------------------------- in-context law
def _bayes_by_hand(tokens: torch.Tensor, vocab: int, alpha: float) -> torch.Tensor:
    """P(x_{t+1} | x_0..x_t) with a uniform first state: Beta(alpha + stays, alpha + moves) at the current state."""
    batch, seq = tokens.shape
    out = torch.zeros(batch, seq, vocab, dtype=torch.float64)
    for b in range(batch):
        stays, moves = [0] * vocab, [0] * vocab
        for t in range(seq):
            x = int(tokens[b, t])
            if t:
                prev = int(tokens[b, t - 1])
                stays[prev] += prev == x
                moves[prev] += prev != x
            n = stays[x] + moves[x]
            out[b, t, x] = (alpha + stays[x]) / (2 * alpha + n)
            out[b, t, (x + 1) % vocab] = (alpha + moves[x]) / (2 * alpha + n)
    return out


def test_in_context_law_is_the_beta_binomial_posterior_predictive():
    source = CyclicMarkov(4, alpha=0.5, initial="uniform")
    tokens = source.sample(6, 30, gen(3))
    probs = source.predictive(tokens)
    assert torch.allclose(probs, _bayes_by_hand(tokens, 4, 0.5), atol=1e-12)
    # its log-loss over a sequence is the Beta-Binomial marginal likelihood of the transitions (chain rule)
    loss = theory.target_log_loss(probs, tokens).sum(1)
    for b in range(6):
        x = tokens[b].tolist()
        marginal = 0.0
        for state in range(4):
            stay = sum(1 for s, n in zip(x, x[1:]) if s == state and n == state)
            move = sum(1 for s, n in zip(x, x[1:]) if s == state and n != state)
            marginal += (math.lgamma(0.5 + stay) + math.lgamma(0.5 + move) - math.lgamma(1 + stay + move)
                         - 2 * math.lgamma(0.5) + math.lgamma(1.0))
        assert float(loss[b]) == pytest.approx(-marginal, abs=1e-10)
    # the plateau counts states over the two the current state can move to
    plateau = theory.plateau_predictions(source, tokens)
    assert (plateau[~source.support[tokens]] == 0).all() and torch.allclose(plateau.sum(-1), torch.ones(6, 30,
                                                                                 dtype=torch.float64))


def test_probe_batches_carry_the_kernels_and_the_prior():
    source = SourceConfig(kind="cyclic", vocab=3, alpha=2).build()
    batch = probes.sample_batch(source, n_sequences=8, seq_len=16, seed=0)
    assert batch.random_kernel and batch.beta == 2.0 and batch.kernels.shape == (8, 3, 3)
    assert torch.allclose(batch.initial, theory.stationary_context_laws(batch.kernels))


# --------------------------------------------------------------------------------------------- references
def _prior_grid(n: int = 40) -> tuple[np.ndarray, np.ndarray]:
    """Stay probabilities [n^3, 3] and weights of a Gauss-Legendre rule over (0, 1)^3 (alpha = 1: uniform)."""
    x, w = np.polynomial.legendre.leggauss(n)
    u, w = (x + 1) / 2, w / 2
    stay = np.stack([a.ravel() for a in np.meshgrid(u, u, u, indexing="ij")], 1)
    return stay, np.einsum("i,j,k->ijk", w, w, w).ravel()


def test_kernel_expectations_match_quadrature_of_the_closed_forms():
    stay, weights = _prior_grid()
    pi, rate = _closed_form(stay)
    exact_rate, exact_hpi = (weights * rate).sum(), (weights * -(pi * np.log(pi)).sum(-1)).sum()
    mc = theory.expected_kernel_references(CyclicMarkov(3, alpha=1.0), tol=5e-4)
    assert mc.method == "monte carlo"
    assert abs(mc.entropy_rate - exact_rate) < 4 * mc.entropy_rate_se + 1e-4
    assert abs(mc.oracle_unigram_loss - exact_hpi) < 4 * mc.oracle_unigram_loss_se + 1e-4


def test_the_control_variate_mean_is_exact_for_any_support():
    """`_spread_mean` gives the two closed forms it generalises, and for the cyclic support a Monte Carlo mean."""
    for vocab, alpha, order in ((3, 0.5, 1), (4, 2.0, 1), (3, 1.0, 2)):
        full = np.ones((vocab**order, vocab))
        assert theory._spread_mean(full, alpha) == pytest.approx((vocab - 1) / (vocab * (vocab * alpha + 1) * vocab**order))
    for vocab, alpha in ((3, 0.5), (5, 2.0)):
        width = vocab - 1
        assert theory._spread_mean(1 - np.eye(vocab), alpha) == pytest.approx(
            (vocab - 2) / (vocab * width * (width * alpha + 1)))
    kernels = CyclicMarkov(4, alpha=0.8).sample_kernels(200000, gen(4))
    spread = ((kernels.mean(-2) - 0.25) ** 2).sum(-1)
    expected = theory._spread_mean(CyclicMarkov(4).support.double().numpy(), 0.8)
    assert abs(float(spread.mean()) - expected) < 5 * float(spread.std()) / math.sqrt(200000)


def _enumerated_bayes_loss(seq_len: int, *, stationary: bool) -> float:
    """The in-context Bayes loss per target of CyclicMarkov(3, alpha=1) over every sequence of `seq_len` states,
    each sequence's probability integrated over the prior by quadrature."""
    stay, weights = _prior_grid(24)
    pi, _ = _closed_form(stay)
    total = 0.0
    for x0 in range(3):
        for steps in itertools.product((0, 1), repeat=seq_len - 1):
            x, like = x0, np.ones(len(weights))
            for move in steps:
                like = like * (1 - stay[:, x] if move else stay[:, x])
                x = (x + move) % 3
            start = pi[:, x0] if stationary else np.full(len(weights), 1 / 3)
            joint = (weights * start * like).sum()
            total += joint * -(math.log(joint) - math.log((weights * start).sum()))
    return total / (seq_len - 1)


@pytest.mark.slow
@pytest.mark.parametrize("initial", ["uniform", "stationary"])
def test_reference_losses_match_exact_enumeration(initial, monkeypatch):
    monkeypatch.setenv("MARKOV_INTERP_CACHE", "off")
    refs = theory.reference_losses(CyclicMarkov(3, alpha=1.0, initial=initial), 8, tol=2e-3)
    exact = _enumerated_bayes_loss(8, stationary=initial == "stationary")
    assert abs(refs.bayes_loss - exact) < 4 * refs.bayes_loss_se + 1e-4
    if initial == "uniform":  # add-alpha over the support is the Bayes predictor
        assert refs.add_alpha_loss == refs.bayes_loss
    else:  # the first state says something about the kernel, which add-alpha ignores
        assert refs.add_alpha_loss > refs.bayes_loss
    assert refs.entropy_rate < refs.bayes_loss < refs.unigram_loss < math.log(3)


# ---------------------------------------------------------------------------------------------- config, run
def test_config_round_trip_and_refusals():
    cfg = SourceConfig(kind="cyclic", vocab=4, alpha=0.5, initial="uniform")
    assert SourceConfig.from_json(cfg.to_json()) == cfg
    assert cfg.build().config == cfg.replace(initial=(0.25,) * 4)  # a source states its first law as a law
    assert cfg.vocab_size == 4 and cfg.in_context
    with pytest.raises(ValueError, match="a cyclic source needs vocab"):
        SourceConfig(kind="cyclic")
    with pytest.raises(ValueError, match=r"a cyclic source does not use \['p'\]"):
        SourceConfig(kind="cyclic", vocab=3, p=0.2)
    with pytest.raises(ValueError, match="vocab must be an integer >= 3, got 2"):
        SourceConfig(kind="cyclic", vocab=2)


def test_the_cli_builds_a_cyclic_run():
    from markov_interp.cli import _train_run, build_parser

    run = _train_run(build_parser().parse_args(["train", "--out", "x", "--source", "cyclic", "--vocab", "3"]))
    assert run.source == SourceConfig(kind="cyclic", vocab=3)
    assert run == training.default_run(kind="cyclic", vocab=3)  # the in-context task's defaults
    assert run.model.n_layers == 2 and run.model.d_vocab == 3


def test_training_batches_are_the_sources_own():
    """The engine's sampler draws what `sample` draws (here: cyclic steps only), alone and beside a Dirichlet
    source in one stack (a sampler that treated the kind as `RandomMarkov` would draw full-support kernels)."""
    from markov_interp.training.batches import member_sampler

    cyclic, dirichlet = CyclicMarkov(4, alpha=0.5), SourceConfig(kind="random", vocab=4, alpha=0.5).build()
    for sources in ([cyclic], [cyclic, dirichlet]):
        tokens = member_sampler(sources, [gen(7 + k) for k in range(len(sources))], 8, 33)()
        assert torch.equal(tokens[0], cyclic.sample(8, 33, generator=gen(7)))
        assert set(((tokens[0, :, 1:] - tokens[0, :, :-1]) % 4).unique().tolist()) <= {0, 1}


@pytest.mark.slow
def test_training_on_cyclic_chains(tmp_path):
    run = training.default_run(kind="cyclic", vocab=3, **{
        "model.n_ctx": 16, "train.steps": 6, "train.seq_len": 16, "train.batch_size": 4, "train.eval_every": 3,
        "train.eval_batches": 1, "train.log_every": 3, "train.device": "cpu"})
    result = training.train(run, tmp_path / "run")
    refs = theory.reference_losses(run.source.build(), run.train.seq_len + 1)
    evals = [r for r in result.metrics if "eval_loss" in r]
    assert evals and evals[-1]["bayes_loss"] == round(refs.bayes_loss, 12)
    assert math.isfinite(result.final.eval_loss)
