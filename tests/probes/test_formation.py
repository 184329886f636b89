"""`probes.circuit_formation` on checkpoints whose circuits are known by construction."""

import pytest

from markov_interp import dynamics, probes
from markov_interp.report import figures
from markov_interp.sources import RandomMarkov
from markov_interp.dynamics import StepInterval
from tests.handbuilt import circuit_model, induction_circuit

K_EDGE = "L0H0->L1H0.k"


def _no_previous_token_head():
    """The hand-built induction circuit's shape with layer 0 attending uniformly: no previous-token role."""
    return circuit_model(3, {(0, 0): ("uniform",), (1, 0): ("induction", 1, 2.0)}, n_layers=2, n_heads=1,
                         n_ctx=128, max_lag=2)


@pytest.fixture(scope="module")
def formation():
    before, after = _no_previous_token_head(), induction_circuit(3)
    return probes.circuit_formation([(1000, after), (1, before), (10, before), (100, after)], RandomMarkov(3),
                                    n_sequences=16, seq_len=64, seed=0)


def test_the_k_edge_enters_when_the_previous_token_head_appears(formation):
    assert formation.steps == (1, 10, 100, 1000)  # sorted
    assert formation.kept[K_EDGE] == (False, False, True, True)
    assert formation.entered[K_EDGE] == 100
    assert formation.effects[K_EDGE][0] < 0.01 < formation.effects[K_EDGE][-1]
    assert formation.edges.index(K_EDGE) < len(formation.edges)
    assert "enters at step 100" in formation.summary() and "\n" not in repr(formation)
    assert formation.to_dict()["entered"][K_EDGE] == 100


def test_the_formation_figure_marks_entries_and_crossings(formation):
    rows = [{"step": s, "eval_loss": 0.94 + 0.09 * max(0.0, 1 - s / 400), "eval_true_loss": 0.94,
             "eval_plateau_loss": 1.03} for s in range(50, 1001, 50)]
    run = dynamics.from_metrics(rows)
    fig = figures.circuit_formation_figure(formation, run, title="hand-built")
    top, bottom = fig.axes
    assert {line.get_label() for line in bottom.get_lines()} >= set(formation.edges)
    stars = [line for line in bottom.get_lines() if line.get_marker() == "*"]
    assert [float(line.get_xdata()[0]) for line in stars] == sorted(
        float(formation.entered[n]) for n in formation.edges if formation.entered[n] is not None)
    crossed = [text.get_text() for text in top.get_legend().get_texts()]
    assert any(f"by step {run.crossings[0.5].by}" in t for t in crossed)
    with pytest.raises(ValueError, match="CircuitFormation"):
        figures.circuit_formation_figure(object())


def test_an_edge_dropped_again_has_no_entry_step():
    before, after = _no_previous_token_head(), induction_circuit(3)
    formation = probes.circuit_formation([(1, after), (2, before)], RandomMarkov(3), n_sequences=16, seq_len=64)
    assert formation.kept[K_EDGE] == (True, False) and formation.entered[K_EDGE] is None
    assert formation.edges[-1] == K_EDGE or formation.entered[formation.edges[-1]] is None  # never-stays last


def test_bad_checkpoints_are_refused():
    with pytest.raises(ValueError, match="at least one"):
        probes.circuit_formation([], RandomMarkov(3))
    model = induction_circuit(3)
    with pytest.raises(ValueError, match="distinct"):
        probes.circuit_formation([(5, model), (5, model)], RandomMarkov(3), n_sequences=4, seq_len=16)
    with pytest.raises(ValueError, match="same length"):
        probes.formation.entry_step([1, 2], [True])


@pytest.mark.parametrize("entry,half,expected", [
    (("L0H0->L1H0.k", 100), StepInterval(170, 180), "before"),
    (("L0H0->L1H0.k", 175), StepInterval(170, 180), "while"),
    (("L0H0->L1H0.k", 180), StepInterval(170, 180), "while"),
    (("L0H0->L1H0.k", 181), StepInterval(170, 180), "after"),
    (("L0H0->L1H0.k", 100), StepInterval(490, None), "no 0.5 crossing"),  # censored: not "before" a crossing
    (("L0H0->L1H0.k", 100), None, "no 0.5 crossing"),
    (None, StepInterval(170, 180), "—"),
])
def test_k_edge_timing_against_the_half_crossing(entry, half, expected):
    from markov_interp.experiments._formation import FormationRecord

    crossings = {"dwell": 1, **({} if half is None else {"0.5": [half.after, half.by]})}  # as results.json keeps them
    record = FormationRecord(where={}, formation={"entered": dict([entry] if entry else [])}, dynamics=None,
                             stored_crossings=crossings)
    assert record.k_edge_timing == expected


def test_known_graphs_are_used_as_they_are(formation):
    """A graph passed for a step (e.g. the final model's, discovered already) is used as it is, not discovered
    again: with every step known nothing is path-patched, and the entries follow from the given graphs."""
    first, last = formation.graphs[0], formation.graphs[-1]
    before, after = _no_previous_token_head(), induction_circuit(3)
    reused = probes.circuit_formation([(1000, after), (1, before)], RandomMarkov(3), n_sequences=16, seq_len=64,
                                      known={1: first, 1000: last})
    assert reused.graphs == (first, last) and reused.kept[K_EDGE] == (False, True)
    assert reused.entered[K_EDGE] == 1000
    with pytest.raises(ValueError, match="not checkpoints"):
        probes.circuit_formation([(1, before)], RandomMarkov(3), known={2: last})
