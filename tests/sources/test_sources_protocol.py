"""Sources through their protocol (issue 34): the public members theory, probes and training read, the kinds the
CLI offers, and the same numbers as before the change (golden digests recorded with main 5e4e421's code)."""

import hashlib
import json

import pytest
import torch

from markov_interp import probes, theory, training
from markov_interp.sources import BinaryChain, MarkovChain, RandomMarkov, SourceConfig, source_kinds

ORDER2 = [[[0.9, 0.1], [0.5, 0.5]], [[0.3, 0.7], [0.2, 0.8]]]


def _sources() -> dict:
    return {
        "binary": BinaryChain(0.2, 0.3),
        "markov2": MarkovChain(ORDER2, order=2),
        "random3": RandomMarkov(3, alpha=0.5),
        "pool": RandomMarkov(3, order=2, pool_size=4, pool_seed=1, initial="uniform"),
        "zero_diag": RandomMarkov(4, zero_diagonal=True),
    }


def _digest(*tensors: torch.Tensor) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


# (sample(16, 40, seed 3, return_kernels=True), probes.sample_batch(n=8, T=24, seed=5): tokens, kernels, initial),
# computed with main 5e4e421 (before sample_batch went through the protocol)
GOLDEN = {
    "binary": ("6a624a9637c05d45", "1814f0eee6ff545a", False, 0.5),
    "markov2": ("7b3d44d29365e8e9", "19b18982d44a8365", False, 0.5),
    "random3": ("61303bbcc433e72a", "8c6b9202824e0c81", True, 0.5),
    "pool": ("258cac9f06eb4f46", "61b205600a93caf4", True, 1.0),
    "zero_diag": ("a1dcba4361f91232", "b583fd8233e6af00", True, 1.0),
}


@pytest.mark.parametrize("name", list(GOLDEN))
def test_batches_are_bit_identical_to_before(name):
    source = _sources()[name]
    tokens, kernels = source.sample(16, 40, torch.Generator().manual_seed(3), return_kernels=True)
    batch = probes.sample_batch(source, n_sequences=8, seq_len=24, seed=5)
    sample_digest, batch_digest, random_kernel, beta = GOLDEN[name]
    assert _digest(tokens, kernels) == sample_digest
    assert _digest(batch.tokens, batch.kernels, batch.initial) == batch_digest
    assert (batch.random_kernel, batch.beta) == (random_kernel, beta)


def test_references_are_the_same_numbers_as_before(monkeypatch):
    """Keyed on the source's config now (not RandomMarkov's parameters): same values, same cache keys."""
    monkeypatch.setenv("MARKOV_INTERP_CACHE", "off")
    theory._random_references.cache_clear()
    binary = theory.reference_losses(RandomMarkov(2, alpha=0.5), 12, n_sequences=64).as_row()
    assert binary == pytest.approx({
        'entropy_rate': 0.35446912586186236, 'entropy_rate_se': 1.0836553049055055e-12,
        'unigram_loss': 0.5555540918993747, 'unigram_loss_se': 0.012090126240179798,
        'bayes_loss': 0.47588460806847416, 'bayes_loss_se': 0.011090328464586633,
        'add_alpha_loss': 0.4891652638248818, 'add_alpha_loss_se': 0.009577830110987662,
        'oracle_unigram_loss': 0.4730964356463566, 'oracle_unigram_loss_se': 1.235708613129243e-09}, rel=1e-12)
    pool = theory.reference_losses(_sources()["pool"], 12, n_sequences=64).as_row()
    assert pool == pytest.approx({
        'entropy_rate': 0.8597280846383661, 'unigram_loss': 1.1099112134533353,
        'unigram_loss_se': 0.012781612828785344, 'bayes_loss': 1.0568489814803108,
        'bayes_loss_se': 0.00786427515960822, 'add_alpha_loss': 1.0568489814803108,
        'add_alpha_loss_se': 0.00786427515960822, 'oracle_unigram_loss': 1.0468728458902083,
        'pool_bayes_loss': 0.9696249481103645, 'pool_bayes_loss_se': 0.00834401795710657}, rel=1e-12)


@pytest.mark.parametrize("source, fields", [
    (RandomMarkov(3, order=2, alpha=0.5), {"vocab": 3, "order": 2, "alpha": 0.5, "initial": "stationary"}),
    (RandomMarkov(3, pool_size=4, initial="uniform"),
     {"vocab": 3, "order": 1, "alpha": 1.0, "initial": [1 / 3] * 3, "pool_size": 4, "pool_seed": 0}),
    (RandomMarkov(4, alpha=2, zero_diagonal=True),
     {"vocab": 4, "order": 1, "alpha": 2.0, "initial": "stationary", "zero_diagonal": True}),
])
def test_dirichlet_cache_keys_are_the_fields_they_had(source, fields):
    """The disk cache's key of a Dirichlet source holds the fields it held when keyed on RandomMarkov's parameters
    (vocab, order, alpha, initial, and pool_size / pool_seed / zero_diagonal when set)."""
    assert source.config.reference_key() == fields


# ---------------------------------------------------------------------------------------------- the members
@pytest.mark.parametrize("name", list(GOLDEN))
def test_config_builds_an_equal_source(name):
    source = _sources()[name]
    config = source.config
    assert SourceConfig.from_json(config.to_json()) == config
    rebuilt = config.build()
    assert type(rebuilt) is type(source) and rebuilt.initial == source.initial
    a = source.sample(6, 20, torch.Generator().manual_seed(1), return_kernels=True)
    b = rebuilt.sample(6, 20, torch.Generator().manual_seed(1), return_kernels=True)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert config.in_context == (source.alpha is not None)


def test_initial_and_kernel_cdf_are_public():
    chain = MarkovChain(ORDER2, order=2)
    assert chain.initial == "stationary"
    assert torch.equal(chain.kernel_cdf, chain.kernel.reshape(4, 2).cumsum(-1)) and chain.kernel_cdf is chain._cdf
    law = (0.1, 0.2, 0.3, 0.4)
    fixed = MarkovChain(ORDER2, order=2, initial=list(law))
    assert fixed.initial == pytest.approx(law) and torch.equal(fixed.initial_context_law, torch.tensor(law, dtype=torch.float64))
    assert BinaryChain(0.2, 0.3, initial="uniform").initial == (0.5, 0.5)
    assert RandomMarkov(2, order=2, initial="uniform").initial == (0.25,) * 4


def test_the_cli_offers_the_builders_kinds():
    from markov_interp.cli import build_parser

    action = next(a for a in build_parser()._subparsers._group_actions[0].choices["train"]._actions
                  if "--source" in a.option_strings)
    assert tuple(action.choices) == source_kinds() and len(source_kinds()) >= 4
    assert all(kind in action.choices for kind in source_kinds()) and "bogus" not in action.choices


def test_in_context_decides_the_defaults():
    assert training.default_run(kind="random", vocab=3).model.n_layers == 2
    assert training.default_run().model.n_layers == 1
    assert SourceConfig(kind="random", vocab=2, pool_size=1).in_context
    assert not SourceConfig(kind="markov", kernel=[[0.5, 0.5], [0.1, 0.9]]).in_context
    assert json.loads(SourceConfig(kind="binary", p=0.2, q=0.3).to_json())["kind"] == "binary"
