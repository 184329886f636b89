"""The one-liners agree with themselves: a model labelled uniform reports no circuit, faithfulness outside [0, 1]
is shown clamped with its excess explained, graded gains appear only on an in-context task, and where path
patching and mean ablation disagree on a head the summary says what each removes."""

from types import SimpleNamespace

import pytest

from markov_interp import models
from markov_interp.probes import classify_mechanism
from markov_interp.probes.classify import MechanismReport
from markov_interp.probes.discovery import faithfulness_text
from markov_interp.sources import BinaryChain, RandomMarkov
from markov_interp.training import default_run


@pytest.fixture(scope="module")
def untrained():
    """The quickstart model before training (seed 0): its prediction is all but uniform, yet on a fixed chain the
    kept-edge rule keeps a few edges from a total effect of about 0.01 nats, with faithfulness above 1."""
    return models.build(default_run().model, seed=0)


def test_a_uniform_model_reports_no_circuit_and_no_gains_on_a_fixed_chain(untrained):
    mech = classify_mechanism(untrained, BinaryChain(0.2, 0.3), seq_len=64, n_sequences=32, progress=False)
    assert mech.mechanism == "uniform"
    assert mech.graph.kept and mech.graph.faithfulness > 1  # what used to read as a kept circuit, faithfulness 1.06
    assert mech.circuit.kind == "none" and "predicts the uniform law" in mech.circuit.describe()
    text = repr(mech)
    assert text.startswith("<MechanismReport: uniform (confident): no circuit; gains not shown (a fixed chain)")
    assert "raw 1.0" in mech.summary() and "the edges left out raise the loss" in mech.summary()
    assert not mech.gains_meaningful and mech.to_dict()["circuit"]["kind"] == "none"


def test_gains_are_shown_on_an_in_context_task(untrained):
    run = default_run(**{"source.kind": "random", "source.vocab": 2})
    mech = classify_mechanism(untrained, run.source.build(), seq_len=64, n_sequences=32, progress=False)
    assert mech.gains_meaningful and "g_1 " in repr(mech) and "gains not shown" not in repr(mech)
    assert isinstance(run.source.build(), RandomMarkov)


def test_faithfulness_is_shown_in_range_or_explained():
    assert faithfulness_text(0.5) == "0.50" and faithfulness_text(1.0000001) == "1.00"
    assert faithfulness_text(1.06).startswith("1.00 (raw 1.06: the edges left out raise the loss")
    assert faithfulness_text(-0.2).startswith("0.00 (raw -0.20: the kept edges alone do worse")
    assert faithfulness_text(1.06, short=True) == "1.00 (raw 1.06)"


def _report(effect: float, ablation: float) -> SimpleNamespace:
    edge = SimpleNamespace(sender="L0H0", strongest=effect)
    graph = SimpleNamespace(kept=[edge, SimpleNamespace(sender="embed", strongest=0.5)],
                            kept_heads=lambda: ("L0H0", "L1H0"))
    return SimpleNamespace(graph=graph, ablation=SimpleNamespace(names=("L0H0", "L1H0"), loss_change=(ablation, 0.3)))


def test_patching_and_ablation_disagreement_is_explained():
    text = MechanismReport.patching_vs_ablation(_report(0.26, 0.0007))  # the numbers
    assert text.startswith("path patching and mean ablation disagree on L0H0 (+0.2600 vs +0.0007 nats)")
    assert "another sequence" in text and "mean output" in text and "L1H0" not in text  # L1H0 sends no kept edge
    assert MechanismReport.patching_vs_ablation(_report(0.26, 0.2)) == ""  # they agree
