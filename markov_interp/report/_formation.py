"""The report's "Circuit over training" section: the run's circuit at its saved checkpoints
(`probes.circuit_formation`), each edge's entry step set against the loss's crossings (`dynamics`)."""

from pathlib import Path
from typing import Any

from markov_interp import dynamics, probes, runs
from markov_interp.report import figures
from markov_interp.report._html import Section, paragraph, table
from markov_interp.runs import RunConfig

__all__ = ["FORMATION_SEQUENCES", "formation_section"]

FORMATION_SEQUENCES = 32  # the probe batch's first sequences, the same at every checkpoint


def _entries_table(formation: probes.CircuitFormation) -> str:
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


def formation_section(run: RunConfig, checkpoints: list[tuple[int, Path]], batch: probes.ProbeBatch,
                      metrics: list[dict], chosen: list[tuple[int, Path]], *, seed: int) -> Section:
    """The circuit at the `chosen` checkpoints (the last saved checkpoint is the final step).

    Args:
        run: the run's config.
        checkpoints: every saved checkpoint (empty: a note instead).
        batch: the report's probe batch (its first `FORMATION_SEQUENCES` sequences are used).
        metrics: the run's metrics rows (their paired evaluations give the crossings).
        chosen: the checkpoints re-probed (the report's spread of `checkpoints`).
        seed: the corruption's seed (the probe batch's).

    Returns:
        The section "formation".
    """
    title = "Circuit over training"
    if not checkpoints:
        return Section("formation", title, (paragraph("Not available: the run folder has no checkpoints.",
                                                      cls="note"),))
    models = []
    for step, path in chosen:
        models.append((step, runs.load_model(path, device=batch.tokens.device, expect=run.model)))
    n = min(FORMATION_SEQUENCES, batch.tokens.shape[0])
    formation = probes.circuit_formation(models, run.source.build(), batch=batch, n_sequences=n, seed=seed)
    crossings = dynamics.from_metrics(metrics)
    fig = figures.circuit_formation_figure(formation, crossings)
    text = paragraph(
        f"The circuit found by path patching (`probes.discover_circuit`) at {len(formation.steps)} saved checkpoints, "
        f"on the first {n} sequences of the probe batch above, the same at every checkpoint. An edge enters at the "
        "first checkpoint from which it stays kept (* in the table: kept at that step; effects in nats). "
        + _crossings_text(crossings))
    return Section("formation", title, (text, fig, _entries_table(formation)))
