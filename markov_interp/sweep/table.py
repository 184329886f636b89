"""The results table: one typed `Row` per cell (its sweep, id, status, grid values, run config and, once
finished, its `CellResult`), flattened to columns only where the table is written (results.csv, and
results.parquet when pyarrow is installed) and read back through one typed reader (`Row.from_columns`, each
column decoded by the type of the field it holds; tables written by older versions read too)."""

import dataclasses
import io
import json
import os
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional, Union

from markov_interp._io import atomic_path, atomic_write, csv_cell, csv_uncell, loads_json, read_text
from markov_interp._display import displayed, headline
from markov_interp.config import shown
from markov_interp.sources import source_config_class, source_kinds, source_options
from markov_interp.models import ModelConfig
from markov_interp.sweep.records import RUNS_DIR, CellRecord
from markov_interp.sweep.results import CellResult, ProbeColumns
from markov_interp.sweep.spec import SECTIONS, Cell, cell_id
from markov_interp.runs import RunConfig, TrainConfig, split_key

__all__ = ["Row", "read_table", "write_table", "TABLE"]

TABLE = "results.csv"


@displayed(line=lambda r: f"{r.sweep}/{r.cell_id} {r.status}: " + (r.error or "") + (headline(r.result) if r.result else ""))
@dataclasses.dataclass(frozen=True, kw_only=True)
class Row:
    """One cell of a sweep as the results table holds it: its sweep, id, status, grid values, run config and,
    once finished, its `CellResult`.

    `columns()` flattens it to the table's columns (`param.<key>`, `source.*`, `model.*`, `train.*`, the
    result's fields, `mechanism` and `probe.*`); `Row.from_columns` is the one reader back (`read_table`),
    decoding each column by the type of the field it holds.
    """

    sweep: str
    cell_id: str
    status: str  # "ok", "failed", "diverged" (error says at which step) or "missing"
    error: Optional[str]
    params: dict  # grid values and seed: {"model.tie_weights": True, "seed": 0}
    config: RunConfig
    result: Optional[CellResult]  # None unless status == "ok"
    run_dir: str  # the run folder, relative to the sweep folder
    stack_size: Optional[int] = None  # cells trained as one stacked model (None: solo; 1: a stack retried solo)
    stack_note: Optional[str] = None  # why a stack was retried as solo cells

    @classmethod
    def of(cls, cell: Cell, record: Optional[CellRecord]) -> "Row":
        """The row of `cell` from its record (status "missing" when none was written)."""
        common = dict(sweep=cell.sweep, cell_id=cell.cell_id, params=dict(cell.params), config=cell.config,
                      run_dir=str(Path(RUNS_DIR) / cell.cell_id))
        if record is None:
            return cls(status="missing", error="no record written", result=None, **common)
        return cls(status=record.status, error=record.error, result=record.result, stack_size=record.stack_size,
                   stack_note=record.stack_note, **common)

    def columns(self) -> dict[str, Any]:
        """The row as flat table columns (None where a value is absent)."""
        out: dict[str, Any] = {"sweep": self.sweep, "cell_id": self.cell_id, "status": self.status,
                               "error": self.error}
        out.update({f"param.{k}": v for k, v in self.params.items()})
        if self.result is not None:
            for f in dataclasses.fields(CellResult):
                if f.name != "probe":
                    out[f.name] = getattr(self.result, f.name)
            if self.result.probe is not None:
                for f in dataclasses.fields(ProbeColumns):
                    name = f.name if f.name == "mechanism" else f"probe.{f.name}"
                    out[name] = getattr(self.result.probe, f.name)
        for section, values in self.config.to_dict().items():
            out.update({f"{section}.{k}": v for k, v in values.items()})
        out["run_dir"] = self.run_dir
        out["stack_size"], out["stack_note"] = self.stack_size, self.stack_note
        return out

    @classmethod
    def from_columns(cls, columns: Mapping[str, Any]) -> "Row":
        """The row written as `columns` (CSV text or values); the config columns must give back the cell id."""
        cell = columns.get("cell_id")

        def get(name: str, kind: Any) -> Any:
            return _decode(columns.get(name), kind, name, cell)

        sections: dict[str, dict] = {s: {} for s in SECTIONS}
        params = {}
        for name in columns:
            head, _, rest = name.partition(".")
            if head in SECTIONS:
                if columns[name] in ("", None) and _is_later(name):
                    continue  # a row whose config left out a later field (`Config._LATER_FIELDS`): its default
                sections[head][rest] = get(name, _field_type(name))
            elif head == "param":
                params[rest] = get(name, _field_type("train.seed" if rest == "seed" else rest))
        config = RunConfig.from_dict(sections)
        if cell_id(config) != cell:
            raise ValueError(f"results row {cell}: its config columns give another cell id ({cell_id(config)})")
        result = None
        if get("status", str) == "ok":
            probe = None
            if columns.get("mechanism") not in (None, ""):
                probe = ProbeColumns(**{f.name: get(f.name if f.name == "mechanism" else f"probe.{f.name}", f.type)
                                        for f in dataclasses.fields(ProbeColumns)})
            result = CellResult(probe=probe, **{f.name: get(f.name, f.type) for f in dataclasses.fields(CellResult)
                                                if f.name != "probe"})
        return cls(sweep=get("sweep", str), cell_id=cell, status=get("status", str), error=get("error", Optional[str]),
                   params=params, config=config, result=result, run_dir=get("run_dir", str),
                   stack_size=get("stack_size", Optional[int]), stack_note=get("stack_note", Optional[str]))


def _field_type(key: str) -> Any:
    """The annotation of the run-config field a dotted key names ("model.preset": str)."""
    section, field = split_key(key, where="results table")
    if (section, field) == ("model", "preset"):
        return str
    if section == "source":  # the options of every source kind (a table may mix kinds)
        return source_options()[field]
    cls = {"model": ModelConfig, "train": TrainConfig}[section]
    return {f.name: f.type for f in dataclasses.fields(cls)}[field]


def _is_later(key: str) -> bool:
    """Whether a dotted key names a field a config leaves out of its JSON at its default (`_LATER_FIELDS`): a
    table mixing runs that set it with runs that do not holds an empty cell for the latter (tables used to read
    that cell as None, which `source.zero_diagonal` or `train.eval_log_points` refuse)."""
    section, field = split_key(key, where="results table")
    classes = ([source_config_class(kind) for kind in source_kinds()] if section == "source"
               else [{"model": ModelConfig, "train": TrainConfig}[section]])
    return any(field in getattr(cls, "_LATER_FIELDS", {}) for cls in classes)


def _kinds(annotation: Any) -> set:
    """The plain types an annotation admits (Optional[int] -> {int, NoneType}, tuple[int, int] -> {tuple})."""
    if annotation is Any:
        return {bool, int, float, list, str, type(None)}
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        return set().union(*(_kinds(a) for a in typing.get_args(annotation)))
    if origin is not None:
        return {origin}
    return {annotation}


def _decode(value: Any, annotation: Any, column: str, cell: Optional[str]) -> Any:
    """A table cell back to the value of the field it holds: CSV text decoded by the field's type."""
    if not isinstance(value, str):
        return value
    if value.startswith("'"):  # quoted text (`_io.csv_cell`): only strings are quoted
        return csv_uncell(value)
    kinds = _kinds(annotation)
    if value == "":
        return None
    if bool in kinds and value in ("True", "False"):
        return value == "True"
    for kind in (int, float):
        if kind in kinds:
            try:
                return kind(value)
            except ValueError:
                pass
    if value == "null" and str not in kinds:  # tables written before typed rows stored absent heads as JSON null
        return None
    if dict in kinds and value.startswith("{"):  # the crossings column
        return loads_json(value, f"results row {cell}: column {column!r}")
    if kinds & {list, tuple} and value.startswith("["):
        decoded = loads_json(value, f"results row {cell}: column {column!r}")
        return tuple(decoded) if tuple in kinds and list not in kinds else decoded
    if str in kinds:
        return value
    raise ValueError(f"results row {cell}: column {column!r} holds {shown(value)}, which is not a {annotation}")


def _parquet_rows(flat: list[dict], columns: list[str]) -> list[dict]:
    """The rows as Parquet cells. A Parquet column has one type, so a column mixing text with numbers (a grid over
    `model.n_heads` holds 2 and [2, 1], the list as JSON text) is JSON text throughout, as the CSV holds it."""
    cells = [{k: _cell_text(row.get(k)) for k in columns} for row in flat]
    for k in columns:
        kinds = {type(c[k]) for c in cells if c[k] is not None}
        if str in kinds and len(kinds) > 1:
            for c in cells:
                if c[k] is not None and not isinstance(c[k], str):
                    c[k] = json.dumps(c[k])
    return cells


def _cell_text(value: Any) -> Any:
    """A value as a CSV / Parquet cell: lists, tuples and dicts (kernels, head coordinates, crossings) as JSON,
    None as empty."""
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value)
    return value


def write_table(out: Path, rows: list[Row]) -> Path:
    """Write `rows` as out/results.csv (text a spreadsheet would run as a formula is quoted) and, when pyarrow is
    installed, out/results.parquet; both atomically.

    Args:
        out: the sweep folder.
        rows: the rows, in table order.

    Returns:
        The path of results.csv.
    """
    import csv
    import io

    flat = [row.columns() for row in rows]
    columns: list[str] = []
    for row in flat:
        columns += [key for key in row if key not in columns]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in flat:
        # text a spreadsheet would run as a formula (a sweep named "=cmd|...") is quoted; _decode unquotes it
        writer.writerow({k: "" if row.get(k) is None else csv_cell(_cell_text(row[k])) for k in columns})
    path = out / TABLE
    atomic_write(path, buffer.getvalue())
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ModuleNotFoundError:
        return path
    table = pa.Table.from_pylist(_parquet_rows(flat, columns))
    with atomic_path(out / "results.parquet") as tmp:
        pq.write_table(table, tmp)
    return path


def read_table(path: "str | os.PathLike") -> list[Row]:
    """The rows of a sweep's results.csv as typed `Row`s (`Row.from_columns`).

    Args:
        path: a sweep folder or its results.csv.

    Returns:
        The rows in table order. FileNotFoundError without a table; ValueError for a row that does not decode
        (naming the cell and column) or whose config columns give another cell id.
    """
    import csv

    path = Path(path)
    if path.is_dir():
        path = path / TABLE
    if not path.exists():
        raise FileNotFoundError(f"no results table at {path}")
    text = read_text(path, "results table")  # a regular file, bounded
    return [Row.from_columns(row) for row in csv.DictReader(io.StringIO(text, newline=""))]
