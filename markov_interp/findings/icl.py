"""Rendered blocks of the in-context experiments (docs/findings-icl.md): the phase diagram and task diversity,
each table the experiment's own (`phases.cells_table`, `diversity.cells_table`, ...) made from its results.json
read back."""

from pathlib import Path

from markov_interp.findings._engine import block
from markov_interp.findings._sources import experiment

PHASES_QUICK = "docs/reproduction/icl/phases-quick/results.json"
DIVERSITY_QUICK = "docs/reproduction/icl/diversity-quick/results.json"


@block("phases-quick-cells", PHASES_QUICK)
def phases_quick_cells(path: Path) -> str:
    """Every cell of the quick phase diagram (smoke)."""
    from markov_interp.experiments import phases

    return phases.cells_table(experiment(path).result.cells).markdown()


@block("diversity-quick-cells", DIVERSITY_QUICK)
def diversity_quick_cells(path: Path) -> str:
    """Every cell of the quick diversity sweep and its N* (smoke)."""
    from markov_interp.experiments import diversity

    result = experiment(path).result
    return (diversity.cells_table(result.cells).markdown() + "\n\n"
            + diversity.transitions_table(result.transitions).markdown())
