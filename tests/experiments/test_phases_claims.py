"""The phase diagram's claims (`experiments._phases_claims`): "with an induction head" needs the circuit, not the
law alone, and every alphabet (number of states) the cells hold gets its own rows; kept weights (`_weights`); the
label changes between two measurements of the same runs."""

import dataclasses

import pytest

from markov_interp import dynamics, experiments
from markov_interp.experiments import _weights, phases


def _record(heads, seed, *, reached, mechanism, vocab=2, classified=True, order=1, label_order=1):
    label = {"mechanism": mechanism, "order": label_order if mechanism == "induction" else None, "confident": True,
             "circuit_confirmed": mechanism == "induction", "previous_token_head": None, "induction_head": None,
             "in_context_fraction": 0.9, "reason": ""}
    measure = {"gains": {"0": 1.0, **{str(k): 1.0 if reached else 0.0 for k in range(1, order + 1)}},
               "reached": order if reached else 0,
               "model_loss": 0.5, "circuit": {"lags": {str(lag): [] for lag in range(1, order + 1)}, "induction": {},
                                              "induction_order": 0, "full": False},
               "classified": label if classified else None}
    return phases.RunRecord(family="layernorm", heads=heads, order=order, seed=seed, status="ok", measure=measure,
                            dynamics=None, vocab=vocab)


def _edelman(rows, vocab=2):
    return next(r for r in rows if r["claim"].endswith("with an induction head") and r["family"] == "layernorm"
                and r["vocab"] == vocab)


@pytest.mark.parametrize("n_induction, verdict", [
    (8, "holds"),  # Wilson [0.68, 1]
    (3, "not resolved: the circuit is mixed (3/8 [0.14, 0.69])"),  # the L3 x1 case: the law alone is not the claim
    (0, "fails: the law without an induction head (0/8 [0.00, 0.32])"),
])
def test_with_an_induction_head_holds_only_when_the_circuit_interval_lies_above_half(n_induction, verdict):
    records = [_record((1, 1), s, reached=True, mechanism="induction" if s < n_induction else "other")
               for s in range(8)]
    row = _edelman(phases.claims(phases.cell_summaries(records)))
    assert row["reached"]["k"] == 8
    assert row["induction"]["k"] == n_induction
    assert row["induction"]["interval"] == pytest.approx(list(dynamics.wilson_interval(n_induction, 8)))
    assert row["verdict"] == verdict


def test_an_induction_circuit_counts_for_its_own_order_only():
    """On an order-2 source, seeds named `induction (order 1)` (the in-context bigram circuit) are not the order-2
    circuit a claim about the trigram law names; seeds named `induction (order 2)` are."""
    records = [_record((2, 1), s, reached=True, mechanism="induction", order=2, label_order=1 if s < 5 else 2)
               for s in range(8)]
    (cell,) = phases.cell_summaries(records)
    assert cell["circuit"]["classified"]["labels"] == {"induction 1": 5, "induction 2": 3}
    assert cell["circuit"]["classified"]["induction"]["k"] == 3


def test_without_the_law_the_circuit_claim_fails_whatever_the_labels():
    records = [_record((1, 1), s, reached=False, mechanism="induction") for s in range(8)]
    assert _edelman(phases.claims(phases.cell_summaries(records)))["verdict"] == "fails at this budget"


def test_unclassified_cells_fall_back_on_the_attention_circuit():
    records = [_record((1, 1), s, reached=True, mechanism="other", classified=False) for s in range(8)]
    row = _edelman(phases.claims(phases.cell_summaries(records)))
    assert row["induction"] == row["full_circuit"] and row["full_circuit"]["k"] == 0
    assert row["verdict"].startswith("fails: the law without an induction head")


def test_each_alphabet_is_its_own_cell_and_its_own_claim_rows():
    two = [_record((1, 1), s, reached=True, mechanism="other") for s in range(8)]
    three = [dataclasses.replace(r, vocab=3, measure={**r.measure, "classified": {
        **r.measure["classified"], "mechanism": "induction", "order": 1}}) for r in two]
    cells = phases.cell_summaries(two + three)
    assert [(c["vocab"], c["label"]) for c in cells] == [(2, "L2 x1"), (3, "L2 x1")]
    rows = phases.claims(cells)
    assert _edelman(rows, 2)["verdict"].startswith("fails: the law without an induction head")
    assert _edelman(rows, 3)["verdict"] == "holds"
    table = phases.claims_table(rows)
    assert "states" in table.columns and {row[2] for row in table.rows} == {"2", "3"}
    assert dict(zip(phases.cells_csv(cells).columns, phases.cells_csv(cells).rows[1]))["vocab"] == "3"


def test_kept_weights_name_what_is_missing(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "model.safetensors").write_bytes(b"w")
    (run / "config.json").write_text("{}")
    folder = _weights.keep(run, tmp_path / "out", "a-run")
    assert _weights.kept(tmp_path / "out", "a-run") == folder
    assert (folder / "model.safetensors").read_bytes() == b"w"
    with pytest.raises(FileNotFoundError, match="config.json"):
        (folder / "config.json").unlink()
        _weights.kept(tmp_path / "out", "a-run")


def test_remeasure_refuses_an_experiment_that_keeps_no_weights(tmp_path):
    experiment = experiments.get("diversity")
    assert experiment.remeasure is None
    with pytest.raises(ValueError, match="keeps no weights"):
        experiments.run(experiment, tmp_path, budget=experiment.budget("tiny"), remeasure=True)


def _run(heads, seed, mechanism, order=1, *, reason, gain=0.9):
    return {"family": "layernorm", "heads": list(heads), "order": 1, "seed": seed, "gains": {"0": 1.0, "1": gain},
            "classified": {"mechanism": mechanism, "order": order if mechanism != "other" else None,
                           "reason": reason}}


def test_label_changes_count_each_move_with_its_reason_and_unnamed_deep_seeds_at_their_law():
    why = "other: it follows the in-context bigram (order 1) without an induction circuit: no kept K-edge"
    before = [_run((1, 1), s, "other", reason=why) for s in range(4)] + [_run((1,), 0, "other", reason=why)]
    after = [_run((1, 1), 0, "switch_counting", reason="switch_counting (order 1, partial): switch counting: L1H0"),
             _run((1, 1), 1, "switch_counting", reason="switch_counting (order 1): switch counting; L1H0 keys"),
             _run((1, 1), 2, "other", reason=why),
             _run((1, 1), 3, "other", reason=why, gain=0.6),  # below the law: not counted as unnamed
             _run((1,), 0, "other", reason=why)]  # one layer: not counted
    table = phases.label_changes(before, after)
    assert [tuple(r) for r in table.rows] == [("other", "other", "3", "unchanged"),  # most common first
                                              ("other", "switch_counting 1", "2", "switch counting")]
    unnamed = phases.unnamed_at_law(after)
    assert [tuple(r) for r in unnamed.rows] == [
        ("L2 x1 order 1", "1", "it follows the in-context bigram without an induction circuit")]
