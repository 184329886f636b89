"""What an edge carries (`probes.edge_content`) and the roles read from it (`probes.circuit`): interchange
interventions against a forward hooked by hand, the donors against a brute-force search, and the circuits of
tests/handbuilt.py whose roles attention scores alone get wrong (a soft previous-token head with a sink, a relayed
previous state, a sink-only decoy, a previous-token pattern that copies something else, switch counting)."""

import dataclasses
import json
import math

import pytest
import torch

from handbuilt import (
    unigram_model,
    copy_decoy_circuit,
    induction_circuit,
    mixed_induction_circuit,
    relay_circuit,
    sink_decoy_circuit,
    sink_induction_circuit,
    step_keyed_circuit,
    switch_counting_circuit,
)
from markov_interp import models, theory
from markov_interp.sources import BinaryChain, RandomMarkov
from markov_interp.probes import Thresholds, classify_mechanism, edge_content, sample_batch
from markov_interp.probes.classify import _decide, _Evidence
from markov_interp.probes.circuit import circuit_verdict, read_circuit
from markov_interp.probes.interchange import EdgeContent
from markov_interp.probes.paths import EdgeKey, EdgeRunner
from markov_interp.probes.interchange import choose_donors, position_variables, variable_names

SEQ = 64


def classify(model, source, *, n_sequences=64, seed=0, **kw):
    return classify_mechanism(model, source, seq_len=SEQ, n_sequences=n_sequences, seed=seed, progress=False, **kw)


# ------------------------------------------------------------------------------ against independent computations
def _scaled_model():
    """Two layers of two heads with LayerNorm, weights scaled far from linear (the path-patching tests' model)."""
    model = models.build(models.preset("paper-2layer", n_ctx=16, n_heads=2, attn_only=True, attn_bias=True), seed=3)
    gen = torch.Generator().manual_seed(0)
    state = models.state_dict_for_save(model)
    state = {n: p * 8.0 if not n.endswith("bias") else torch.randn(p.shape, generator=gen) for n, p in state.items()}
    return models.hooked_model(model.markov_config, state)


@torch.no_grad()
def _hooked_by_hand(model, tokens, sender: str, receiver: str, channel: str, value):
    """The logits and the receiver layer's pattern with `sender`'s output replaced by `value` where `receiver`
    reads it through `channel` alone, by a forward whose one hook recomputes that head input from the weights:
    the stream entering the receiver's block moved by (value - clean output) @ W_O, its LayerNorm, W_{channel}."""
    s_layer, s_head = int(sender[1]), int(sender[3])
    r_layer, r_head = int(receiver[1]), int(receiver[3])
    _, clean = model.run_with_cache(tokens)
    moved = (value - clean[f"blocks.{s_layer}.attn.hook_z"][:, :, s_head]) @ model.W_O[s_layer, s_head]
    stream = clean[f"blocks.{r_layer}.hook_resid_pre"] + moved
    x = stream - stream.mean(-1, keepdim=True)
    x = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + model.cfg.eps)
    p = models.state_dict_for_save(model)
    x = x * p[f"blocks.{r_layer}.ln1.weight"] + p.get(f"blocks.{r_layer}.ln1.bias", 0.0)
    name = channel.upper()
    new = x @ getattr(model, f"W_{name}")[r_layer, r_head] + getattr(model, f"b_{name}")[r_layer, r_head]

    def hook(act, hook=None):
        act = act.clone()
        act[:, :, r_head] = new
        return act

    seen = {}

    def keep(act, hook=None):
        seen["pattern"] = act[:, r_head].clone()
        return act

    logits = model.run_with_hooks(tokens, fwd_hooks=[(f"blocks.{r_layer}.attn.hook_{channel}", hook),
                                                     (f"blocks.{r_layer}.attn.hook_pattern", keep)])
    return logits, seen["pattern"]


@pytest.mark.parametrize("edge", ["L0H1->L1H0.k", "L0H0->L1H1.q", "L0H0->L1H0.v"])
def test_interchange_along_one_edge_equals_a_forward_hooked_by_hand(edge):
    """`EdgeRunner.patched`: the sender's output from other sequences (a donor per position, as `edge_content`
    draws them) patched along one edge: the logits and the receiver's pattern equal those of a forward that
    recomputes that one head input from the weights."""
    model = _scaled_model().requires_grad_(False)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 2, (6, 12), generator=gen)
    pool = torch.randint(0, 2, (10, 12), generator=gen)
    sender, rest = edge.split("->")
    receiver, channel = rest.split(".")
    _, cache = model.run_with_cache(pool)
    donor = torch.randint(0, 10, (6, 12), generator=gen)
    value = cache[f"blocks.0.attn.hook_z"][:, :, int(sender[3])][donor, torch.arange(12)]
    runner = EdgeRunner(model, tokens)
    key = EdgeKey(sender, receiver, channel)
    logits, seen = runner.patched([key, key], [value, runner.clean["blocks.0.attn.hook_z"][:, :, int(sender[3])]],
                                  record=["blocks.1.attn.hook_pattern"])
    by_hand, pattern = _hooked_by_hand(model, tokens, sender, receiver, channel, value)
    assert torch.allclose(logits[0], by_hand, atol=1e-4, rtol=1e-4)
    assert torch.allclose(seen["blocks.1.attn.hook_pattern"][0][:, int(receiver[3])], pattern, atol=1e-5)
    assert torch.allclose(logits[1], runner.clean_logits, atol=1e-5)  # the clean output patched in: the clean run
    assert float((logits[0] - runner.clean_logits).abs().max()) > 0.05  # the patch moves the logits: it could fail


def test_position_variables_match_a_loop():
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 3, (4, 20), generator=gen)
    got = position_variables(tokens, vocab=3, max_lag=2)
    assert tuple(got) == variable_names(2)
    for b in range(4):
        x = tokens[b].tolist()
        for j in range(20):
            lag = [x[j - l] if j - l >= 0 else -1 for l in range(3)]
            counts = [x[:j + 1].count(s) for s in range(3)]
            switches = sum(x[t] != x[t - 1] for t in range(1, j + 1))
            moves = [sum(1 for t in range(1, j + 1) if (x[t - 1], x[t]) == (a, c)) for a in range(3) for c in range(3)]
            want = {"state": [x[j]], "lag1": [lag[1]], "lag2": [lag[2]], "switch": [-1 if j == 0 else int(
                x[j] != x[j - 1])], "step": [lag[1], x[j]], "lags": lag[1:], "window": lag, "counts": counts,
                "switches": [switches], "transitions": moves}
            for name, values in want.items():
                assert got[name][0][b, j].tolist() == values, (name, b, j)
    assert got["state"][1] and not got["counts"][1]  # states are matched exactly, counts by the nearest donor


@pytest.mark.parametrize("name", ["lag1", "counts"])
def test_donors_hold_the_variable_and_the_first_state(name):
    """Every hold donor is another sequence with the same first state that agrees on the variable (exactly, for a
    state; for counts no other sequence of the pool is nearer), at the same position; random donors only obey the
    first state."""
    gen = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, 2, (40, 24), generator=gen)
    values, exact = position_variables(tokens, vocab=2, max_lag=2)[name]
    first = tokens[:, 0]
    donor, covered, dist = choose_donors(values, exact, first, 8, torch.Generator().manual_seed(0))
    for b in range(8):
        for j in range(24):
            others = [p for p in range(40) if p != b and first[p] == first[b]]
            gaps = [float((values[p, j] - values[b, j]).abs().sum()) for p in others]
            d = int(donor[b, j])
            if not covered[b, j]:
                assert d == b and (exact and min(gaps) > 0)
                continue
            assert d != b and first[d] == first[b]
            assert float((values[d, j] - values[b, j]).abs().sum()) == min(gaps) == float(dist[b, j])
            assert not exact or min(gaps) == 0
    assert bool(covered.all())  # 40 sequences cover two states at every position


# ----------------------------------------------------------------------------------------- hand-built circuits
def test_a_plain_induction_circuit_carries_the_lagged_state_into_the_keys():
    model, source = induction_circuit(3, n_ctx=SEQ), RandomMarkov(3)
    report = classify(model, source)
    content = report.content
    assert isinstance(content, EdgeContent) and content.carries("L0H0->L1H0.k") == "lag1"
    row = content["L0H0->L1H0.k"]
    assert row.explained["lag1"] > 0.99 and row.interval["lag1"][0] > 0.95
    assert row.explained["state"] < 0.5 and row.attention["lag1"] > 0.95  # the receiver's attention moves with it
    assert content.carries("embed->L1H0.q") == "state" and not content["embed->L1H0.q"].measured
    assert (report.mechanism, report.order, report.circuit.kind) == ("induction", 1, "induction")
    assert report.previous_token_head == (0, 0) and report.induction_head == (1, 0)
    json.dumps(report.to_dict(), allow_nan=False)
    assert "carries lag1" in content.summary() and "\n" not in repr(content)


@pytest.mark.parametrize("vocab", [2, 3])
def test_a_soft_previous_token_head_with_a_sink_feeds_an_induction_head(vocab):
    """The previous-token head gives i - 1 a share of 0.15 and position 0 the rest: below chance on the plain
    previous-token score, a previous-token head by what its K-edge carries (and beyond the sink)."""
    report = classify(sink_induction_circuit(vocab), RandomMarkov(vocab))
    assert (report.mechanism, report.order) == ("induction", 1) and report.circuit.kind == "induction", report.reasons
    assert report.content.carries("L0H0->L1H0.k") == "lag1"
    scores = report.attention
    assert float(scores.lag_excess(1)[0, 0]) < Thresholds().head_excess  # attention alone misses it (0.11)
    assert float(scores.sink[0, 0]) > 0.8 and float(scores.lag_excess_beyond_sink(1)[0, 0]) > 0.95


def test_a_relayed_previous_state_is_an_induction_circuit():
    report = classify(relay_circuit(3), RandomMarkov(3))
    assert (report.mechanism, report.order) == ("induction", 1), report.reasons
    assert report.induction.relays == {"L1H0": ("L0H0",)}
    assert report.content.carries("L0H0->L1H0.v") == "lag1" and report.content.carries("L1H0->L2H0.k") == "lag1"
    assert float(report.attention.lag_excess(1)[1, 0]) < 0.05  # the relay attends to itself
    assert "relaying L0H0" in report.circuit.describe()


def test_a_sink_only_head_is_not_a_previous_token_head():
    """All but 0.001 of the head's attention sits on position 0: beyond the sink it is a perfect previous-token
    head, but it carries x_0 (the same for every key): no previous state reaches the keys."""
    report = classify(sink_decoy_circuit(3), RandomMarkov(3))
    assert report.mechanism != "induction" and report.circuit.kind != "induction" and not report.circuit_confirmed
    assert float(report.attention.lag_excess_beyond_sink(1)[0, 0]) > 0.95  # what fools a sink-aware score
    assert report.graph.edge("L0H0->L1H0.k").effect < report.graph.threshold  # no token effect to speak of
    assert report.induction.carried.get("L0H0->L1H0.k") in (None, "position")


def test_a_previous_token_pattern_that_copies_something_else_is_not_induction():
    """L1H0 attends from i to i - 1 but copies a counting head's output, not the state: the attention rule calls
    it a previous-token head (an induction circuit); what its K-edge carries is no lagged state."""
    model, source = copy_decoy_circuit(3), RandomMarkov(3)
    report = classify(model, source)
    assert report.mechanism != "induction" and report.circuit.kind != "induction", report.reasons
    assert not (report.content.carries("L1H0->L2H0.k") or "").startswith("lag")
    assert float(report.attention.lag_excess(1)[1, 0]) > 0.95
    by_attention = read_circuit(report.graph, report.attention, order=1, head_excess=Thresholds().head_excess)
    assert by_attention.found  # the decoy the content is for
    assert "L1H0->L2H0.k carries" in report.reasons[0] and "tried: state, lag1" in report.reasons[0]


def test_switch_counting_reaches_the_bigram_law_without_an_induction_head():
    report = classify(switch_counting_circuit(), RandomMarkov(2))
    assert (report.mechanism, report.order, report.circuit.kind) == ("switch_counting", 1, "switch_counting")
    assert report.law.law == "in_context_bigram" and report.law.passed, report.reasons
    assert not report.circuit_confirmed and report.induction.switch_heads[0].name == "L1H0"
    assert report.content.carries("L0H0->L1H0.v") == "lag1" and report.content.carries("embed->L1H0.k") == "state"
    assert "switch counting" in report.reasons[0]
    # the variant attending to the other state's positions is the same circuit; its law needs a division it lacks
    other = classify(switch_counting_circuit(attend="other"), RandomMarkov(2))
    assert other.circuit.kind == "switch_counting" and other.mechanism == "switch_counting"
    assert other.qualifier == "partial" and not other.confident


def test_keys_by_the_step_into_them_are_switch_counting_not_induction():
    """A mixed head (itself and the position before) writes the step (x_{j-1}, x_j) into the keys of a head keyed by
    its own state: its K-edge carries the step, its keys as a whole the step, not the lagged state alone (trained
    two-layer binary models do this, docs/circuits.md); before the step was a variable, the edge carried the window
    and the model was `other`."""
    report = classify(step_keyed_circuit(step_weight=-0.08), RandomMarkov(2))
    assert report.content.carries("L0H0->L1H0.k") == "step"
    keys = report.content.keys_of("L1H0")
    assert keys.carries == "step" and keys.explained["lag1"] < 0.75 and keys.explained["state"] < 0.75
    assert report.circuit.kind == "switch_counting" and report.mechanism == "switch_counting"
    assert not report.circuit_confirmed and "switch counting" in report.reasons[0]


def test_a_mixed_previous_token_head_into_keys_that_match_the_lag_is_induction():
    """The same mixed head feeding an induction head that takes the key's own state back out of its keys: the
    K-edge still carries the step, but the keys as a whole carry the lagged state, so it is induction (and the
    receiver keys test, not the edge alone, tells the two apart)."""
    report = classify(mixed_induction_circuit(), RandomMarkov(2))
    assert report.content.carries("L0H0->L1H0.k") == "step"
    assert report.content.keys_of("L1H0").carries == "lag1"
    assert (report.mechanism, report.order, report.circuit.kind) == ("induction", 1, "induction"), report.reasons
    assert report.confident and report.law.law == "in_context_bigram"


def test_without_the_content_the_roles_come_from_attention():
    """`content=False` (or a model whose residual stream is not additive): the attention rule, which misses the
    sink circuit; the content is None."""
    report = classify(sink_induction_circuit(3), RandomMarkov(3), content=False)
    assert report.content is None and report.mechanism == "other" and not report.circuit_confirmed
    assert "no kept K-edge comes from a previous-token head" in report.reasons[0]


# ----------------------------------------------------------------------------------------- no circuit under it
def test_no_circuit_is_named_and_no_label_is_confident_below_half_faithfulness():
    """The same evidence with the kept circuit's faithfulness set to 0.3: the headline names no circuit, the call
    is not confident, and the reasons say why; the headline always states the faithfulness."""
    report = classify(induction_circuit(3, n_ctx=SEQ), RandomMarkov(3))
    assert report.confident and "faithfulness 1.00" in report.headline()
    graph = dataclasses.replace(report.graph, faithfulness=0.3)
    circuit = circuit_verdict(graph, report.induction, in_weights=False,
                              in_context_fraction=report.in_context_fraction, source_order=1)
    assert circuit.kind == "induction" and not circuit.faithful
    ev = _Evidence(law=report.law, sim=report.strategies, gains=report.gains, swap=report.kernel_swap,
                   induction=report.induction, circuit=circuit, random_kernel=True, source_order=1)
    decision = _decide(ev, report.thresholds)
    assert decision.mechanism == "other" and not decision.confident
    assert "faithfulness 0.30" in decision.reasons[0] and "no circuit is named" in decision.reasons[0]



def test_a_context_free_label_does_not_rest_on_the_circuits_faithfulness():
    """A model that follows the stationary law ignores the context: its kept circuit (of a context effect that may
    be nil) does not carry the label, so a faithfulness below one half leaves `unigram` confident."""
    source = BinaryChain(0.2, 0.3)
    report = classify(unigram_model(theory.stationary_distribution(source.kernel), n_ctx=SEQ), source)
    assert report.mechanism == "unigram" and report.confident
    graph = dataclasses.replace(report.graph, faithfulness=0.1)
    circuit = circuit_verdict(graph, report.induction, in_weights=True,
                              in_context_fraction=report.in_context_fraction, source_order=1)
    ev = _Evidence(law=report.law, sim=report.strategies, gains=report.gains, swap=report.kernel_swap,
                   induction=report.induction, circuit=circuit, random_kernel=False, source_order=1)
    decision = _decide(ev, report.thresholds)
    assert decision.mechanism == "unigram" and decision.confident

def test_a_split_over_confident_readout_keeps_its_circuit():
    """Both roles split over two heads at unembedding scale 8: corrupting half the readout lowers the loss. Ranked
    by the signed change the kept circuit lost its value edges (faithfulness 0.00); by |effect| it keeps them."""
    report = classify(induction_circuit(3, per_role=2, n_ctx=SEQ, logit_scale=8.0), RandomMarkov(3), n_sequences=32)
    assert report.faithfulness >= 0.9 and {"embed->L1H0.v", "embed->L1H1.v"} <= set(report.graph.kept_names)
    assert report.graph.edge("embed->L1H0.v").effect < 0  # kept for its size
    assert (report.mechanism, report.qualifier) == ("induction", "miscalibrated")
