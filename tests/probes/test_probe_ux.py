"""The probes as a user meets them: one probe length everywhere, results that display well in a notebook,
TransformerLens shapes in the figures, one signature convention, clear errors.

The display and shape checks run on the hand-built circuit of tests/handbuilt.py (its heads are known: L0H1
previous-token, L1H0 induction); the entry-point agreement trains a small model at sequence length 32 inside a
context of 128, where the old rules (Python min(n_ctx, 128), `probe` the training length) disagreed.
"""

import json
import warnings
from pathlib import Path

import pytest
import torch

from handbuilt import induction_model
from markov_interp import cli, models, probes, report
from markov_interp.sources import RandomMarkov, SourceConfig
from markov_interp.probes.joint import Cancelling

TERNARY = RandomMarkov(3)


@pytest.fixture(scope="module")
def circuit():
    return induction_model(3)  # n_ctx 48, previous-token head L0H1, induction head L1H0


@pytest.fixture(scope="module")
def mech(circuit):
    return probes.classify_mechanism(circuit, TERNARY, n_sequences=16, seed=0)


@pytest.fixture(scope="module")
def batch():
    return probes.sample_batch(TERNARY, n_sequences=8, seq_len=32, seed=0)


# ------------------------------------------------------------------------------------------- probe length
def test_probe_length_rule_and_its_warning():
    model = induction_model(3)  # a fresh one: the warning is once per model
    assert probes.probe_length(model) == min(48, probes._common.DEFAULT_PROBE_LENGTH) == 48  # no training length known
    model.markov_train_seq_len = 20
    assert probes._common.training_length(model) == 20 and probes.probe_length(model) == 20
    assert probes.probe_length(model, 16) == 16
    with pytest.raises(ValueError, match="n_ctx=48"):
        probes.probe_length(model, 49)
    with pytest.raises(ValueError, match="seq_len"):
        probes.probe_length(model, 1)
    # the same rule on a model's numbers (what `probe` / `report` size their batch by before loading the model)
    length_for = probes._common.probe_length_for
    assert length_for(48, None) == 48 and length_for(48, 20) == 20
    assert length_for(16, 20) == 16 and length_for(48, 20, 30) == 30  # capped at n_ctx
    with pytest.raises(ValueError, match="n_ctx=48"):
        length_for(48, 20, 49)
    tokens = TERNARY.sample(2, 30, torch.Generator().manual_seed(0))
    with pytest.warns(probes._common.ProbeLengthWarning,
                      match=r"trained on sequences of 20: positions 20\.\.29 were never"):
        probes.next_state_probs(model, tokens)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per model: the second probe beyond the length is silent
        probes.attention_scores(model, tokens)
        probes.next_state_probs(model, tokens[:, :20])


def test_classify_defaults_to_the_training_length(circuit):
    model = induction_model(3)
    model.markov_train_seq_len = 24
    assert probes.classify_mechanism(model, TERNARY, n_sequences=4).seq_len == 24
    assert probes.classify_mechanism(circuit, TERNARY, n_sequences=4).seq_len == 48  # unknown: min(n_ctx, 128)


def test_loaded_and_trained_models_carry_their_training_length(tmp_path, circuit):
    """The training length lives in the weights file's metadata (`models.weights_metadata`), read by the probes;
    nothing is set on TransformerLens's object. A file without it (a model of one's own) leaves it unknown."""
    from markov_interp import runs
    from markov_interp.training import train

    run = runs.RunConfig(source=SourceConfig(kind="random", vocab=3), model=models.preset(
        "attn-only-2layer", n_layers=1, d_vocab=3, n_ctx=16),
        train=runs.TrainConfig(steps=2, seq_len=12, batch_size=4, eval_every=0, n_checkpoints=1, device="cpu"))
    result = train(run, tmp_path / "run", progress=False)
    assert models.weights_metadata(result.model) == models.WeightsMetadata(train_seq_len=12, step=2)
    (_, checkpoint), = runs.list_checkpoints(tmp_path / "run")
    for path in (tmp_path / "run", tmp_path / "run" / "model.safetensors", checkpoint):
        for model in (models.load(path), runs.load_model(path)):
            assert models.weights_metadata(model) == models.WeightsMetadata(train_seq_len=12, step=2), path
            assert probes._common.training_length(model) == 12 and probes.probe_length(model) == 12
    for model in (result.model, models.load(tmp_path / "run")):
        assert "markov_train_seq_len" not in vars(model)  # not an attribute of the model object
    alone = models.save(result.model, tmp_path / "alone" / "weights.safetensors")  # no run folder around it
    assert models.weights_metadata(models.load(alone)) == models.WeightsMetadata()
    assert probes._common.training_length(models.load(alone)) is None and probes.probe_length(models.load(alone)) == 16
    own = models.load(alone)
    own.markov_train_seq_len = 8  # a model of one's own: the length set by hand is the probes' default
    assert probes.probe_length(own) == 8 and probes.probe_length(result.model) == 12


@pytest.mark.slow
def test_every_entry_point_gives_the_same_verdict(tmp_path, capsys):
    """A two-layer model trained at length 32 in a context of 128 (the issue's case: `probe` said induction,
    Python, probing at min(n_ctx, 128) = 128, said other): Python, `probe --json` and `report` agree."""
    from markov_interp.training import RunConfig, TrainConfig, train

    run = RunConfig(source=SourceConfig(kind="random", vocab=3, alpha=1.0),
                    model=models.preset("attn-only-2layer", d_vocab=3, n_ctx=128),
                    train=TrainConfig(steps=600, seq_len=32, batch_size=64, lr=1e-2, schedule="constant", seed=0,
                                      eval_every=0, n_checkpoints=2, device="cpu"))
    folder = tmp_path / "icl"
    train(run, folder, progress=False)
    assert min(128, probes._common.DEFAULT_PROBE_LENGTH) != 32  # the old Python default probed elsewhere
    python = probes.classify_mechanism(models.load(folder), run.source.build()).to_dict()
    assert cli.main(["probe", str(folder), "--json"]) == 0
    from_cli = json.loads(capsys.readouterr().out)
    from_report = report.build(folder, max_checkpoints=2).mechanism.to_dict()
    assert python["seq_len"] == from_cli["seq_len"] == from_report["seq_len"] == 32
    assert python["mechanism"] == from_cli["mechanism"] == from_report["mechanism"] == "induction"
    assert python["reasons"] == from_cli["reasons"] == from_report["reasons"]
    assert cli.main(["probe", str(folder), "--seq-len", "64"]) == 0  # beyond the training length: one line
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("markov-interp probe: warning: probing at sequence length 64")
    assert cli.main(["probe", str(folder), "--seq-len", "129"]) == 2
    assert "exceed the model's n_ctx=128" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ display
def test_results_have_short_reprs_summaries_and_html(circuit, mech, batch):
    clean, corrupted = probes.patching.patching_pair(batch)
    results = [mech, mech.attention, mech.ablation, mech.behaviour, mech.strategies, mech.readout, mech.circuit,
               probes.activation_patching(circuit, clean, corrupted)]
    for result in results:
        text = repr(result)
        assert text.startswith(f"<{type(result).__name__}: ") and "\n" not in text and len(text) < 200
        assert 1 <= len(result.summary().splitlines()) <= 6
        page = result._repr_html_()
        assert "<table" in page and len(page) < 40_000
    assert repr(mech).startswith("<MechanismReport: induction (order 1, confident)")
    assert repr(batch).startswith("<ProbeBatch: 8 sequences x 32 states over 3 states")
    assert "L1H0" in repr(mech.circuit) and "L0H1" in repr(mech.circuit)
    page = mech._repr_html_()
    for field in ("strategies", "circuit", "induction", "attention", "ablation", "readout"):  # every table
        assert f".{field}: " in page


def test_dataframes_hold_the_probe_numbers(mech):
    heads = mech.to_dataframe()
    assert list(heads.index) == ["L0H0", "L0H1", "L1H0", "L1H1"]
    grid, excess = mech.attention.previous_token, mech.attention.excess("induction")
    for name, row in heads.iterrows():
        layer, head = int(name[1]), int(name[3])
        assert row["previous_token"] == pytest.approx(float(grid[layer, head]))
        assert row["induction_excess"] == pytest.approx(float(excess[layer, head]))
        assert row["ablation_loss_change"] == pytest.approx(mech.ablation[name])
    assert heads["induction_excess"].idxmax() == "L1H0" and heads["previous_token_excess"].idxmax() == "L0H1"
    table = mech.ablation.to_dataframe()
    assert list(table.index) == list(mech.ablation.names)
    assert table["loss_change"].tolist() == pytest.approx(list(mech.ablation.loss_change))
    laws = mech.strategies.to_dataframe()
    assert laws.index[0] == mech.strategies.closest == "in_context_bigram"
    assert laws["divergence"].to_dict() == pytest.approx(mech.strategies.divergences)
    roles = mech.induction.to_dataframe()
    assert roles.loc["induction order 1", "heads"] == "L1H0" and bool(roles["confirmed"].all())
    edges = mech.circuit.to_dataframe()
    assert set(edges.index) == {e.name for e in mech.circuit.edges}
    assert edges["kept"].sum() == len(mech.circuit.kept) and edges.loc["L0H1->L1H0.k", "kept"]
    assert edges["effect"].to_dict() == pytest.approx({e.name: e.effect for e in mech.circuit.edges})
    curves = mech.behaviour.to_dataframe()
    assert len(curves) == mech.seq_len and curves["loss"].iloc[:-1].mean() == pytest.approx(mech.eval_loss)
    assert curves["loss"].isna().tolist() == [False] * (mech.seq_len - 1) + [True]  # the last state has no target
    readout = mech.readout.to_dataframe()
    assert list(readout.index) == ["0", "1", "2"] and readout["count"].sum() == int(mech.readout.counts.sum())


def test_attention_scores_table_leaves_out_absent_heads(mech):
    grids = {name: getattr(mech.attention, name).clone() for name in ("previous_token", "induction", "same_token")}
    for grid in grids.values():
        grid[0, 1] = float("nan")  # a layer with fewer heads: its surplus head is NaN in every grid
    scores = probes.attention.AttentionScores(**grids, previous_token_chance=mech.attention.previous_token_chance,
                                    induction_chance=mech.attention.induction_chance,
                                    same_token_chance=mech.attention.same_token_chance)
    assert list(scores.to_dataframe().index) == ["L0H0", "L1H0", "L1H1"]


# ------------------------------------------------------------------------------- conventions and shapes
def test_probes_that_read_tokens_take_a_probe_batch(circuit, batch):
    by_batch = probes.attention_scores(circuit, batch).to_dict()
    assert by_batch == probes.attention_scores(circuit, batch.tokens).to_dict()
    assert probes.ablation_table(circuit, batch).to_dict() == probes.ablation_table(circuit, batch.tokens).to_dict()
    assert torch.equal(probes.next_state_probs(circuit, batch), probes.next_state_probs(circuit, batch.tokens))


def test_probes_that_need_kernels_refuse_bare_tokens(circuit, batch):
    for probe in (probes.behaviour_report, probes.kernel_readout, probes.strategy_similarity):
        with pytest.raises((ValueError, TypeError)):  # jaxtyping's TypeCheckError under pytest, else ValueError
            probe(circuit, batch.tokens)
    from markov_interp.probes._common import check_batch

    with pytest.raises(ValueError, match="takes a ProbeBatch"):
        check_batch(batch.tokens, "behaviour")


def test_identical_patching_inputs_are_refused(circuit, batch):
    with pytest.raises(ValueError, match="identical"):
        probes.activation_patching(circuit, batch.tokens, batch.tokens.clone())
    with pytest.raises((ValueError, TypeError)):  # jaxtyping's TypeCheckError under pytest, else ValueError
        probes.activation_patching(circuit, batch.tokens, batch.tokens[:, :-1])


def test_pattern_scores_check_their_shapes(batch):
    pattern = probes.attention.uniform_causal_pattern(batch.tokens)
    with pytest.raises((ValueError, TypeError)):
        probes.attention.previous_token_score(pattern[0], batch.tokens)  # [head, q, k]: no batch axis
    with pytest.raises(ValueError, match=r"\[8, head, 16, 16\]"):
        probes.attention.same_token_score(pattern, batch.tokens[:, :16])  # patterns of 32 positions, tokens of 16


def test_attention_figure_takes_transformer_lens_shapes(circuit):
    tokens = TERNARY.sample(1, 10, torch.Generator().manual_seed(1))
    _, cache = circuit.run_with_cache(tokens)
    stacked = report.attention_patterns_figure(cache.stack_activation("pattern")[:, 0], tokens[0])
    one_layer = report.attention_patterns_figure(cache["pattern", 1][0], tokens, layer=1)  # TL's [head, q, k]
    assert stacked.props["attentionHeadNames"] == ["L0H0", "L0H1", "L1H0", "L1H1"]
    assert one_layer.props["attentionHeadNames"] == ["L1H0", "L1H1"]
    assert one_layer.props["attention"] == stacked.props["attention"][2:]
    named = report.attention_patterns_figure(cache["pattern", 0][0], probes.state_labels(tokens[0], names="abc"))
    assert named.props["tokens"] == ["abc"[int(t)] for t in tokens[0]]
    with pytest.raises(ValueError, match="must be one sequence"):
        report.attention_patterns_figure(cache["pattern", 0][0], tokens.expand(2, -1))
    with pytest.raises(ValueError, match="do not match 9 tokens"):
        report.attention_patterns_figure(cache["pattern", 0][0], tokens[0, :9])
    from markov_interp.report.figures import _patterns_by_head

    with pytest.raises(ValueError, match=r"cache\['pattern', layer\]\[0\]"):
        _patterns_by_head(torch.zeros(3, 3), None)
    with pytest.raises(ValueError, match="draws a probes.attention.AttentionScores"):
        report.head_scores_figure(cache["pattern", 0])


def test_state_labels():
    assert probes.state_labels(torch.tensor([2, 0])) == ["2", "0"]
    assert probes.state_labels(torch.tensor([[0, 1], [1, 1]])) == [["0", "1"], ["1", "1"]]
    assert probes.state_labels([1, 0], names=["sun", "rain"]) == ["rain", "sun"]
    with pytest.raises(ValueError, match="names has 2 entries"):
        probes.state_labels([0, 2], names="ab")
    with pytest.raises(ValueError, match="integer states"):
        probes.state_labels(torch.zeros(3))


# ------------------------------------------------------------------------- every result type displays (32)
def public_probe_names() -> dict[str, object]:
    """Every public name of the probes: the face (`probes.__all__`) and each module's own public definitions (the
    engines, reached as `probes.<module>.<Name>`)."""
    import pkgutil

    found = {}
    for info in pkgutil.iter_modules(probes.__path__):
        module = getattr(probes, info.name)
        found.update({name: getattr(module, name) for name in getattr(module, "__all__", ())})
    found.update({name: getattr(probes, name) for name in probes.__all__})
    return found


def _result_types() -> dict[str, type]:
    """Every typed result of the package: the probes' public results (the face's and the modules'), and the other
    stages' results."""
    import dataclasses as dc

    from markov_interp import dynamics, landscape, sweep, theory
    from markov_interp.report import Report
    from markov_interp.report._condition import ConditionEscapes
    from markov_interp.training import FinalLosses, TrainResult

    # names, engines and an engine's working state (verify's gradient estimates), not results a user reads
    not_results = {"Component", "EdgeKey", "EdgeRunner", "ProbeLengthWarning", "ProbeResult", "Estimates"}
    found = {name: obj for name, obj in public_probe_names().items() if isinstance(obj, type)
             and dc.is_dataclass(obj) and name not in not_results}
    found.update({c.__name__: c for c in (
        theory.ReferenceLosses, theory.KernelExpectations, FinalLosses, TrainResult, dynamics.ExcessCurve,
        dynamics.RunDynamics, dynamics.Quantile, dynamics.Survival, dynamics.MedianCurve, dynamics.ConditionDynamics,
        dynamics.FractionComparison, dynamics.AreaComparison, dynamics.Comparison, landscape.CanonicalProjection,
        landscape.Trajectory, landscape.RegimeMap, landscape.UnigramPointAnalysis, landscape.BigramMinima,
        sweep.CellResult, sweep.ProbeColumns, sweep.Row, sweep.SweepResult, Report, ConditionEscapes)})
    return found


def test_every_result_type_is_enumerated(examples):
    names = set(_result_types())
    assert {"MechanismReport", "LogitAttribution", "PositionPatching", "KernelSwap", "Gains", "LawCheck", "Edge",
            "SwapPlan", "Role", "ProbeBatch", "TokenStatistics", "CircuitFormation", "TrainResult", "Survival",
            "Report"} <= names
    assert set(examples) == names, set(examples) ^ names


def _probe_examples(circuit, mech, batch) -> dict:
    clean, corrupted = probes.patching.patching_pair(batch)
    return {
        "MechanismReport": mech, "LawCheck": mech.law.raw, "LawVerdict": mech.law, "Thresholds": mech.thresholds,
        "Gains": mech.gains, "KernelSwap": mech.kernel_swap, "CircuitGraph": mech.graph,
        "CircuitVerdict": mech.circuit, "Edge": mech.circuit.edges[0], "PassResult": mech.graph.position,
        "JointTest": mech.graph.joint[0],
        "Cancelling": Cancelling(edges=("L1H1->logits", "L1H2->logits"), effect=0.0, se=0.0, alone=(0.249, 0.259),
                                 corruption="resample", dropped=True),  # (test_verdicts.py finds real ones)
        "Circuit": mech.induction, "Role": mech.induction.roles[0], "BehaviourReport": mech.behaviour,
        "EdgeContent": mech.content, "EdgeCarry": next(e for e in mech.content.edges if e.measured),
        "AttentionScores": mech.attention, "AblationTable": mech.ablation, "KernelReadout": mech.readout,
        "StrategySimilarity": mech.strategies, "ProbeBatch": batch,
        "LogitAttribution": probes.direct_logit_attribution(circuit, batch),
        "WeightCircuits": probes.ov_circuits(circuit),
        "CompositionScores": probes.patching.composition_scores(circuit, "K"),
        "PositionPatching": probes.patching_by_position(circuit, clean, corrupted),
        "PatchingResult": probes.activation_patching(circuit, clean, corrupted),
        "SwapPlan": probes.kernel_swap.swap_plan(TERNARY, n_sequences=4, seq_len=16, seed=0),
        "TokenStatistics": probes.attention.token_statistics(batch, vocab=3),
        "CircuitFormation": probes.circuit_formation([(1, circuit), (2, circuit)], TERNARY, n_sequences=4,
                                                     seq_len=16),
        "Target": probes.probe_target("state", batch, lag=1),
        "ProbeFit": probes.linear_probe(circuit, batch, ("resid_post", 0), "state_counts", n_bootstrap=20),
        "ProbeTable": probes.probe_layers(circuit, batch, probes.probe_target("state", batch, lag=1), n_bootstrap=20),
    }


def _other_examples(mech) -> dict:
    import math

    from markov_interp import dynamics, landscape, sweep, theory
    from markov_interp.report import Report
    from markov_interp.report._condition import ConditionEscapes
    from markov_interp.training import FinalLosses, RunConfig, TrainResult, default_run

    refs = theory.ReferenceLosses(entropy_rate=0.5446, unigram_loss=0.6730)
    final = FinalLosses(step=300, eval_loss=0.55, train_loss=0.56, references=refs)
    run = default_run()
    curve = dynamics.ExcessCurve((10, 20, 30, 40), (0.05, 0.04, 0.01, 0.0), (0.05,) * 4)
    other = dynamics.ExcessCurve((10, 20, 30, 40), (0.05, 0.05, 0.04, 0.01), (0.05,) * 4)
    runs_a = [dynamics.run_dynamics(curve)] * 4
    runs_b = [dynamics.run_dynamics(other)] * 4
    surv = dynamics.survival([r.escape for r in runs_a])
    comparison = dynamics.compare(runs_a, runs_b, n_boot=20, seed=0)
    cell = sweep.CellResult(final_step=300, final_eval_loss=0.55, final_train_loss=0.56, entropy_rate=0.5446,
                            unigram_loss=0.6730, bayes_loss=None, excess_loss=0.0054, outcome="optimum",
                            stuck_at_unigram=False, escape_step=30, probe=sweep.ProbeColumns(mechanism="kernel"),
                            seconds=1.0, censored=False, crossings=runs_a[0].to_json())
    row = sweep.Row(sweep="grid", cell_id="abc", status="ok", error=None, params={"seed": 0}, config=run,
                    result=cell, run_dir="runs/abc")
    trajectory = landscape.Trajectory(("e", "w", "b"), torch.zeros(3, 3).numpy(),
                                      torch.tensor([0.7, 0.6, 0.5]).numpy())
    return {
        "ReferenceLosses": refs, "KernelExpectations": theory.KernelExpectations(1.0, 0.01, 1.1, 0.01, "monte carlo"),
        "FinalLosses": final,
        "TrainResult": TrainResult(model=None, metrics=[{"step": 1}], final=final, config=run, out_dir=None),
        "ExcessCurve": curve, "RunDynamics": runs_a[0], "Quantile": surv.median(), "Survival": surv,
        "MedianCurve": dynamics.median_curve([curve, other]),
        "ConditionDynamics": dynamics.condition(runs_a),
        "FractionComparison": comparison.escape, "AreaComparison": comparison.area, "Comparison": comparison,
        "CanonicalProjection": landscape.CanonicalProjection(e=1.0, w=0.5, b=0.0, a=1.0, coupling=1.0, tied=True,
                                                             direction=torch.ones(8).numpy(),
                                                             embedding_alignment=math.nan),
        "Trajectory": trajectory,
        "RegimeMap": landscape.RegimeMap(kind="pq", x=torch.tensor([0.2, 0.8]).numpy(),
                                         y=torch.tensor([0.3, 0.9]).numpy(), x_label="p", y_label="q",
                                         bigram=torch.tensor([[True, False], [True, True]]).numpy(), tied=True),
        "UnigramPointAnalysis": landscape.unigram_point_analysis(-0.2, p=0.5, q=0.8),
        "BigramMinima": landscape.bigram_minima(torch.tensor([-0.5, 0.0, 0.5]).numpy(), p=0.2, q=0.3),
        "CellResult": cell, "ProbeColumns": cell.probe, "Row": row,
        "SweepResult": sweep.SweepResult(rows=[row], table=Path("runs/grid/results.csv"), n_run=1, n_skipped=0,
                                         n_failed=0),
        "Report": Report(title="a report", sections=(), mechanism=mech),
        "ConditionEscapes": ConditionEscapes(sweep_dir=Path("runs/grid"), sweep_name="grid", cell_id="abc",
                                             escape=runs_a[0].escape, summary=surv, budget=40),
    }


def _belief_examples() -> dict:
    """The belief probes' results on the hand-built belief model (tests/handbuilt.py)."""
    from tests.handbuilt import BELIEF_KERNEL, belief_model, chain_hmm

    source, model = chain_hmm(BELIEF_KERNEL), belief_model(BELIEF_KERNEL)
    tokens = source.sample(64, 16, generator=torch.Generator().manual_seed(13))
    fit = probes.beliefs.belief_probes(model, tokens, source, n_bootstrap=0, sites=["L0.resid_post"],
                                       concatenate=False)["L0.resid_post"]
    return {"BeliefPatch": probes.beliefs.belief_patch(model, tokens[:32], source, fit, n_bootstrap=0),
            "SimplexProjection": probes.beliefs.simplex_projection(source.belief_states(tokens)[0].double())}


@pytest.fixture(scope="module")
def examples(circuit, mech, batch):
    return {**_probe_examples(circuit, mech, batch), **_other_examples(mech), **_belief_examples()}


@pytest.mark.parametrize("name", sorted(_result_types()))
def test_result_displays_in_one_line_as_html_and_as_json(name, examples):
    """Every result type: a one-line repr with no tensor values and no NaN, an HTML view, and `to_dict()` that
    strict JSON accepts."""
    value = examples[name]
    assert type(value).__name__ == name
    text = repr(value)
    assert text.startswith(f"<{name}: ") and text.endswith(">") and "\n" not in text and len(text) <= 200, text
    assert "tensor(" not in text and "array(" not in text and "nan" not in text.lower(), text
    page = value._repr_html_()
    assert page.lstrip().startswith(("<div", "<iframe")) and "tensor(" not in page, page[:200]
    json.dumps(value.to_dict(), allow_nan=False)


def test_logit_attribution_has_no_mlp_part_for_a_model_without_mlps(circuit, batch):
    """Issue 32: `LogitAttribution.mlps` showed NaN for an attention-only model; now it is None and every display
    lists only the parts the model has."""
    assert circuit.cfg.attn_only
    dla = probes.direct_logit_attribution(circuit, batch)
    assert dla.mlps is None and ".mlp" not in "".join(dla.components())
    assert sum(dla.components().values()) == pytest.approx(dla.total, abs=1e-6)
    assert "mlp" not in repr(dla) and "nan" not in dla._repr_html_().lower()
    assert dla.to_dict()["mlps"] is None and set(dla.to_dataframe().index) == set(dla.components())


# ---------------------------------------------------------------------------------- argument types (32)
def _public_probes() -> dict:
    import inspect

    return {name: getattr(probes, name) for name in probes.__all__
            if inspect.isfunction(getattr(probes, name)) and name not in ("checked", "headline")}


def test_every_public_probe_checks_its_argument_types():
    assert all(getattr(fn, "__markov_checked__", False) for fn in _public_probes().values())


@pytest.mark.parametrize("name", sorted(_public_probes()))
def test_a_wrong_argument_type_names_the_parameter(name):
    """Each parameter whose type the probe checks (a model, a source, tokens, a batch, a tensor, a result) given a
    value of the wrong type (a float): a TypeError naming the probe, the parameter and what it takes."""
    import inspect
    import typing

    from markov_interp.probes._common import _expected

    fn = _public_probes()[name]
    hints = typing.get_type_hints(fn.__wrapped__)
    checked = [p for p in inspect.signature(fn).parameters if p in hints and _expected(hints[p]) is not None]
    for param in checked:
        with pytest.raises(TypeError, match=rf"^{name}: {param} must be .+, got float 0.5$"):
            fn(**{param: 0.5})


def test_the_issue_case_classify_with_tokens_for_the_source(circuit, batch):
    with pytest.raises(TypeError, match=r"classify_mechanism: source must be a Markov source .*got a torch.int64 "
                                        r"tensor of shape \(8, 32\)"):
        probes.classify_mechanism(circuit, batch.tokens)
    with pytest.raises(TypeError, match="model must be a TransformerLens hooked model"):
        probes.attention_scores(batch.tokens, batch)
    with pytest.raises(TypeError, match="batch must be a ProbeBatch"):
        probes.behaviour_report(circuit, batch.tokens)
