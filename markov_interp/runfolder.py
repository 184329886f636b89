"""Run-folder safety: one writer at a time, stale temporary files removed, metrics checked against the
checkpoint a run resumes from, and a run's status (diverged or not) recorded beside its files.

`training.train` writes a run folder (config.json, metrics.jsonl, checkpoints/, model.safetensors). Faults this
module guards against:

- two processes writing one folder (two `train` calls, or a sweep restarted while its old workers still run):
  `lock(run_dir)` takes an OS-level lock (`fcntl.flock` on `run_dir/.lock`, released by the kernel when the
  holder exits, crash and `kill -9` included); a second writer is refused at once with `RunFolderBusy`, whose
  one-line message names the holder (pid, host, start time, written into the lock file);
- a writer killed inside an atomic write leaves `.<name>.<random>.tmp` files (see `_io.atomic_path`):
  `remove_stale_tmp` deletes them while the lock is held (no live writer can own them then);
- metrics.jsonl that does not reach the step of the checkpoint a run would resume from (a folder damaged by an
  unlocked second writer, or edited by hand): `resume_step` picks the newest checkpoint whose metrics rows are
  all present (training from it rewrites the rest bit-identically) or refuses with a message saying how to
  recover;
- training that diverged (a non-finite loss): `mark_diverged` writes `status.json`; `divergence(run_dir)`
  reads it (or, for folders written before it existed, finds the non-finite loss in the metrics) so `probe`,
  `report` and sweeps say "diverged" instead of classifying a broken model.
"""

import contextlib
import datetime
import json
import math
import os
import socket
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

from markov_interp._io import atomic_write

__all__ = [
    "RunFolderError",
    "RunFolderBusy",
    "TrainingDiverged",
    "lock",
    "holder",
    "remove_stale_tmp",
    "logged_steps",
    "resume_step",
    "metrics_complete",
    "mark_diverged",
    "divergence",
    "diverged_message",
    "read_config",
    "check_writable_dir",
    "LOCK_FILE",
    "STATUS_FILE",
    "OWN_FILES",
]

LOCK_FILE = ".lock"
STATUS_FILE = "status.json"
OWN_FILES = (LOCK_FILE, STATUS_FILE)  # files this module puts in a run folder (not "foreign" content)


class RunFolderError(RuntimeError):
    """A run folder cannot be used as it is; the message names the folder and how to recover."""


class RunFolderBusy(RunFolderError):
    """Another process holds the run folder's lock (it is writing the run)."""


class TrainingDiverged(RuntimeError):
    """Training hit a non-finite loss; the run is recorded as diverged (`status.json`, a metrics row).

    `step` is the first step whose loss was not finite, `checkpoint` the last finite checkpoint kept (or None).
    """

    def __init__(self, message: str, *, step: int, run_dir: Optional[Path] = None,
                 checkpoint: Optional[int] = None) -> None:
        super().__init__(message)
        self.step = step
        self.run_dir = run_dir
        self.checkpoint = checkpoint


# ------------------------------------------------------------------------------------------------- locking
def _holder_text() -> str:
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    return json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": started})


def holder(run_dir: "str | os.PathLike") -> str:
    """Who holds (or last held) the lock of `run_dir`, as "pid 123 on host since 2026-01-01T00:00:00+00:00"."""
    try:
        info = json.loads((Path(run_dir) / LOCK_FILE).read_text())
        return f"pid {info['pid']} on {info['host']} since {info['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "an unknown process (its lock file is empty: it is just starting)"


@contextlib.contextmanager
def lock(run_dir: "str | os.PathLike") -> Iterator[Path]:
    """Hold the exclusive write lock of `run_dir` (created if missing) for the `with` block.

    The lock is `fcntl.flock` on `run_dir/.lock`: the kernel drops it when the holder's file is closed or its
    process dies, so a crashed writer never leaves the folder locked. Raises `RunFolderBusy` at once (no wait)
    when another process, or another open of the lock in this one, holds it. Where `fcntl` is missing
    (Windows) the block runs unlocked.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ModuleNotFoundError:  # pragma: no cover - Windows: no flock; run unlocked
        yield run_dir
        return
    path = run_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunFolderBusy(
                f"{run_dir} is being written by {holder(run_dir)}; wait for it to finish or stop it "
                "(the lock is released when that process exits)"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, _holder_text().encode(), 0)
        yield run_dir
    finally:
        os.close(fd)  # closing the only descriptor releases the flock


def remove_stale_tmp(run_dir: "str | os.PathLike", subfolders: tuple = ("checkpoints",)) -> list[Path]:
    """Delete the temporary files of interrupted atomic writes (`.<name>.<random>.tmp`, see `_io.atomic_path`)
    in `run_dir` and its `subfolders`; returns what was removed. Call it only while holding `lock`."""
    run_dir = Path(run_dir)
    removed = []
    for folder in (run_dir, *(run_dir / name for name in subfolders)):
        if not folder.is_dir():
            continue
        for path in folder.glob(".*.tmp"):
            if path.is_file():
                path.unlink()
                removed.append(path)
    return removed


# ------------------------------------------------------------------------------------------ resume checks
def logged_steps(train_cfg: Any, upto: int) -> list[int]:
    """The steps <= `upto` at which `training.train` writes a metrics row for `train_cfg`: every
    `log_every`-th step and every evaluation step (`training.evaluation_steps`, the last step included)."""
    from markov_interp.training import evaluation_steps

    tc = train_cfg
    evals = evaluation_steps(tc)
    return [s for s in range(1, min(upto, tc.steps) + 1) if s % tc.log_every == 0 or s in evals]


def _covered(rows: list[dict], expected: list[int], step: int) -> bool:
    return [r.get("step") for r in rows if isinstance(r.get("step"), int) and r["step"] <= step] == expected


def resume_step(run_dir: Path, train_cfg: Any, checkpoints: list[int], rows: list[dict], *,
                final_weights: bool = False) -> Optional[int]:
    """The checkpoint step a run in `run_dir` resumes from: the newest of `checkpoints` whose metrics rows
    (`rows`, as read from metrics.jsonl) are all present up to it; the resumed run rewrites the rows after it
    (and the final weights) bit-identically. None when there are no checkpoints (train from step 0).

    `final_weights`: the folder holds model.safetensors although its metrics are incomplete (a folder damaged
    by an unlocked second writer); it is repaired from a checkpoint, with a warning. Raises `RunFolderError`
    with the way to recover when the metrics reach no checkpoint, or there is none to repair final weights.
    """
    last = max((r["step"] for r in rows if isinstance(r.get("step"), int)), default=0)
    if not checkpoints:
        if final_weights:
            raise RunFolderError(
                f"{run_dir} has final weights but its metrics.jsonl ends at step {last} of {train_cfg.steps} and "
                f"there is no checkpoint to repair it from; delete {run_dir / 'model.safetensors'} and "
                f"{run_dir / 'metrics.jsonl'} to retrain, or delete the folder"
            )
        return None
    newest = max(checkpoints)
    for step in sorted(checkpoints, reverse=True):
        if _covered(rows, logged_steps(train_cfg, step), step):
            if final_weights or step != newest:
                warnings.warn(f"{run_dir}: metrics.jsonl ends at step {last} (incomplete); resuming from the "
                              f"checkpoint of step {step} to rewrite the rest", stacklevel=3)
            return step
    raise RunFolderError(
        f"{run_dir}: metrics.jsonl has rows up to step {last} but lacks rows before every checkpoint "
        f"(steps {sorted(checkpoints)}), so training cannot resume consistently; delete {run_dir / 'checkpoints'} "
        f"and {run_dir / 'model.safetensors'} to retrain from step 0, or delete the folder"
    )


def metrics_complete(train_cfg: Any, rows: list[dict]) -> bool:
    """Whether `rows` hold exactly the metrics rows of a finished run (every logged step up to the last)."""
    return _covered(rows, logged_steps(train_cfg, train_cfg.steps), train_cfg.steps) and len(rows) == len(
        logged_steps(train_cfg, train_cfg.steps))


# ------------------------------------------------------------------------------------------------ status
def mark_diverged(run_dir: Path, *, step: int, reason: str, checkpoint: Optional[int]) -> dict:
    """Record in `run_dir/status.json` that the run diverged at `step` (its first non-finite loss)."""
    status = {"status": "diverged", "step": step, "reason": reason, "last_finite_checkpoint": checkpoint}
    atomic_write(Path(run_dir) / STATUS_FILE, json.dumps(status, indent=1, sort_keys=True))
    return status


def _not_finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isfinite(value)


def divergence(run_dir: "str | os.PathLike") -> Optional[dict]:
    """How `run_dir`'s run diverged ({"status": "diverged", "step", "reason", "last_finite_checkpoint"}), or
    None if it did not. Reads status.json; a folder written before that file existed counts as diverged when
    a metrics row holds a non-finite loss."""
    run_dir = Path(run_dir)
    path = run_dir / STATUS_FILE
    if path.exists():
        try:
            status = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise ValueError(f"{path} is not valid JSON: {err}") from None
        return status if isinstance(status, dict) and status.get("status") == "diverged" else None
    from markov_interp.training import load_metrics

    for row in load_metrics(run_dir):
        bad = [k for k in ("train_loss", "eval_loss") if _not_finite(row.get(k))]
        if bad or row.get("diverged"):
            what = bad[0] if bad else "loss"
            return {"status": "diverged", "step": row.get("step"), "last_finite_checkpoint": None,
                    "reason": f"non-finite {what} ({row.get(what)}) in the metrics row of step {row.get('step')}"}
    return None


def diverged_message(run_dir: "str | os.PathLike", status: dict) -> str:
    """One line saying that the run in `run_dir` diverged, where and what to do."""
    return (f"{run_dir}: training diverged at step {status.get('step')} ({status.get('reason')}); the run "
            "has no trained model; lower the learning rate (or clip gradients) and train into a new folder")


# --------------------------------------------------------------------------------------------- reading
def read_config(run_dir: "str | os.PathLike") -> Any:
    """The `training.RunConfig` of a run folder; errors name the folder or the config file."""
    from markov_interp.training import CONFIG_FILE, RunConfig

    run_dir = Path(run_dir)
    path = run_dir / CONFIG_FILE
    if not run_dir.is_dir():
        raise FileNotFoundError(f"no run folder at {run_dir} (no {path})")
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: is {run_dir} a run folder written by `train`?")
    try:
        return RunConfig.from_json(path.read_text())
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None


def training_seq_len(run_dir: "str | os.PathLike") -> Optional[int]:
    """The training sequence length recorded in `run_dir`'s config.json (`train.seq_len`), None when the folder
    holds no readable run config (weights saved on their own): what the probes default to for its model.

    Args:
        run_dir: the folder that holds the weights.

    Returns:
        The training length, or None.
    """
    from markov_interp.training import CONFIG_FILE

    try:
        value = json.loads((Path(run_dir) / CONFIG_FILE).read_text())["train"]["seq_len"]
    except (OSError, ValueError, KeyError, TypeError):  # no run folder: the probes fall back to their default
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def check_writable_dir(path: "str | os.PathLike", what: str) -> Path:
    """Check before any work that `path` is (or can be created as) a folder this process can write into.

    Raises ValueError naming `what` and the path: a file in the way, a missing parent that cannot be created,
    or a folder without write permission (tested by creating and removing a file, which also catches
    read-only file systems).
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{what} {path} is a file, not a folder")
    existing = path
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"{what} {path} cannot be created: {existing} is a file, not a folder")
    try:
        fd, probe = tempfile.mkstemp(dir=existing, prefix=".write-test.", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise ValueError(f"{what} {path} is not writable ({err.strerror or err}: {existing})") from None
    return path
