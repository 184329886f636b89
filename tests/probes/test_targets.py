"""The representation probes' targets against computations written here, position by position, with plain loops."""

import pytest
import torch

from markov_interp import probes, sources
from markov_interp.sources import BinaryChain, RandomMarkov
from markov_interp.probes.targets import TARGETS, Target, probe_target

V = 3


@pytest.fixture(scope="module")
def tokens():
    return RandomMarkov(V).sample(5, 14, torch.Generator().manual_seed(3))


def _loops(tokens, vocab):
    """Per (sequence, position): state counts, transition counts [V, V], switches, with Python loops."""
    out = {}
    for b, row in enumerate(tokens.tolist()):
        for t in range(len(row)):
            seen = row[: t + 1]
            n = [seen.count(x) for x in range(vocab)]
            pairs = [[sum(1 for u in range(t) if row[u] == c and row[u + 1] == x) for x in range(vocab)]
                     for c in range(vocab)]
            switches = sum(1 for u in range(1, t + 1) if row[u] != row[u - 1])
            out[b, t] = (n, pairs, switches)
    return out


def test_counts_equal_loops(tokens):
    loops = _loops(tokens, V)
    counts = probe_target("state_counts", tokens, vocab=V)
    freq = probe_target("state_counts", tokens, vocab=V, normalize=True)
    trans = probe_target("transition_counts", tokens, vocab=V)
    trans_freq = probe_target("transition_counts", tokens, vocab=V, normalize=True)
    switches = probe_target("switch_counts", tokens)
    rate = probe_target("switch_counts", tokens, normalize=True)
    for (b, t), (n, pairs, s) in loops.items():
        assert counts.values[b, t].tolist() == n
        assert freq.values[b, t].tolist() == pytest.approx([c / (t + 1) for c in n])
        assert trans.values[b, t].tolist() == [c for row in pairs for c in row]
        assert switches.values[b, t, 0] == s
        if t > 0:
            assert trans_freq.values[b, t].tolist() == pytest.approx([c / t for row in pairs for c in row])
            assert rate.values[b, t, 0] == pytest.approx(s / t)
    assert counts.valid.all() and trans.valid.all() and switches.valid.all()
    assert not rate.valid[:, 0].any() and rate.valid[:, 1:].all() and not trans_freq.valid[:, 0].any()
    assert trans.outputs[:4] == ("n00", "n01", "n02", "n10")


def test_transition_counts_of_order_two_equal_loops(tokens):
    counts = sources.transition_counts(tokens, V, order=2)
    for b, row in enumerate(tokens.tolist()):
        for t in range(len(row)):
            expected = torch.zeros(V * V, V, dtype=torch.float64)
            for u in range(1, t):  # the transition (x_{u-1}, x_u) -> x_{u+1}, seen once u + 1 <= t
                expected[row[u - 1] * V + row[u], row[u + 1]] += 1
            assert torch.equal(counts[b, t], expected), (b, t)


def test_two_state_switches_and_state_counts_give_the_transition_counts():
    """The switch-counting identity the targets are meant to test a model for: on two states n01 and n10 differ
    by at most one and add up to the switches, so switches, the first state and the current state give them."""
    tokens = BinaryChain(0.3, 0.4).sample(20, 30, torch.Generator().manual_seed(0))
    trans = probe_target("transition_counts", tokens, vocab=2).values
    switches = probe_target("switch_counts", tokens).values[..., 0]
    assert torch.equal(trans[..., 1] + trans[..., 2], switches)
    assert (trans[..., 1] - trans[..., 2]).abs().max() <= 1


def test_add_beta_row_and_posterior_equal_the_formulas(tokens):
    loops = _loops(tokens, V)
    beta = 0.7
    row = probe_target("add_beta_row", tokens, vocab=V, beta=beta)
    source = RandomMarkov(V, alpha=2.0)
    posterior = probe_target("posterior", tokens, source=source)
    for (b, t), (_, pairs, _) in loops.items():
        current = pairs[int(tokens[b, t])]
        assert row.values[b, t].tolist() == pytest.approx([(c + beta) / (sum(current) + V * beta) for c in current])
        assert posterior.values[b, t].tolist() == pytest.approx([(c + 2.0) / (sum(current) + V * 2.0)
                                                                for c in current])
    chain = BinaryChain(0.2, 0.3)
    binary = chain.sample(3, 10, torch.Generator().manual_seed(1))
    fixed = probe_target("posterior", binary, source=chain)  # a fixed chain: the kernel row of the current state
    kernel = torch.tensor([[0.8, 0.2], [0.3, 0.7]], dtype=torch.float64)
    assert torch.allclose(fixed.values, kernel[binary])


def test_states_and_positions(tokens):
    for lag in (0, 1, 4):
        target = probe_target("state", tokens, vocab=V, lag=lag)
        for b, row in enumerate(tokens.tolist()):
            assert target.values[b, lag:].tolist() == row[: len(row) - lag]
        assert not target.valid[:, :lag].any() and target.valid[:, lag:].all() and target.n_classes == V
    position = probe_target("position", tokens)
    assert position.values[2, :, 0].tolist() == list(range(tokens.shape[1])) and position.kind == "real"


def test_a_batch_gives_its_vocab_and_beta():
    batch = probes.sample_batch(RandomMarkov(3, alpha=0.25), n_sequences=4, seq_len=8, seed=0)
    row = probe_target("add_beta_row", batch)
    assert torch.allclose(row.values, sources.add_beta_predictions(batch.tokens, 3, beta=0.25))
    assert probe_target("state", batch).n_classes == 3


def test_a_tensor_of_ones_own():
    labels = Target.from_tensor(torch.tensor([[0, 2, 1], [1, 1, 0]]), name="mine")
    assert labels.kind == "class" and labels.n_classes == 3 and labels.valid.all()
    beliefs = torch.rand(2, 3, 4, generator=torch.Generator().manual_seed(0))
    beliefs[1, 2, 0] = float("nan")
    real = Target.from_tensor(beliefs)
    assert real.kind == "real" and real.values.shape == (2, 3, 4) and real.values.dtype == torch.float64
    assert not real.valid[1, 2] and int(real.valid.sum()) == 5  # a NaN row is left out
    assert Target.from_tensor(torch.zeros(2, 3, dtype=torch.long), n_classes=4).outputs == ("0", "1", "2", "3")


def test_bad_targets_are_refused(tokens):
    with pytest.raises(ValueError, match="lag 14 reaches beyond the sequences: they have 14 positions"):
        probe_target("state", tokens, vocab=V, lag=14)
    with pytest.raises(ValueError, match="unknown target 'states'; the targets are"):
        probe_target("states", tokens, vocab=V)
    with pytest.raises(ValueError, match=r"takes no option \['lag'\]"):
        probe_target("position", tokens, lag=1)
    with pytest.raises(ValueError, match="needs vocab="):
        probe_target("state_counts", tokens)
    with pytest.raises(ValueError, match=r"tokens .*outside 0\.\.1|tokens must lie in 0\.\.1"):
        probe_target("state", tokens, vocab=2)
    with pytest.raises(ValueError, match="needs source="):
        probe_target("posterior", tokens)
    with pytest.raises(ValueError, match="a target must be"):
        Target.from_tensor(torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="valid must be a boolean tensor of shape"):
        Target.from_tensor(torch.zeros(2, 3), valid=torch.ones(3, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="class labels must be >= 0"):
        Target.from_tensor(torch.tensor([[0, -1]]))
    with pytest.raises(ValueError, match="n_classes must be an integer >= 3"):
        Target.from_tensor(torch.tensor([[0, 2]]), n_classes=2)
    with pytest.raises(ValueError, match="outputs must name the 3 classes, got 2 names"):
        Target(name="x", values=torch.zeros(2, 3, dtype=torch.long), valid=torch.ones(2, 3, dtype=torch.bool),
               n_classes=3, outputs=("a", "b"))
    assert set(TARGETS) == {"state", "state_counts", "transition_counts", "switch_counts", "add_beta_row",
                            "posterior", "position"}
