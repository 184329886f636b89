"""The phase-diagram and task-diversity experiments (issue 23): budgets, grids, measures on hand-built models whose
mechanism is known, the per-cell statistics, the claims' verdicts, the transition N* against a brute-force
crossing, the pool's unigram-retrieval law against enumeration, and (slow) both experiments end to end at their
smoke-test budget through the registry."""

import dataclasses
import itertools
import json
import math
import shutil

import numpy as np
import pytest
import torch

import handbuilt as hb
from markov_interp import dynamics, experiments, probes, theory
from markov_interp.sources import RandomMarkov
from markov_interp.experiments import diversity, phases


# ------------------------------------------------------------------------------------------------ budgets
def test_both_experiments_are_registered_with_quick_and_full_budgets():
    registered = experiments.registered()
    for name, module in (("phases", phases), ("diversity", diversity)):
        assert registered[name] is module.EXPERIMENT
        assert module.QUICK.cuts and module.QUICK.seeds >= 2
        assert module.FULL.seeds >= 16 and module.FULL.steps > module.QUICK.steps


@pytest.mark.parametrize("change, message", [
    ({"families": ("bogus",)}, "families"),
    ({"seq_len": 3}, "seq_len"),
    ({"seeds": 1}, "seeds"),
    ({"shapes": ((1, 0),)}, "shapes"),
    ({"group": 0}, "group"),
])
def test_phase_budget_refuses_bad_fields(change, message):
    with pytest.raises(ValueError, match=message):
        phases.TINY.replace(**change)


@pytest.mark.parametrize("change, message", [({"pool_sizes": (4, 1)}, "increasing"), ({"vocab": 1}, "vocab"),
                                             ({"depths": ()}, "depths")])
def test_diversity_budget_refuses_bad_fields(change, message):
    with pytest.raises(ValueError, match=message):
        diversity.TINY.replace(**change)


def test_phase_specs_cover_every_order_shape_and_seed():
    budget = phases.TINY.replace(shapes=((1,), (2, 1), (1, 1)), families=("attention-only", "layernorm"))
    specs = phases.phase_specs(budget)
    # one spec per family and depth; its grid the orders x that depth's shapes
    assert sorted(s.name for s in specs) == ["phases-attention-only-L1", "phases-attention-only-L2",
                                              "phases-layernorm-L1", "phases-layernorm-L2"]
    cells = [(s.base["model"]["normalization"], tuple(h), k, seed) for s in specs
             for h, k, seed in itertools.product(s.grid["model.n_heads"], s.grid["source.order"], s.seeds)]
    assert len(cells) == len(set(cells)) == 2 * 3 * 2 * 2
    assert {c[1] for c in cells} == {(1,), (2, 1), (1, 1)}


def test_formation_runs_are_the_grid_runs_with_checkpoints():
    """The formation specs repeat the grid's first seeds with checkpoints, and saving checkpoints does not change
    training: the same config with and without them ends at the same weights, bit for bit."""
    from markov_interp.training import train_many

    budget = phases.TINY.replace(seeds=3, formation_seeds=2)
    grid = {(c.config.train.replace(n_checkpoints=0), c.config.model, c.config.source)
            for s in phases.phase_specs(budget) for c in s.cells()}
    formation = [c.config for s in phases.formation_specs(budget) for c in s.cells()]
    assert len(formation) == 2 * 2 * 2 and {r.train.seed for r in formation} == {0, 1}
    assert all(r.train.n_checkpoints == budget.formation_checkpoints for r in formation)
    assert all((r.train.replace(n_checkpoints=0), r.model, r.source) in grid for r in formation)
    assert phases.formation_specs(budget.replace(formation_seeds=0)) == []
    run = formation[-1]
    (plain,) = train_many([dataclasses.replace(run, train=run.train.replace(n_checkpoints=0))], models_out=True)
    (saved,) = train_many([run], models_out=True)
    for (name, a), b in zip(plain.model.state_dict().items(), saved.model.state_dict().values()):
        assert torch.equal(a, b), name


def test_diversity_specs_grid_the_pool_sizes_and_fresh_kernels():
    specs = diversity.diversity_specs(diversity.TINY.replace(depths=(1, 2)))
    assert [s.base["model"]["n_layers"] for s in specs] == [1, 2]
    assert all(s.grid == {"source.pool_size": [1, 4, None]} for s in specs)


# ----------------------------------------------------------------------------------------------- measures
@pytest.mark.parametrize("gains, reached", [({0: 1.2, 1: 0.9, 2: 0.6}, 2), ({0: 1.2, 1: 0.4, 2: 0.9}, 0),
                                            ({0: 0.3, 1: 2.0}, -1), ({0: 0.7, 1: math.nan}, 0)])
def test_order_reached_needs_every_rung(gains, reached):
    assert phases.order_reached(gains) == reached


def test_phase_measures_on_an_induction_circuit_of_each_order():
    for order in (1, 2):
        source = RandomMarkov(2, order=order)
        batch = probes.sample_batch(source, n_sequences=32, seq_len=64, seed=3)
        m = phases.measure_model(hb.induction_circuit(2, order=order, n_ctx=64), batch, source)
        # the circuit by construction: lag heads L0H0 (lag 1), L0H1 (lag 2), the order-k induction head L1H0
        assert m["circuit"]["lags"] == {str(lag): [f"L0H{lag - 1}"] for lag in range(1, order + 1)}
        assert m["circuit"]["induction_order"] == order and m["circuit"]["full"]
        # gains as the probes define them, and the unigram step fully climbed
        expected = probes.graded_gains(probes.next_state_probs(hb.induction_circuit(2, order=order, n_ctx=64),
                                                               batch.tokens), batch, beta=1.0, max_order=order)
        assert m["gains"] == {str(k): pytest.approx(v) for k, v in expected.items()}
        assert m["gains"]["0"] > 0.9 and m["reached"] == phases.order_reached({int(k): v for k, v in
                                                                              m["gains"].items()})
        assert m["classified"] is None


def test_phase_measures_on_a_one_layer_counter_find_no_circuit():
    source = RandomMarkov(2, order=1)
    batch = probes.sample_batch(source, n_sequences=32, seq_len=64, seed=3)
    m = phases.measure_model(hb.counting_circuit(2, n_ctx=64), batch, source)
    assert m["reached"] == 0  # the in-context unigram law, not the bigram law
    assert m["circuit"]["induction_order"] == 0 and not m["circuit"]["full"]


@pytest.mark.slow
def test_classifier_names_the_induction_circuit_and_never_a_single_layer():
    source = RandomMarkov(2, order=1)
    batch = probes.sample_batch(source, n_sequences=32, seq_len=64, seed=3)
    two = phases.measure_model(hb.induction_circuit(2, order=1, n_ctx=64), batch, source, classify=True)
    assert two["classified"]["mechanism"] == "induction" and two["classified"]["order"] == 1
    assert (two["classified"]["previous_token_head"], two["classified"]["induction_head"]) == ("L0H0", "L1H0")
    one = phases.measure_model(hb.counting_circuit(2, n_ctx=64), batch, source, classify=True)
    assert one["classified"]["mechanism"] != "induction" and not one["classified"]["circuit_confirmed"]


def _record(family, heads, order, seed, reached, gains=None):
    measure = {"gains": gains or {str(j): 1.0 if j <= reached else 0.0 for j in range(order + 1)},
               "reached": reached, "model_loss": 0.5,
               "circuit": {"lags": {str(lag): [] for lag in range(1, order + 1)}, "induction": {},
                           "induction_order": 0, "full": False},
               "classified": {"mechanism": "state_and_counts", "order": None, "confident": True,
                              "circuit_confirmed": False, "previous_token_head": None, "induction_head": None,
                              "in_context_fraction": 0.5, "reason": ""} if seed == 0 else None}
    return phases.RunRecord(family=family, heads=heads, order=order, seed=seed, status="ok", measure=measure,
                            dynamics=None)


def test_cell_summaries_count_seeds_with_wilson_intervals_and_claims_follow_them():
    records = [_record("layernorm", (1,), 1, s, 0) for s in range(6)]
    records += [_record("layernorm", (1, 1), 1, s, 1 if s < 5 else 0) for s in range(6)]
    cells = phases.cell_summaries(records)
    one, two = cells
    assert one["reached"]["1"]["k"] == 0 and one["reached"]["0"]["k"] == 6
    assert two["reached"]["1"]["k"] == 5
    assert two["reached"]["1"]["interval"] == pytest.approx(list(dynamics.wilson_interval(5, 6)))
    assert two["median_order"] == 1 and one["median_order"] == 0
    assert one["circuit"]["classified"]["labels"] == {"state_and_counts": 1}
    rows = phases.claims(cells)
    verdicts = {(r["paper"], r["family"], r["shape"], r["order"]): r["verdict"] for r in rows}
    # depth 1 never reaches the bigram law: the learn-not claim holds; 5/6 at depth 2 is not resolved (Wilson
    # interval [0.44, 0.97] straddles 1/2); claims on cells this grid lacks are "not tested"
    assert verdicts[("Edelman et al. 2024", "layernorm", "L1 x1", 1)] == "holds"
    assert verdicts[("Edelman et al. 2024", "layernorm", "L2 x1", 1)] == "not resolved (mixed)"
    assert verdicts[("Edelman et al. 2024", "attention-only", "L2 x1", 1)] == phases.NOT_TESTED
    assert verdicts[("Rajaraman et al. 2024", "layernorm", "L3 x1", 3)] == phases.NOT_TESTED
    tested = [r for r in rows if r["verdict"] not in (phases.NOT_TESTED, "(the comparison)")]
    assert all(r["shape"] in ("L1 x1", "L2 x1") and r["order"] == 1 for r in tested)
    assert {r["paper"] for r in rows} == {"Rajaraman et al. 2024", "Ekbote et al. 2025", "Nichani et al. 2024",
                                          "Edelman et al. 2024"}  # every cited claim has its rows
    # a comparison: 5/6 against 0/6 at order 1 (LayerNorm against attention-only, Rajaraman) is resolved
    versus = phases.claims(phases.cell_summaries(
        records + [_record("attention-only", (1, 1), 1, s, 0) for s in range(6)]))
    row = next(r for r in versus if r["claim"].startswith("LayerNorm is what") and r["order"] == 1
               and r["family"] == "layernorm")
    assert row["verdict"].startswith("holds (ahead of attention-only L2 x1)")
    table, csv = phases.cells_table(cells), phases.cells_csv(cells)
    assert len(table.rows) == len(csv.rows) == 2
    assert dict(zip(csv.columns, csv.rows[1]))["reached_1"] == f"{5 / 6:.4g}"


# -------------------------------------------------------------------------------------------- diversity
def test_pool_unigram_predictions_match_enumeration():
    pool = RandomMarkov(3, pool_size=3, pool_seed=5).pool  # [kernel, vocab, vocab]
    tokens = torch.tensor([[0, 2, 2, 1, 0, 0], [1, 1, 1, 1, 2, 0]])
    got = theory.pool_unigram_predictions(pool, tokens)
    for n_kernel in range(3):
        assert torch.allclose(pool[n_kernel].sum(-1), torch.ones(3, dtype=pool.dtype))
    laws = []
    for kernel in pool.double().numpy():  # stationary law: the left eigenvector for eigenvalue 1
        values, vectors = np.linalg.eig(kernel.T)
        v = np.real(vectors[:, np.argmin(np.abs(values - 1))])
        laws.append(v / v.sum())
    for b, t in itertools.product(range(2), range(6)):
        weights = np.array([np.prod([law[x] for x in tokens[b, : t + 1].tolist()]) for law in laws])
        expected = (weights / weights.sum()) @ np.array(laws)
        assert np.allclose(got[b, t].numpy(), expected, atol=1e-10)


def _brute_crossing(sizes, values, level):
    means = [sum(v) / len(v) for v in values]
    x = [math.log2(n) for n in sizes]
    for i in range(len(sizes)):
        if all(m >= level for m in means[i:]):
            if i == 0:
                return 2 ** x[0], "<="
            return 2 ** (x[i - 1] + (level - means[i - 1]) / (means[i] - means[i - 1]) * (x[i] - x[i - 1])), "="
    return float(sizes[-1]), ">"


def test_transition_point_matches_a_brute_force_crossing():
    rng = np.random.default_rng(0)
    sizes = [1, 2, 4, 16, 64]
    for _ in range(200):
        values = [list(rng.uniform(0, 1, size=3)) for _ in sizes]
        estimate, relation = diversity.transition_point(sizes, values)
        expected, expected_relation = _brute_crossing(sizes, values, 0.5)
        assert relation == expected_relation and estimate == pytest.approx(expected)


def test_transition_interval_collapses_without_spread_and_covers_the_estimate():
    sizes = [1, 4, 16]
    exact = diversity.transition_interval(sizes, [[0.0] * 4, [0.0] * 4, [1.0] * 4])
    assert (exact.estimate, exact.relation) == (8.0, "=") and exact.interval == pytest.approx((8.0, 8.0))
    noisy = diversity.transition_interval(sizes, [[0.0, 0.1, 0.2], [0.2, 0.4, 0.9], [0.8, 1.0, 0.9]])
    assert noisy.interval[0] <= noisy.estimate <= noisy.interval[1]
    never = diversity.transition_interval(sizes, [[0.0, 0.1], [0.1, 0.2], [0.2, 0.3]])
    assert never.relation == ">" and never.interval[1] == math.inf and "not reached" in never.describe()


def test_diversity_measures_tell_retrieval_from_inference_on_handbuilt_models():
    pool1 = RandomMarkov(3, pool_size=1, pool_seed=0)
    outside = probes.sample_batch(RandomMarkov(3), n_sequences=32, seq_len=64, seed=2)
    inside = probes.sample_batch(pool1, n_sequences=32, seq_len=64, seed=1)
    # the pool's one kernel held in the weights: retrieval, the swap fraction 0
    kernel = diversity.measure_model(hb.kernel_model(pool1.pool[0], n_ctx=64), inside, outside, pool1)
    assert kernel["phase"] == "bigram retrieval" and abs(kernel["swap_fraction"]) < 1e-6
    assert kernel["in"]["model"] == pytest.approx(kernel["in"]["pool_bayes"], abs=1e-5)
    # an induction circuit estimates the kernel in context: inference, most of the way to the in-context law
    pool4 = RandomMarkov(3, pool_size=4, pool_seed=0)
    inside4 = probes.sample_batch(pool4, n_sequences=32, seq_len=64, seed=1)
    induction = diversity.measure_model(hb.induction_circuit(3, n_ctx=64), inside4, outside, pool4)
    assert induction["phase"] == "bigram inference" and induction["swap_fraction"] > 0.6
    counter = diversity.measure_model(hb.counting_circuit(3, n_ctx=64), inside4, outside, pool4)
    assert counter["phase"] == "unigram inference"
    assert counter["swap_fraction"] < induction["swap_fraction"]


def test_transitions_and_cells_from_records():
    def record(size, seed, swap):
        m = {"in": {"model": 1.0, "in_context_bayes": 0.9, "pool_bayes": 0.8},
             "out": {"model": 1.0, "in_context_bayes": 0.9, "pool_bayes": 1.2}, "swap_fraction": swap,
             "swap_se": 0.01, "kl": {a: 0.1 for a in diversity.ALGORITHMS},
             "phase": "bigram inference" if swap > 0.5 else "bigram retrieval"}
        return diversity.DiversityRecord(depth=2, pool_size=size, seed=seed, status="ok", measure=m)

    records = [record(n, s, v) for n, v in ((1, 0.0), (4, 0.0), (16, 1.0)) for s in range(3)]
    budget = diversity.TINY.replace(pool_sizes=(1, 4, 16), depths=(2,))
    trans = diversity.transitions(records, budget)
    assert trans["2"]["swap_fraction"]["estimate"] == pytest.approx(8.0)
    assert trans["2"]["inference_phase"]["estimate"] == pytest.approx(8.0)
    cells = diversity.cell_summaries(records)
    assert [c["inference"]["k"] for c in cells] == [0, 0, 3]
    assert cells[0]["in"]["excess_pool_bayes"]["mean"] == pytest.approx(0.2)
    assert len(diversity.cells_csv(cells).rows) == 3 and len(diversity.references_table(cells).rows) == 3
    # the claims: N* reached inside the grid (Raventós); retrieval at N = 1 and inference at N = 16 are each 3/3,
    # whose Wilson intervals [0.44, 1] straddle 1/2: not resolved with 3 seeds, held with 8
    claims = {paper: verdict for paper, _, _, verdict in diversity.claims(cells, trans)}
    assert claims["Raventós et al. 2023"] == "holds" and claims["Park et al. 2024"] == "not resolved (mixed)"
    more = [record(n, s, v) for n, v in ((1, 0.0), (4, 0.0), (16, 1.0)) for s in range(8)]
    more_claims = diversity.claims(diversity.cell_summaries(more), diversity.transitions(more, budget))
    assert {paper: verdict for paper, _, _, verdict in more_claims}["Park et al. 2024"] == "holds"
    never = [record(n, s, 0.0) for n in (1, 4, 16) for s in range(8)]
    never_claims = diversity.claims(diversity.cell_summaries(never), diversity.transitions(never, budget))
    assert {p: v for p, _, _, v in never_claims}["Raventós et al. 2023"].startswith("fails")
    assert diversity.claims([], {})[0][-1] == "not tested at this budget"


# ------------------------------------------------------------------------------------------- end to end
@pytest.mark.slow
@pytest.mark.parametrize("name", ["phases", "diversity"])
def test_tiny_budget_end_to_end_through_the_registry(tmp_path, name):
    experiment = experiments.get(name)
    finished = experiments.run(experiment, tmp_path, budget=experiment.budget("tiny", workers=1))
    assert finished.failed == 0
    written = {p.name for p in finished.files}
    assert {"summary.md", "results.json", "cells.csv"} <= written
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["budget"]["name"] == "tiny" and data["result"]["runs"]
    assert all(r["status"] == "ok" for r in data["result"]["runs"])
    assert "smoke test" in (tmp_path / "summary.md").read_text()
    if name == "phases":  # seed 0 of every cell followed over training: one row per cell, a circuit per checkpoint
        formation = data["result"]["formation"]
        assert len(formation) == len({(tuple(r["heads"]), r["order"]) for r in data["result"]["runs"]})
        assert all(len(f["formation"]["faithfulness"]) == len(f["formation"]["steps"]) >= 3 for f in formation)
        assert "## Circuits over training" in (tmp_path / "summary.md").read_text()
        assert "escape_curves.png" in written  # a fresh run has its loss curves (a read-back one does not)
    # a rerun reuses the finished runs and their cached measures
    again = experiments.run(experiment, tmp_path, budget=experiment.budget("tiny", workers=1))
    assert json.loads((tmp_path / "results.json").read_text())["result"]["runs"] == data["result"]["runs"]
    assert again.failed == 0
    # read back with no training (`experiments.load`): every cell summary recomputed from the recorded runs
    back = experiments.load(tmp_path)
    assert back.name == name and back.budget == experiment.budget("tiny", workers=1)
    assert json.dumps(back.result.to_json(), sort_keys=True) == json.dumps(data["result"], sort_keys=True)
    if name == "phases":  # the final weights kept beside results.json measure every run again, no training
        kept = sorted(p.name for p in (tmp_path / "weights").iterdir())
        assert kept == sorted(phases.weights_name(r) for r in back.result.records)
        shutil.rmtree(tmp_path / "runs")  # nothing of the training is left but the kept weights
        again = experiments.run(experiment, tmp_path, budget=back.budget, remeasure=True)
        assert json.loads((tmp_path / "results.json").read_text())["result"]["runs"] == data["result"]["runs"]


@pytest.mark.slow
def test_three_state_diagram_end_to_end_and_beside_the_binary_one(tmp_path):
    experiment = experiments.get("phases")
    budgets = {v: experiment.budget("tiny", workers=1, vocab=v, orders=(1,), shapes=((1, 1),), formation_seeds=0)
               for v in (2, 3)}
    done = {v: experiments.run(experiment, tmp_path / f"v{v}", budget=b) for v, b in budgets.items()}
    runs3 = json.loads((tmp_path / "v3" / "results.json").read_text())["result"]["runs"]
    assert {r["vocab"] for r in runs3} == {3} and all(r["status"] == "ok" for r in runs3)
    config = json.loads((tmp_path / "v3" / "weights" / "layernorm-v3-h1-1-k1-s0" / "config.json").read_text())
    assert config["source"]["vocab"] == config["model"]["d_vocab"] == 3
    cells, rows = phases.alphabets([done[2].result, done[3].result])
    assert [(c["vocab"], c["label"]) for c in cells] == [(2, "L2 x1"), (3, "L2 x1")]
    edelman = [r for r in rows if r["claim"].endswith("with an induction head") and r["family"] == "layernorm"]
    assert sorted(r["vocab"] for r in edelman) == [2, 3] and all(r["reached"]["n"] == 2 for r in edelman)
