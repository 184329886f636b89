"""Process supervision for sweeps: each task in its own child process, deaths seen one by one.

A process pool (`concurrent.futures.ProcessPoolExecutor`) breaks as a whole when one worker dies: every task
still queued or running fails with BrokenProcessPool. Here each task runs in a fresh child process (at most
`workers` alive), the parent waits on every child's exit and result pipe, and:

- a child that exits without sending a result (killed by the out-of-memory killer, a segfault, `os._exit`)
  costs only its own task, which runs once more in a fresh child (`retries`); a task that keeps killing its
  worker is reported with the exit code and signal of its last death while every other task finishes;
- `split(task)` may turn a dead task into smaller ones (a stack of training runs retried as single runs);
- children end with their parent: on Linux each child asks the kernel for SIGKILL when the parent dies
  (`prctl(PR_SET_PDEATHSIG)`), and a watch thread in every child exits it once its parent is gone (other
  platforms, and the window before prctl), so `kill -9` of the sweep leaves no worker writing its folders.
  When the parent stops on an exception (Ctrl-C included), it terminates the children it started.
"""

import collections
import dataclasses
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Optional

__all__ = ["WorkerDeath", "supervise", "die_with_parent"]

_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_WATCH_SECONDS = 0.5


@dataclasses.dataclass(frozen=True)
class WorkerDeath:
    """How a worker process ended without a result: its exit code (negative: killed by that signal)."""

    exitcode: Optional[int]
    attempts: int  # how many workers the task was given (each one died)

    @property
    def signal(self) -> Optional[str]:
        """The name of the signal that killed the worker ("SIGKILL"), None if it exited by itself."""
        if self.exitcode is None or self.exitcode >= 0:
            return None
        try:
            return signal.Signals(-self.exitcode).name
        except ValueError:
            return f"signal {-self.exitcode}"

    def describe(self) -> str:
        how = f"killed by {self.signal}" if self.signal else f"exited with code {self.exitcode} without a result"
        tries = "once" if self.attempts == 1 else f"in each of {self.attempts} fresh workers"
        return f"worker died ({how}, {tries})"


def die_with_parent(parent_pid: int) -> None:
    """Make this (child) process end when `parent_pid` ends: PR_SET_PDEATHSIG on Linux, plus a daemon thread
    that polls the parent id (reparenting changes it) and exits the process when the parent is gone."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):  # no libc prctl: the watch thread still covers it
            pass
    if os.getppid() != parent_pid:  # the parent died before the death signal was armed
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(_WATCH_SECONDS)
            if os.getppid() != parent_pid:
                os._exit(1)

    threading.Thread(target=watch, name="watch-parent", daemon=True).start()


def _child(conn: Any, parent_pid: int, run: Callable[[Any], Any], task: Any) -> None:
    die_with_parent(parent_pid)
    result = run(task)
    conn.send(result)
    conn.close()


@dataclasses.dataclass
class _Running:
    process: Any
    conn: Any  # parent's read end; None once the result arrived or the pipe closed
    task: Any
    attempts: int
    result: Any = None
    has_result: bool = False


def supervise(
    tasks: Sequence[Any],
    run: Callable[[Any], Any],
    on_done: Callable[[Any, Any, Optional[WorkerDeath]], None],
    *,
    workers: int,
    retries: int = 1,
    split: Optional[Callable[[Any], list]] = None,
    start_method: str = "fork",
) -> None:
    """Run `run(task)` for every task, each in a fresh child process, at most `workers` at a time.

    `on_done(task, result, None)` is called in this process with what `run` returned (it must be picklable),
    in completion order. A child that dies without a result is retried: first through `split(task)` when that
    gives two or more smaller tasks (each then runs with a fresh retry budget), else `retries` more times in a
    fresh child; then `on_done(task, None, WorkerDeath(...))`. An exception in this process (Ctrl-C included)
    terminates the running children and propagates.
    """
    import multiprocessing
    from multiprocessing.connection import wait

    ctx = multiprocessing.get_context(start_method)
    queue = collections.deque((task, 0) for task in tasks)
    running: dict[Any, _Running] = {}  # process sentinel -> child
    parent = os.getpid()
    try:
        while queue or running:
            while queue and len(running) < workers:
                task, attempts = queue.popleft()
                read, write = ctx.Pipe(duplex=False)
                process = ctx.Process(target=_child, args=(write, parent, run, task), daemon=False)
                process.start()
                write.close()  # only the child writes; its exit then closes the pipe
                running[process.sentinel] = _Running(process, read, task, attempts + 1)
            conns = {r.conn: r for r in running.values() if r.conn is not None}
            ready = wait(list(running) + list(conns))
            for conn, child in conns.items():
                if conn in ready:
                    _receive(child)
            for sentinel in [s for s in running if s in ready]:
                child = running.pop(sentinel)
                child.process.join()
                if child.conn is not None:  # a result sent just before exiting, or end of file: no block
                    _receive(child)
                _finish(child, queue, on_done, retries, split)
    finally:
        _stop(running)


def _receive(child: _Running) -> None:
    """Read the child's one message, or its end of file (it died without one); the pipe is then done with."""
    try:
        child.result, child.has_result = child.conn.recv(), True
    except (EOFError, OSError):
        pass
    child.conn.close()
    child.conn = None


def _finish(child: _Running, queue: collections.deque, on_done: Callable, retries: int,
            split: Optional[Callable]) -> None:
    if child.has_result:
        on_done(child.task, child.result, None)
        return
    parts = split(child.task) if split is not None else None
    if parts is not None and len(parts) > 1:
        queue.extend((part, 0) for part in parts)
    elif child.attempts <= retries:
        queue.append((child.task, child.attempts))
    else:
        on_done(child.task, None, WorkerDeath(exitcode=child.process.exitcode, attempts=child.attempts))


def _stop(running: dict) -> None:
    """Terminate and reap the children still running (this process is stopping on an exception)."""
    for child in running.values():
        if child.process.is_alive():
            child.process.terminate()
    deadline = time.monotonic() + 5
    for child in running.values():
        child.process.join(max(0.0, deadline - time.monotonic()))
        if child.process.is_alive():
            child.process.kill()
            child.process.join()
