"""The attention scores' token statistics and masses against direct per-pair computations, and their
sequence-at-a-time steps against one step over the batch (the same numbers, bit for bit)."""

import itertools

import pytest
import torch

from markov_interp.probes import attention


def _reference_terms(tokens: torch.Tensor, order: int, vocab: int) -> dict:
    """The candidate pairs, matches and baseline rates of `attention._InductionTerms`, pair by pair in Python."""
    batch, seq = tokens.shape
    x = tokens.tolist()
    pairs = [(i, i - lag, lag) for lag in range(1, seq - order) for i in range(order + lag, seq)]
    same = lambda b, i, j, ms: all(x[b][i - m] == x[b][j - 1 - m] for m in ms)  # noqa: E731
    match = [[same(b, i, j, range(order)) for i, j, _ in pairs] for b in range(batch)]
    lower = [[same(b, i, j, range(order - 1)) for i, j, _ in pairs] for b in range(batch)]
    scored = [[any(m for m, (q, _, _) in zip(match[b], pairs) if q == i) for i in range(seq)] for b in range(batch)]
    stratum = lambda b, p: (attention._lag_bucket(pairs[p][2]), x[b][pairs[p][0]], x[b][pairs[p][1]],  # noqa: E731
                            lower[b][p])
    hits, counts = {}, {}
    for b, p in itertools.product(range(batch), range(len(pairs))):
        if scored[b][pairs[p][0]]:
            key = stratum(b, p)
            counts[key] = counts.get(key, 0) + 1
            hits[key] = hits.get(key, 0) + match[b][p]
    rate = [[hits.get(stratum(b, p), 0) / max(counts.get(stratum(b, p), 0), 1) for p in range(len(pairs))]
            for b in range(batch)]
    return {"index": [i * seq + j for i, j, _ in pairs], "query": [i for i, _, _ in pairs], "match": match,
            "rate": rate, "scored": scored}


@pytest.mark.parametrize("shape,vocab,order", [((4, 30), 2, 1), ((3, 25), 3, 2), ((2, 20), 3, 3), ((2, 3), 2, 2),
                                               ((2, 2), 2, 1)])
def test_induction_terms_match_a_pair_by_pair_computation(shape, vocab, order):
    tokens = torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(order))
    terms = attention._induction_terms(tokens, order, vocab)
    for name, expected in _reference_terms(tokens, order, vocab).items():
        got = getattr(terms, name)
        assert got.tolist() == expected, name
    assert terms.rate.dtype == torch.float64 and terms.match.dtype == torch.bool


def test_masses_a_few_sequences_at_a_time_equal_one_step_over_the_batch(monkeypatch):
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 3, (11, 33), generator=gen)
    pattern = torch.softmax(torch.randn(11, 2, 33, 33, generator=gen).masked_fill(
        ~torch.ones(33, 33, dtype=torch.bool).tril(), float("-inf")), dim=-1)
    terms = attention._induction_terms(tokens, 1, 3)

    def scores() -> tuple:
        return (attention.same_token_score(pattern, tokens), attention.previous_token_score(pattern, tokens),
                *attention._lag_masses(pattern, terms, (False, True)))

    chunked = scores()
    monkeypatch.setattr(attention, "_CHUNK", 10**6)  # one step over the whole batch
    whole = scores()
    assert all(torch.equal(a, b) for a, b in zip(chunked, whole))
    # the pair gather against the dense sum over keys: sum_j a_ij x match_ij, mean over the scored queries
    dense = torch.zeros(11, 33 * 33, dtype=torch.float64)
    dense[:, terms.index] = terms.match.double()
    n_scored = terms.scored.sum()
    expected = torch.einsum("bhqk,bqk->h", pattern.double(), dense.view(11, 33, 33)) / n_scored
    assert torch.allclose(whole[2].double(), expected, atol=1e-6)
