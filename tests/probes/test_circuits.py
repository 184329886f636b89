"""Circuit discovery: the edge graph, path patching against a brute-force re-implementation, the kept edges of
hand-built circuits, the gradient estimate, corruptions, graded gains, the state-and-counts law, kernel swap."""

import itertools
import json
import math
import sys

import pytest
import torch
import torch.nn.functional as F

from handbuilt import (
    counting_circuit,
    decoy_kernel_model,
    induction_circuit,
    intended_induction_edges,
    position_edges,
    kernel_model,
    pair_kernel_model,
    skipping_circuit,
    unigram_model,
)
from markov_interp import models, sources, theory
from markov_interp.sources import BinaryChain, MarkovChain, RandomMarkov
from markov_interp.probes import Component, attention_scores, discover_circuit, graded_gains, sample_batch, swap_kernels
from markov_interp.probes.interventions import intervened_run, model_components
from markov_interp.probes.kernel_swap import swap_plan
from markov_interp.probes.paths import EdgeKey, EdgeRunner, edge_attributions, graph_edges
from markov_interp.probes.strategies import state_and_counts_probs
from markov_interp.probes.ablation import derangement
from markov_interp.probes.discovery import corrupted_tokens, kept_edges
from markov_interp.probes.kernel_swap import SwapPlan, _permuted
from markov_interp.probes.paths import edge_estimates

BINARY = BinaryChain(0.2, 0.3)
SEQ = 48


# ------------------------------------------------------------------------------------------ brute force
def _scaled(model, factor: float, seed: int = 0):
    """`model` rebuilt with every weight multiplied by `factor` and its biases drawn (so that attention, LayerNorm
    and the MLP work far from linear). Through the on-disk state, so the same on every TransformerLens version."""
    gen = torch.Generator().manual_seed(seed)
    state = models.state_dict_for_save(model)
    for name, p in state.items():
        state[name] = p * factor if not name.endswith("bias") else torch.randn(p.shape, generator=gen)
    return models.hooked_model(model.markov_config, state)


def _brute_losses(model, tokens, corrupted, bad: set, positions=None) -> torch.Tensor:
    """Each sequence's mean loss with the edges named in `bad` corrupted, computed from the weights alone: every
    sender's output (the token embedding "embed", the position embedding "pos", heads, MLPs) and every receiver
    input formed by hand (ACDC's edge-level forward), independently of the hooks and of `probes.paths`. The
    corrupted run reads `corrupted` tokens at `positions` (default: their own)."""
    p, cfg = models.state_dict_for_save(model), model.markov_config
    heads, dh = model.markov_config.heads_per_layer, cfg.d_head

    def norm(x, w):
        if cfg.normalization is None:
            return x
        return (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + cfg.eps) * w

    def forward(tok, where, corrupt_out, cut):
        out = {"embed": p["embed.weight"][tok], "pos": p["pos_embed.weight"][where]}

        def read(receiver, suffix, upstream):
            total = torch.zeros_like(out["embed"])
            for s in upstream:
                total = total + (corrupt_out[s] if f"{s}->{receiver}{suffix}" in cut else out[s])
            return total

        done = ["embed", "pos"]
        for layer in range(cfg.n_layers):
            new = []
            for h in range(heads[layer]):
                name, rows = f"L{layer}H{h}", slice(h * dh, (h + 1) * dh)
                w1 = p.get(f"blocks.{layer}.ln1.weight")
                q, k, v = (norm(read(name, f".{c}", done), w1) @ p[f"blocks.{layer}.attn.{c}.weight"][rows].T
                           for c in "qkv")
                scores = q @ k.transpose(-1, -2) / math.sqrt(dh)
                mask = torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1)
                pattern = torch.softmax(scores.masked_fill(mask, -torch.inf), dim=-1)
                out[name] = (pattern @ v) @ p[f"blocks.{layer}.attn.o.weight"][:, rows].T
                new.append(name)
            done += new
            if not cfg.attn_only:
                name = f"L{layer}.mlp"
                x = norm(read(name, "", done), p.get(f"blocks.{layer}.ln2.weight"))
                act = F.gelu(x @ p[f"blocks.{layer}.mlp.in.weight"].T) if cfg.act_fn == "gelu" else F.relu(
                    x @ p[f"blocks.{layer}.mlp.in.weight"].T)
                out[name] = act @ p[f"blocks.{layer}.mlp.out.weight"].T
                done.append(name)
        unembed = p["embed.weight"] if cfg.tie_weights else p["unembed.weight"]
        logits = norm(read("logits", "", done), p.get("ln_final.weight")) @ unembed.T + p["unembed.bias"]
        return out, logits

    own = torch.arange(tokens.shape[1]).expand_as(tokens)
    with torch.no_grad():
        corrupt_out, _ = forward(corrupted, own if positions is None else positions, {}, set())
        _, logits = forward(tokens, own, corrupt_out, bad)
    logp = torch.log_softmax(logits.double(), -1)[:, :-1]
    return -torch.gather(logp, 2, tokens[:, 1:, None])[..., 0].mean(1)


def _ln_mlp_model():
    return _scaled(models.build(models.preset("paper-2layer", n_ctx=16, n_heads=2), seed=3), 25.0)


def _uneven_model():
    """Three attention-only layers with 2, 1 and 2 heads (`ModelConfig(n_heads=(2, 1, 2))`: the hooked model has 2
    heads in every layer, layer 1's surplus head zero)."""
    return _scaled(models.build(models.preset("attn-only-2layer", n_layers=3, n_heads=(2, 1, 2), d_vocab=3, n_ctx=16,
                                              d_model=8), seed=4), 8.0)


@pytest.mark.parametrize("make,vocab,corrupt", [(_ln_mlp_model, 2, "tokens"), (_uneven_model, 3, "tokens"),
                                                (_ln_mlp_model, 2, "positions"), (_uneven_model, 3, "both")])
def test_path_patching_agrees_with_a_brute_force_edge_forward(make, vocab, corrupt):
    """Single edges, pairs, every kept edge into a receiver and random joint sets, corrupting the tokens, the
    positions (the positional pass) or both, against the forward written by hand from the weights."""
    model = make()
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (6, 12), generator=gen)
    corrupted = torch.randint(0, vocab, (6, 12), generator=gen) if corrupt != "positions" else tokens
    positions = torch.stack([torch.randperm(12, generator=gen) for _ in range(6)]) if corrupt != "tokens" else None
    runner = EdgeRunner(model, tokens, corrupted, corrupted_positions=positions)
    edges = runner.edges
    subsets = [[], list(edges)] + [[e] for e in edges]
    subsets += [[e for e in edges if torch.rand((), generator=gen) < frac] for frac in (0.2, 0.5, 0.8)]
    pick = torch.randperm(len(edges), generator=gen)[:8].tolist()
    subsets += [[edges[i], edges[j]] for i, j in itertools.combinations(pick, 2)]  # pairs, as the joint tests run
    subsets += [[e for e in edges if e.receiver == r] for r in ("L1H0", "logits")]  # a receiver's edges together
    together = runner.many_losses(subsets)  # every set in one stacked run
    for subset, ours in zip(subsets, together):
        brute = _brute_losses(model, tokens, corrupted, {e.name for e in subset}, positions)
        assert torch.allclose(ours, brute, atol=2e-5, rtol=1e-4), [e.name for e in subset]
    assert torch.allclose(runner.losses(subsets[-1]), together[-1], atol=1e-6)  # alone or stacked: the same
    # the effects are not all zero: the test could fail; edges out of a sender the corruption leaves alone are 0
    single = {e: float((runner.losses([e]) - runner.clean_losses).abs().max()) for e in edges}
    assert max(single.values()) > 0.05
    still = {"tokens": "pos", "positions": "embed", "both": None}[corrupt]
    if still:
        assert not runner.varies(still) and all(v == 0 for e, v in single.items() if e.sender == still)
    else:
        assert runner.varies("embed") and runner.varies("pos")


@pytest.mark.parametrize("make,vocab", [(_ln_mlp_model, 2), (_uneven_model, 3)])
def test_passes_from_the_moved_stream_match_passes_from_the_tokens(make, vocab):
    """The one-pass way of measuring single edges (the residual stream moved by the sender's change and put back
    after the receiver's sublayer), and the stage algorithm's passes started at their stage's block from the moved
    stream, give the losses of passes run from the tokens with the senders' outputs set (`single_pass=False`), for
    single edges, pairs and larger sets, in both passes; a model whose residual stream is not the sum of its
    senders' writes (shortformer) runs from the tokens."""
    model = make()
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, vocab, (6, 12), generator=gen)
    positions = torch.stack([torch.randperm(12, generator=gen) for _ in range(6)])
    for kwargs in (dict(corrupted_tokens=tokens[torch.tensor([1, 2, 3, 4, 5, 0])]), dict(corrupted_positions=positions)):
        fast, staged = (EdgeRunner(model, tokens, single_pass=flag, **kwargs) for flag in (True, False))
        assert fast.single_pass and not staged.single_pass
        edges = fast.edges
        sets = [[e] for e in edges] + [list(edges), [e for e in edges if e.receiver == "logits"]]
        sets += [[edges[i], edges[j]] for i, j in itertools.combinations(torch.randperm(len(edges), generator=gen)[
            :6].tolist(), 2)]
        sets += [[e for e in edges if torch.rand((), generator=gen) < frac] for frac in (0.3, 0.7)]
        ours, theirs = fast.many_losses(sets), staged.many_losses(sets)
        # float32 in another order on models scaled to losses near 10 nats: the brute-force test's tolerance
        assert torch.allclose(ours, theirs, atol=2e-5, rtol=1e-4)
        assert float((theirs - staged.clean_losses).abs().max()) > 0.01  # the effects are not all zero
    model.cfg.positional_embedding_type = "shortformer"
    try:
        assert not EdgeRunner(model, tokens, tokens[torch.tensor([1, 2, 3, 4, 5, 0])]).single_pass
    finally:
        model.cfg.positional_embedding_type = "standard"


def test_graph_edges_follow_the_stages_and_skip_absent_heads():
    model = _uneven_model()
    names = [e.name for e in graph_edges(model)]
    assert "L1H1" not in " ".join(names)  # the absent head is neither sender nor receiver
    assert names[:6] == ["embed->L0H0.q", "pos->L0H0.q", "embed->L0H0.k", "pos->L0H0.k", "embed->L0H0.v",
                         "pos->L0H0.v"]
    assert "L0H0->L2H0.k" in names and "L2H0->logits" in names and "L1H0->L1H0.q" not in names
    # senders embed, pos, then heads: 2 x 3 x 2 edges into layer 0, 3 x 4 into L1H0, 2 x 3 x 5 into layer 2, 7 into
    # the logits
    assert len(names) == 12 + 12 + 30 + 7
    assert [c.name for c in model_components(model, kinds=("head",))] == ["L0H0", "L0H1", "L1H0", "L2H0", "L2H1"]
    with pytest.raises(ValueError, match="only 1 heads"):
        Component.parse("L1H1").check(model)
    scores = attention_scores(model, torch.randint(0, 3, (2, 10)))
    assert math.isnan(float(scores.previous_token[1, 1])) and not math.isnan(float(scores.previous_token[1, 0]))
    mlp = _ln_mlp_model()
    assert [e.name for e in graph_edges(mlp) if e.receiver == "L0.mlp"] == ["embed->L0.mlp", "pos->L0.mlp",
                                                                              "L0H0->L0.mlp", "L0H1->L0.mlp"]


def test_recording_returns_what_the_pass_computed_before_its_replacement():
    model = _ln_mlp_model()
    tokens = torch.randint(0, 2, (3, 10), generator=torch.Generator().manual_seed(1))
    _, cache = model.run_with_cache(tokens)
    comp = Component.parse("L0H1")
    zeros = {comp.hook_name: torch.zeros_like(cache[comp.hook_name])}
    logits, rec = intervened_run(model, tokens, [comp], zeros, record=[comp.hook_name, "blocks.1.attn.hook_q"])
    assert torch.allclose(rec[comp.hook_name], cache[comp.hook_name])  # before the replacement
    assert not torch.allclose(rec["blocks.1.attn.hook_q"], cache["blocks.1.attn.hook_q"])  # downstream moved
    assert not torch.allclose(logits, model(tokens))
    assert Component.parse("L1H0.k").hook_name == "blocks.1.attn.hook_k" and Component.parse("embed").layer == 0
    with pytest.raises(ValueError, match="'embed'"):
        Component.parse("L0.embed")


# ------------------------------------------------------------------------------------- hand-built circuits
def _discover(model, source, **kw):
    kw.setdefault("progress", False)
    return discover_circuit(model, source, seq_len=min(SEQ, model.cfg.n_ctx), n_sequences=16, **kw)


CIRCUITS = {
    "order 1": (lambda: induction_circuit(3, n_ctx=SEQ), RandomMarkov(3), 1, {1: ["L0H0"]}, ("L1H0",)),
    "order 1 binary, decoys": (lambda: induction_circuit(2, n_ctx=SEQ, decoys=True), RandomMarkov(2), 1,
                               {1: ["L0H0"]}, ("L1H0",)),
    "order 2": (lambda: induction_circuit(2, order=2, n_ctx=SEQ), RandomMarkov(2, order=2), 2,
                {1: ["L0H0"], 2: ["L0H1"]}, ("L1H0",)),
    "split over heads": (lambda: induction_circuit(3, per_role=2, n_ctx=SEQ), RandomMarkov(3), 1,
                         {1: ["L0H0", "L0H1"]}, ("L1H0", "L1H1")),
    "split over layers": (lambda: induction_circuit(2, per_role=2, n_layers=3, spread_layers=True, n_ctx=SEQ),
                          RandomMarkov(2), 1, {1: ["L0H0", "L1H0"]}, ("L2H0", "L2H1")),
    "skipping a layer": (lambda: skipping_circuit(3, n_ctx=SEQ), RandomMarkov(3), 1, {1: ["L0H0"]}, ("L2H0",)),
    "order 2 skipping a layer": (lambda: skipping_circuit(2, order=2, n_ctx=SEQ), RandomMarkov(2, order=2), 2,
                                 {1: ["L0H0"], 2: ["L0H1"]}, ("L2H0",)),
}


@pytest.mark.parametrize("name", list(CIRCUITS))
def test_kept_edges_of_handbuilt_induction_circuits_are_exactly_the_intended_ones(name):
    make, source, order, prev, induction = CIRCUITS[name]
    graph = _discover(make(), source, method="exact")  # every edge measured (auto: test_attribution_then_verify_...)
    intended = intended_induction_edges(order, prev=prev, induction=induction)
    # the positional pass adds the previous-token heads' position reads (their queries and keys), and the induction
    # heads' own (they push key 0 away by position) where moving that push changes the loss by the positional
    # pass's threshold in absolute value (binary, decoys: -0.010 nats, kept by the |effect| rule)
    extra = set(graph.kept_names) - (intended | position_edges(prev))
    assert set(graph.kept_names) >= intended | position_edges(prev), graph.summary()
    assert extra <= {f"pos->{i}.k" for i in induction}, graph.summary()
    assert all(abs(graph.edge(e).position_effect) >= graph.position.threshold for e in extra)
    assert set(graph.position.kept) >= position_edges(prev) and not set(graph.position.kept) & {
        e for e in intended if e.startswith("embed")}  # no token edge moves in the positional pass
    assert graph.faithfulness >= 0.9 and graph.position.faithfulness >= 0.9 and graph.completeness >= 0.9
    token_kept = [e for e in graph.kept_names if not e.startswith("pos")]
    # every kept edge matters inside the circuit (redundant copies of a role least: 0.004 nats each, split over layers)
    assert all(graph.minimality[e] > 1e-3 for e in token_kept)
    assert all(graph.position.minimality[e] > 0.01 for e in position_edges(prev))
    assert graph.cancelling == ()  # nothing cancels in these circuits
    dropped = [e for e in graph.edges if e.name not in graph.kept_names]
    assert max(abs(e.effect) for e in dropped) < 1e-6  # decoys and unread slots: exactly nothing
    # positions of dropped edges: nothing, but for the induction head's keys, which push away key 0 by position
    # (moving that push elsewhere helps a little: a negative effect, kept only where it reaches the threshold)
    assert max(abs(e.position_effect) for e in dropped if not e.name.startswith("pos->L")) < 1e-6
    assert max(abs(e.position_effect) for e in dropped) < graph.position.threshold
    assert all(e.se >= 0 for e in graph.edges)
    json.dumps(graph.to_dict(), allow_nan=False)


@pytest.mark.parametrize("source,layers", [(BINARY, 1), (BINARY, 2), (MarkovChain([[0.7, 0.2, 0.1], [0.1, 0.6, 0.3],
                                                                                 [0.3, 0.3, 0.4]]), 2)])
def test_kernel_models_whose_decoys_write_to_dead_dimensions_keep_no_head_edge(source, layers):
    graph = _discover(decoy_kernel_model(source.kernel, n_ctx=SEQ, n_layers=layers), source)
    assert graph.kept_names == ("embed->logits",)
    assert graph.faithfulness == pytest.approx(1.0, abs=1e-9)
    assert graph.edge("embed->logits").effect > 0.05
    assert max(abs(e.effect) for e in graph.edges if e.sender != "embed" or e.receiver != "logits") < 1e-6


def test_order_two_kernel_in_the_weights_keeps_the_previous_token_head_and_mlp():
    kernel = torch.tensor([[[0.5, 0.5], [0.9, 0.1]], [[0.3, 0.7], [0.2, 0.8]]], dtype=torch.float64)
    source = MarkovChain(kernel, order=2)
    graph = _discover(pair_kernel_model(kernel, n_ctx=SEQ), source)
    assert set(graph.kept_names) == {"embed->L0H0.v", "embed->L0.mlp", "L0H0->L0.mlp", "L0.mlp->logits",
                                     "pos->L0H0.q", "pos->L0H0.k"}
    assert graph.faithfulness >= 0.9


def test_faithfulness_of_a_partial_circuit_is_measured_not_assumed():
    """With the kept rule set so high that no edge passes (and no lowering towards a faithfulness target), the
    whole circuit is corrupted: faithfulness 0, and in general (L_corrupted - L_circuit) / (L_corrupted - L_clean)
    from its own losses."""
    model, source = induction_circuit(3, n_ctx=SEQ), RandomMarkov(3)
    full = _discover(model, source)
    strict = _discover(model, source, min_fraction=0.99, target_faithfulness=0)
    assert strict.kept_names == () and strict.circuit_loss == pytest.approx(strict.corrupted_loss)
    assert strict.faithfulness == pytest.approx(0.0, abs=1e-9)
    assert full.faithfulness == pytest.approx((full.corrupted_loss - full.circuit_loss) / full.total_effect)


def test_kept_rule_drops_edges_that_reach_nothing():
    e = lambda s, r, i: EdgeKey(s, r, i)  # noqa: E731
    effects = {e("embed", "L0H0", "v"): 1.0, e("L0H0", "L1H0", "k"): 1.0, e("embed", "L1H0", "q"): 1.0,
               e("L1H0", "logits", "logits"): 1.0, e("embed", "L0H1", "q"): 1.0,  # L0H1 sends nothing on
               e("L0H1", "L1H1", "v"): 1.0}  # ... and L1H1 never reaches the logits
    assert {k.name for k in kept_edges(effects, 0.5)} == {"embed->L0H0.v", "L0H0->L1H0.k", "embed->L1H0.q",
                                                          "L1H0->logits"}
    assert kept_edges(effects, 2.0) == ()


def test_edge_attribution_tracks_path_patching_on_a_near_linear_model_and_flags_disagreements():
    # small weights: every edge acts almost linearly, so the gradient estimate must match the exact effect
    model = _scaled(models.build(models.preset("paper-2layer", n_ctx=32, n_heads=2), seed=1), 2.0)
    tokens = BINARY.sample(16, 24, torch.Generator().manual_seed(0))
    runner = EdgeRunner(model, tokens, tokens[derangement(16, seed=1)])
    grads = edge_attributions(runner)
    exact = {e: float((runner.losses([e]) - runner.clean_losses).mean()) for e in runner.edges}
    x, y = torch.tensor([exact[e] for e in runner.edges]), torch.tensor([grads[e] for e in runner.edges])
    assert float(torch.corrcoef(torch.stack([x, y]))[0, 1]) > 0.95
    big = x.abs() > 0.1 * x.abs().max()
    assert torch.allclose(y[big], x[big], rtol=0.3)
    # a hand-built circuit saturates its softmax: the gradient misses it, and the graph says so
    graph = _discover(induction_circuit(3, n_ctx=SEQ), RandomMarkov(3))
    # (the value edge's estimate is -0.014 against an effect of +0.357: the gradient would not keep it)
    assert "embed->L1H0.v" in graph.disagreements and set(graph.disagreements) <= set(graph.kept_names)
    assert abs(graph.edge("L0H0->L1H0.k").attribution) < 0.6 * graph.edge("L0H0->L1H0.k").effect


@pytest.mark.parametrize("overrides", [dict(), dict(normalization="LNPre", attn_bias=True), dict(normalization=None),
                                       dict(positional="rotary", n_heads=(2, 1))])
def test_gradient_estimates_from_the_head_inputs_match_the_whole_graph(overrides):
    """The estimates' gradients at each head's input, taken from the channel's gradient through W and the block's
    own norm (`single_pass`), equal the ones back through the whole pass's graph (`single_pass=False`), for LN,
    LNPre, no norm, rotary positions and uneven heads; the estimates are not all zero."""
    model = _scaled(models.build(models.preset("paper-2layer", n_ctx=16, **{"n_heads": 2, **overrides}), seed=2), 4.0)
    gen = torch.Generator().manual_seed(0)
    tokens = BINARY.sample(6, 12, gen)
    for kwargs in (dict(corrupted_tokens=tokens[derangement(6, seed=1)]),
                   dict(corrupted_positions=torch.stack([torch.randperm(12, generator=gen) for _ in range(6)]))):
        if "corrupted_positions" in kwargs and overrides.get("positional") == "rotary":
            continue  # no position embedding to corrupt
        fast, whole = (EdgeRunner(model, tokens, single_pass=flag, **kwargs) for flag in (True, False))
        for ours, theirs in zip(edge_estimates(fast, steps=3), edge_estimates(whole, steps=3)):
            x, y = torch.tensor([ours[e] for e in fast.edges]), torch.tensor([theirs[e] for e in fast.edges])
            assert torch.allclose(x, y, atol=1e-7, rtol=1e-5)  # float32, another order
            assert float(y.abs().max()) > 1e-4  # 1e3 x the tolerance


def test_corruptions_resample_swap_and_shuffle():
    batch = sample_batch(RandomMarkov(3), n_sequences=8, seq_len=20, seed=0)
    resampled = corrupted_tokens(batch, RandomMarkov(3), "resample", seed=1)
    assert not any(torch.equal(resampled[i], batch.tokens[i]) for i in range(8))
    shuffled = corrupted_tokens(batch, RandomMarkov(3), "shuffle", seed=1)
    assert torch.equal(shuffled.sort(1).values, batch.tokens.sort(1).values)  # same states, another order
    assert not torch.equal(shuffled, batch.tokens)
    swapped = corrupted_tokens(batch, BINARY, "kernel_swap", seed=1)
    assert swapped.shape == batch.tokens.shape
    graph = _discover(induction_circuit(3, n_ctx=SEQ), RandomMarkov(3), corruption="shuffle")
    assert graph.corruption == "shuffle" and "L0H0->L1H0.k" in graph.kept_names
    with pytest.raises(ValueError, match="corruption"):
        _discover(induction_circuit(3, n_ctx=SEQ), RandomMarkov(3), corruption="noise")
    with pytest.raises(ValueError, match="min_fraction"):
        _discover(induction_circuit(3, n_ctx=SEQ), RandomMarkov(3), min_fraction=-1)


def test_discovery_is_deterministic():
    a = _discover(induction_circuit(2, n_ctx=SEQ), RandomMarkov(2), seed=3)
    b = _discover(induction_circuit(2, n_ctx=SEQ), RandomMarkov(2), seed=3)
    assert a.to_dict() == b.to_dict()


# ------------------------------------------------------------------------------------------------- gains
def test_gains_match_a_per_sequence_loop_and_a_jackknife():
    batch = sample_batch(RandomMarkov(3), n_sequences=24, seq_len=40, seed=2)
    model = induction_circuit(3, n_ctx=SEQ)
    with torch.no_grad():
        probs = torch.softmax(model(batch.tokens).double(), -1)
    gains = graded_gains(probs, batch)
    assert sorted(gains) == [0, 1, 2]
    losses = {}
    for k in (-1, 0, 1, 2):
        law = (torch.full((24, 40, 3), 1 / 3, dtype=torch.float64) if k < 0 else
               sources.add_beta_predictions(batch.tokens, 3, order=k, beta=1.0))
        losses[k] = [float(theory.target_log_loss(law[b:b + 1], batch.tokens[b:b + 1]).mean()) for b in range(24)]
    mine = [float(theory.target_log_loss(probs[b:b + 1], batch.tokens[b:b + 1]).mean()) for b in range(24)]
    for k in (0, 1, 2):
        num = [losses[k - 1][b] - mine[b] for b in range(24)]
        den = [losses[k - 1][b] - losses[k][b] for b in range(24)]
        assert gains[k] == pytest.approx(sum(num) / sum(den), rel=1e-9)
        leave = [(sum(num) - num[b]) / (sum(den) - den[b]) for b in range(24)]
        mean = sum(leave) / 24
        jack = math.sqrt(23 / 24 * sum((x - mean) ** 2 for x in leave))
        assert gains.se[k] == pytest.approx(jack, rel=0.25)
    # the circuit counts transitions: it climbs more of the unigram -> bigram step than any state-and-counts law
    assert 0.2 < gains[1] < 1.5
    json.dumps(gains.to_dict(), allow_nan=False)


def _two_dim_state_law(counts: tuple[int, int], state: int, grid: int = 800) -> torch.Tensor:
    """The state-and-counts law for binary chains with uniform (p, q), by quadrature over the (p, q) square."""
    axis = (torch.arange(grid, dtype=torch.float64) + 0.5) / grid
    p, q = torch.meshgrid(axis, axis, indexing="ij")
    pi1 = p / (p + q)
    logw = counts[0] * torch.log1p(-pi1) + counts[1] * torch.log(pi1)
    w = torch.softmax(logw.flatten(), 0).reshape(grid, grid)
    to_one = p if state == 0 else 1 - q
    one = float((w * to_one).sum())
    return torch.tensor([1 - one, one], dtype=torch.float64)


def test_state_and_counts_law_matches_quadrature_on_binary_chains():
    tokens = torch.tensor([[0, 1, 1, 0, 1, 1, 1, 0, 0, 1] * 4])
    law = state_and_counts_probs(tokens, 2, order=1, alpha=1.0, n_kernels=16384)
    ones = tokens.cumsum(1)
    for t in (0, 3, 9, 25, 39):
        n1 = int(ones[0, t])
        exact = _two_dim_state_law((t + 1 - n1, n1), int(tokens[0, t]))
        assert torch.allclose(law[0, t], exact, atol=0.02), (t, law[0, t], exact)
    # balanced counts at long contexts: kernels with pi = (1/2, 1/2) have p = q, and E[p | p = q] = 2/3
    long = torch.tensor([[0, 1] * 200])
    assert float(state_and_counts_probs(long, 2, order=1, alpha=1.0)[0, -2, 1]) == pytest.approx(2 / 3, abs=0.04)


# ------------------------------------------------------------------------------------------- kernel swap
def test_kernel_swap_separates_weights_from_context():
    kernel = swap_kernels(kernel_model(BINARY.kernel, n_ctx=SEQ), BINARY, seq_len=SEQ, n_sequences=32)
    assert kernel.in_context_fraction == pytest.approx(0.0, abs=1e-6)
    context = swap_kernels(induction_circuit(2, n_ctx=SEQ), BINARY, seq_len=SEQ, n_sequences=32)
    assert context.in_context_fraction > 0.7 and context.se < 0.1
    # the fraction is the ratio of the plan's own losses
    assert context.raw_fraction == pytest.approx((context.weights_loss - context.model_loss)
                                                 / (context.weights_loss - context.context_loss))
    for model in (unigram_model([0.5, 0.5, 0.0001][:2], n_ctx=SEQ), counting_circuit(3, n_ctx=SEQ)):
        vocab = int(model.cfg.d_vocab)
        swap = swap_kernels(model, RandomMarkov(vocab), seq_len=SEQ, n_sequences=32)
        assert 0.0 <= swap.in_context_fraction <= (0.05 if vocab == 2 else 0.9)
    ind = swap_kernels(induction_circuit(3, n_ctx=SEQ), RandomMarkov(3), seq_len=SEQ, n_sequences=32)
    assert ind.in_context_fraction > 0.7 and "Dirichlet(0.1)" in ind.description


def test_swap_kernels_permute_and_flip():
    kernel = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.6, 0.3], [0.3, 0.3, 0.4]], dtype=torch.float64)
    perm = torch.tensor([2, 0, 1])
    moved = _permuted(kernel, perm, 1)
    for a, b in itertools.product(range(3), repeat=2):  # state s is relabelled perm[s]
        assert float(moved[perm[a], perm[b]]) == pytest.approx(float(kernel[a, b]))
    order2 = RandomMarkov(2, order=2).sample_kernels(1, torch.Generator().manual_seed(0))[0].reshape(2, 2, 2)
    swapped = _permuted(order2, torch.tensor([1, 0]), 2)
    assert float(swapped[1, 0, 1]) == pytest.approx(float(order2[0, 1, 0]))
    plan = swap_plan(MarkovChain(kernel), n_sequences=4, seq_len=10, swap="flip")
    assert torch.allclose(plan.batch.kernels[0], kernel.flip(-1))
    with pytest.raises(ValueError, match="unchanged"):
        swap_plan(BinaryChain(0.3, 0.3), n_sequences=4, seq_len=10, swap="permute")
    with pytest.raises(ValueError, match="swap"):
        swap_plan(RandomMarkov(2), n_sequences=4, seq_len=10, swap="flip")


def test_a_source_can_supply_its_own_swap_plan():
    """The hook a kernel pool uses: a source with `kernel_swap_plan` decides what is fed and the references."""

    class Pooled(RandomMarkov):
        def kernel_swap_plan(self, *, n_sequences, seq_len, seed):
            batch = sample_batch(BINARY, n_sequences=n_sequences, seq_len=seq_len, seed=seed)
            weights = sources.kernel_predictions(BINARY.kernel[None], batch.tokens, BINARY.initial_context_law[None])
            context = sources.add_beta_predictions(batch.tokens, 2, order=1, beta=0.5)
            return SwapPlan(batch=batch, weights_law=weights, context_law=context, description="pool swap")

    swap = swap_kernels(kernel_model(BINARY.kernel, n_ctx=SEQ), Pooled(2), seq_len=SEQ, n_sequences=16)
    assert swap.description == "pool swap" and swap.in_context_fraction == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError, match="weights_law"):  # laws over 3 states for a binary batch
        SwapPlan(batch=sample_batch(BINARY, n_sequences=2, seq_len=5, seed=0), weights_law=torch.zeros(2, 5, 3),
                 context_law=torch.zeros(2, 5, 3), description="")


def test_pool_sources_swap_in_kernels_outside_the_pool():
    """Retrieval against inference: fresh kernels from the prior, the pool's Bayes predictor as the weights law."""
    pooled = RandomMarkov(3, pool_size=4)
    plan = swap_plan(pooled, n_sequences=8, seq_len=20, seed=0)
    assert "pool of 4 kernels" in plan.description
    pool = pooled.pool
    for kernel in plan.batch.kernels:  # none of the swap kernels is in the pool
        assert float((pool - kernel).abs().flatten(1).max(1).values.min()) > 1e-3
    expected = sources.pool_bayes_predictions(pool, pooled.initial_context_laws(pool), plan.batch.tokens)
    assert torch.allclose(plan.weights_law, expected)
    assert torch.allclose(plan.context_law, sources.add_beta_predictions(plan.batch.tokens, 3, order=1, beta=1.0))
    swap = swap_kernels(induction_circuit(3, n_ctx=SEQ), pooled, seq_len=SEQ, n_sequences=32)
    assert swap.in_context_fraction > 0.6  # the circuit estimates in context: it follows the fresh kernels
    with pytest.raises(ValueError, match="pool"):
        swap_plan(pooled, n_sequences=4, seq_len=10, swap="prior")


# ------------------------------------------------------------------------------------ weights and report
def test_ov_and_qk_circuits_and_logit_attribution_of_a_handbuilt_circuit():
    from markov_interp.probes import direct_logit_attribution, ov_circuits, qk_circuits

    model = induction_circuit(3, n_ctx=SEQ, decoys=True)
    ov, qk = ov_circuits(model), qk_circuits(model)
    assert ov.shape == (2, 2, 3, 3) and (ov.kind, qk.kind) == ("OV", "QK")
    # typed, never a bare tensor: the copying head is named with its diagonal score (2 - 0 = +2.00)
    assert repr(ov).startswith("<WeightCircuits: OV circuits of 4 heads") and "L1H0 +2.00" in repr(ov)
    assert ov.diagonal()["L1H0"] == pytest.approx(2.0) and ov.to_dict()["rows"] == "attended state"
    assert torch.allclose(ov[1, 0], 2.0 * torch.eye(3))  # the induction head copies, logit scale 2
    assert torch.allclose(ov[0, 0], torch.zeros(3, 3))  # the previous-token head writes nothing the unembedding reads
    assert torch.allclose(qk[0, 0], torch.zeros(3, 3))  # it attends by position, not by state
    batch = sample_batch(RandomMarkov(3), n_sequences=8, seq_len=SEQ, seed=0)
    dla = direct_logit_attribution(model, batch)
    # only the induction head writes the logits (no LayerNorm, no bias): it carries all of them
    assert dla.heads[1, 0] == pytest.approx(dla.total, abs=1e-5) and dla.total > 0.1
    assert abs(dla.embed) < 1e-6 and abs(dla.rest) < 1e-5 and float(dla.heads[0].abs().max()) < 1e-6
    uneven = models.build(models.preset("attn-only-2layer", n_heads=(2, 1), d_vocab=3, n_ctx=SEQ), seed=0)
    assert math.isnan(float(ov_circuits(uneven)[1, 1, 0, 0])) and math.isnan(float(qk_circuits(uneven)[1, 1, 0, 0]))
    assert math.isnan(float(direct_logit_attribution(uneven, batch).heads[1, 1]))
    assert not math.isnan(float(ov_circuits(uneven)[1, 0, 0, 0]))


def test_logit_attribution_of_a_kernel_model_is_the_embedding_and_adds_up_with_layernorm():
    from markov_interp.probes import direct_logit_attribution

    batch = sample_batch(BINARY, n_sequences=8, seq_len=SEQ, seed=0)
    dla = direct_logit_attribution(kernel_model(BINARY.kernel, n_ctx=SEQ), batch)
    assert dla.embed == pytest.approx(dla.total, abs=1e-5) and float(dla.heads.abs().max()) < 1e-6
    model = _ln_mlp_model()  # LayerNorm, MLPs: the shares are exact with the final scale frozen
    tokens = torch.randint(0, 2, (4, 12), generator=torch.Generator().manual_seed(0))
    dla = direct_logit_attribution(model, tokens)
    with torch.no_grad():
        logits = model(tokens).double()
    centred = logits - logits.mean(-1, keepdim=True)
    assert dla.total == pytest.approx(float(torch.gather(centred[:, :-1], -1, tokens[:, 1:, None]).mean()), rel=1e-5)
    # positions and the output bias are all the rest: recompute them by hand from the weights
    p = models.state_dict_for_save(model)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    scale = cache["ln_final.hook_scale"].double()
    pos = p["pos_embed.weight"][:12].double().expand(4, -1, -1)
    pos_logits = ((pos - pos.mean(-1, keepdim=True)) / scale * p["ln_final.weight"].double()) @ p[
        "embed.weight"].double().T
    bias = p["unembed.bias"].double()
    rest = (pos_logits + bias) - (pos_logits + bias).mean(-1, keepdim=True)
    assert dla.rest == pytest.approx(float(torch.gather(rest[:, :-1], -1, tokens[:, 1:, None]).mean()), abs=2e-4)


def test_patching_by_position_stacks_what_one_position_at_a_time_gives():
    from markov_interp.probes import patching_by_position
    from markov_interp.probes.interventions import intervened_probs
    from markov_interp.probes.patching import patching_pair

    model = induction_circuit(3, n_ctx=SEQ)
    batch = sample_batch(RandomMarkov(3), n_sequences=8, seq_len=20, seed=1)
    clean, corrupted = patching_pair(batch)
    result = patching_by_position(model, clean, corrupted)
    assert result.recovery.shape == (2, 20)
    with torch.no_grad():
        _, cc = model.run_with_cache(clean)
        p_clean = torch.softmax(model(clean).double(), -1)[:, -1]
    for layer, pos in ((0, 3), (1, 19), (1, 7)):
        comp = Component(kind="resid", layer=layer)
        patched = intervened_probs(model, corrupted, [[comp]], {comp.hook_name: cc[comp.hook_name]},
                                   positions=[pos])[0][:, -1]
        kl = float(theory.kl_divergence(p_clean, patched).mean())
        assert float(result.recovery[layer, pos]) == pytest.approx(1 - kl / result.baseline_kl, abs=1e-6)
    assert float(result.recovery[0].max()) > 0.1  # some earlier position carries what the prediction needs


def test_report_from_a_model_without_a_run_folder(tmp_path):
    from markov_interp import report

    model = induction_circuit(3, n_ctx=SEQ)
    rep = report.from_model(model, RandomMarkov(3), n_sequences=16, seq_len=SEQ)
    assert tuple(s.id for s in rep.sections) == report.MODEL_SECTION_IDS
    body = rep.section("circuit").body()
    assert body.count('class="edge') == len(rep.mechanism.graph.kept) == 7  # 5 token edges, 2 position reads
    assert body.count('class="edge position"') == 2 and "dashed: position information" in body
    assert 'class="circuit-diagram"' in body and "L0H0-&gt;L1H0.k" in body and "faithfulness" in body
    assert sum(rep.section(i).body().count("<svg") for i in ("circuit", "weights", "attribution", "patching")) >= 4
    with pytest.raises(ValueError, match="path"):
        rep.save()
    path = rep.save(tmp_path / "model.html")
    text = path.read_text()
    assert "<script src=" not in text and "<link" not in text  # nothing to fetch (the browser test checks it)


@pytest.mark.slow
def test_circuit_section_draws_in_a_real_browser_without_the_network(tmp_path):
    """The report of a model without a run folder, opened offline in Debian's chromium (as tests/report/test_report.py
    drives it): the SVG diagram is laid out with one path per kept edge, and nothing is fetched."""
    import os

    from markov_interp import report

    chromium = os.environ.get("MARKOV_INTERP_CHROMIUM", "/usr/bin/chromium")
    if not os.path.exists(chromium):
        pytest.skip(f"chromium not found at {chromium}")
    playwright = pytest.importorskip("playwright.sync_api")
    rep = report.from_model(induction_circuit(2, order=2, n_ctx=SEQ), RandomMarkov(2, order=2), n_sequences=16,
                            seq_len=SEQ)
    path = rep.save(tmp_path / "model.html")
    with playwright.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu",
                                                                     "--disable-dev-shm-usage"])
        try:
            page = browser.new_page()
            fetched, errors = [], []
            page.on("request", lambda r: fetched.append(r.url) if r.url.startswith(("http:", "https:")) else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(path.resolve().as_uri(), wait_until="load")
            page.wait_for_timeout(300)
            # the circuit section's diagram (the first screen shows the same one)
            edges = page.evaluate("() => [...document.querySelectorAll('#section-circuit svg.circuit-diagram "
                                  "path.edge')].map(p => p.getBBox().height)")
            labels = page.evaluate("() => [...document.querySelectorAll('#section-circuit svg.circuit-diagram "
                                   "text')].map(t => t.textContent)")
        finally:
            browser.close()
    # every kept edge drawn (the 12 intended ones and any positional edge the |effect| keep rule adds), not degenerate
    assert len(edges) == len(rep.mechanism.graph.kept) >= 12 and min(edges) > 10
    assert {"L0H0", "L0H1", "L1H0", "embed", "logits"} <= set(labels) and "k" in labels and "q" in labels
    assert fetched == [] and errors == []


# ------------------------------------------------------------------------- attribution, then verification
VERIFIED = ["order 1", "order 2", "split over heads", "skipping a layer"]


@pytest.mark.parametrize("name", VERIFIED + ["cancelling", "position", "kernel decoys", "pair kernel"])
def test_attribution_then_verify_keeps_exactly_the_exact_set(name):
    """The gradient estimates choose what to measure, never what to keep: the kept set is exact patching's on every
    hand-built circuit (saturated softmaxes, where the estimates miss the K-edge, included)."""
    from handbuilt import cancelling_circuit, position_circuit

    k2 = torch.tensor([[[0.5, 0.5], [0.9, 0.1]], [[0.3, 0.7], [0.2, 0.8]]], dtype=torch.float64)
    make, source = {
        "cancelling": (lambda: cancelling_circuit(3, n_ctx=SEQ), RandomMarkov(3)),
        "position": (lambda: position_circuit(3, n_ctx=32), RandomMarkov(3)),
        "kernel decoys": (lambda: decoy_kernel_model(BINARY.kernel, n_ctx=SEQ, n_layers=2), BINARY),
        "pair kernel": (lambda: pair_kernel_model(k2, n_ctx=SEQ), MarkovChain(k2, order=2)),
    }.get(name, CIRCUITS.get(name, (None, None))[:2])
    model = make()
    exact = _discover(model, source, method="exact")
    fast = _discover(model, source, method="attribution+verify")
    assert fast.kept_names == exact.kept_names and fast.method == "attribution+verify"
    assert all(e.verified for e in fast.kept) and fast.n_verified <= exact.n_verified
    assert [c.edges for c in fast.cancelling] == [c.edges for c in exact.cancelling]
    for e in fast.edges:  # what was measured is measured alike; the rest is marked as an estimate
        if e.verified:
            assert e.effect == pytest.approx(exact.edge(e.name).effect, abs=1e-9)
        else:  # an estimate in one pass at least: no SE there
            assert math.isnan(e.se) or math.isnan(e.position_se)


def test_methods_and_the_edge_cap():
    model, source = induction_circuit(3, n_ctx=SEQ), RandomMarkov(3)
    graph = _discover(model, source, method="attribution")  # estimates decide, and nothing is measured alone
    assert graph.method == "attribution" and not any(e.verified for e in graph.kept)
    assert graph.faithfulness == graph.faithfulness and graph.joint == () and graph.minimality == {}
    assert graph.n_verified == 0 and "estimate only" in graph.summary() and "estimate only" in repr(graph)
    exact = _discover(model, source, method="exact")
    assert graph.n_runs < exact.n_runs / 4 and graph.to_dict()["n_runs"] == graph.n_runs
    capped = _discover(model, source, method="attribution+verify", max_edges=3)
    assert capped.n_verified <= 2 * (3 + len(capped.kept))  # three per pass, and the circuit's own edges
    with pytest.raises(ValueError, match="attribution\\+verify"):
        _discover(model, source, method="exact", max_edges=5)
    with pytest.raises(ValueError, match="method"):
        _discover(model, source, method="fast")
    with pytest.raises(ValueError, match="max_edges"):
        _discover(model, source, max_edges=0)
    with pytest.raises(TypeError, match="positions"):
        _discover(model, source, positions="yes")
    assert _discover(model, source).method == "exact"  # "auto": a small graph is measured exactly


def test_saturated_heads_are_read_from_the_clean_run():
    """`EdgeRunner.attention_peak` (each head's mean largest attention weight over queries after the first, kept
    from the runner's clean run) equals the same reduction of the cached patterns, and `saturated_heads` names the
    hand-built circuit's previous-token head (one key per query by construction) and not a random-init model's."""
    from markov_interp.probes.verify import SATURATED, saturated_heads

    tokens = RandomMarkov(3).sample(8, 24, torch.Generator().manual_seed(0))
    for model in (induction_circuit(3, n_ctx=SEQ), models.build(models.preset("attn-only-2layer", d_vocab=3,
                                                                              n_ctx=SEQ), seed=0)):
        runner = EdgeRunner(model, tokens, tokens[derangement(8, seed=1)])
        _, cache = model.run_with_cache(tokens)
        direct = torch.stack([cache["pattern", layer][:, :, 1:].max(-1).values.mean((0, 2))
                              for layer in range(model.cfg.n_layers)])
        torch.testing.assert_close(runner.attention_peak, direct)
        expected = {f"L{l}H{h}" for l, row in enumerate(direct.tolist()) for h, v in enumerate(row) if v >= SATURATED}
        assert set(saturated_heads(runner)) == expected
    assert "L0H0" in saturated_heads(EdgeRunner(induction_circuit(3, n_ctx=SEQ), tokens))
    assert saturated_heads(runner) == ()  # the random-init model: no head near one key


def test_the_walk_down_the_ranking_measures_in_blocks_and_never_twice():
    """`verify_plan`: the blind edges (into a saturated head's queries and keys), then the 16 highest in the ranking;
    `next_block`: the next 16 unmeasured edges down the ranking, however small their estimates, in rank order; an
    unreliable edge ranks by the larger of its two estimates."""
    from markov_interp.probes.verify import TOP_CANDIDATES, Estimates, next_block, verify_plan

    keys = [EdgeKey(f"L0H{i}", "logits", "logits") for i in range(60)]
    mean = {e: (-1) ** i * 0.01 / (i + 1) for i, e in enumerate(keys)}  # |estimate| falls down the list
    first = {**mean, keys[40]: 0.02}  # its clean-run estimate the largest of all: unreliable, it ranks first
    blind = EdgeKey("embed", "L1H0", "k")
    mean[blind] = first[blind] = 0.0  # a saturated head's key edge: estimated 0, measured first all the same
    est = Estimates.of(first, mean, unreliable={keys[40]}, blind={blind})
    ranked = [keys[40]] + [e for e in keys if e != keys[40]] + [blind]
    assert list(est.ranked) == ranked
    plan = verify_plan(est)
    assert plan == [blind] + ranked[:TOP_CANDIDATES]
    measured = set(plan)
    for start in range(TOP_CANDIDATES, 59, TOP_CANDIDATES):  # block after block down to the smallest estimates
        block = next_block(est, measured)
        assert block == [e for e in ranked if e not in measured][:TOP_CANDIDATES] and block[0] == ranked[start]
        measured |= set(block)
    assert measured == set(keys) | {blind} and next_block(est, measured) == []


def test_no_progress_bar_when_asked_for_none(capsys):
    _discover(induction_circuit(2, n_ctx=SEQ), RandomMarkov(2), progress=False)
    assert "path patching" not in capsys.readouterr().err


def test_the_default_progress_bar_only_where_someone_watches(monkeypatch):
    from markov_interp.probes import discovery

    # a pipe or a captured stderr: no bar by default (a slow call under load must not write to a pipe)
    monkeypatch.setattr("sys.stderr.isatty", lambda: False)
    monkeypatch.delitem(sys.modules, "ipykernel", raising=False)
    assert discovery._progress(None).disable and discovery._progress(False).disable
    assert not discovery._progress(True).disable
    monkeypatch.setattr("sys.stderr.isatty", lambda: True)  # a terminal
    assert not discovery._progress(None).disable
