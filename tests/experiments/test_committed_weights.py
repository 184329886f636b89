"""The weights committed beside the phase diagrams' results.json reproduce the file's per-seed numbers: measured
again from the kept weights (no training), a seed's gain fractions and model loss equal what results.json holds."""

from pathlib import Path

import pytest

from markov_interp import experiments, runs
from markov_interp._io import read_json
from markov_interp.experiments import _weights, phases

ROOT = Path(__file__).resolve().parents[2] / "docs" / "reproduction" / "icl"
FOLDERS = ["phases-standard", "phases-standard3", "phases-converged"]


def _deep_runs(data: dict) -> list[dict]:
    """One deep run per order: the first of each order whose measure is in the file."""
    chosen = {}
    for run in data["result"]["runs"]:
        if run.get("gains") and len(run["heads"]) >= 2:
            chosen.setdefault(run["order"], run)
    return list(chosen.values())


@pytest.mark.parametrize("folder", FOLDERS)
def test_kept_weights_reproduce_the_committed_numbers(folder):
    done = experiments.load(ROOT / folder)
    data = read_json(ROOT / folder / "results.json", "results file")
    budget, batches = done.budget, phases._probe_batches(done.budget)
    chosen = _deep_runs(data)
    assert len(chosen) == len(budget.orders)
    for run in chosen:
        record = phases._record_from_json(run, budget.vocab)
        kept = _weights.kept(ROOT / folder, phases.weights_name(record))
        cfg = runs.read_config(kept)
        assert (cfg.source.order, cfg.train.seed, cfg.source.vocab) == (run["order"], run["seed"], run["vocab"])
        measure = phases.measure_model(runs.load_model(kept, device="cpu"), batches[run["order"]],
                                       cfg.source.build(), classify=False)
        assert measure["gains"] == run["gains"], phases.weights_name(record)
        assert measure["model_loss"] == run["model_loss"], phases.weights_name(record)
