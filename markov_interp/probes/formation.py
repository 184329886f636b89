"""`circuit_formation`: the circuit of a model at every saved checkpoint, and when each edge enters it.

A trained model's circuit (`discover_circuit`) says *what* the model computes; read at every checkpoint of its
run, it says *when* each part forms. Every checkpoint is probed on the same batch, so an edge's effect is
comparable along training. An edge **enters** the circuit at the first checkpoint from which it stays kept at
every later checkpoint (a transient edge, kept once and dropped again, has no entry step but is still listed);
comparing entry steps with the loss's crossings (`dynamics`) shows whether the previous-token -> induction K-edge
forms before, during or after the loss leaves the plateau.

>>> formation = circuit_formation([(1, model), (2, model)], source, n_sequences=16)  # (step, model at that step)
>>> formation.entered["L0H0->L1H0.k"]  # the first checkpoint step from which the edge stays kept
1
"""

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, Optional

from markov_interp.sources import Source
from markov_interp.models import HookedModel
from markov_interp.probes._common import ProbeBatch, probe_length, sample_batch
from markov_interp.probes._display import ProbeResult, dataframe
from markov_interp.probes.discovery import CircuitGraph, discover_circuit

__all__ = ["CircuitFormation", "circuit_formation", "entry_step"]


def entry_step(steps: Sequence[int], kept: Sequence[bool]) -> Optional[int]:
    """The first step from which `kept` holds at every later step (None when it is not kept at the last one).

    >>> entry_step([1, 10, 100, 1000], [False, True, False, True])
    1000
    >>> entry_step([1, 10, 100], [True, True, False]) is None
    True
    """
    if len(steps) != len(kept):
        raise ValueError(f"steps and kept must have the same length, got {len(steps)} and {len(kept)}")
    entered = None
    for step, now in zip(steps, kept):
        entered = (step if entered is None else entered) if now else None
    return entered


@dataclasses.dataclass(frozen=True, kw_only=True, repr=False)  # repr: ProbeResult's one line, not every graph
class CircuitFormation(ProbeResult):
    """The circuit at every checkpoint (`graphs`, one `CircuitGraph` per step of `steps`, all on one probe batch).

    `edges`: every edge kept at some checkpoint, ordered by entry (edges that never stay last); `effects[name]`:
    its path-patching effect (nats) at every step; `kept[name]`: whether it is kept there; `entered[name]`: its
    entry step (`entry_step`), None when it is not kept at the end.
    """

    steps: tuple[int, ...]
    graphs: tuple[CircuitGraph, ...]
    edges: tuple[str, ...]
    effects: dict[str, tuple[float, ...]]
    kept: dict[str, tuple[bool, ...]]
    entered: dict[str, Optional[int]]

    def summary(self) -> str:
        end = self.graphs[-1]
        lines = [f"circuit over {len(self.steps)} checkpoints (steps {self.steps[0]}-{self.steps[-1]}): "
                 f"{len(end.kept)} edges kept at the end, faithfulness {end.faithfulness:.2f}"]
        for name in self.edges:
            when = self.entered[name]
            lines.append(f"  {name}: " + (f"enters at step {when}" if when is not None else "not kept at the end")
                         + f", effect at the end {self.effects[name][-1]:+.3f} nats")
        return "\n".join(lines)

    def to_dataframe(self) -> Any:
        return dataframe([{"edge": name, "entered": self.entered[name],
                           **{f"step {s}": e for s, e in zip(self.steps, self.effects[name])}}
                          for name in self.edges])

    def to_dict(self) -> dict[str, Any]:
        return {"steps": list(self.steps), "edges": list(self.edges),
                "effects": {k: [None if not math.isfinite(x) else x for x in v] for k, v in self.effects.items()},
                "kept": {k: list(v) for k, v in self.kept.items()}, "entered": dict(self.entered),
                "faithfulness": [g.faithfulness for g in self.graphs]}


def circuit_formation(checkpoints: Sequence[tuple[int, HookedModel]], source: Source, *,
                      n_sequences: int = 32, seq_len: Optional[int] = None, seed: int = 0,
                      batch: Optional[ProbeBatch] = None, known: Optional[Mapping[int, CircuitGraph]] = None,
                      **discover: Any) -> CircuitFormation:
    """`discover_circuit` at every checkpoint on one probe batch, and when each edge enters the circuit.

    Args:
        checkpoints: (step, model) pairs of one run, any order (sorted here); the models share one shape.
        source: the data source the run trained on.
        n_sequences: probe sequences (one batch for every checkpoint).
        seq_len: probe length (default `probe_length` of the last model: the training length when known).
        seed: seed of the probe batch and of the corruption.
        batch: a probe batch to use instead of a fresh one.
        known: {step: graph} already discovered for that step's model on this batch with these options (e.g. the
            final model's, from `classify_mechanism`): used as they are, not discovered again.
        **discover: any other option of `discover_circuit` (the corruption, the kept-edge rule, ...).

    Returns:
        A `CircuitFormation`.
    """
    if not checkpoints:
        raise ValueError("circuit_formation needs at least one (step, model) checkpoint, got none")
    ordered = sorted(checkpoints, key=lambda pair: pair[0])
    steps = tuple(int(step) for step, _ in ordered)
    if len(set(steps)) != len(steps):
        raise ValueError(f"checkpoint steps must be distinct, got {list(steps)}")
    known = dict(known or {})
    if set(known) - set(steps):
        raise ValueError(f"known graphs for steps {sorted(set(known) - set(steps))} that are not checkpoints {steps}")
    if batch is None and set(steps) - set(known):
        length = seq_len if seq_len is not None else probe_length(ordered[-1][1])
        batch = sample_batch(source, n_sequences=n_sequences, seq_len=length, seed=seed)
    graphs = tuple(known[step] if step in known else
                   discover_circuit(model, source, batch=batch, n_sequences=n_sequences, seed=seed, **discover)
                   for step, model in ordered)
    names = [e.name for e in graphs[-1].edges]
    kept = {name: tuple(name in g.kept_names for g in graphs) for name in names}
    ever = [name for name in names if any(kept[name])]
    effects = {name: tuple(g.edge(name).effect for g in graphs) for name in ever}
    entered = {name: entry_step(steps, kept[name]) for name in ever}
    order = sorted(ever, key=lambda n: (entered[n] is None, entered[n] or 0, names.index(n)))
    return CircuitFormation(steps=steps, graphs=graphs, edges=tuple(order), effects=effects,
                            kept={n: kept[n] for n in order}, entered={n: entered[n] for n in order})
