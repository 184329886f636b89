"""A sweep run against its condition: the run's escape beside the survival curve of every seed of the same
cell up to its seed (`markov_interp.dynamics`), for `report.build`.

A run belongs to a sweep when its folder is `<sweep>/runs/<cell_id>` and `<sweep>/results.csv` lists it
(`sweep.run`'s layout). Its condition is the rows of the same sweep whose configuration equals the run's
except for `train.seed`; the crossings come from that table (`sweep.read_table`, `CellResult.crossing`),
which takes them from each run's paired evaluation (`dynamics.from_metrics`).
"""

import dataclasses
import json
from pathlib import Path
from typing import Any, Optional

from markov_interp import dynamics, sweep
from markov_interp._display import displayed
from markov_interp.runs import RunConfig

__all__ = ["ConditionEscapes", "condition_escapes", "sweep_folder"]


@displayed(line=lambda c: f"cell {c.cell_id} of {c.sweep_name!r}: {c.sentence()}")
@dataclasses.dataclass(frozen=True)
class ConditionEscapes:
    """One sweep run's escape against its condition's distribution over seeds (the run included)."""

    sweep_dir: Path
    sweep_name: str
    cell_id: str
    escape: dynamics.StepInterval  # the run's crossing of `dynamics.ESCAPE_FRACTION` (by None: censored)
    summary: dynamics.Survival  # over every finished seed of the condition
    budget: int

    def sentence(self) -> str:
        """E.g. "escaped in (230, 240]; the condition's median escape is (250, 260] [95%: (180, 300]] over 16
        seeds, 1 censored"."""
        e, s = self.escape, self.summary
        own = (f"no confirmed escape (censored after step {e.after} of {self.budget})" if e.censored
               else f"escaped in {e}")
        return (f"{own}; the condition's median escape is {s.median().describe()} over {s.n} seeds, "
                f"{s.n_censored} censored")


def sweep_folder(run_dir: "str | Path") -> Optional[Path]:
    """The sweep folder a run folder belongs to (`<sweep>/runs/<cell_id>` with `<sweep>/results.csv`), or None."""
    run_dir = Path(run_dir).resolve()
    root = run_dir.parent.parent
    if run_dir.parent.name != sweep.RUNS_DIR or not (root / sweep.TABLE).is_file():
        return None
    return root


def _condition_key(config: RunConfig) -> str:
    data = config.to_dict()
    data["train"].pop("seed", None)
    return json.dumps(data, sort_keys=True, default=str)


def condition_escapes(run_dir: "str | Path") -> Optional[ConditionEscapes]:
    """The run's escape against its condition, or None when the run is not a finished cell of a sweep (or its
    table has no escape recorded)."""
    root = sweep_folder(run_dir)
    if root is None:
        return None
    rows = sweep.read_table(root / sweep.TABLE)
    cell = Path(run_dir).resolve().name
    mine = [r for r in rows if Path(r.run_dir).name == cell and r.status == "ok"]
    if not mine or mine[0].result is None or mine[0].result.crossing() is None:
        return None
    row = mine[0]
    key = _condition_key(row.config)
    seen, escapes = set(), []
    for r in rows:
        found = r.result.crossing() if r.status == "ok" and r.result is not None else None
        if r.sweep == row.sweep and found is not None and r.cell_id not in seen and _condition_key(r.config) == key:
            seen.add(r.cell_id)
            escapes.append(found)
    return ConditionEscapes(sweep_dir=root, sweep_name=row.sweep, cell_id=cell, escape=row.result.crossing(),
                            summary=dynamics.survival(escapes), budget=row.config.train.steps)
