"""The one budget and summary path of every experiment module (the paper's reproduction among them).

- `Budget`: how much compute an experiment spends (name, seeds, steps, device, `cuts`: what a reduced budget
  leaves out), validated field by field from its annotations; an experiment subclasses it with its own fields.
- `Table` and `Section`: the parts of a summary, as text (a table renders as markdown and as CSV).
- `Summary`: what a typed experiment result offers the writer (sections, figures, CSV tables, JSON, failures).
- `Provenance`: who made a summary, where and how long it took (the command, machine, device, torch and
  Python versions, precision, wall time).
- `write_summary`: summary.md (header with the provenance and the budget's cuts, then the sections),
  results.json (provenance, budget, result), the figures (PNG) and CSV tables, every file written atomically.
- `Experiment` and `run`: a registered experiment (see `markov_interp.experiments`) run into its folder, timed,
  and its summary written.
"""

import csv
import dataclasses
import functools
import io
import json
import os
import platform
import sys
import time
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Optional, Protocol, runtime_checkable

from markov_interp._io import atomic_path, atomic_write
from markov_interp.config import Config, check_fields, field_limits, scalar_kind, to_jsonable

__all__ = ["Budget", "Table", "Section", "Summary", "Provenance", "Experiment", "Finished", "write_summary",
           "render_markdown", "describe_device", "run", "smoke_note", "SMOKE", "SUMMARY_FILE", "RESULTS_FILE"]

SUMMARY_FILE = "summary.md"
RESULTS_FILE = "results.json"
_DPI = 120


# --------------------------------------------------------------------------------------------------- budget
@dataclasses.dataclass(frozen=True, kw_only=True)
class Budget(Config):
    """How much compute an experiment spends, and what a reduced budget leaves out.

    Subclass it (a frozen, keyword-only dataclass) to add an experiment's own fields. Every field is checked
    against its annotation when the budget is made (also by `replace`), by the one checker
    (`config.check_fields`): an `int` is a positive integer (or >= 0 when named in `ZERO_OK`; `Optional[int]`:
    None or a positive integer), a `float` a finite number (stored as a float), a `str` a string, a
    `tuple[X, ...]` a non-empty tuple of X (a list is stored as a tuple); a field declared with `config.bounds`
    takes those limits instead. `check()` adds a subclass's rules across fields.

    >>> Budget(name="full", seeds=16, steps=2000).replace(steps=100, name="short", cuts="100 steps")
    Budget(name='short', seeds=16, steps=100, device='auto', cuts='100 steps')
    >>> Budget(name="quick", seeds=4, steps=60)
    Traceback (most recent call last):
    ...
    ValueError: budget 'quick': cuts must say what this budget leaves out of the full one (only a budget named 'full' may leave it empty)
    """

    name: str  # "quick", "full", or any label; summary headings name it
    seeds: int  # seeds per condition (arm, grid point): a distribution over seeds needs at least two
    steps: int  # optimiser steps of the main runs (an experiment may add others)
    device: str = "auto"  # where the runs train ("auto": cuda when available, else cpu); not part of a run's id
    cuts: str = ""  # what this budget leaves out compared with the full experiment (or the paper's setup)

    ZERO_OK: ClassVar[tuple[str, ...]] = ()  # int fields that may be 0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"budget name must be a non-empty string, got {self.name!r}")
        check_fields(self, prefix=f"budget {self.name!r}: ", limits=self._limits)  # the one checker (config)
        for field in dataclasses.fields(self):
            object.__setattr__(self, field.name, _floats(getattr(self, field.name), _hints(type(self))[field.name]))
        from markov_interp.devices import check_device_name  # imports torch: not at `--help`

        check_device_name(self.device, what=f"budget {self.name!r}: device")  # the one check (devices)
        if self.seeds < 2:
            raise ValueError(f"budget {self.name!r}: seeds must be at least 2 (a distribution over seeds), "
                             f"got {self.seeds}")
        if self.name != "full" and not self.cuts.strip():
            raise ValueError(f"budget {self.name!r}: cuts must say what this budget leaves out of the full one "
                             "(only a budget named 'full' may leave it empty)")
        self.check()

    def _limits(self, field: "dataclasses.Field") -> dict[str, Any]:
        """A field's declared `config.bounds`, else the budget's rule: ints (and their lists) >= 1 (>= 0 when
        named in `ZERO_OK`, not for list items), lists non-empty, numbers finite."""
        if field_limits(field):
            return field_limits(field)
        kind = _hints(type(self))[field.name]
        listed = typing.get_origin(kind) is tuple
        least = 0 if field.name in self.ZERO_OK and not listed else 1
        return dict(minimum=least if scalar_kind(kind) is int else None, nonempty=listed)

    def check(self) -> None:
        """A subclass's rules across fields (raise ValueError naming them); none here."""

    @classmethod
    def from_dict(cls, data: Any, *, where: Optional[str] = None) -> "Budget":
        """`Config.from_dict`, JSON's lists read as the tuples a budget's list fields are (results.json's
        "budget")."""
        def tuples(value: Any) -> Any:
            return tuple(tuples(v) for v in value) if isinstance(value, list) else value

        if isinstance(data, Mapping):
            data = {k: tuples(v) for k, v in data.items()}
        return super().from_dict(data, where=where)


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _floats(value: Any, kind: Any) -> Any:
    """`value` with the numbers its annotation `kind` calls floats made floats (a budget stores 1e-2, not 0)."""
    if kind is float:
        return float(value)
    if typing.get_origin(kind) is tuple and isinstance(value, tuple):
        args = typing.get_args(kind)
        return tuple(_floats(v, args[0] if args[-1] is Ellipsis else args[i]) for i, v in enumerate(value))
    return value


# ---------------------------------------------------------------------------------------------- the summary
@dataclasses.dataclass(frozen=True)
class Table:
    """A table of text cells: `markdown()` for summary.md, `csv()` for a .csv file.

    >>> print(Table(("arm", "escaped"), (("free", "3/4"), ("clamped", "4/4"))).markdown())
    | arm | escaped |
    |---|---|
    | free | 3/4 |
    | clamped | 4/4 |
    """

    columns: Sequence[str]  # stored as a tuple
    rows: Sequence[Sequence[str]]  # stored as a tuple of tuples

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", tuple(self.columns))
        object.__setattr__(self, "rows", tuple(tuple(r) for r in self.rows))
        for row in self.rows:
            if len(row) != len(self.columns):
                raise ValueError(f"table row {row!r} has {len(row)} cells for {len(self.columns)} columns "
                                 f"{list(self.columns)}")
            bad = [c for c in row if not isinstance(c, str)]
            if bad:
                raise ValueError(f"table cells must be text (format them first), got {bad!r}")

    def markdown(self) -> str:
        """A markdown table ("(no rows)" when empty)."""
        if not self.rows:
            return "(no rows)"
        lines = ["| " + " | ".join(self.columns) + " |", "|" + "---|" * len(self.columns)]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in self.rows]
        return "\n".join(lines)

    def csv(self) -> str:
        """The table as CSV text (a header line, then one line per row)."""
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(self.columns)
        writer.writerows(self.rows)
        return buffer.getvalue()


@dataclasses.dataclass(frozen=True)
class Section:
    """A part of summary.md: a heading (none when `title` is ""), text, a table, text after it and the figures
    (file names written beside summary.md) shown at its end. `id` names it for readers that pick one section of a
    result (the docs' rendered blocks, `tools.findings`): a title is wording and may change, an id does not."""

    title: str = ""
    text: str = ""
    table: Optional[Table] = None
    after: str = ""
    figures: tuple[str, ...] = ()
    id: str = ""  # a stable name ("formation"); "" for a section no reader picks

    def markdown(self) -> str:
        parts = [f"## {self.title}"] if self.title else []
        parts += [p for p in (self.text, self.table.markdown() if self.table else "", self.after) if p]
        parts += [f"![{Path(name).stem}]({name})" for name in self.figures]
        return "\n\n".join(parts)


@runtime_checkable
class Summary(Protocol):
    """What an experiment's typed result (a frozen dataclass) offers `write_summary`.

    Subclass it explicitly to inherit the defaults of `figures` and `tables` (none)."""

    @property
    def failed(self) -> int:
        """Runs (or cells) that failed: a summary with failures makes the command exit with code 1."""
        ...

    def sections(self) -> Sequence[Section]:
        """The parts of summary.md after its header, in order."""
        ...

    def to_json(self) -> dict:
        """Everything results.json holds of the result (every seed's numbers; JSON-ready)."""
        ...

    def figures(self) -> Mapping[str, Any]:
        """Matplotlib figures by file name ("survival.png"), written beside summary.md."""
        return {}

    def tables(self) -> Mapping[str, Table]:
        """CSV tables by file name ("summary.csv"), written beside summary.md."""
        return {}


def describe_device(device: str) -> str:
    """Where runs asking for `device` train in this process: "cpu" or "cuda (GPU NAME)"."""
    import torch

    from markov_interp.training import resolve_device

    resolved = resolve_device(device)
    return f"cuda ({torch.cuda.get_device_name(resolved)})" if resolved.type == "cuda" else resolved.type


@dataclasses.dataclass(frozen=True, kw_only=True)
class Provenance:
    """Who made a summary, where, and how long it took (the header of summary.md, "provenance" in results.json)."""

    command: str  # the command line that made it
    machine: str  # architecture and CPU cores
    device: str  # `describe_device` of the runs' device
    torch: str
    python: str
    precision: str  # of the runs, as the experiment states it ("fp32", or which runs used what)
    seconds: float  # wall time of the call that wrote the summary

    @classmethod
    def capture(cls, *, command: str, device: str, precision: str, seconds: float) -> "Provenance":
        """This process's machine and versions, with what the caller knows.

        Args:
            command: the command line (`python -m ...` or `markov-interp ...`).
            device: the runs' device setting ("auto", "cpu", "cuda:1"), described as where it resolves here.
            precision: the runs' precision.
            seconds: wall time of the call.

        Returns:
            The provenance."""
        import torch

        return cls(command=command, machine=f"{platform.machine()} with {os.cpu_count()} CPU cores",
                   device=describe_device(device), torch=torch.__version__, python=sys.version.split()[0],
                   precision=precision, seconds=round(float(seconds), 1))

    def describe(self) -> str:
        """One sentence for the top of summary.md."""
        return (f"Made by `{self.command}` on {self.machine}, device {self.device}, torch {self.torch}, Python "
                f"{self.python}, precision {self.precision}; wall time {self.seconds / 60:.1f} min.")


SMOKE = "smoke: does not test the claims"
SMOKE_BUDGET = "quick"  # a budget of this name checks that the code path runs: its numbers are not findings


def smoke_note(budget_name: str) -> Optional[str]:
    """The line at the top of a summary made at the quick budget (None for any other budget).

    >>> smoke_note("quick").startswith("**smoke: does not test the claims.** The quick budget checks")
    True
    >>> smoke_note("full") is None
    True
    """
    if budget_name != SMOKE_BUDGET:
        return None
    return (f"**{SMOKE}.** The quick budget checks that the code path runs end to end; its numbers are not findings "
            "(read those from a standard or full budget).")


def render_markdown(title: str, provenance: Provenance, budget: Budget, sections: Sequence[Section]) -> str:
    """summary.md's text: "# TITLE (BUDGET)", at the quick budget the smoke note (`smoke_note`), the provenance,
    the budget's cuts, then the sections."""
    head = [f"# {title} ({budget.name})", *filter(None, [smoke_note(budget.name)]), provenance.describe()]
    if budget.cuts:
        head.append(f"Budget: {budget.cuts.rstrip('.')}.")
    return "\n\n".join(head + [s.markdown() for s in sections if s.markdown()]) + "\n"


def write_summary(out_dir: "str | os.PathLike", *, title: str, provenance: Provenance, budget: Budget,
                  summary: Summary) -> list[Path]:
    """Write a result's summary.md, results.json, figures and CSV tables into `out_dir`, each atomically.

    Args:
        out_dir: the folder (created when absent).
        title: summary.md's heading.
        provenance: the header (`Provenance.capture`).
        budget: the budget the result was made at (its cuts are stated; results.json holds all its fields).
        summary: the typed result.

    Returns:
        The paths written: summary.md, results.json, then figures and tables in their order.
    """
    out = Path(out_dir)
    files = [atomic_write(out / SUMMARY_FILE, render_markdown(title, provenance, budget, summary.sections()))]
    data = {"title": title, "provenance": dataclasses.asdict(provenance), "budget": budget.to_dict(),
            "result": summary.to_json()}
    files.append(atomic_write(out / RESULTS_FILE, json.dumps(to_jsonable(data), indent=1, default=_json_default)))
    for name, fig in summary.figures().items():
        with atomic_path(out / name) as tmp:
            fig.savefig(tmp, format="png", dpi=_DPI, bbox_inches="tight")
        files.append(out / name)
    files += [atomic_write(out / name, table.csv()) for name, table in summary.tables().items()]
    return files


def _json_default(value: Any) -> Any:
    """What `json` cannot write itself: dataclasses as dicts, anything else (paths) as text."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return str(value)


# ------------------------------------------------------------------------------------------- an experiment
@dataclasses.dataclass(frozen=True, kw_only=True)
class Experiment:
    """A registered experiment: its name, title, budgets and the function that runs it.

    `run(budget, out_dir, progress=...)` trains every run under out_dir (run folders there, so a rerun reuses
    what is finished) and returns the typed result (a `Summary`)."""

    name: str  # the registry key and the folder name under --out: lower case, digits and "-"
    title: str  # summary.md's heading
    budgets: Mapping[str, Budget]  # at least "quick" and "full"
    run: Callable[..., Summary]
    precision: str = "fp32"  # of its runs, stated in the header
    # read(budget, results.json's "result") -> the typed result with every statistic recomputed from the per-run
    # rows by the current code, no training (`experiments.load`); None: the experiment cannot be read back
    read: Optional[Callable[[Budget, Mapping[str, Any]], Summary]] = None
    # remeasure(budget, out_dir, progress=...) -> the typed result measured again, no training, from the final
    # weights kept beside out_dir's results.json (`_weights`); None: the experiment keeps no weights
    remeasure: Optional[Callable[..., Summary]] = None

    def __post_init__(self) -> None:
        if not self.name or not all(c.isalnum() and not c.isupper() or c == "-" for c in self.name):
            raise ValueError(f"experiment name must be lower case letters, digits and '-', got {self.name!r}")
        missing = {"quick", "full"} - set(self.budgets)
        if missing:
            raise ValueError(f"experiment {self.name!r}: budgets lack {sorted(missing)} (give 'quick' and 'full')")
        for key, budget in self.budgets.items():
            if not isinstance(budget, Budget):
                raise ValueError(f"experiment {self.name!r}: budget {key!r} is not a Budget, got {budget!r}")
        object.__setattr__(self, "budgets", dict(self.budgets))

    def budget(self, name: str = "full", **changes: Any) -> Budget:
        """The budget `name` with `changes` (validated; unknown fields raise ValueError naming them)."""
        if name not in self.budgets:
            raise ValueError(f"experiment {self.name!r} has no budget {name!r}; it has {sorted(self.budgets)}")
        budget = self.budgets[name]
        try:
            return budget.replace(**changes) if changes else budget
        except ValueError as err:
            raise ValueError(f"experiment {self.name!r}: {err}") from None


@dataclasses.dataclass(frozen=True)
class Finished:
    """What `run` returns: the experiment's typed result, the budget and provenance, and the files written."""

    name: str
    budget: Budget
    result: Summary
    provenance: Provenance
    files: tuple[Path, ...]

    @property
    def failed(self) -> int:
        return self.result.failed


def run(experiment: Experiment, out_dir: "str | os.PathLike", *, budget: Optional[Budget] = None,
        command: Optional[str] = None, progress: bool = False, remeasure: bool = False, **options: Any) -> Finished:
    """Run `experiment` into `out_dir` (its run folders and its summary), timed, and write its summary.

    Args:
        experiment: the experiment (`markov_interp.experiments.get(name)`).
        out_dir: its folder: run folders under it (a rerun reuses finished runs), summary.md, results.json, figures.
        budget: default its "full" budget.
        command: the command line named in the header (default a `python -m markov_interp.experiments` line).
        progress: progress bars while training.
        remeasure: measure and classify again from the weights kept beside out_dir's results.json, with no
            training (`Experiment.remeasure`; give the file's budget), and write the summary anew.
        options: passed on to the experiment's run function, for the options of its own (the reproduction's
            sweep folder, backend, workers and group: `markov-interp reproduce`).

    Returns:
        The result, budget, provenance and files (`Finished`).
    """
    budget = budget if budget is not None else experiment.budget("full")
    if remeasure and experiment.remeasure is None:
        raise ValueError(f"experiment {experiment.name!r} keeps no weights: it cannot be measured again (--remeasure)")
    start = time.perf_counter()
    if remeasure:
        result = experiment.remeasure(budget, Path(out_dir), progress=progress)
    else:
        result = experiment.run(budget, Path(out_dir), progress=progress, **options)
    seconds = time.perf_counter() - start
    command = command or (f"python -m markov_interp.experiments --only {experiment.name}"
                          + ("" if budget.name == "full" else f" --budget {budget.name}"))
    provenance = Provenance.capture(command=command, device=budget.device, precision=experiment.precision,
                                    seconds=seconds)
    files = write_summary(out_dir, title=experiment.title, provenance=provenance, budget=budget, summary=result)
    return Finished(experiment.name, budget, result, provenance, tuple(files))
