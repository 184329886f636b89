"""Strategy similarity (Edelman et al. 2024): hand-built models are closest to the strategy they implement."""

import json
import math

import pytest
import torch

from handbuilt import hand_set, induction_model, kernel_model, unigram_model
from markov_interp import models, sources, theory
from markov_interp.sources import BinaryChain, MarkovChain, RandomMarkov
from markov_interp.models import ModelConfig
from markov_interp.probes import next_state_probs, sample_batch, strategy_similarity
from markov_interp.probes.strategies import StrategySimilarity
from markov_interp.probes.strategies import STRATEGIES, strategy_probs

KERNEL = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.6, 0.3], [0.3, 0.3, 0.4]], dtype=torch.float64)
SEQ = 48


@pytest.fixture(scope="module")
def fixed_batch():
    return sample_batch(MarkovChain(KERNEL), n_sequences=64, seq_len=SEQ, seed=0)


@pytest.fixture(scope="module")
def random_batch():
    return sample_batch(RandomMarkov(3), n_sequences=64, seq_len=SEQ, seed=0)


@torch.no_grad()
def counting_model(vocab: int, *, n_ctx: int = SEQ, logit_scale: float = 4.0):
    """One attention-only layer that attends uniformly to x_0..x_t and writes logit_scale times the state
    frequencies into the logits: an in-context unigram counter (it ignores which state is current)."""
    cfg = ModelConfig(n_layers=1, n_heads=1, d_model=2 * vocab, d_head=vocab, attn_only=True, normalization=None,
                      tie_weights=False, unembed_bias=True, d_vocab=vocab, n_ctx=n_ctx)
    eye = torch.eye(vocab)
    emb = torch.zeros(vocab, 2 * vocab)
    emb[:, :vocab] = eye  # current state one-hot; queries and keys stay zero, so attention is uniform
    v = torch.zeros(vocab, 2 * vocab)
    v[:, :vocab] = eye
    o = torch.zeros(2 * vocab, vocab)
    o[vocab:] = eye  # frequencies into the output slot
    head = torch.zeros(vocab, 2 * vocab)
    head[:, vocab:] = logit_scale * eye
    return hand_set(cfg, {"embed.weight": emb, "blocks.0.attn.v.weight": v, "blocks.0.attn.o.weight": o,
                          "unembed.weight": head})


def test_kernel_model_is_closest_to_the_true_kernel(fixed_batch):
    sim = strategy_similarity(kernel_model(KERNEL, n_ctx=SEQ), fixed_batch)
    assert sim.closest == "kernel"
    assert sim.kernel == pytest.approx(0.0, abs=1e-6)
    # among the in-context strategies, the k-gram (transition counts) is the one tending to the kernel
    assert sim.in_context_kgram == sim.in_context_bigram
    assert sim.in_context_kgram < min(sim.in_context_unigram, sim.uniform, sim.stationary)


def test_unigram_model_is_closest_to_the_stationary_law(fixed_batch):
    sim = strategy_similarity(unigram_model(theory.stationary_distribution(KERNEL), n_ctx=SEQ), fixed_batch)
    assert sim.closest == "stationary"
    assert sim.stationary == pytest.approx(0.0, abs=1e-6)
    assert sim.kernel > 0.1 and sim.in_context_kgram > 0.1


def test_induction_model_on_random_kernels_is_closest_to_the_in_context_bigram(random_batch):
    sim = strategy_similarity(induction_model(3, n_ctx=SEQ), random_batch)
    assert sim.closest == "in_context_bigram"
    assert sim.in_context_kgram < 0.5 * min(sim.uniform, sim.in_context_unigram)
    assert sim.stationary is None and sim.kernel is None  # no fixed law to store in weights
    assert set(sim.divergences) == {"uniform", "in_context_unigram", "state_and_counts", "in_context_bigram"}
    assert sim.ranking[0] == "in_context_bigram" and sim.ranking[-1] == "uniform"


def test_counting_model_is_closest_to_the_in_context_unigram(random_batch):
    sim = strategy_similarity(counting_model(3), random_batch)
    assert sim.closest == "in_context_unigram"
    assert sim.in_context_unigram < 0.5 * min(sim.uniform, sim.in_context_kgram)


@pytest.mark.parametrize("kind", ["fixed", "random"])
def test_fresh_model_is_closest_to_uniform(kind, fixed_batch, random_batch):
    batch = fixed_batch if kind == "fixed" else random_batch
    model = models.build(models.preset("attn-only-2layer", d_vocab=3, n_ctx=SEQ), seed=0)
    sim = strategy_similarity(model, batch)
    assert sim.closest == "uniform"
    assert sim.uniform < 0.01 < min(v for k, v in sim.divergences.items() if k != "uniform")


def test_divergence_is_kl_from_strategy_to_model_against_a_direct_computation(fixed_batch):
    model = induction_model(3, n_ctx=SEQ)
    probs = next_state_probs(model, fixed_batch.tokens)
    sim = strategy_similarity(model, fixed_batch, probs=probs)
    laws = strategy_probs(fixed_batch)
    assert list(laws) == [n for n in STRATEGIES if n in laws]  # simplest first
    for name in laws:
        p, q = laws[name].numpy(), probs.numpy()
        expected = sum(
            pi * math.log(pi / qi) for prow, qrow in zip(p.reshape(-1, 3), q.reshape(-1, 3))
            for pi, qi in zip(prow, qrow) if pi > 0
        ) / (p.shape[0] * p.shape[1])
        assert sim.divergences[name] == pytest.approx(expected, rel=1e-9), name
    # the opposite direction gives other numbers: the direction is a real choice
    reverse = float(theory.kl_divergence(probs, laws["in_context_unigram"]).mean())
    assert abs(reverse - sim.in_context_unigram) > 1e-3
    assert strategy_similarity(model, fixed_batch).to_dict() == sim.to_dict()  # probs= reuses the same pass


def test_strategy_laws_and_options(random_batch):
    laws = strategy_probs(random_batch)
    assert list(laws) == ["uniform", "in_context_unigram", "state_and_counts", "in_context_bigram"]
    torch.testing.assert_close(laws["in_context_bigram"],
                               sources.add_beta_predictions(random_batch.tokens, 3, order=1, beta=1.0))
    # beta changes the in-context strategies and is recorded
    model = induction_model(3, n_ctx=SEQ)
    default, sharp = strategy_similarity(model, random_batch), strategy_similarity(model, random_batch, beta=0.1)
    assert default.beta == random_batch.beta == 1.0 and sharp.beta == 0.1
    assert sharp.in_context_kgram != default.in_context_kgram and sharp.uniform == default.uniform
    with pytest.raises(ValueError, match="beta"):
        strategy_similarity(model, random_batch, beta=0)


def test_order_two_source_uses_the_trigram_strategy():
    kernel = torch.full((2, 2, 2), 0.5, dtype=torch.float64)
    kernel[0, 1] = torch.tensor([0.9, 0.1], dtype=torch.float64)
    batch = sample_batch(MarkovChain(kernel, order=2), n_sequences=8, seq_len=16, seed=0)
    laws = strategy_probs(batch)
    assert list(laws) == ["uniform", "stationary", "kernel", "in_context_unigram", "in_context_bigram",
                          "in_context_trigram"]  # every order 0..2
    for k, name in enumerate(["in_context_unigram", "in_context_bigram", "in_context_trigram"]):
        torch.testing.assert_close(laws[name], sources.add_beta_predictions(batch.tokens, 2, order=k, beta=0.5))
    sim = strategy_similarity(unigram_model([0.5, 0.5], n_ctx=16), batch)
    assert sim.order == 2 and sim.closest == "uniform"  # uniform before stationary on a tie (pi = 1/2 here)


def test_to_dict_is_json_and_closest_breaks_ties_towards_simpler():
    sim = StrategySimilarity(divergences={"uniform": 0.3, "in_context_unigram": 0.1, "in_context_bigram": 0.1},
                             gaps={"uniform": 0.2, "in_context_unigram": 0.05, "in_context_bigram": 0.05},
                             aliases={}, order=1, beta=1.0)
    assert sim.closest == "in_context_unigram" and sim.stationary is None
    d = json.loads(json.dumps(sim.to_dict(), allow_nan=False))
    assert d == {"divergences": {"uniform": 0.3, "in_context_unigram": 0.1, "in_context_bigram": 0.1},
                 "gaps": {"uniform": 0.2, "in_context_unigram": 0.05, "in_context_bigram": 0.05}, "aliases": {},
                 "order": 1, "beta": 1.0, "closest": "in_context_unigram", "losses": {}}
    batch = sample_batch(BinaryChain(0.2, 0.3), n_sequences=4, seq_len=8, seed=0)
    fixed = strategy_similarity(kernel_model([[0.8, 0.2], [0.3, 0.7]], n_ctx=8), batch).to_dict()
    assert fixed["closest"] == "kernel"
    assert set(fixed["divergences"]) == {"uniform", "stationary", "kernel", "in_context_unigram", "in_context_bigram"}


def test_gaps_are_the_distance_to_the_nearest_other_law_and_aliases_merge_equal_laws(fixed_batch):
    sim = strategy_similarity(kernel_model(KERNEL, n_ctx=SEQ), fixed_batch)
    laws = strategy_probs(fixed_batch)
    for name in laws:  # independent: min over the other laws of mean KL(other || law)
        want = min(float(theory.kl_divergence(laws[o], laws[name]).mean()) for o in laws if o != name)
        assert sim.gaps[name] == pytest.approx(want, rel=1e-9), name
    assert sim.aliases == {}
    symmetric = sample_batch(BinaryChain(0.3, 0.3), n_sequences=8, seq_len=SEQ, seed=0)
    merged = strategy_similarity(unigram_model([0.5, 0.5], n_ctx=SEQ), symmetric)
    assert merged.aliases == {"stationary": "uniform"} and "stationary" not in merged.candidates
    assert merged.closest == "uniform"


@pytest.mark.slow
def test_training_on_random_kernels_goes_uniform_then_unigram_then_bigram(tmp_path):
    """Edelman et al.'s phases on a short two-layer run (about 10 s on one thread); the unigram phase may show
    as the state-and-counts law, which sits just above the in-context unigram law."""
    from markov_interp.sources import SourceConfig
    from markov_interp.training import RunConfig, TrainConfig, list_checkpoints, train

    src = SourceConfig(kind="random", vocab=3)
    run = RunConfig(source=src, model=models.preset("attn-only-2layer", d_vocab=3, n_ctx=32),
                    train=TrainConfig(steps=600, seq_len=32, batch_size=64, lr=1e-2, schedule="constant",
                                      device="cpu", n_checkpoints=12, eval_every=300))
    train(run, tmp_path, progress=False)
    batch = sample_batch(src.build(), n_sequences=128, seq_len=32, seed=1)
    ckpts = list_checkpoints(tmp_path)
    closest = [strategy_similarity(models.build(run.model, seed=0), batch).closest]
    closest += [strategy_similarity(models.load(path, device="cpu"), batch).closest for _, path in ckpts]
    assert closest[0] == "uniform" and closest[-1] == "in_context_bigram", closest
    # the middle phase: the in-context unigram law or the state-and-counts law just above it (closest first)
    middle = [i for i, name in enumerate(closest) if name in ("in_context_unigram", "state_and_counts")]
    assert middle and closest.index("uniform") < middle[0] < closest.index("in_context_bigram"), closest
