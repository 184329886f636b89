"""`run`: a sweep from its specs to its table. The distinct cells, those still to run (restart), grouping into
stacks, an executor (local processes or Ray), each record saved as it arrives, then one table."""

import dataclasses
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional, Union

from markov_interp._io import atomic_write
from markov_interp.config import MAX_PARALLEL, check_int
from markov_interp.devices import check_device_name, resolve_device
from markov_interp._display import displayed
from markov_interp.sweep import executors
from markov_interp.sweep.cells import CellFn, default_group, group_cells
from markov_interp.sweep.records import (RESULTS_DIR, RUNS_DIR, CellRecord, is_done, probe_settings, read_record,
                                         record_path, write_record)
from markov_interp.sweep.spec import Cell, SweepSpec, load_spec
from markov_interp.sweep.table import Row, write_table
from markov_interp import runs
from markov_interp.streams import LEGACY_STREAM

__all__ = ["run", "SweepResult", "SpecLike", "check_sweep_folder", "SPEC_FILE", "folder_stream"]


@displayed(line=lambda r: f"{len(r.rows)} cells ({r.n_run} run now, {r.n_skipped} done before), {r.n_failed} failed, "
                          f"{r.n_diverged} diverged -> {r.table}")
@dataclasses.dataclass
class SweepResult:
    """What `run` returns: the table rows (one per cell, spec order), the table's path and counts."""

    rows: list[Row]
    table: Path
    n_run: int  # cells executed in this call
    n_skipped: int  # cells already finished before this call
    n_failed: int  # cells whose record says failed after this call (diverged cells are not failures)
    n_diverged: int = 0  # cells whose training diverged (non-finite loss): a result of the recipe, not a fault

    @property
    def failed(self) -> list[Row]:
        return [r for r in self.rows if r.status not in ("ok", "diverged")]

    @property
    def diverged(self) -> list[Row]:
        return [r for r in self.rows if r.status == "diverged"]


SpecLike = Union[SweepSpec, str, os.PathLike, dict, Sequence]  # a spec, a spec file, a table, or a list of those


def _as_specs(spec: SpecLike) -> list[SweepSpec]:
    if isinstance(spec, SweepSpec):
        return [spec]
    if isinstance(spec, (str, os.PathLike)):
        return [load_spec(spec)]
    if isinstance(spec, dict):
        return [SweepSpec.from_dict(spec)]
    if isinstance(spec, (list, tuple)) and spec:
        return [s for item in spec for s in _as_specs(item)]
    raise ValueError(f"spec must be a SweepSpec, a spec file path, a dict or a list of those, got {spec!r}")


def _check_options(backend: str, workers: Optional[int], group: Optional[int]) -> None:
    if backend not in executors.BACKENDS:
        raise ValueError(f"backend must be one of {list(executors.BACKENDS)}, got {backend!r}")
    check_int("workers", workers, minimum=1, maximum=MAX_PARALLEL, none_ok=True)
    check_int("group", group, minimum=1, none_ok=True)


def run(
    spec: SpecLike,
    out_dir: "str | os.PathLike",
    *,
    backend: str = "local",
    workers: Optional[int] = None,
    progress: bool = True,
    retry_failed: bool = True,
    group: Optional[int] = None,
    _cell_fn: Optional[CellFn] = None,
) -> SweepResult:
    """Run every cell of `spec` (a `SweepSpec`, a spec file, or a list of specs) into `out_dir`.

    Each cell is a training run of `training.train` in out_dir/runs/<cell_id>, followed by
    `probes.classify_mechanism` (unless the spec says probe = false). Cells already finished are skipped,
    so a stopped sweep restarted with the same command only runs what is left; a cell that raises is recorded
    with its error and traceback (status "failed", retried on the next call unless `retry_failed=False`) and
    the other cells go on. `backend="local"` runs each cell in a fresh child process, `workers` at a time
    (default: all cores, one torch thread each; `workers=1` runs in this process): a worker that dies (killed
    for memory) costs only its cell, which runs once more in a fresh process and is then recorded failed with
    "worker died" and the signal; workers end when the sweep's process ends (even by `kill -9`).
    `backend="ray"` submits one Ray task per cell (num_cpus=1, one retry of a dead worker) to the cluster
    `ray.init()` connects to (RAY_ADDRESS, or a local instance); out_dir must then be on a filesystem every
    node sees. A cell whose training diverges (non-finite loss) gets status "diverged" (its error names the step):
    counted apart from failures (`SweepResult.n_diverged`) and not run again. `group` (default
    `default_group`: 1 on a CPU, 64 on a GPU) trains up to that many compatible cells as one stacked model
    (`training.train_many`); a stack that raises, or whose process dies, is retried cell by cell. Same seeds and
    group give the same table on either backend. Writes out_dir/results.csv (and results.parquet when pyarrow
    is present). See docs/sweeps.md.

    Args:
        spec: a `SweepSpec`, a spec file (TOML / JSON), a dict, or a list of those (distinct names).
        out_dir: the sweep folder (created; locked while this runs).
        backend: "local" (supervised child processes) or "ray".
        workers: local processes at once (default: all cores; 1: in this process).
        progress: a progress bar over cells.
        retry_failed: run cells whose record says "failed" again.
        group: the most compatible cells per stacked model (default `default_group`).
        _cell_fn: tests only: replaces `cells.run_cell` and runs every cell alone.

    Returns:
        The `SweepResult`: one `Row` per cell in spec order, the table's path and the counts.
    """
    out = runs.folder_path(out_dir, "out_dir")
    specs, cells, probe_for = _plan(spec, backend, workers, group, out)
    settings = probe_settings()
    with runs.lock(out):  # one sweep at a time per folder: a second is refused at once, naming the first
        check_sweep_folder(out)  # before anything is written; a refusal takes back the lock's .lock
        runs.remove_stale_tmp(out, subfolders=(RESULTS_DIR,))
        (out / RUNS_DIR).mkdir(exist_ok=True)
        (out / RESULTS_DIR).mkdir(exist_ok=True)
        atomic_write(out / SPEC_FILE, json.dumps([s.to_dict() for s in specs], indent=2, sort_keys=True,
                                                   default=str))
        pending, n_skipped = _pending(cells, out, probe_for, settings, retry_failed)
        _run_cells(pending, out, probe_for, settings, backend, workers, progress, group, _cell_fn)
        rows = [Row.of(c, read_record(record_path(out, c.cell_id))) for c in cells]
        table = write_table(out, rows)
    n_diverged = sum(1 for r in rows if r.status == "diverged")
    return SweepResult(rows=rows, table=table, n_run=len(pending), n_skipped=n_skipped, n_diverged=n_diverged,
                       n_failed=sum(1 for r in rows if r.status != "ok") - n_diverged)


SPEC_FILE = "spec.json"  # what makes a folder a sweep's: every sweep writes it first


def check_sweep_folder(out: Path) -> None:
    """Refuse to run a sweep into `out` unless it is a sweep's folder (it holds the `SPEC_FILE` a sweep writes
    first) or holds nothing but what `_empty_start` allows (a sweep stopped before it wrote its spec, run folders of
    `train --seeds`). A sweep rewrites spec.json, results.csv and results.parquet, so a folder of the user's files (a
    results.csv of their own) is refused naming what is there, as `train` refuses one.

    Args:
        out: the sweep folder (locked by the caller).

    Raises:
        ValueError: naming the folder and the first entries that are not a sweep's.
    """
    if (out / SPEC_FILE).is_file() or not out.is_dir():
        return
    foreign = sorted(entry.name for entry in os.scandir(out) if not _empty_start(entry))
    if foreign:
        raise ValueError(f"{out} is not a sweep folder (no {SPEC_FILE}) and holds {', '.join(foreign[:5])}"
                         f"{' ...' if len(foreign) > 5 else ''}; a sweep writes spec.json, results.csv and "
                         "results.parquet there, so it refuses a folder of other files: give an empty or new folder")


def _empty_start(entry: os.DirEntry) -> bool:
    """What may be in a sweep's folder before its spec.json: its lock, temporary files of atomic writes, run folders
    (the package's: `train --seeds` may write OUT/seed-N beside a sweep starting there), empty folders (one being
    made), and runs/ and results/ holding only these."""
    if entry.name == runs.LOCK_FILE or runs.is_temporary(entry.name):
        return True
    if not entry.is_dir(follow_symlinks=False):
        return False
    inner = list(os.scandir(entry.path))
    if not inner or any(e.name in (runs.CONFIG_FILE, runs.LOCK_FILE) for e in inner):
        return True
    return entry.name in (RUNS_DIR, RESULTS_DIR) and all(_empty_start(e) for e in inner)


def _plan(spec: SpecLike, backend: str, workers: Optional[int], group: Optional[int],
          out: Path) -> tuple[list[SweepSpec], list[Cell], dict[str, bool]]:
    """`run`'s checks before it touches the folder: the options, the specs (on the folder's stream,
    `folder_stream`), their distinct cells and the cells' devices; and which cells are probed (by cell id)."""
    _check_options(backend, workers, group)
    stream = folder_stream(out)
    specs = [_on_stream(s, stream) for s in _as_specs(spec)]
    cells = _distinct_cells(specs)
    _check_devices(cells, backend)
    return specs, cells, _probe_for(specs, cells)


def _run_cells(pending: list[Cell], out: Path, probe_for: dict[str, bool], settings: dict[str, Any], backend: str,
               workers: Optional[int], progress: bool, group: Optional[int], cell_fn: Optional[CellFn]) -> None:
    """Run the `pending` cells of the sweep in `out`, in stacks of up to `group` compatible cells (alone with a
    test's `cell_fn`), on `backend`; each cell's record is written as it ends."""
    if not pending:
        return

    def save(c: Cell, record: CellRecord) -> None:
        write_record(out, dataclasses.replace(record, cell_id=c.cell_id,
                                              probe_settings=settings if probe_for[c.cell_id] else None))

    runs_dir = str(out / RUNS_DIR)
    size = 1 if cell_fn is not None else (group if group is not None else default_group(pending))
    groups = group_cells(pending, size, runs_dir)
    if backend == "ray":
        executors.run_ray(groups, runs_dir, probe_for, save, progress, cell_fn)
    else:
        executors.run_local(groups, runs_dir, probe_for, save, progress, workers, cell_fn)


def folder_stream(out: Path) -> Optional[str]:
    """The random stream of the cells of a sweep folder whose spec names none (`TrainConfig.stream`): "torch-1" for
    a folder that holds cells (records or run folders) none of whose run configs names a stream other than
    "torch-1" (a sweep trained before counter streams, or continued since under this rule), so that it restarts,
    is re-probed and is extended on the stream its runs were trained on, with the same cell ids (nothing is
    retrained); None (the default, "counter-1") for a new or empty folder and one trained on "counter-1". A spec
    that sets `train.stream` (in its base or grid) is followed either way.

    Args:
        out: the sweep folder (it need not exist).

    Returns:
        "torch-1" or None.
    """
    records = list((out / RESULTS_DIR).glob("*.json")) if (out / RESULTS_DIR).is_dir() else []
    configs = list((out / RUNS_DIR).glob(f"*/{runs.CONFIG_FILE}")) if (out / RUNS_DIR).is_dir() else []
    if not records and not configs:
        return None
    for path in configs:
        try:
            train = json.loads(path.read_text()).get("train", {})
        except (OSError, ValueError, AttributeError):
            continue  # unreadable: the cell's own run says so when it runs
        if isinstance(train, dict) and train.get("stream", LEGACY_STREAM) != LEGACY_STREAM:
            return None
    return LEGACY_STREAM


def _on_stream(spec: SweepSpec, stream: Optional[str]) -> SweepSpec:
    """`spec` with `train.stream = stream` in its base, unless `stream` is None or the spec sets the stream."""
    if stream is None or "stream" in spec.base.get("train", {}) or "train.stream" in spec.grid:
        return spec
    return dataclasses.replace(spec, base={**spec.base, "train": {**spec.base.get("train", {}), "stream": stream}})


def _check_devices(cells: list[Cell], backend: str) -> None:
    """The cells' devices, checked once before anything is written (`devices.resolve_device`; on Ray only their
    names: the workers' machines decide what they have), instead of failing every cell with torch's error."""
    for device in sorted({c.config.train.device for c in cells}):
        if backend == "ray":
            check_device_name(device, what="train.device")
        else:
            resolve_device(device, what="train.device")


def _probe_for(specs: list[SweepSpec], cells: list[Cell]) -> dict[str, bool]:
    """Per distinct cell id, whether to probe it: a cell shared by two sweeps runs once, probed if any asks."""
    probe_of = {s.name: s.probe for s in specs}
    probe_for: dict[str, bool] = {}
    for c in cells:
        probe_for[c.cell_id] = probe_for.get(c.cell_id, False) or probe_of[c.sweep]
    return probe_for


def _pending(cells: list[Cell], out: Path, probe_for: dict[str, bool], settings: dict[str, Any],
             retry_failed: bool) -> tuple[list[Cell], int]:
    """The distinct cells still to run (not done with these probe settings; failed ones unless
    `retry_failed=False`) and how many cells are skipped."""
    todo: dict[str, Cell] = {}
    n_skipped = 0
    for c in cells:
        if c.cell_id in todo:
            continue
        record = read_record(record_path(out, c.cell_id), warn=True)  # the one warning for an unusable record
        if is_done(record, probe_for[c.cell_id], settings) or (
            record is not None and record.failed and not retry_failed
        ):
            n_skipped += 1
            continue
        todo[c.cell_id] = c
    return list(todo.values()), n_skipped


def _distinct_cells(specs: list[SweepSpec]) -> list[Cell]:
    """Every cell of `specs`; ValueError for two sweeps of one name or two cells of one sweep that are one run."""
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"sweep names must be distinct, got {names}")
    cells = [c for s in specs for c in s.cells()]
    seen: dict[str, Cell] = {}
    for c in cells:
        other = seen.get(c.cell_id)
        if other is not None and other.sweep == c.sweep:
            raise ValueError(
                f"sweep {c.sweep!r}: cells {other.params} and {c.params} are the same run (same config); "
                "remove the duplicate grid values"
            )
        seen.setdefault(c.cell_id, c)
    return cells
