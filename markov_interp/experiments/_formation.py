"""Circuits over training for a grid experiment: the circuit of a run at every checkpoint
(`probes.circuit_formation`), set against the run's own loss crossings (`dynamics`).

The question it answers: does the previous-token -> induction K-edge enter the circuit before, while
or after the loss leaves the in-context unigram plateau? A **K-edge** is an edge from a head into another head's
keys ("L0H0->L1H0.k"): the composition an induction head needs. Each formation run's measure is cached like
every other per-run measure (`_shared.cached_measure`), as JSON.
"""

import dataclasses
import types
from pathlib import Path
from typing import Any, Optional

from markov_interp import dynamics
from markov_interp.experiments import Table, _shared

__all__ = ["FORMATION_SEQUENCES", "FormationRecord", "measure_formation", "is_k_edge", "formation_table",
           "formation_figure"]

FORMATION_SEQUENCES = 64  # probe sequences per checkpoint (one batch for every checkpoint of a run)
_KEY = "formation-1"


def is_k_edge(name: str) -> bool:
    """An edge from a head into another head's keys ("L0H1->L1H0.k"), the composition of an induction head.

    >>> is_k_edge("L0H1->L1H0.k"), is_k_edge("embed->L1H0.k"), is_k_edge("L0H0->L1H0.q")
    (True, False, False)
    """
    sender, _, receiver = name.partition("->")
    return sender.startswith("L") and "H" in sender and receiver.endswith(".k")


@dataclasses.dataclass(frozen=True, kw_only=True)
class FormationRecord:
    """One formation run: its cell (`where`: family, heads, order, seed), its circuit at every checkpoint
    (`formation`: `CircuitFormation.to_dict()`) and its crossings (None when it has no plateau to leave)."""

    where: dict
    formation: dict
    dynamics: Optional[dynamics.RunDynamics]  # None when read back from results.json (it keeps no curves)
    stored_crossings: Optional[dict] = None  # read back: the crossings as results.json keeps them

    @property
    def crossings(self) -> dict:
        """{fraction: StepInterval} of the run's loss ({} when it has no plateau to leave)."""
        if self.dynamics is not None:
            return self.dynamics.crossings
        return {} if self.stored_crossings is None else dynamics.crossings_from_json(self.stored_crossings)[0]

    def to_json(self) -> dict:
        """The record as results.json keeps it (`from_json` reads it back)."""
        crossings = self.dynamics.to_json() if self.dynamics is not None else self.stored_crossings
        return {**self.where, "formation": self.formation, "crossings": crossings}

    @classmethod
    def from_json(cls, data: dict) -> "FormationRecord":
        where = {k: v for k, v in data.items() if k not in ("formation", "crossings")}
        return cls(where=where, formation=data["formation"], dynamics=None, stored_crossings=data.get("crossings"))

    @property
    def k_edge_entry(self) -> Optional[tuple[str, int]]:
        """(name, step) of the first K-edge to enter and stay; None when no K-edge is kept at the end."""
        entered = [(step, name) for name, step in self.formation["entered"].items()
                   if step is not None and is_k_edge(name)]
        return None if not entered else min(entered)[::-1]

    @property
    def k_edge_timing(self) -> str:
        """When the run's first K-edge to stay entered, against its loss crossing half the plateau's excess (a grid
        interval between evaluations): "before", "while" (inside that interval), "after", "no 0.5 crossing" (the
        loss never crossed it within the budget) or "—" (no K-edge stayed).

        >>> FormationRecord(where={}, formation={"entered": {"L0H0->L1H0.k": 175}}, dynamics=None,
        ...                 stored_crossings={"dwell": 1, "0.5": [170, 180]}).k_edge_timing
        'while'
        """
        entry, half = self.k_edge_entry, self.crossings.get(0.5)
        if entry is None:
            return "—"
        if half is None or half.censored:
            return "no 0.5 crossing"
        return "before" if entry[1] <= half.after else "after" if entry[1] > half.by else "while"

    def view(self) -> Any:
        """The formation with attributes, as `report.figures.circuit_formation_figure` reads it."""
        return types.SimpleNamespace(**{k: self.formation[k] for k in ("steps", "edges", "effects", "kept",
                                                                       "entered")})


def measure_formation(folder: Path, work: Path, cell_id: str, *, seed: int) -> dict:
    """The circuit of the run in `folder` at every checkpoint and its final model (cached in work/measures).

    Args:
        folder: the run folder (checkpoints saved by `TrainConfig.n_checkpoints`).
        work: the sweep folder (the cache lives in work/measures).
        cell_id: the run's sweep cell id (the cache's file name).
        seed: the probe batch's seed.

    Returns:
        `probes.formation.CircuitFormation.to_dict()`."""
    def measure() -> dict:
        from markov_interp import probes
        from markov_interp import runs

        model = runs.load_model(folder, device="cpu")
        run = runs.read_config(folder)
        checkpoints = [(step, runs.load_model(path, device="cpu", expect=run.model))
                       for step, path in runs.list_checkpoints(folder)]
        steps = {s for s, _ in checkpoints}
        if run.train.steps not in steps:
            checkpoints.append((run.train.steps, model))
        return probes.circuit_formation(checkpoints, run.source.build(), n_sequences=FORMATION_SEQUENCES,
                                        seed=seed).to_dict()  # at the training length: `probes.probe_length`

    return _shared.cached_measure(work, cell_id + "-formation", f"{_KEY}:{FORMATION_SEQUENCES}:seed{seed}", measure)


def _by(crossing: Optional[dynamics.StepInterval]) -> str:
    return "—" if crossing is None else str(crossing)


def formation_table(records: list[FormationRecord], labels: dict) -> Table:
    """One row per formation run: the first K-edge to enter and its step, the loss crossings of 0.9 / 0.5 /
    0.25, whether the K-edge entered before the 0.5 crossing, the edges kept at the end and their faithfulness.

    Args:
        records: the formation runs.
        labels: {id(record): the cell's label}.
    """
    rows = []
    for r in records:
        crossings = r.crossings
        entry = r.k_edge_entry
        rows.append((labels[id(r)], str(r.where["seed"]), entry[0] if entry else "none",
                     str(entry[1]) if entry else "—", *(_by(crossings.get(f)) for f in (0.9, 0.5, 0.25)),
                     r.k_edge_timing,
                     str(sum(1 for k in r.formation["kept"].values() if k[-1])),
                     f"{r.formation['faithfulness'][-1]:.2f}"))
    return Table(("cell", "seed", "first K-edge to stay", "enters at step", "loss crosses 0.9", "0.5", "0.25",
                  "K-edge vs the 0.5 crossing", "edges kept at the end", "faithfulness at the end"), rows)


def formation_figure(record: FormationRecord, title: str) -> Any:
    """`report.figures.circuit_formation_figure` of one formation run."""
    from markov_interp.report import figures

    return figures.circuit_formation_figure(record.view(), record.dynamics, title=title)
