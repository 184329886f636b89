"""Probes on models whose mechanism is known by construction (tests/handbuilt.py), then on trained models.

Reference numbers are computed independently here (explicit loops, closed forms), never by the probe code.
"""

import dataclasses
import json
import math

import pytest
import torch

from handbuilt import (  # noqa: E402
    decoy_kernel_model,
    induction_circuit,
    induction_model,
    kernel_model,
    unigram_model,
)

from markov_interp import sources, theory  # noqa: E402
from markov_interp.sources import BinaryChain, MarkovChain, RandomMarkov  # noqa: E402
from markov_interp.probes import (  # noqa: E402
    Component, Thresholds, ablation_table, activation_patching, attention_scores, classify_mechanism, kernel_readout,
    next_state_probs, sample_batch)
from markov_interp.probes.ablation import ablated_probs, set_ablation_losses
from markov_interp.probes.attention import (induction_baseline, induction_keys, induction_score, previous_token_score,
                                            same_token_score, uniform_causal_pattern)
from markov_interp.probes.behaviour import (context_dependence, in_context_learning_score, kernel_predictor,
                                            state_dependence)
from markov_interp.probes.interventions import model_components, set_component
from markov_interp.probes.patching import composition_scores, head_composition, patched_probs, patching_pair
from markov_interp.probes.readout import implied_kernel
from markov_interp.probes.ablation import derangement  # noqa: E402

BINARY = BinaryChain(0.2, 0.3)
TERNARY = MarkovChain([[0.7, 0.2, 0.1], [0.1, 0.6, 0.3], [0.3, 0.3, 0.4]])
CHAINS = {"binary": BINARY, "ternary": TERNARY}
PREV, IND = (0, 1), (1, 0)  # where induction_model puts its previous-token and induction heads


@pytest.fixture(scope="module")
def induction3():
    return induction_model(3)


@pytest.fixture(scope="module")
def tokens3():
    return TERNARY.sample(16, 48, torch.Generator().manual_seed(1))


# ------------------------------------------------------------------------------------------ attention
def _loop_scores(pattern, tokens, *, lag=1, order=1):
    """Independent per-query loops for head 0: previous-token mass at `lag`, order-`order` induction mass
    (keys order <= j < i whose `order` preceding states equal the last `order` states at i; queries with a
    match), same-token mass."""
    prev, ind, same = [], [], []
    for b in range(tokens.shape[0]):
        x = tokens[b].tolist()
        for i in range(tokens.shape[1]):
            row = pattern[b, 0, i]
            if i >= lag:
                prev.append(float(row[i - lag]))
            if i >= 1:
                same.append(sum(float(row[j]) for j in range(i + 1) if x[j] == x[i]))
            keys = [j for j in range(order, i) if i >= order - 1
                    and all(x[j - 1 - m] == x[i - m] for m in range(order))]
            if keys:
                ind.append(sum(float(row[j]) for j in keys))
    return sum(prev) / len(prev), sum(ind) / len(ind), sum(same) / len(same)


def _loop_baseline(pattern, tokens, *, order=1, vocab=2):
    """Independent loops for the induction baseline of head 0: the match rate per stratum (lag bucket, x_i,
    x_j, lower-order match) over the candidate keys of the queries with a match, weighted by attention."""
    def bucket(lag):
        return lag if lag <= 4 else 5 + math.floor(math.log(lag / 5, 1.5))

    def match(x, i, j, k):
        return all(x[j - 1 - m] == x[i - m] for m in range(k))

    pairs, hits, counts = [], {}, {}
    for b in range(tokens.shape[0]):
        x = tokens[b].tolist()
        for i in range(order - 1, tokens.shape[1]):
            keys = list(range(order, i))
            if not any(match(x, i, j, order) for j in keys):
                continue
            for j in keys:
                key = (bucket(i - j), x[i], x[j], match(x, i, j, order - 1))
                hits[key] = hits.get(key, 0) + match(x, i, j, order)
                counts[key] = counts.get(key, 0) + 1
                pairs.append((b, i, j, key))
    n_queries = len({(b, i) for b, i, _, _ in pairs})
    return sum(float(pattern[b, 0, i, j]) * hits[key] / counts[key] for b, i, j, key in pairs) / n_queries


def test_scores_of_uniform_attention_match_loops():
    tokens = BINARY.sample(3, 12, torch.Generator().manual_seed(0))
    pattern = uniform_causal_pattern(tokens)
    want = _loop_scores(pattern, tokens)
    got = (previous_token_score(pattern, tokens), induction_score(pattern, tokens), same_token_score(pattern, tokens))
    for g, w in zip(got, want):
        assert float(g[0]) == pytest.approx(w, rel=1e-5)
    # chance of the previous-token score is the mean of 1/(i+1) over i >= 1
    assert want[0] == pytest.approx(sum(1 / (i + 1) for i in range(1, 12)) / 11, rel=1e-6)


@pytest.mark.parametrize("order", [1, 2, 3])
def test_random_pattern_scores_and_baselines_match_loops(order):
    gen = torch.Generator().manual_seed(3 + order)
    tokens = TERNARY.sample(3, 14, gen)
    pattern = torch.rand(3, 1, 14, 14, generator=gen).tril()
    pattern = pattern / pattern.sum(-1, keepdim=True)
    want = _loop_scores(pattern, tokens, lag=order, order=order)
    got = (previous_token_score(pattern, tokens, lag=order), induction_score(pattern, tokens, order=order),
           same_token_score(pattern, tokens))
    for g, w in zip(got, want):
        assert float(g[0]) == pytest.approx(w, rel=1e-5)
    baseline = induction_baseline(pattern, tokens, order=order, vocab=3)
    assert float(baseline[0]) == pytest.approx(_loop_baseline(pattern, tokens, order=order, vocab=3), rel=1e-5)


def test_induction_keys_leave_out_the_query_itself():
    tokens = torch.tensor([[0, 0, 0, 0]])
    keys = induction_keys(tokens)
    assert not keys.diagonal(dim1=1, dim2=2).any()  # j = i never counts, even when x_{i-1} = x_i
    assert keys[0, 3].tolist() == [False, True, True, False]


@pytest.mark.parametrize("vocab", [2, 3])
def test_handbuilt_induction_heads_are_singled_out(vocab):
    model = induction_model(vocab)
    tokens = (BINARY if vocab == 2 else TERNARY).sample(16, 48, torch.Generator().manual_seed(0))
    scores = attention_scores(model, tokens)
    assert scores.previous_token[PREV] > 0.99
    assert scores.top_head("previous_token") == PREV
    assert scores.top_head("induction", layers=range(1, 2)) == IND
    assert scores.excess("induction")[IND] > 0.5
    # decoys: layer-0 head 0 attends to itself (same-token 1, previous-token 0); layer-1 head 1 is uniform
    assert scores.previous_token[0, 0] < 0.01 and scores.same_token[0, 0] > 0.99
    assert scores.excess("induction")[0, 0].abs() < 0.05  # self-attention: j = i is left out
    assert scores.excess("induction")[1, 1].abs() < 0.05
    assert 0 < scores.previous_token_chance < scores.same_token_chance < 1


def test_sticky_chain_decoys_score_their_baseline():
    """On p = q = 0.1 a previous-token, a self and a same-token head all put most of their mass on keys whose
    previous state equals the current one; the token-statistics baseline gives them no induction excess,
    while a real induction head keeps a clear one."""
    sticky = BinaryChain(0.1, 0.1)
    tokens = sticky.sample(32, 48, torch.Generator().manual_seed(0))
    decoys = attention_scores(decoy_kernel_model(sticky.kernel), tokens)
    assert decoys.excess("previous_token")[0, 0] > 0.99  # L0H0 is a previous-token head
    assert decoys.same_token[0, 2] > 0.99  # L0H2 a same-token head
    assert decoys.induction[0, 0] > 0.8 and decoys.induction[0, 2] > 0.6  # raw scores look like induction
    assert decoys.induction_excess(1).abs().max() < 0.15
    real = attention_scores(induction_circuit(2, n_ctx=48), tokens)
    assert real.induction_excess(1)[1, 0] > 0.4 and real.induction_excess(1)[0, 0].abs() < 0.1


def test_order_two_scores_separate_lags_and_orders():
    source = RandomMarkov(3, order=2)
    tokens = source.sample(16, 64, torch.Generator().manual_seed(0))
    second = attention_scores(induction_circuit(3, order=2, n_ctx=64), tokens, max_order=2)
    assert second.lag_excess(1)[0, 0] > 0.99 and second.lag_excess(2)[0, 1] > 0.99
    assert second.lag_excess(2)[0, 0].abs() < 0.1 and second.lag_excess(1)[0, 1].abs() < 0.1
    assert second.induction_excess(2)[1, 0] > 0.7
    first = attention_scores(induction_circuit(3, order=1, n_ctx=64), tokens, max_order=2)
    # a first-order head matches one state: excess at order 1, none at order 2 (its baseline conditions on it)
    assert first.induction_excess(1)[1, 0] > 0.7 and first.induction_excess(2)[1, 0] < 0.15
    json.dumps(second.to_dict(), allow_nan=False)
    with pytest.raises(ValueError, match="order"):
        second.induction_excess(3)


# ------------------------------------------------------------------------------------------ behaviour
def test_context_dependence_matches_pair_loop():
    gen = torch.Generator().manual_seed(0)
    tokens = BINARY.sample(5, 7, gen)
    probs = sources.add_beta_predictions(tokens, 2, beta=0.5)
    total, n = 0.0, 0
    for t in range(7):
        for a in range(5):
            for b in range(5):
                if a != b and tokens[a, t] == tokens[b, t]:
                    total += 0.5 * float((probs[a, t] - probs[b, t]).abs().sum())
                    n += 1
    assert context_dependence(probs, tokens, vocab=2) == pytest.approx(total / n, rel=1e-9)


def test_context_and_state_dependence_of_a_kernel():
    tokens = BINARY.sample(32, 20, torch.Generator().manual_seed(0))
    predict = kernel_predictor(BINARY.kernel, order=1)
    assert context_dependence(predict(tokens), tokens, vocab=2) == 0.0
    # flipping the current state moves the prediction from one row to the other: TV = |0.8 - 0.3| = 0.5
    assert state_dependence(predict, tokens, vocab=2, positions=[1, 5, 19]) == pytest.approx(0.5)


def test_in_context_learning_score_of_synthetic_curves():
    assert in_context_learning_score(torch.full((100,), 0.6, dtype=torch.float64)) == 0.0
    falling = torch.linspace(1.0, 0.5, 100, dtype=torch.float64)
    assert in_context_learning_score(falling) == pytest.approx(float(falling[-10:].mean() - falling[:10].mean()))
    with pytest.raises(ValueError, match="fractions"):
        in_context_learning_score(falling, early=0.0)


def test_implied_kernel_recovers_kernel_and_marks_unseen_rows():
    tokens = TERNARY.sample(8, 30, torch.Generator().manual_seed(0))
    rows, counts = implied_kernel(kernel_predictor(TERNARY.kernel, order=1)(tokens), tokens, vocab=3)
    assert torch.allclose(rows, TERNARY.kernel)
    assert int(counts.sum()) == tokens.numel()
    only_zero = torch.zeros(2, 5, dtype=torch.long)
    rows, counts = implied_kernel(torch.full((2, 5, 3), 1 / 3, dtype=torch.float64), only_zero, vocab=3)
    assert counts.tolist() == [10, 0, 0] and torch.isnan(rows[1:]).all()


@pytest.mark.parametrize("name", ["binary", "ternary"])
def test_kernel_readout_of_handbuilt_models(name):
    source = CHAINS[name]
    batch = sample_batch(source, n_sequences=16, seq_len=40, seed=0)
    readout = kernel_readout(kernel_model(source.kernel), batch)
    assert readout.max_abs_error < 1e-5 and readout.weighted_kl < 1e-8
    pi = theory.stationary_distribution(source.kernel)
    flat = kernel_readout(unigram_model(pi), batch)
    assert torch.allclose(flat.implied, pi.expand_as(flat.implied), atol=1e-6)
    excess = theory.unigram_loss(source.kernel) - theory.entropy_rate(source.kernel)  # KL(P || pi) under pi
    assert flat.weighted_kl == pytest.approx(excess, rel=1e-4)


# ------------------------------------------------------------------------------------------ ablation
def test_component_names_round_trip_and_errors(induction3):
    names = [c.name for c in model_components(induction3)]
    assert names == ["L0H0", "L0H1", "L0.attn", "L1H0", "L1H1", "L1.attn"]  # attention-only: no MLP
    assert all(Component.parse(n).name == n for n in names)
    with pytest.raises(ValueError, match="L0H1"):
        Component.parse("layer0")
    with pytest.raises(ValueError, match="no MLP"):
        Component.parse("L0.mlp").check(induction3)
    with pytest.raises(ValueError, match="only 2 heads"):
        Component.parse("L0H2").check(induction3)
    mlp_model = kernel_model(BINARY.kernel, with_mlp=True)
    assert [c.name for c in model_components(mlp_model)] == ["L0H0", "L0.attn", "L0.mlp"]
    tokens = BINARY.sample(4, 16, torch.Generator().manual_seed(0))
    for method in ("zero", "mean", "resample"):  # its attention and MLP write nothing: no ablation matters
        table = ablation_table(mlp_model, tokens, method=method)
        assert max(abs(c) for c in table.loss_change) < 1e-6


def test_zero_ablating_a_head_equals_zeroing_its_output_weights(induction3, tokens3):
    ablated = ablated_probs(induction3, tokens3, ["L1H0"], method="zero")
    # independent: the induction head is the only writer of the output slot, so its removal leaves logits 0
    assert torch.allclose(ablated, torch.full_like(ablated, 1 / 3), atol=1e-6)
    untouched = ablated_probs(induction3, tokens3, ["L1H1"], method="zero")  # decoy writes nothing
    assert torch.allclose(untouched, next_state_probs(induction3, tokens3), atol=1e-6)


def test_mean_ablation_of_a_constant_component_changes_nothing(induction3, tokens3):
    # the decoy heads write nothing: mean = zero = resample = clean
    clean = next_state_probs(induction3, tokens3)
    for method in ("zero", "mean", "resample"):
        probs = ablated_probs(induction3, tokens3, ["L0H0", "L1H1"], method=method, seed=2)
        assert torch.allclose(probs, clean, atol=1e-6), method


def test_set_component_writes_only_its_slice_and_positions():
    act = torch.arange(2 * 4 * 3 * 2, dtype=torch.float32).reshape(2, 4, 3, 2)  # [batch pos head d_head]
    head = Component(kind="head", layer=0, head=1)
    out = set_component(act, head, torch.zeros(()), positions=[1, 3])
    changed = (out != act)
    assert changed[:, [1, 3], 1].all() and changed.sum() == int((act[:, [1, 3], 1] != 0).sum())
    assert torch.equal(act, torch.arange(48, dtype=torch.float32).reshape(2, 4, 3, 2))  # the input is not written
    mean = act.mean(0)  # [pos head d_head], broadcast over the batch; a longer mean is cut to the run's length
    longer = torch.cat([mean, mean[:1]], dim=0)
    out = set_component(act, head, longer)
    assert torch.equal(out[:, :, 1], mean[None, :, 1].expand(2, -1, -1)) and torch.equal(out[:, :, 0], act[:, :, 0])
    layer = Component(kind="attn", layer=0)
    resid = torch.randn(2, 4, 5)
    assert torch.equal(set_component(resid, layer, resid.flip(0)), resid.flip(0))
    with pytest.raises(ValueError, match="3 sequences"):
        set_component(resid, layer, torch.randn(3, 4, 5))


def test_ablation_and_patching_run_through_the_one_loop(induction3, tokens3):
    # a group ablated together by the loop = ablated_probs of the same group
    pair = [Component.parse("L0H1"), Component.parse("L1H0")]
    (loss,) = set_ablation_losses(induction3, tokens3, [pair], method="mean")
    probs = ablated_probs(induction3, tokens3, pair, method="mean")
    assert loss == pytest.approx(float(theory.target_log_loss(probs, tokens3).mean()), rel=1e-9)
    # patching every component from a run into itself changes nothing
    same = patched_probs(induction3, tokens3, tokens3, model_components(induction3))
    torch.testing.assert_close(same, next_state_probs(induction3, tokens3))
    table = ablation_table(induction3, tokens3)
    assert table[pair[1]] == table["L1H0"] and "L1H0" in table and "L7H0" not in table
    assert all(isinstance(c, Component) for c in table.components)


def test_derangement_has_no_fixed_point():
    for seed in range(5):
        perm = derangement(7, seed=seed)
        assert sorted(perm.tolist()) == list(range(7)) and (perm != torch.arange(7)).all()
    with pytest.raises(ValueError, match="at least 2"):
        derangement(1, seed=0)


def test_ablation_table_singles_out_the_circuit(induction3):
    # random kernels: no context-free predictor is any good, so every way of removing the circuit hurts
    tokens = RandomMarkov(3).sample(16, 48, torch.Generator().manual_seed(4))
    for method in ("mean", "resample", "zero"):
        table = ablation_table(induction3, tokens, method=method)
        assert table["L0H0"] == pytest.approx(0, abs=1e-6) and table["L1H1"] == pytest.approx(0, abs=1e-6)
        assert table["L0H1"] > 0.05 and table["L1H0"] > 0.05, (method, table.to_dict())
        grid = table.head_grid()
        assert grid.shape == (2, 2) and grid[PREV] > 0.05
    json.dumps(table.to_dict())


# ------------------------------------------------------------------------------------------ patching
def test_patching_induction_head_restores_clean_prediction(induction3):
    tokens = RandomMarkov(3).sample(16, 48, torch.Generator().manual_seed(0))
    clean, corrupted = patching_pair(tokens, seed=0)
    assert (clean[:, -1] == corrupted[:, -1]).all() and not torch.equal(clean, corrupted)
    result = activation_patching(induction3, clean, corrupted)
    recovery = {c.name: r for c, r in zip(result.components, result.recovery)}
    assert recovery["L1H0"] == result["L1H0"] == result[Component(kind="head", layer=1, head=0)]
    assert result.baseline_kl > 0.05
    # the induction head alone writes the logits: patching it (or its layer) restores the clean law exactly
    assert recovery["L1H0"] == pytest.approx(1.0, abs=1e-4) and recovery["L1.attn"] == pytest.approx(1.0, abs=1e-4)
    assert abs(recovery["L1H1"]) < 1e-4 and abs(recovery["L0H0"]) < 1e-4
    assert recovery["L0H1"] > 0.2  # the previous-token head feeds the keys of the induction head


def test_patching_a_kernel_model_has_nothing_to_restore():
    tokens = BINARY.sample(8, 30, torch.Generator().manual_seed(0))
    result = activation_patching(kernel_model(BINARY.kernel), *patching_pair(tokens))
    assert result.baseline_kl < 1e-10
    assert all(math.isnan(r) for r in result.recovery)  # nothing to recover: NaN, None in JSON
    assert set(json.loads(json.dumps(result.to_dict()))["recovery"].values()) == {None}


def test_k_composition_links_previous_token_head_to_induction_head(induction3):
    k = composition_scores(induction3, "K")
    assert k.shape == (2, 2, 2, 2) and k.mode == "K"
    assert not torch.isnan(k.scores).any()  # the decoys have zero weights: 0/0 is reported as 0
    assert k[PREV[0], PREV[1], IND[0], IND[1]] == k.scores.max() and k.scores.max() > 0.3
    strongest = next(iter(k.pairs()))  # the typed result names the pair
    assert strongest == f"L{PREV[0]}H{PREV[1]}->L{IND[0]}H{IND[1]}" and strongest in repr(k)
    assert k.chance == pytest.approx(induction3.cfg.d_model ** -0.5)
    scores = head_composition(induction3, PREV, IND)
    assert scores["K"] > 0.3 and scores["K"] > 3 * scores["Q"] and scores["K"] > 3 * scores["V"]
    with pytest.raises(ValueError, match="earlier layer"):
        head_composition(induction3, IND, PREV)


# ------------------------------------------------------------------------------------------ classify
# The first round's cases (more in tests/probes/test_classify.py); 96 states, where the hand-built induction model's
# linear read-out of counts is close enough to the in-context bigram law.
def _handbuilt(kind, source):
    if kind == "induction":
        return induction_model(source.vocab, n_ctx=96)
    if kind == "kernel":
        return kernel_model(source.kernel, n_ctx=96)
    return unigram_model(theory.stationary_distribution(source.kernel), n_ctx=96)


@pytest.mark.parametrize("kind", ["induction", "kernel", "unigram"])
@pytest.mark.parametrize("chain", ["binary", "ternary"])
def test_classify_handbuilt_models(kind, chain):
    source = CHAINS[chain]
    report = classify_mechanism(_handbuilt(kind, source), source, seq_len=96, n_sequences=32, seed=0)
    assert report.mechanism == kind, report.reasons
    # the exact models are confident; the induction model's linear read-out of counts is about as far from the
    # in-context bigram law as that law is from the kernel on a fixed chain: labelled right, near the margin
    assert report.confident or kind == "induction", report.reasons
    assert report.law.margin_ratio <= report.thresholds.margin
    assert report.order == (1 if kind in ("induction", "kernel") else None)
    if kind == "induction":
        assert report.previous_token_head == PREV and report.induction_head == IND
        assert report.circuit_confirmed
    else:
        assert report.context_ratio < 1e-6 and report.law.divergence < 1e-6
    b = report.behaviour
    if kind == "kernel":  # predicts with the kernel: same loss curve as the kernel itself, ICL score included
        assert torch.allclose(b.loss_curve, b.kernel_loss_curve, atol=1e-4) and b.kl_kernel < 1e-6
        assert report.eval_loss == pytest.approx(theory.entropy_rate(source.kernel), abs=0.05)
    if kind == "unigram":
        assert b.kl_stationary < 1e-6
        assert report.eval_loss == pytest.approx(theory.unigram_loss(source.kernel), abs=0.05)


@pytest.mark.parametrize("vocab", [2, 3])
def test_classify_handbuilt_induction_on_random_kernels(vocab):
    report = classify_mechanism(induction_model(vocab, n_ctx=96), RandomMarkov(vocab), seq_len=96, n_sequences=32,
                                seed=1)
    assert report.mechanism == "induction" and report.order == 1 and report.circuit_confirmed, report.reasons
    assert report.behaviour.kl_add_beta < report.behaviour.kl_stationary
    assert report.behaviour.icl_score < -0.05  # the loss falls along the sequence, as add-beta's does
    d = report.to_dict()
    text = json.dumps(d, allow_nan=False)
    assert {"mechanism", "order", "law", "strategies", "circuit", "eval_loss", "entropy_rate", "unigram_loss",
            "heads"} <= set(json.loads(text))
    assert d["heads"]["previous_token"][0][1] > 0.99
    roles = {r["name"]: r for r in d["induction"]["roles"]}
    assert roles["previous-token"]["heads"] == ["L0H1"] and roles["induction order 1"]["heads"] == ["L1H0"]
    assert [e["name"] for e in d["induction"]["k_edges"]] == ["L0H1->L1H0.k"]
    assert all(r["effect"] > 0 and r["confirmed"] for r in roles.values())
    assert d["law"]["law"] == "in_context_bigram" and d["law"]["passed"]


def test_classify_names_kernel_model_with_mlp_and_two_heads():
    model = kernel_model(TERNARY.kernel, n_heads=2, with_mlp=True)
    report = classify_mechanism(model, TERNARY, seq_len=32, n_sequences=16, seed=0)
    assert report.mechanism == "kernel" and report.previous_token_head is None


def _numbers(value):
    if isinstance(value, dict):
        return [x for k in sorted(value) for x in _numbers(value[k])]
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _numbers(v)]
    return [value] if isinstance(value, (int, float)) and not isinstance(value, bool) else []


def test_classify_is_deterministic_and_checks_inputs(induction3):
    a = classify_mechanism(induction3, TERNARY, seq_len=32, n_sequences=16, seed=5).to_dict()
    b = classify_mechanism(induction3, TERNARY, seq_len=32, n_sequences=16, seed=5).to_dict()
    assert a["mechanism"] == b["mechanism"] and a["reasons"] == b["reasons"]
    assert _numbers(a) == pytest.approx(_numbers(b), rel=1e-9, abs=1e-12, nan_ok=True)  # float ties only
    with pytest.raises(ValueError, match="d_vocab"):
        classify_mechanism(induction3, BINARY)
    with pytest.raises(ValueError, match="n_ctx"):
        classify_mechanism(induction3, TERNARY, seq_len=1000)
    with pytest.raises(ValueError, match="n_sequences"):
        classify_mechanism(induction3, TERNARY, n_sequences=1)
    with pytest.raises(ValueError, match="threshold"):
        Thresholds(fit=-1.0)
    with pytest.raises(ValueError, match="not from"):
        classify_mechanism(induction3, TERNARY, batch=sample_batch(RandomMarkov(3, order=2), n_sequences=4,
                                                                   seq_len=8, seed=0))


def test_probes_refuse_bad_tokens(induction3):
    with pytest.raises(ValueError, match="0..2"):
        next_state_probs(induction3, torch.tensor([[0, 1, 3]]))
    with pytest.raises((ValueError, TypeError)):  # jaxtyping's TypeCheckError in tests, ValueError otherwise
        next_state_probs(induction3, torch.zeros(2, 3))


# ------------------------------------------------------------------------------------------ trained models
def _run(source, model, *, steps, lr, seq_len, batch_size):
    from markov_interp.training import RunConfig, TrainConfig

    train_cfg = TrainConfig(steps=steps, batch_size=batch_size, seq_len=seq_len, lr=lr, schedule="constant", seed=0,
                            eval_every=0, n_checkpoints=0, device="cpu")
    return RunConfig(source=source, model=model, train=train_cfg)


@pytest.fixture(scope="module")
def kernel_run_dir(tmp_path_factory):
    """A one-layer model (the paper's block, untied) trained briefly on the binary chain p=0.2, q=0.3."""
    from markov_interp.sources import SourceConfig
    from markov_interp.models import preset
    from markov_interp.training import train

    run = _run(SourceConfig(kind="binary", p=0.2, q=0.3), preset("paper-1layer", n_ctx=64, tie_weights=False),
               steps=100, lr=1e-2, seq_len=64, batch_size=16)
    out = tmp_path_factory.mktemp("kernel-run")
    train(run, out, progress=False)
    return out


@pytest.mark.slow
def test_trained_one_layer_model_is_named_kernel(kernel_run_dir):
    from markov_interp import models

    model = models.load(kernel_run_dir)
    report = classify_mechanism(model, BINARY, seq_len=64, n_sequences=64, seed=1)
    assert report.mechanism == "kernel" and report.confident, report.reasons
    assert report.context_ratio < 0.1
    assert report.order == 1 and report.law.law == "kernel"
    assert report.eval_loss < theory.entropy_rate(BINARY.kernel) + 0.02
    assert report.readout.max_abs_error < 0.1  # the implied kernel is the chain's


@pytest.mark.slow
def test_trained_two_layer_attention_only_model_is_named_induction():
    from markov_interp.sources import SourceConfig
    from markov_interp.models import preset
    from markov_interp.training import train

    source = SourceConfig(kind="random", vocab=3, alpha=1.0)
    # 400 steps: seeds 0 and 1 both gave induction, fit 0.15-0.21 (600 steps: 0.12-0.13), measured on the
    # "torch-1" stream, which this recipe keeps (on "counter-1" seed 0 is also confident induction, L0H0->L1H0.k
    # kept, but one attention excess is 0.475 against the 0.5 asserted here: other data, other weights)
    run = _run(source, preset("attn-only-2layer", d_vocab=3, n_ctx=32), steps=400, lr=1e-2, seq_len=32,
               batch_size=64)
    run = dataclasses.replace(run, train=dataclasses.replace(run.train, stream="torch-1"))
    model = train(run, progress=False).model
    report = classify_mechanism(model, source.build(), seq_len=32, n_sequences=64, seed=1)
    assert report.mechanism == "induction" and report.order == 1 and report.confident, report.reasons
    assert report.previous_token_head == (0, 0) and report.induction_head == (1, 0)
    assert all(r.confirmed and len(r.heads) == 1 for r in report.induction.roles)
    assert "L0H0->L1H0.k" in report.circuit.kept_names and report.circuit.faithfulness > 0.8
    assert report.circuit_confirmed and report.behaviour.icl_score < -0.03
    assert report.attention.excess("previous_token")[0, 0] > 0.5 and report.attention.excess("induction")[1, 0] > 0.5
    assert report.eval_loss < report.behaviour.in_context_unigram_loss  # it beats every state-free predictor


@pytest.mark.slow
def test_cli_probe_prints_json_and_summary(kernel_run_dir, capsys):
    from markov_interp.cli import main

    assert main(["probe", str(kernel_run_dir), "--json", "--n-sequences", "16", "--seq-len", "32"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["mechanism"] == "kernel" and data["order"] == 1 and data["law"]["law"] == "kernel"
    assert set(data["strategies"]["divergences"]) == {"uniform", "stationary", "kernel", "in_context_unigram",
                                                      "in_context_bigram"}
    assert [r["name"] for r in data["induction"]["roles"]] == ["previous-token", "induction order 1"]
    assert data["circuit"]["kept"] and data["in_context_fraction"] < 0.2  # the kernel, held in the weights
    for key in ("eval_loss", "entropy_rate", "unigram_loss"):
        assert math.isfinite(data[key])
    assert data["entropy_rate"] == pytest.approx(theory.entropy_rate(BINARY.kernel))
    assert len(data["heads"]["previous_token"]) == 1 and len(data["heads"]["induction"][0]) == 1
    assert main(["probe", str(kernel_run_dir), "--n-sequences", "16", "--seq-len", "32"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("mechanism: kernel (order 1)") and "L0H0" in text and "role induction order 1" in text
    assert "edges kept" in text
    assert main(["probe", str(kernel_run_dir / "missing")]) == 2
    assert "config.json" in capsys.readouterr().err
