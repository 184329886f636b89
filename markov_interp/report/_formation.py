"""The report's "Circuit over training" section: the run's circuit at its saved checkpoints
(`probes.circuit_formation`), each edge's entry step set against the loss's crossings (`dynamics`)."""

from pathlib import Path
from typing import Any, Optional

import torch

from markov_interp import dynamics, models, probes, runs
from markov_interp.probes.discovery import CIRCUIT_SEQUENCES
from markov_interp.report import figures
from markov_interp.report._html import paragraph, table
from markov_interp.runs import RunConfig

__all__ = ["FORMATION_SEQUENCES", "formation_section"]

# the probe batch's first sequences, the same at every checkpoint: as many as the verdict's circuit, so the final
# checkpoint's graph is the verdict's (reused, not path-patched again)
FORMATION_SEQUENCES = CIRCUIT_SEQUENCES


def _entries_table(formation: probes.formation.CircuitFormation) -> str:
    rows = []
    for name in formation.edges:
        when = formation.entered[name]
        rows.append((name, "—" if when is None else str(when),
                     *(f"{e:+.3f}" + ("*" if k else "") for e, k in zip(formation.effects[name],
                                                                          formation.kept[name]))))
    return table(rows, header=("edge", "enters at step", *(f"step {s}" for s in formation.steps)))


def _crossings_text(run: Any) -> str:
    if run is None:
        return "The run has no plateau to leave (no paired evaluations or no gap), so no crossings are drawn."
    found = [f"{f:g}: {x}" for f, x in sorted(run.crossings.items(), reverse=True)]
    return "The loss's excess over the true law, as a fraction of the plateau's, crosses " + "; ".join(found) + "."


def _reused(chosen: list[tuple[int, Path]], final: Optional[tuple], seed: int) -> set[int]:
    """The chosen steps whose checkpoint holds exactly the final model's weights (the last one, normally), when
    the final graph was discovered with the formation's options (the default corruption and rule, this seed)."""
    if final is None or final[2].seed != seed or final[2].corruption != "resample":
        return set()
    _, weights = models.read_weights(final[0])
    same = set()
    for step, path in chosen[-1:]:  # only the last checkpoint can be the final model
        _, state = models.read_weights(path)
        if state.keys() == weights.keys() and all(torch.equal(state[k], weights[k]) for k in state):
            same.add(step)
    return same


def formation_section(run: RunConfig, checkpoints: list[tuple[int, Path]], batch: probes.ProbeBatch,
                      metrics: list[dict], chosen: list[tuple[int, Path]], *, seed: int,
                      final: Optional[tuple[Path, models.HookedModel, probes.CircuitGraph]] = None) -> tuple:
    """The circuit at the `chosen` checkpoints (the last saved checkpoint is the final step).

    Args:
        run: the run's config.
        checkpoints: every saved checkpoint (empty: a note instead).
        batch: the report's probe batch (its first `FORMATION_SEQUENCES` sequences are used).
        metrics: the run's metrics rows (their paired evaluations give the crossings).
        chosen: the checkpoints re-probed (the report's spread of `checkpoints`).
        seed: the corruption's seed (the probe batch's).
        final: (weights file, model, circuit graph) of the final model, the graph discovered on this batch (the
            verdict's): a chosen checkpoint holding the same weights reuses them instead of loading and
            path-patching the same model again; the formation then runs on as many sequences as that graph.

    Returns:
        The parts of the section "formation" (`report._build.SECTIONS`).
    """
    if not checkpoints:
        return (paragraph("Not available: the run folder has no checkpoints.", cls="note"),)
    reuse = _reused(chosen, final, seed)
    n = final[2].n_sequences if reuse else min(FORMATION_SEQUENCES, batch.tokens.shape[0])
    loaded = []
    for step, path in chosen:
        if step in reuse:
            loaded.append((step, final[1]))
            continue
        loaded.append((step, runs.load_model(path, device=batch.tokens.device, expect=run.model)))
    # no gradient estimate per checkpoint: the section shows each edge's measured effect and whether it is kept,
    # which the estimate does not change (it only ranks edges where path patching verifies a subset)
    formation = probes.circuit_formation(loaded, run.source.build(), batch=batch, n_sequences=n, seed=seed,
                                         known={step: final[2] for step in reuse}, attribution=False)
    crossings = dynamics.from_metrics(metrics)
    fig = figures.circuit_formation_figure(formation, crossings)
    text = paragraph(
        f"The circuit found by path patching (`probes.discover_circuit`) at {len(formation.steps)} saved checkpoints, "
        f"on the first {n} sequences of the probe batch above, the same at every checkpoint. An edge enters at the "
        "first checkpoint from which it stays kept (* in the table: kept at that step; effects in nats). "
        + "".join(f"Step {step} holds the final weights: its circuit is the verdict's above. " for step in reuse)
        + _crossings_text(crossings))
    return (text, fig, _entries_table(formation))
