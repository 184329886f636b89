"""The probes as a user meets them: one probe length everywhere, results that display well in a notebook,
TransformerLens shapes in the figures, one signature convention, clear errors.

The display and shape checks run on the hand-built circuit of tests/handbuilt.py (its heads are known: L0H1
previous-token, L1H0 induction); the entry-point agreement trains a small model at sequence length 32 inside a
context of 128, where the old rules (Python min(n_ctx, 128), `probe` the training length) disagreed.
"""

import json
import warnings

import pytest
import torch

from handbuilt import induction_model
from markov_interp import cli, models, probes, report
from markov_interp.data import RandomMarkov, SourceConfig

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
    assert probes.probe_length(model) == min(48, probes.DEFAULT_PROBE_LENGTH) == 48  # no training length known
    model.markov_train_seq_len = 20
    assert probes.training_length(model) == 20 and probes.probe_length(model) == 20
    assert probes.probe_length(model, 16) == 16
    with pytest.raises(ValueError, match="n_ctx=48"):
        probes.probe_length(model, 49)
    with pytest.raises(ValueError, match="seq_len"):
        probes.probe_length(model, 1)
    tokens = TERNARY.sample(2, 30, torch.Generator().manual_seed(0))
    with pytest.warns(probes.ProbeLengthWarning, match=r"trained on sequences of 20: positions 20\.\.29 were never"):
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
    from markov_interp.training import RunConfig, TrainConfig, train

    run = RunConfig(source=SourceConfig(kind="random", vocab=3), model=models.preset(
        "attn-only-2layer", n_layers=1, d_vocab=3, n_ctx=16),
        train=TrainConfig(steps=2, seq_len=12, batch_size=4, eval_every=0, n_checkpoints=0, device="cpu"))
    result = train(run, tmp_path / "run", progress=False)
    assert result.model.markov_train_seq_len == 12
    assert models.load(tmp_path / "run").markov_train_seq_len == 12
    assert models.load(tmp_path / "run" / "model.safetensors").markov_train_seq_len == 12
    alone = models.save(result.model, tmp_path / "alone" / "weights.safetensors")  # no run folder around it
    assert models.load(alone).markov_train_seq_len is None


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
    assert min(128, probes.DEFAULT_PROBE_LENGTH) != 32  # the old Python default probed elsewhere
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
    clean, corrupted = probes.patching_pair(batch)
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
    scores = probes.AttentionScores(**grids, previous_token_chance=mech.attention.previous_token_chance,
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
    for probe in (probes.behaviour, probes.kernel_readout, probes.strategy_similarity):
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
    pattern = probes.uniform_causal_pattern(batch.tokens)
    with pytest.raises((ValueError, TypeError)):
        probes.previous_token_score(pattern[0], batch.tokens)  # [head, q, k]: no batch axis
    with pytest.raises(ValueError, match=r"\[8, head, 16, 16\]"):
        probes.same_token_score(pattern, batch.tokens[:, :16])  # patterns of 32 positions, tokens of 16


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
    with pytest.raises(ValueError, match="draws a probes.AttentionScores"):
        report.head_scores_figure(cache["pattern", 0])


def test_state_labels():
    assert probes.state_labels(torch.tensor([2, 0])) == ["2", "0"]
    assert probes.state_labels(torch.tensor([[0, 1], [1, 1]])) == [["0", "1"], ["1", "1"]]
    assert probes.state_labels([1, 0], names=["sun", "rain"]) == ["rain", "sun"]
    with pytest.raises(ValueError, match="names has 2 entries"):
        probes.state_labels([0, 2], names="ab")
    with pytest.raises(ValueError, match="integer states"):
        probes.state_labels(torch.zeros(3))
