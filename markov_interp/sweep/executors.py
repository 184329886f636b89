"""Executors: where the groups of cells run. `run_local` gives each group a fresh child process (`workers` at a
time; `workers=1` runs in this process), `run_ray` one Ray task. Either way a group's records come back to this
process, which saves them (`save`) as they arrive: a worker that dies costs only its own cells (a dead stack is
retried as solo cells, a dead solo cell once more), and a progress bar counts cells and failures.
"""

import dataclasses
import functools
import os
import socket
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any, Optional

from markov_interp._workers import WorkerDeath
from markov_interp.sweep.cells import CellFn, execute_group
from markov_interp.sweep.records import CellRecord, failure
from markov_interp.sweep.spec import Cell

__all__ = ["run_local", "run_ray", "BACKENDS", "Save", "ClusterLost"]

BACKENDS = ("local", "ray")
Save = Callable[[Cell, CellRecord], None]  # writes a cell's record (the sweep folder's one writer)


def _bar(total: int, progress: bool, desc: str) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, disable=not progress, desc=desc, unit="cell", dynamic_ncols=True)


def _start_method() -> str:
    """fork where the platform has it (workers inherit the imported package and need no `__main__` guard in
    the caller's script; torch re-creates its thread pool in the child), spawn elsewhere."""
    import multiprocessing

    return "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"


def run_local(groups: list[list[Cell]], runs_dir: str, probe_for: dict[str, bool], save: Save, progress: bool,
              workers: Optional[int], cell_fn: Optional[CellFn]) -> None:
    """Run `groups` in child processes (one fresh process per group, `workers` at a time; default all cores;
    `workers=1`: in this process), saving each cell's record as it arrives.

    Args:
        groups: the groups of `cells.group_cells`.
        runs_dir: the sweep's runs/ folder.
        probe_for: per cell id, whether to probe it.
        save: writes a cell's record.
        progress: a progress bar over cells.
        workers: processes at once (None: all cores).
        cell_fn: a stand-in for `cells.run_cell` (tests).
    """
    asked = workers or os.cpu_count() or 1
    n = min(asked, len(groups))  # with asked > 1 even a single cell runs in a child: its death stays its own
    bar = _bar(sum(len(g) for g in groups), progress, "sweep")
    failed = 0

    stacked = {c.cell_id: len(g) for g in groups if len(g) > 1 for c in g}  # a dead stack comes back as solo cells

    def done(g: tuple[Cell, ...], records: Optional[list[CellRecord]], death: Optional[WorkerDeath]) -> None:
        nonlocal failed
        got = records if death is None else [_death_record(death)] * len(g)
        if len(g) == 1 and g[0].cell_id in stacked:  # say so in its row: stack size 1, and why
            note = f"the worker of its stack of {stacked[g[0].cell_id]} died; retried as a solo cell"
            got = [dataclasses.replace(r, stack_size=1, stack_note=note) for r in got]
        failed += _record_group(list(g), lambda: got, "", save, bar, failed)

    try:
        if asked == 1:
            for g in groups:
                run_now = functools.partial(execute_group, g, runs_dir, [probe_for[c.cell_id] for c in g], cell_fn)
                failed += _record_group(g, run_now, "cell raised", save, bar, failed)
            return
        from markov_interp._workers import supervise

        # one fresh process per group: a dead worker (out-of-memory kill) costs only its cells; a dead stack is
        # retried as solo cells, a dead solo cell once more
        run = functools.partial(_execute_child, runs_dir=runs_dir, probe_for=probe_for, cell_fn=cell_fn)
        supervise([tuple(g) for g in groups], run, done, workers=n, retries=1, split=_split_group,
                  start_method=_start_method())
    finally:
        bar.close()


def _record_group(cells: list[Cell], get: Callable[[], list[CellRecord]], lost: str, save: Save, bar: Any,
                  failed: int) -> int:
    """Save the records `get()` returns for a group of cells (failure records if the worker was lost); returns
    how many of them failed."""
    try:
        records = get()
    except Exception as err:
        records = [failure(f"{lost}: {type(err).__name__}: {err}", traceback.format_exc())] * len(cells)
    bad = 0
    for cell, record in zip(cells, records):
        save(cell, record)
        bad += int(record.failed)
        bar.set_postfix(failed=failed + bad, refresh=False)
        bar.update(1)
    return bad


class ClusterLost(RuntimeError):
    """The Ray cluster of a sweep was lost while cells were left: its head stopped answering, or no worker node
    with a CPU is left. The message says what was lost and how to resume (the records of finished cells are saved:
    the same command on a working cluster skips them); the CLI prints it as one line, exit code 2."""


HEALTH_SECONDS = 2.0  # how often `run_ray` checks the cluster while it waits for a cell
LOST_SECONDS = 10.0  # a head unreachable (or a cluster without a CPU) this long is lost (Ray itself ends the
#                      driver with its own traceback and exit code 1 after 60 s without its head)


def run_ray(groups: list[list[Cell]], runs_dir: str, probe_for: dict[str, bool], save: Save, progress: bool,
            cell_fn: Optional[CellFn]) -> None:
    """Run `groups` as Ray tasks (num_cpus=1, one retry of a dead worker) on the cluster `ray.init()` connects
    to, saving each cell's record as its task finishes.

    While it waits it checks the cluster every `HEALTH_SECONDS`: a head that does not answer, or a cluster with no
    CPU left (every worker node lost) for `LOST_SECONDS` ends the sweep with `ClusterLost`, one line saying what
    was lost and how to resume, instead of Ray's traceback a minute later. A task that comes back lost (its worker
    or node died) fails its cells only once the cluster is seen healthy: a killed head fails every running task at
    once, and those cells are then left unrecorded, to run again with the same command.

    Args:
        groups, runs_dir, probe_for, save, progress, cell_fn: as `run_local`'s.

    Raises:
        ClusterLost: the cluster was lost before every cell finished.
    """
    try:
        import ray
    except ModuleNotFoundError:
        raise ValueError("backend='ray' needs the 'ray' package (pip install 'markov-interp[ray]')") from None
    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False)
    # Ray re-runs a task whose worker died max_retries times; after that ray.get raises and only its cells fail
    task = ray.remote(num_cpus=1, max_retries=1)(execute_group_in_worker)
    refs = {task.remote(g, runs_dir, [probe_for[c.cell_id] for c in g], cell_fn): g for g in groups}
    total = sum(len(g) for g in groups)
    bar = _bar(total, progress, "sweep (ray)")
    failed, health = 0, _ClusterHealth(ray)
    try:
        remaining = list(refs)
        while remaining:
            done, remaining = ray.wait(remaining, num_returns=1, timeout=HEALTH_SECONDS)
            if not done:
                health.check(sum(len(refs[r]) for r in remaining), total)
                continue
            group = refs[done[0]]
            try:
                records = ray.get(done[0])
            except Exception as err:  # the task's worker died or Ray lost it: its cells fail, unless the whole
                # cluster is gone (a killed head fails every running task at once): then nothing is recorded
                health.confirm(sum(len(refs[r]) for r in remaining) + len(group), total)
                records = err
            lost = "worker died (Ray retried it once)"
            failed += _record_group(group, functools.partial(_given, records), lost, save, bar, failed)
    finally:
        bar.close()


def _given(records: "list[CellRecord] | Exception") -> list[CellRecord]:
    """`records`, or raise the error that came back instead."""
    if isinstance(records, Exception):
        raise records
    return records


class _ClusterHealth:
    """`run_ray`'s check of its cluster: the head answers (a TCP connection to its GCS address) and some node has
    a CPU; either failing for `LOST_SECONDS` raises `ClusterLost`."""

    def __init__(self, ray: Any) -> None:
        self.ray = ray
        self.address = ray.get_runtime_context().gcs_address
        self.since: Optional[float] = None

    def check(self, left: int, total: int) -> bool:
        """True when the cluster is healthy now, False while it has been lost for less than `LOST_SECONDS`;
        `ClusterLost` (saying `left` of `total` cells are not finished) after that."""
        problem = self._problem()
        if problem is None:
            self.since = None
            return True
        now = time.monotonic()
        self.since = self.since if self.since is not None else now
        if now - self.since < LOST_SECONDS:
            return False
        head = problem.startswith("its head")
        how = ("start the cluster again (ray start --head ...)" if head else
               "add a worker node (ray start --address ...) or start the cluster again")
        raise ClusterLost(f"the Ray cluster at {self.address} was lost ({problem} for {LOST_SECONDS:.0f} s) with "
                          f"{left} of {total} cells not finished (the others' records are saved); {how} and run "
                          "the same command: finished cells are skipped")

    def confirm(self, left: int, total: int) -> None:
        """After a task came back lost: return once the cluster is healthy (the task's own worker died), or raise
        `ClusterLost` when it stays lost for `LOST_SECONDS`."""
        while not self.check(left, total):
            time.sleep(HEALTH_SECONDS / 4)

    def _problem(self) -> Optional[str]:
        host, _, port = self.address.rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=1.0).close()
        except (OSError, ValueError):
            return "its head does not answer"
        try:
            cpus = self.ray.cluster_resources().get("CPU", 0)
        except Exception:  # Ray's own errors while the cluster changes: the next check decides
            return None
        return None if cpus > 0 else "no worker node with a CPU is left"


def _worker_init() -> None:
    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def execute_group_in_worker(cells: Sequence[Cell], runs_dir: str, probes: Sequence[bool],
                            cell_fn: Optional[CellFn]) -> list[CellRecord]:
    """`cells.execute_group` in a worker process: one torch thread."""
    _worker_init()
    return execute_group(cells, runs_dir, probes, cell_fn)


def _execute_child(group: tuple[Cell, ...], *, runs_dir: str, probe_for: dict[str, bool],
                   cell_fn: Optional[CellFn]) -> list[CellRecord]:
    """What a local sweep's child process runs (`_workers.supervise`): one group of cells."""
    return execute_group_in_worker(list(group), runs_dir, [probe_for[c.cell_id] for c in group], cell_fn)


def _split_group(group: tuple[Cell, ...]) -> list[tuple[Cell, ...]]:
    """A stack whose process died is retried as solo cells (`_workers.supervise`'s split)."""
    return [(c,) for c in group] if len(group) > 1 else []


def _death_record(death: WorkerDeath) -> CellRecord:
    """The record of a cell whose worker process died on every try (`_workers.WorkerDeath`)."""
    return failure(death.describe(), None, worker_exitcode=death.exitcode, worker_signal=death.signal)
