"""The run folder: its layout (file names, config, metrics, status), its lock and safety checks, and reading it.

`training.train` / `train_many` write one folder per run:

    config.json          the `RunConfig` (sorted JSON); a folder holding another config is refused
    metrics.jsonl        one JSON row per logged step (`load_metrics`): step, lr, train loss and, at evaluation
                         steps, the paired evaluation losses beside theory's reference losses
    model.safetensors    the final weights (`models.save`), written when a run finishes without diverging
    checkpoints/         step_NNNNNNN.safetensors (weights) + step_NNNNNNN.pt (optimiser, loss scaler,
                         generators, pending losses, clamp means) at log-spaced steps
    resume/              the run's resume point while it trains: the same two files, at a cadence of its own
                         (`TrainConfig.resume_every`), one kept at a time and removed when the run ends; only
                         training reads it (readers of checkpoints never see it)
    status.json          written when the run diverged
    .lock                the write lock

Readers (`probe`, `report`, sweeps) use this module (`markov_interp.runs`) and import nothing of `training`;
checkpoint files are `runs.checkpoints`'; which checkpoint a run resumes from is training's
(`training.resume`, it needs the schedule). Faults guarded against here and there:

- two processes writing one folder (two `train` calls, or a sweep restarted while its old workers still run):
  `lock(run_dir)` takes an OS-level lock (`fcntl.flock` on `run_dir/.lock`, released by the kernel when the
  holder exits, crash and `kill -9` included); a second writer is refused at once with `RunFolderBusy`, whose
  one-line message names the holder (pid, host, start time, written into the lock file);
- a writer killed inside an atomic write leaves `.<name>.<random>.tmp` files (see `_io.atomic_path`):
  `remove_stale_tmp` deletes them while the lock is held (no live writer can own them then);
- metrics.jsonl that does not reach the step of the checkpoint a run would resume from (a folder damaged by an
  unlocked second writer, or edited by hand): `training.resume.resume_step` picks the newest checkpoint whose metrics rows are
  all present (training from it rewrites the rest bit-identically) or refuses with a message saying how to
  recover;
- training that diverged (a non-finite loss): `mark_diverged` writes `status.json`; `divergence(run_dir)`
  reads it (or, for folders written before it existed, finds the non-finite loss in the metrics) so `probe`,
  `report` and sweeps say "diverged" instead of classifying a broken model;
- a folder with planted links or special files (`RUN/.lock -> ~/victim`, `RUN/checkpoints -> /elsewhere`, a FIFO
  for metrics.jsonl): `check_contents` refuses symbolic links, FIFOs, sockets and devices in the folder and its
  subfolders (`_io.UnsafePath`); `lock` runs it on every folder it locks (runs and sweeps) and `read_config` on
  every folder it reads, and the lock file itself is opened without following a link. So nothing the package
  opens, replaces or deletes inside a run or sweep folder leads out of it (docs/faults.md);
- a hard link (`ln ~/victim RUN/.lock`): a file about to be written is refused when it has other names
  (`check_contents(..., writing=True)` in `lock`, and the lock and `MetricsLog`, the two files written in place,
  check their own descriptor); every other file is written fresh and renamed (`_io.atomic_write`);
- a run killed before its first checkpoint (an empty metrics.jsonl, rows without a checkpoint, half a checkpoint):
  `prepare` reads the folder by `OWN_FILES`, the one list of the package's files, and the same command starts the
  run from scratch; damaged checkpoints skipped at a resume give one warning (`runs.checkpoints.read_newest_checkpoint`).
"""

import contextlib
import datetime
import errno
import json
import math
import os
import re
import socket
import stat
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

from markov_interp import clamps
from markov_interp._io import (UnsafePath, atomic_write, check_target, describe_kind, loads_json, naming_error,
                               read_json, read_text, write_all)
from markov_interp.config import check_int, check_type, shown
from markov_interp.models import WEIGHTS_FILE, HookedModel, ModelConfig, NonFiniteWeights, load
from markov_interp.runs.config import EXECUTION_FIELDS, RunConfig

__all__ = [
    "RunFolderError",
    "RunFolderBusy",
    "CheckpointDamaged",
    "TrainingDiverged",
    "lock",
    "holder",
    "training_now",
    "unfinished",
    "remove_stale_tmp",
    "mark_diverged",
    "divergence",
    "diverged_message",
    "read_config",
    "prepare",
    "check_writable_dir",
    "folder_path",
    "is_temporary",
    "check_contents",
    "check_single_link",
    "training_seq_len",
    "run_folder_of",
    "load_model",
    "load_metrics",
    "check_metrics_row",
    "read_run_config",
    "write_metrics",
    "MetricsLog",
    "LOCK_FILE",
    "STATUS_FILE",
    "OWN_FILES",
    "REPORT_FILE",
    "foreign_entries",
    "CONFIG_FILE",
    "METRICS_FILE",
    "CHECKPOINT_DIR",
    "RESUME_DIR",
    "WEIGHTS_FILE",
]


CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
CHECKPOINT_DIR = "checkpoints"
RESUME_DIR = "resume"  # the resume point (`runs.checkpoints.list_resume_points`): training's alone
LOCK_FILE = ".lock"
STATUS_FILE = "status.json"
REPORT_FILE = "report.html"  # where `report` writes by default (re-exported as `report.REPORT_FILE`)
# The one list of what the package puts in a run folder (besides the temporary files of its atomic writes,
# `.<name>.<random>.tmp`, and step_NNNNNNN.{safetensors,pt} in checkpoints/ and resume/). `prepare` reads a folder
# by it: a folder holding only these is a run's (resumed, or started from scratch when it never reached a checkpoint),
# anything else is someone else's.
OWN_FILES = (CONFIG_FILE, METRICS_FILE, WEIGHTS_FILE, STATUS_FILE, LOCK_FILE, CHECKPOINT_DIR, REPORT_FILE, RESUME_DIR)
_STEP_DIRS = (CHECKPOINT_DIR, RESUME_DIR)  # the subfolders of step_NNNNNNN files
_CHECKPOINT_NAME = re.compile(r"^step_\d{7}\.(safetensors|pt)$")


class RunFolderError(RuntimeError):
    """A run folder cannot be used as it is; the message names the folder and how to recover."""


class RunFolderBusy(RunFolderError):
    """Another process holds the run folder's lock (it is writing the run)."""


class CheckpointDamaged(ValueError):
    """A checkpoint's files are unreadable, truncated, of another model or not finite (resume falls back to an
    older checkpoint)."""


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
        fd = _open_lock(Path(run_dir) / LOCK_FILE, create=False)
        try:
            info = loads_json(os.pread(fd, 4096, 0), "the lock file")  # 4096 brackets: no RecursionError
        finally:
            os.close(fd)
        return f"pid {info['pid']} on {info['host']} since {info['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "an unknown process (its lock file is empty: it is just starting)"


@contextlib.contextmanager
def lock(run_dir: "str | os.PathLike") -> Iterator[Path]:
    """Hold the exclusive write lock of `run_dir` (created if missing) for the `with` block.

    The lock is `fcntl.flock` on `run_dir/.lock`: the kernel drops it when the holder's file is closed or its
    process dies, so a crashed writer never leaves the folder locked. Raises `RunFolderBusy` at once (no wait)
    when another process, or another open of the lock in this one, holds it. Where `fcntl` is missing
    (Windows) the block runs unlocked. Raises `_io.UnsafePath` when `.lock` is a link or not a regular file, or
    the folder holds a link or special file (`check_contents`), before anything in it is written.

    A block that raises (a refused command: `prepare` refusing a folder of someone else's files, a refused
    sweep) takes back what the lock made: the `.lock` file, when this call created it, and the folders it
    created, when they are empty; so a refused command leaves the user's folder as it was. (A `.lock` removed
    while another process waits to open it is detected: the lock is taken only on the file the name still
    holds.)
    """
    run_dir = Path(run_dir)
    made = _missing_folders(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ModuleNotFoundError:  # pragma: no cover - Windows: no flock; run unlocked
        yield run_dir
        return
    path = run_dir / LOCK_FILE
    created = not os.path.lexists(path)
    fd = _open_lock(path, create=True)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunFolderBusy(
                f"{run_dir} is being written by {holder(run_dir)}; wait for it to finish or stop it "
                "(the lock is released when that process exits)"
            ) from None
        if not _names(path, fd):  # its refused holder removed it while we opened it: the name has a new file
            raise RunFolderBusy(f"{run_dir}'s lock changed while it was taken (another command started there at "
                                "the same moment); try again")
        try:
            check_contents(run_dir, writing=True)
            os.ftruncate(fd, 0)  # fd is the regular file .lock itself (_open_lock), never a link's target
            os.pwrite(fd, _holder_text().encode(), 0)
            yield run_dir
        except BaseException:
            if created:  # still holding the flock: no other process holds this file
                with contextlib.suppress(OSError):
                    os.unlink(path)
                _remove_empty(made)
            raise
    finally:
        os.close(fd)  # closing the only descriptor releases the flock


def _names(path: Path, fd: int) -> bool:
    """Whether `path` still names the file open as `fd`."""
    try:
        named, held = os.lstat(path), os.fstat(fd)
    except FileNotFoundError:
        return False
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def _missing_folders(folder: Path) -> list[Path]:
    """The folders of `folder`'s path that do not exist yet, deepest first (what `mkdir(parents=True)` makes)."""
    missing = []
    while not os.path.lexists(folder) and folder.parent != folder:
        missing.append(folder)
        folder = folder.parent
    return missing


def _remove_empty(folders: list[Path]) -> None:
    """Remove `folders` (deepest first) while they are empty."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:  # not empty (something was written), or already gone
            return


def remove_stale_tmp(run_dir: "str | os.PathLike", subfolders: tuple = _STEP_DIRS) -> list[Path]:
    """Delete the temporary files of interrupted atomic writes (`.<name>.<random>.tmp`, see `_io.atomic_path`)
    in `run_dir` and its `subfolders`; returns what was removed. Call it only while holding `lock`."""
    run_dir = Path(run_dir)
    removed = []
    for folder in (run_dir, *(run_dir / name for name in subfolders)):
        if folder.is_symlink() or not folder.is_dir():  # never delete inside a folder a link leads to
            continue
        for path in folder.glob(".*.tmp"):
            if stat.S_ISREG(os.lstat(path).st_mode):  # our temporary files are regular files, never links
                path.unlink()
                removed.append(path)
    return removed


def _open_lock(path: Path, *, create: bool) -> int:
    """A descriptor of the regular file `path` (the lock), opened without following a link and without
    blocking on a FIFO; `_io.UnsafePath` if a link or anything but a regular file is there."""
    check_target(path, "lock file")  # refuse before opening: opening a device can act on it
    flags = os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | (os.O_CREAT if create else 0)
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as err:
        if err.errno == errno.ELOOP:  # a link planted between the check and the open
            check_target(path, "lock file")
        raise
    info = os.fstat(fd)
    try:
        if not stat.S_ISREG(info.st_mode):
            raise UnsafePath(f"lock file {path} is {describe_kind(info.st_mode)}, not a regular file; remove it")
        if create:  # the writer's open (`lock`): it truncates and writes the file in place
            check_single_link(path, info.st_nlink)
    except UnsafePath:
        os.close(fd)
        raise
    return fd


def check_contents(folder: "str | os.PathLike", depth: int = 2, *, writing: bool = False) -> Path:
    """Refuse a run or sweep folder that holds a symbolic link or a special file (FIFO, socket, device), and, when
    it is about to be written, a file with another hard link.

    The package opens, replaces and deletes files inside run and sweep folders (the lock, metrics, status,
    checkpoints, sweep records): a planted link there would lead those operations out of the folder, and a
    FIFO would hang a read. A hard link (`st_nlink > 1`) is another name of the same file somewhere else: the
    lock and metrics.jsonl are written in place, so writing them would change that other file too, as a
    symbolic link would (`echo precious > v.txt; ln v.txt RUN/.lock` used to end with the lock in v.txt).
    `folder` itself may be a link (the user named it); what is inside may not.

    Args:
        folder: the run or sweep folder (absent: nothing to check).
        depth: how many levels to look into (2: the folder's entries and its subfolders' entries, i.e. a run's
            checkpoints/ and a sweep's results/ and runs/<cell>/ names; a cell's own folder is checked when it
            is locked or read).
        writing: the caller is about to write the folder (`lock`): hard-linked files are refused too. Readers
            (`read_config`) read a hard-linked file as it is, since reading it cannot change the other name.

    Returns:
        `folder` as a `Path`.

    Raises:
        UnsafePath: naming the first link, special file or (writing) hard-linked file found and what it is.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return folder
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                if depth > 1:
                    check_contents(entry.path, depth - 1, writing=writing)
            elif not entry.is_file(follow_symlinks=False):
                kind = describe_kind(entry.stat(follow_symlinks=False).st_mode)
                target = f" to {os.readlink(entry.path)}" if entry.is_symlink() else ""
                raise UnsafePath(f"{entry.path} is {kind}{target}; markov-interp does not follow links or open "
                                 "special files inside a run or sweep folder: remove it (put the real file there)")
            elif writing:
                try:
                    n_links = entry.stat(follow_symlinks=False).st_nlink
                except FileNotFoundError:  # renamed away meanwhile (a temporary file of a writer next door)
                    continue
                check_single_link(entry.path, n_links)
    return folder


def check_single_link(path: "str | os.PathLike", n_links: int) -> None:
    """Refuse a file of a run or sweep folder that has other names (`n_links` > 1, its `st_nlink`): writing it
    would change the file under those names too (`_io.UnsafePath`, saying how to break the link)."""
    if n_links > 1:
        raise UnsafePath(f"{path} has {n_links - 1} other hard link(s): writing it would change that file too, so "
                         "markov-interp refuses it as it refuses a symbolic link; give it its own copy "
                         f"(cp -p {path} {path}.copy && mv {path}.copy {path}) or remove it")


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
        status = read_json(path, "status file")
        if not isinstance(status, dict) or status.get("status") != "diverged":
            return None
        try:
            check_int("step", status.get("step"), minimum=0, none_ok=True)
            check_type("reason", status.get("reason", ""), str)
        except ValueError as err:
            raise ValueError(f"{path} is not a divergence record: {err}") from None
        return status
    for row in load_metrics(run_dir):
        bad = [k for k in ("train_loss", "eval_loss") if _not_finite(row.get(k))]
        if bad or row.get("diverged"):
            what = bad[0] if bad else "loss"
            return {"status": "diverged", "step": row.get("step"), "last_finite_checkpoint": None,
                    "reason": f"non-finite {what} ({row.get(what)}) in the metrics row of step {row.get('step')}"}
    return None


def diverged_message(run_dir: "str | os.PathLike", status: dict) -> str:
    """One line saying that the run in `run_dir` diverged, where and what to do."""
    reason = status.get("reason")
    reason = shown(reason)[1:-1] if isinstance(reason, str) else shown(reason)  # a long one edited in: cut short
    return (f"{run_dir}: training diverged at step {status.get('step')} ({reason}); the run has no trained model; "
            "lower the learning rate (or clip gradients) and train into a new folder")


# --------------------------------------------------------------------------------------------- reading
def read_config(run_dir: "str | os.PathLike") -> RunConfig:
    """The `RunConfig` of a run folder; errors name the folder or the config file. Refuses a folder holding a
    link or special file (`check_contents`)."""
    run_dir = Path(run_dir)
    path = run_dir / CONFIG_FILE
    if not run_dir.is_dir():
        raise FileNotFoundError(f"no run folder at {run_dir} (no {path})")
    check_contents(run_dir)  # every reader starts here: no link or FIFO inside is followed or opened
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: is {run_dir} a run folder written by `train`?")
    return read_run_config(path)


def read_run_config(path: Path) -> RunConfig:
    """The `RunConfig` a run folder's config.json holds, read as a stored file: a regular file of at most
    `_io.READ_LIMITS["run config"]`, JSON nested at most `_io.MAX_JSON_DEPTH` deep, and no file it names is opened
    (a clamp file entry must carry the sha256 recorded when it was made: `clamps.stored_config`). ValueError naming
    the file otherwise."""
    try:
        with clamps.stored_config(str(path)):
            return RunConfig.from_dict(read_json(path, "run config"))
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None


def training_seq_len(run_dir: "str | os.PathLike") -> Optional[int]:
    """The training sequence length recorded in `run_dir`'s config.json (`train.seq_len`), None when the folder
    holds no readable run config (weights saved on their own).

    Args:
        run_dir: a run folder.

    Returns:
        The training length, or None.
    """
    try:
        value = read_json(Path(run_dir) / CONFIG_FILE, "run config")["train"]["seq_len"]
    except (OSError, ValueError, KeyError, TypeError):  # no run folder: the probes fall back to their default
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def run_folder_of(path: "str | os.PathLike") -> Path:
    """The run folder a weights path belongs to: `path` itself for a folder, the folder of model.safetensors, the
    run folder above checkpoints/ (or resume/) for a checkpoint's (a resume point's) weights
    (checkpoints/step_NNNNNNN.safetensors)."""
    path = Path(path)
    if path.is_dir():
        return path
    return path.parent.parent if path.parent.name in _STEP_DIRS else path.parent


def load_model(path: "str | os.PathLike", *, device: Any = None, expect: Optional[ModelConfig] = None) -> HookedModel:
    """`models.load` of a run folder's weights (final or a checkpoint's), with the training length taken from
    the run's config.json when the weights file does not record it (folders written before training recorded
    it): `models.weights_metadata(model).train_seq_len`, the probes' default length (`probes.probe_length`).

    Args:
        path: a run folder, its model.safetensors, or a checkpoint's weights file in its checkpoints/.
        device: where the model lives.
        expect: the model config the weights must have (ValueError otherwise).

    Returns:
        The hooked model.

    Raises:
        RunFolderError: the weights hold NaN or infinity (a diverged run writes none, so they are damaged; probe
            and report refuse them rather than name a mechanism).
    """
    folder = run_folder_of(path)
    if Path(path).is_dir() and not (Path(path) / WEIGHTS_FILE).exists() and (Path(path) / CONFIG_FILE).is_file():
        raise FileNotFoundError(f"no model weights at {Path(path) / WEIGHTS_FILE}: {unfinished(folder)}")
    try:
        return load(path, device=device, expect=expect, finite=True, train_seq_len=training_seq_len(folder))
    except NonFiniteWeights as err:  # a diverged run records it (status.json) and writes no final weights: damage
        where = path if not Path(path).is_dir() else Path(path) / WEIGHTS_FILE
        raise RunFolderError(
            f"{where} holds non-finite weights ({', '.join(err.keys[:3])}{' ...' if len(err.keys) > 3 else ''}) "
            f"although the run is not recorded as diverged: the file is damaged; `markov-interp train --config "
            f"{folder / CONFIG_FILE} --out {folder}` restores it from the run's checkpoints") from None


def folder_path(value: "str | os.PathLike", what: str) -> Path:
    """`value` as a folder's `Path`, refusing the empty name: `Path("")` is the current folder, so `train --out ""`
    used to train into wherever the command ran.

    >>> folder_path("", "--out")
    Traceback (most recent call last):
    ...
    ValueError: --out is empty; give a folder name (use . for the current folder)
    """
    if not isinstance(value, (str, os.PathLike)):
        raise ValueError(f"{what} must be a folder path, got {type(value).__name__} {shown(value)}")
    if not os.fspath(value).strip():
        raise ValueError(f"{what} is empty; give a folder name (use . for the current folder)")
    return Path(value)


def training_now(run_dir: "str | os.PathLike") -> bool:
    """Whether a process holds the write lock of `run_dir` now (a run being trained), without taking it."""
    path = Path(run_dir) / LOCK_FILE
    try:
        import fcntl

        fd = _open_lock(path, create=False)
    except (ModuleNotFoundError, OSError):  # no lock file: nobody has written here (or no flock: Windows)
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # a writer's exclusive lock refuses it
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def unfinished(run_dir: "str | os.PathLike") -> str:
    """Why a run folder with a config holds no final weights, for an error message: still training (who holds
    its lock) or stopped before the end (interrupted or crashed), with the last step its metrics record and the
    command that resumes it."""
    run_dir = Path(run_dir)
    steps = [row.get("step") for row in _metric_rows(run_dir)]
    last = f"metrics.jsonl records step {steps[-1]}" if steps and steps[-1] is not None else "no step recorded yet"
    if training_now(run_dir):
        return f"the run is still training ({holder(run_dir)}; {last}); wait for it to finish"
    return (f"the run has not finished and no process is training it: it was stopped or crashed ({last}); "
            f"`markov-interp train --config {run_dir / CONFIG_FILE} --out {run_dir}` resumes it (from its newest "
            "checkpoint, if any)")


def _metric_rows(run_dir: Path) -> list[dict]:
    """The readable rows of a run's metrics.jsonl (none when it is missing or torn)."""
    try:
        return load_metrics(run_dir)
    except (OSError, ValueError):
        return []


def check_writable_dir(path: "str | os.PathLike", what: str) -> Path:
    """Check before any work that `path` is (or can be created as) a folder this process can write into.

    Raises ValueError naming `what` and the path: an empty name (`folder_path`), a file in the way, a missing
    parent that cannot be created, or a folder without write permission (tested by creating and removing a file,
    which also catches read-only file systems).
    """
    path = folder_path(path, what)
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


# ------------------------------------------------------------------------------------------------ config
def _config_diff(a: dict, b: dict, prefix: str = "") -> list[str]:
    diffs = []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key, "<absent>"), b.get(key, "<absent>")
        if isinstance(va, dict) and isinstance(vb, dict):
            diffs += _config_diff(va, vb, f"{prefix}{key}.")
        elif va != vb:
            diffs.append(f"{prefix}{key}: {va!r} in folder vs {vb!r} requested")
    return diffs


def _comparable(run: RunConfig) -> dict:
    data = run.to_dict()
    for name in EXECUTION_FIELDS:  # where a run executes and how often it saves do not change what it is
        data["train"].pop(name, None)
    return data


def is_temporary(name: str) -> bool:
    """A temporary file of an atomic write (`_io.atomic_path`) or of `check_writable_dir` (`.<name>.<random>.tmp`):
    the package's in any folder it writes."""
    return name.startswith(".") and name.endswith(".tmp")


def foreign_entries(out_dir: "str | os.PathLike") -> list[str]:
    """The entries of `out_dir` (and of its checkpoints/ and resume/) that are not the package's: anything but
    `OWN_FILES`, checkpoint files (a resume point's too) and the temporary files of atomic writes. A run folder has
    none."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        return []
    foreign = [e.name for e in os.scandir(out_dir) if e.name not in OWN_FILES and not is_temporary(e.name)]
    for name in _STEP_DIRS:
        folder = out_dir / name
        if folder.is_dir() and not folder.is_symlink():
            foreign += [f"{name}/{e.name}" for e in os.scandir(folder)
                        if not (_CHECKPOINT_NAME.match(e.name) or is_temporary(e.name))]
    return sorted(foreign)


def _progress(out_dir: Path) -> list[str]:
    """What in a folder of the package's files records a run's progress: metrics rows, checkpoint or resume-point
    files, final weights, a divergence record (an empty metrics.jsonl, an empty checkpoints/ and the lock record
    none)."""
    found = []
    metrics = out_dir / METRICS_FILE
    if metrics.is_file() and metrics.stat().st_size > 0:
        found.append(f"{METRICS_FILE} rows")
    for name in _STEP_DIRS:
        folder = out_dir / name
        if folder.is_dir() and any(_CHECKPOINT_NAME.match(e.name) for e in os.scandir(folder)):
            found.append(f"{name}/ files")
    found += [name for name in (WEIGHTS_FILE, STATUS_FILE) if (out_dir / name).exists()]
    return found


def prepare(out_dir: Path, run: RunConfig) -> None:
    """Make `out_dir` the folder of `run` (call it holding the folder's `lock`), by what the folder holds:

    - nothing, or only the lock and temporary files: `run`'s config.json is written;
    - a config.json of `run` (the device and the resume cadence aside): the same run; it resumes from its newest
      checkpoint or resume point, or starts from scratch when it never reached one (a run killed before its first checkpoint, whatever else it left);
    - a config.json of another run that recorded nothing (no metrics row, checkpoint file, weights or divergence
      record) and only the package's files (`OWN_FILES`): a command refused after writing it, or killed before
      step 1; `run`'s config replaces it, with a warning;
    - anything else is refused (ValueError saying what is there): another run's progress, run files without a
      config (which run they are is unknown), or files that are not the package's and no config.
    """
    config_path = out_dir / CONFIG_FILE
    foreign = foreign_entries(out_dir)
    if not config_path.exists():
        if foreign:
            raise ValueError(f"{out_dir} holds files that are not a run's ({', '.join(foreign[:5])}"
                             f"{' ...' if len(foreign) > 5 else ''}) and no {CONFIG_FILE}; refusing to write a run "
                             "into it (give an empty or new folder)")
        progress = _progress(out_dir) if out_dir.exists() else []
        if progress:
            raise ValueError(f"{out_dir} holds run files ({', '.join(progress)}) but no {CONFIG_FILE}, so which run "
                             "they belong to is unknown; delete them (or the folder) to train a run here")
        out_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(config_path, run.to_json().encode())
        return
    try:
        saved = read_run_config(config_path)
    except ValueError as err:
        raise ValueError(f"{config_path} is not a valid run config: {str(err).removeprefix(f'{config_path}: ')}"
                         ) from None
    diffs = _config_diff(_comparable(saved), _comparable(run))
    if not diffs:
        return  # the same run: `loop` resumes it from its newest checkpoint, or from step 0
    if foreign or _progress(out_dir):
        raise ValueError(
            f"{out_dir} holds a run with a different config; refusing to overwrite it. Differences: "
            + "; ".join(diffs)
        )
    warnings.warn(f"{out_dir} holds the config.json of a run that never started (no metrics, checkpoints or "
                  "weights); replacing it with this run's", stacklevel=3)
    atomic_write(config_path, run.to_json().encode())


# ------------------------------------------------------------------------------------------------ metrics
def write_metrics(run_dir: "str | os.PathLike", rows: list[dict]) -> None:
    """Replace the folder's metrics.jsonl by `rows` (one sorted JSON object a line), atomically."""
    text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows)
    atomic_write(Path(run_dir) / METRICS_FILE, text.encode())


def load_metrics(run_dir: "str | os.PathLike") -> list[dict]:
    """The rows of a run folder's metrics.jsonl.

    A last line without its newline that is not JSON is a row torn by a crash while it was appended
    (`MetricsLog`): it is left out (a resume rewrites the file without it). Any other line that is not JSON, or
    not a metrics row (`check_metrics_row`), raises ValueError naming the file and line. The file is read as a
    stored file (`_io.read_text`: a regular file of at most `_io.READ_LIMITS["metrics file"]`).
    """
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return []
    lines = read_text(path, "metrics file").split("\n")
    rows = []
    for i, line in enumerate(lines):
        if line.strip():
            try:
                rows.append(check_metrics_row(loads_json(line, "the row")))
            except json.JSONDecodeError as err:
                if i == len(lines) - 1:  # no newline after it: torn by a crash mid-append
                    break
                raise ValueError(f"{path} line {i + 1} is not JSON: {err}") from None
            except ValueError as err:
                raise ValueError(f"{path} line {i + 1} is not a metrics row: {err}") from None
    return rows


# the row's fields that are not numbers: a divergence row's, and how a hidden source's entropy rate was found
# (`theory.ReferenceLosses.as_row`)
_ROW_KINDS = {"reason": str, "diverged": bool, "entropy_rate_method": str}


def check_metrics_row(row: Any) -> dict:
    """`row` if it is a metrics row as training writes it: a JSON object whose "step" is an integer >= 0, whose
    "diverged" is true or false, "reason" and "entropy_rate_method" strings, and whose every other value is a
    number (NaN and infinity included: a diverging run logs them) or null. ValueError naming the field otherwise
    (a row `[1, 2]`, a loss written as text: readers used to fail on them with a raw AttributeError or TypeError
    naming no file).

    >>> check_metrics_row({"step": 3, "train_loss": "0.5"})
    Traceback (most recent call last):
    ...
    ValueError: train_loss must be a number, got '0.5'
    """
    if not isinstance(row, dict):
        raise ValueError(f"a metrics row is a JSON object, got {shown(row)}")
    check_int("step", row.get("step"), minimum=0)
    for key, value in row.items():
        if key != "step":
            check_type(shown(key)[1:-1], value, _ROW_KINDS.get(key, Optional[float]))
    return row


class MetricsLog:
    """A run folder's metrics.jsonl, open for appending while the run trains: one JSON line per row.

    Opened once (`O_APPEND`, never following a link, refused unless a regular file with no other hard link), so
    logging costs O(1) per
    row whatever the run's length (the file used to be rewritten whole at every row). `sync` makes the rows
    written so far durable; training calls it before each checkpoint is written and at the end, so a checkpoint
    on disk always has its rows on disk. A crash mid-append can leave a torn last line, which `load_metrics`
    skips and a resume cuts off. ENOSPC and other write errors name the file.
    """

    def __init__(self, run_dir: "str | os.PathLike") -> None:
        self.path = check_target(Path(run_dir) / METRICS_FILE, "metrics file")
        flags = (os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
                 | getattr(os, "O_CLOEXEC", 0))
        try:
            self.fd = os.open(self.path, flags, 0o666)
        except OSError as err:
            if err.errno == errno.ELOOP:  # a link planted since the check
                check_target(self.path, "metrics file")
            raise naming_error(err, self.path) from None
        info = os.fstat(self.fd)
        try:
            if not stat.S_ISREG(info.st_mode):
                raise UnsafePath(f"metrics file {self.path} is {describe_kind(info.st_mode)}, not a regular file; "
                                 "remove it")
            check_single_link(self.path, info.st_nlink)  # appended in place: another name would change too
        except UnsafePath:
            os.close(self.fd)
            raise
        self.dirty = False

    def append(self, row: dict) -> None:
        """Write `row` as one line (sorted JSON)."""
        try:
            write_all(self.fd, json.dumps(row, sort_keys=True) + "\n")
        except OSError as err:
            raise naming_error(err, self.path) from None
        self.dirty = True

    def sync(self) -> None:
        """fsync the rows appended since the last sync."""
        if self.dirty:
            try:
                os.fsync(self.fd)
            except OSError as err:
                raise naming_error(err, self.path) from None
            self.dirty = False

    def close(self) -> None:
        """Close the file (without a sync: call `sync` first where durability matters)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
