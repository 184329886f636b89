"""A cell's record file, out_dir/results/<cell_id>.json: its status ("ok", "failed", "diverged"), error and
traceback, its `CellResult` once finished, how it was trained (stack size, why a stack was retried solo, how
its worker died) and the probe settings it was probed with. `CellRecord` is the typed record; `read_record`
the one reader (a damaged, incomplete or older-format file is treated as absent: the cell runs again and its
training is reused, with one warning naming the file); `is_done` says whether a restart may skip the cell.

The file layout is format 2 (a JSON object with sorted keys): records written before `CellRecord` read back
unchanged.
"""

import dataclasses
import hashlib
import importlib.util
import json
import re
import warnings
from pathlib import Path
from typing import Any, Optional

from markov_interp._io import atomic_write, read_json
from markov_interp.config import Checked, bounds
from markov_interp.sweep.results import CellResult

__all__ = ["CellRecord", "RECORD_FORMAT", "STATUSES", "RESULTS_DIR", "RUNS_DIR", "record_path", "read_record",
           "write_record", "is_done", "probe_settings"]

RESULTS_DIR = "results"  # out_dir/results/<cell_id>.json (and <cell_id>.probe.json)
RUNS_DIR = "runs"  # out_dir/runs/<cell_id>/: the cell's training run folder
RECORD_FORMAT = 2
STATUSES = ("ok", "failed", "diverged")


_CELL_ID = re.compile(r"^[0-9a-f]{16}$")  # `spec.cell_id`


@dataclasses.dataclass(frozen=True, kw_only=True)
class CellRecord(Checked):
    """What a cell's execution left: its status, error, traceback and, when "ok", its `CellResult`.

    "diverged" (a non-finite loss: a result of the recipe, not a fault) and "ok" are final; "failed" is retried
    by the next run unless it says `retry_failed=False`.

    The one schema of a record file (`config.Checked`: checked whenever a record is built, read or written): the
    types below; a status of `STATUSES`; a result exactly when "ok" (itself checked, `CellResult`); an error
    message when "failed" or "diverged"; a stack size >= 1; a cell id of 16 hex digits, which `read_record` also
    matches against the file's name."""

    status: str  # "ok", "failed", "diverged"
    error: Optional[str] = None
    traceback: Optional[str] = None
    result: Optional[CellResult] = None  # set exactly when status == "ok"
    stack_size: Optional[int] = bounds(minimum=1, default=None)  # cells trained together (None: solo by choice)
    stack_note: Optional[str] = None  # why a stack was retried as solo cells
    worker_exitcode: Optional[int] = None  # a worker that died on every try: its exit code and signal
    worker_signal: Optional[str] = None
    cell_id: Optional[str] = None  # stamped when written
    probe_settings: Optional[dict[str, Any]] = None  # the settings the result was probed with (None: not probed)

    def check(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"record status must be one of {list(STATUSES)}, got {self.status!r}")
        if (self.status == "ok") != (self.result is not None):
            raise ValueError(f"a record has a result exactly when its status is 'ok' (status {self.status!r})")
        if self.status != "ok" and self.error is None:
            raise ValueError(f"a {self.status!r} record must say why (its error is null)")
        if self.cell_id is not None and not _CELL_ID.match(self.cell_id):
            raise ValueError(f"cell_id must be 16 hex digits, got {self.cell_id!r}")

    @property
    def failed(self) -> bool:
        """Neither finished nor diverged."""
        return self.status == "failed"

    def to_json(self) -> dict[str, Any]:
        """The record file's object (format 2; the optional fields only when set, as before `CellRecord`)."""
        data: dict[str, Any] = {"format": RECORD_FORMAT, "status": self.status, "error": self.error,
                                "traceback": self.traceback, "cell_id": self.cell_id,
                                "probe_settings": self.probe_settings}
        if self.result is not None:
            data["result"] = self.result.to_dict()
        for name in ("stack_size", "stack_note", "worker_exitcode", "worker_signal"):
            if getattr(self, name) is not None:
                data[name] = getattr(self, name)
        return data

    @classmethod
    def from_json(cls, data: Any) -> "CellRecord":
        """The record a file's object holds, checked field by field; ValueError naming the field when it is not a
        usable format-2 record (keys this version does not know are left aside: a later version's)."""
        if not isinstance(data, dict) or data.get("format") != RECORD_FORMAT:
            raise ValueError(f"not a format-{RECORD_FORMAT} record")
        result = CellResult.from_dict(data.get("result")) if data.get("status") == "ok" else None
        fields = {f.name for f in dataclasses.fields(cls)} - {"result"}
        return cls.from_dict({**{k: v for k, v in data.items() if k in fields}, "result": result})


def failure(error: str, traceback: Optional[str] = None, **fields: Any) -> CellRecord:
    """A "failed" record."""
    return CellRecord(status="failed", error=error, traceback=traceback, **fields)


def record_path(out: Path, cell_id: str) -> Path:
    """Where a cell's record lives in the sweep folder `out`."""
    return out / RESULTS_DIR / f"{cell_id}.json"


def read_record(path: Path, *, warn: bool = False) -> Optional[CellRecord]:
    """The record of a finished cell, or None (the cell runs again; its training is reused) when there is none
    or it cannot be used: not a regular file, larger than `_io.READ_LIMITS["sweep record"]`, not JSON or nested
    deeper than `_io.MAX_JSON_DEPTH` (it used to abort the whole sweep with a RecursionError), an older format, or a
    record that fails its schema (`CellRecord`: a status it
    does not know, an "ok" without a result, a value of the wrong type or out of its range, another cell's id).

    Args:
        path: the record file (`record_path`).
        warn: say so (one warning naming the file and the problem) when a file is there but unusable; the sweep's
            first read of each record warns, later reads in the same run do not.

    Returns:
        The typed record, or None.
    """
    if not path.exists():
        return None
    try:
        record = CellRecord.from_json(read_json(path, "sweep record"))  # a regular file, bounded, depth-limited
        if record.cell_id is not None and record.cell_id != path.stem:
            raise ValueError(f"it is the record of cell {record.cell_id}")
        return record
    except (OSError, UnicodeDecodeError, ValueError) as err:  # JSONDecodeError is a ValueError
        if warn:
            warnings.warn(f"sweep record {path} is unusable ({err}); its cell runs again (its training is reused)",
                          stacklevel=3)
        return None


def write_record(out: Path, record: CellRecord) -> Path:
    """Write `record` atomically to its file.

    Args:
        out: the sweep folder.
        record: the record, stamped with its cell's id (ValueError without one).

    Returns:
        The record file's path.
    """
    if record.cell_id is None:
        raise ValueError("write_record: the record names no cell (cell_id is None)")
    return atomic_write(record_path(out, record.cell_id), json.dumps(record.to_json(), indent=1, sort_keys=True,
                                                                     default=str))


def is_done(record: Optional[CellRecord], probe: bool, settings: dict[str, Any]) -> bool:
    """Whether a restart skips the cell: diverged (deterministic: the same config diverges again), or "ok" and
    probed with `settings` when `probe`.

    Args:
        record: the cell's record (`read_record`), None when there is none.
        probe: whether this run probes the cell.
        settings: the current `probe_settings()`.

    Returns:
        True when the cell need not run.
    """
    if record is not None and record.status == "diverged":
        return True
    if record is None or record.status != "ok":
        return False
    return (not probe) or record.probe_settings == settings


def probe_settings() -> dict[str, Any]:
    """What a cell's probe columns depend on besides the trained model: the probes' source code (found without
    importing them). A finished cell whose record carries other settings is probed again (its training is
    reused) on the next run."""
    spec = importlib.util.find_spec("markov_interp.probes")
    assert spec is not None and spec.submodule_search_locations, "markov_interp.probes is a package"
    digest = hashlib.sha256()
    for path in sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return {"version": 1, "probes_source": digest.hexdigest()[:16]}
