"""Executing cells: one cell (`run_cell`), compatible cells as one stacked model (`run_stack`), grouping cells
into stacks (`group_cells`), and the failure isolation around them (`execute_group`: every exception becomes a
"failed" record of its cell, a stack that raises is retried cell by cell). What an executor's worker runs.

Training is `training.train` / `training.train_many` (one engine: a cell's weights are the same alone or in a
stack); probing is `sweep.probing`, imported only when a cell is probed.
"""

import dataclasses
import json
import os
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Optional

from markov_interp._io import atomic_write
from markov_interp.sweep.records import RESULTS_DIR, CellRecord, failure
from markov_interp.sweep.results import CellResult
from markov_interp.sweep.spec import Cell
from markov_interp.training import TrainResult, list_checkpoints, stack_key, train, train_many
from markov_interp.runs import TrainingDiverged, list_resume_points

__all__ = ["run_cell", "run_stack", "execute_cell", "execute_group", "group_cells", "default_group",
           "DEFAULT_GROUP", "CellFn"]

CellFn = Callable[..., CellResult]  # (cell, runs_dir, *, probe) -> CellResult: `run_cell` or a test's stand-in


def run_cell(cell: Cell, runs_dir: "str | os.PathLike", *, probe: bool = True, progress: bool = False) -> CellResult:
    """Train (or load) one cell into runs_dir/<cell_id> and return its results (without error handling).

    The final evaluation loss, the last logged training loss, the reference losses of `theory` (entropy rate,
    unigram loss, in-context Bayes loss for random kernels), `outcome`, the crossings of `dynamics` (with
    `escape_step`, `censored` and `stuck_at_unigram`) and, with `probe`, the mechanism and key probe scores
    (the full report goes to results/<cell_id>.probe.json).

    Args:
        cell: the cell.
        runs_dir: the sweep's runs/ folder.
        probe: run `probes.classify_mechanism` on the trained model.
        progress: a progress bar while training.

    Returns:
        The cell's `CellResult`.
    """
    start = time.perf_counter()
    run_dir = Path(runs_dir) / cell.cell_id
    result = train(cell.config, run_dir, progress=progress)
    return _cell_result(cell, result, runs_dir, probe=probe, start=start)


def _cell_result(cell: Cell, result: TrainResult, runs_dir: "str | os.PathLike", *, probe: bool,
                 start: float) -> CellResult:
    """The `CellResult` of a trained (or loaded) cell, probed when asked (the full report goes to
    results/<cell_id>.probe.json)."""
    columns = None
    if probe:
        from markov_interp.sweep.probing import probe as probe_model  # probes load only where a cell is probed

        columns, report = probe_model(result.model, cell.config)
        atomic_write(Path(runs_dir).parent / RESULTS_DIR / f"{cell.cell_id}.probe.json",
                     json.dumps(report, indent=1, sort_keys=True, default=str))
    return CellResult.from_training(result, columns, round(time.perf_counter() - start, 3))


def _failed(err: Exception, prefix: str = "") -> CellRecord:
    """The "failed" record of an exception being handled (its traceback included)."""
    return failure(f"{prefix}{type(err).__name__}: {err}", traceback.format_exc())


def execute_cell(cell: Cell, runs_dir: str, probe: bool, cell_fn: Optional[CellFn] = None) -> CellRecord:
    """Run one cell, catching any exception into a failed record (this is what a worker executes).

    Args:
        cell: the cell.
        runs_dir: the sweep's runs/ folder.
        probe: probe the trained model.
        cell_fn: a stand-in for `run_cell` (tests).

    Returns:
        Its record: "ok" with the result, "diverged" (`TrainingDiverged`), or "failed" with the traceback.
    """
    try:
        result = (cell_fn or run_cell)(cell, runs_dir, probe=probe)
        return CellRecord(status="ok", result=result)
    except TrainingDiverged as err:  # a result, not a fault: the recipe diverges on this cell (not retried)
        return CellRecord(status="diverged", error=str(err))
    except Exception as err:  # a failing cell is recorded; the sweep goes on
        return _failed(err)


def run_stack(cells: Sequence[Cell], runs_dir: "str | os.PathLike", *, probes: Sequence[bool]) -> list[CellRecord]:
    """Train compatible cells as one stacked model (`training.train_many`) into runs_dir/<cell_id>.

    Args:
        cells: cells of one `group_cells` group.
        runs_dir: the sweep's runs/ folder.
        probes: per cell, whether to probe it.

    Returns:
        One record per cell: "ok" with its `CellResult`, "diverged" for a member whose loss went non-finite,
        "failed" for a member whose probe raised. Raises if the stack does.
    """
    start = time.perf_counter()
    results = train_many([c.config for c in cells], [Path(runs_dir) / c.cell_id for c in cells], progress=False,
                         models_out=any(probes))  # hooked models only for the probes
    records = []
    for cell, probe, result in zip(cells, probes, results):
        if result.failed:  # the recipe diverged on this member: a result, not a fault (as solo cells)
            records.append(CellRecord(status="diverged", error=result.failed, stack_size=len(cells)))
            continue
        try:
            cell_result = _cell_result(cell, result, runs_dir, probe=probe, start=start)
            records.append(CellRecord(status="ok", result=cell_result, stack_size=len(cells)))
        except Exception as err:  # a probe failing on one member fails that cell only
            records.append(_failed(err))
    return records


def execute_group(cells: Sequence[Cell], runs_dir: str, probes: Sequence[bool],
                  cell_fn: Optional[CellFn] = None) -> list[CellRecord]:
    """Run a group of cells: one cell alone, several as a stack; a stack that raises is retried cell by cell
    (each resumes from the checkpoints its stack wrote, which are solo checkpoints), so one bad cell cannot
    fail its neighbours.

    Args:
        cells: one group of `group_cells`.
        runs_dir: the sweep's runs/ folder.
        probes: per cell, whether to probe it.
        cell_fn: a stand-in for `run_cell` (tests).

    Returns:
        One record per cell, in order (a retried stack's carry stack size 1 and their `stack_note`).
    """
    if len(cells) == 1:
        return [execute_cell(cells[0], runs_dir, probes[0], cell_fn)]
    try:
        return run_stack(cells, runs_dir, probes=probes)
    except Exception as err:
        note = f"stack of {len(cells)} raised {type(err).__name__}: {err}; retried as solo cells"
        records = [execute_cell(c, runs_dir, p, cell_fn) for c, p in zip(cells, probes)]
        return [dataclasses.replace(r, stack_size=1, stack_note=note) for r in records]


# Cells per stack when `group` is not given: 1 on a CPU (a stack of 8 is 1.6x faster per core in
# benchmarks/bench_many.py, about what the process pool's parallel cells already give; a cell's weights are the
# same alone or stacked, see `training.loop`), 64 on a GPU (7.4x the model-steps/s of solo runs at the paper's
# size in the prototype of ../shared/gpu-findings.md; about 13 MB of activations per member at seq 1024, batch 16).
DEFAULT_GROUP = {"cpu": 1, "cuda": 64}


def default_group(cells: Sequence[Cell]) -> int:
    """The stack size for `cells` when the caller gives none: from the device their runs ask for.

    Args:
        cells: the cells to run.

    Returns:
        `DEFAULT_GROUP["cuda"]` when any cell runs on a GPU (asked for, or "auto" with one present), else the CPU's.
    """
    import torch

    devices = {c.config.train.device for c in cells}
    cuda = any(d.startswith("cuda") or (d == "auto" and torch.cuda.is_available()) for d in devices)
    return DEFAULT_GROUP["cuda" if cuda else "cpu"]


def group_cells(cells: Sequence[Cell], group: int, runs_dir: "str | os.PathLike") -> list[list[Cell]]:
    """Split cells into stacks of at most `group` compatible cells (spec order within each stack).

    Cells stack when `training.stack_key` agrees (same shapes and recipe) and their folders hold the
    same newest checkpoint or resume-point step (so an interrupted stack re-forms and resumes where it stopped). A pure
    function of the cells and their folders: the local and Ray backends form the same stacks.

    Args:
        cells: the cells to run.
        group: the most cells per stack (1: every cell alone).
        runs_dir: the sweep's runs/ folder (where checkpoints are looked for).

    Returns:
        The groups, each a list of cells.
    """
    if group <= 1:
        return [[c] for c in cells]
    buckets: dict[Any, list[Cell]] = {}
    groups: list[list[Cell]] = []
    for c in cells:
        key = stack_key(c.config)
        folder = Path(runs_dir) / c.cell_id
        newest = max((step for step, _ in list_checkpoints(folder) + list_resume_points(folder)), default=0)
        buckets.setdefault((key, newest), []).append(c)
    for members in buckets.values():
        groups += [members[i:i + group] for i in range(0, len(members), group)]
    return groups
