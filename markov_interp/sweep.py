"""Sweeps: grids of training runs, run in parallel, restartable, failure-isolated, summarised in one table.

The research questions of Makkuva et al. ("Attention with Markov", arXiv 2402.04161) are about regimes:
p + q, weight tying, depth, initialisation, precision and seeds. A `SweepSpec` names a base run config and a
grid over any source / model / training option plus a list of seeds; every point of the grid is a *cell*, one
training run whose folder name is a hash of its full config (so the same cell is the same folder in every
sweep that contains it). `run(spec, out_dir)` trains every cell (a child process per cell, as many at once
as cores, one torch thread each, or Ray tasks), probes each trained model with `probes.classify_mechanism`,
and writes one tidy results table: one row per cell with its config columns, final losses, the `theory`
reference losses, the "stuck at the unigram loss" flag and the mechanism with its key probe scores.

Layout of a sweep folder:

    out_dir/spec.json             the spec(s) of the latest call (informational)
    out_dir/runs/<cell_id>/       the training run folder (see `training`): config.json, metrics.jsonl, ...
    out_dir/results/<cell_id>.json  the cell's row once finished, or its error and traceback if it failed
    out_dir/results.csv           the table (also results.parquet when pyarrow is installed)
    out_dir/.lock                 held while a sweep runs cells here (a second sweep is refused at once)

A row is typed end to end: `run_cell` returns a `CellResult` (built from `training.TrainResult.final` and the
`probes.MechanismReport`'s attributes, the latter as `ProbeColumns`), `run` returns `Row`s, and only the table
flattens them to columns (`Row.columns`); `read_table` reads them back through one typed reader
(`Row.from_columns`, each column decoded by the type of the field it holds).

Restart: a cell whose results file says "ok" (with the same probe settings) or "diverged" is not run again;
a cell that failed is retried; a cell interrupted mid-training resumes from its newest checkpoint (`training.train`).

A spec file (TOML):

    name = "pq-tied"
    seeds = [0, 1, 2]            # each grid point is trained once per seed (train.seed)

    [base.source]
    kind = "binary"
    p = 0.5
    q = 0.8

    [base.model]                 # `preset` is optional; other keys override it; d_vocab follows the source
    preset = "paper-1layer"

    [base.train]
    steps = 400
    seq_len = 256

    [grid]                       # dotted keys: source.*, model.*, train.*
    "source.p" = [0.2, 0.5, 0.8]
    "model.tie_weights" = [true, false]

    [[exclude]]                  # optional: grid points to leave out (every key given must match)
    "source.p" = 0.5
    "source.q" = 0.5
"""

import dataclasses
import functools
import hashlib
import itertools
import json
import math
import os
import time
import traceback
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Optional, Union

from transformer_lens.model_bridge import TransformerBridge

from markov_interp import dynamics
from markov_interp._io import atomic_path, atomic_write, csv_cell, csv_uncell
from markov_interp.config import Config, check_bool, check_int, check_keys
from markov_interp.data import SourceConfig
from markov_interp.models import ModelConfig
from markov_interp.probes import MechanismReport
from markov_interp.training import (RunConfig, TrainConfig, TrainResult, build_run, list_checkpoints, runfolder,
                                    split_key, stack_key, train, train_many)
from markov_interp.training.runfolder import TrainingDiverged

__all__ = [
    "SweepSpec",
    "Cell",
    "load_spec",
    "cell_id",
    "run",
    "run_cell",
    "run_stack",
    "group_cells",
    "default_group",
    "SweepResult",
    "Row",
    "CellResult",
    "ProbeColumns",
    "outcome",
    "read_table",
    "STUCK_FRACTION",
    "MIN_GAP",
]

# `outcome`: a final loss is at the "optimum" below optimum + STUCK_FRACTION * (unigram_loss - optimum), the line
# of `dynamics` (escape and stuck themselves are `dynamics`' crossings of the paired excess curve). The optimum
# is the entropy rate for a fixed kernel (the bigram / k-gram loss) and the in-context Bayes loss for random kernels.
STUCK_FRACTION = dynamics.ESCAPE_FRACTION
# Below this gap (nats) between unigram loss and optimum the two solutions are indistinguishable (p + q near
# 1 makes the chain nearly i.i.d.) and the flag is left undecided (None).
MIN_GAP = 0.005

_SECTIONS = ("source", "model", "train")
_RESULTS_DIR = "results"
_RUNS_DIR = "runs"
_TABLE = "results.csv"
_RECORD_FORMAT = 2  # results/<cell_id>.json: {"format", "status", "error", "traceback", "result", ...}


# --------------------------------------------------------------------------------------------------- spec
def _check_key(key: str, where: str) -> tuple[str, str]:
    """`training.split_key` (the one dotted-key parser) plus the sweep's rule: seeds come from `seeds`."""
    section, field = split_key(key, where=where)
    if key == "train.seed":
        raise ValueError(f"{where}: give seeds with the top-level `seeds = [...]` list, not {key!r}")
    return section, field


@dataclasses.dataclass(frozen=True, kw_only=True)
class SweepSpec(Config):
    """A grid of training runs: a base run config, a grid over dotted options and a list of seeds.

    `base` holds up to three sections, "source", "model" (optionally with a `preset` name; `d_vocab` follows
    the source unless given) and "train", each a dict of `SourceConfig` / `ModelConfig` / `TrainConfig`
    fields. `grid` maps "section.field" to the list of values to try; the cells are the Cartesian product of
    the grid times `seeds`, minus grid points matching an entry of `exclude`. `probe=False` skips
    `classify_mechanism`. Unknown keys anywhere raise ValueError naming them (serialisation and the refusal of
    unknown top-level keys come from `config.Config`; dotted keys are checked by `training.split_key`).

    >>> spec = SweepSpec(name="demo", base={"source": {"kind": "binary", "p": 0.2, "q": 0.3},
    ...                  "train": {"steps": 5, "seq_len": 16}}, grid={"model.tie_weights": [True, False]},
    ...                  seeds=(0, 1))
    >>> len(spec.cells()), sorted(spec.cells()[0].params)
    (4, ['model.tie_weights', 'seed'])
    """

    # Broad annotations on purpose: values come from user files and are validated in __post_init__.
    name: Any = "sweep"  # str: names the sweep in the table's `sweep` column
    base: Any = dataclasses.field(default_factory=dict)  # {"source": {...}, "model": {...}, "train": {...}}
    grid: Any = dataclasses.field(default_factory=dict)  # {"section.field": [values]}
    seeds: Any = (0,)  # ints >= 0 (stored as a tuple)
    exclude: Any = ()  # tables of "section.field" = value (stored as a tuple)
    probe: Any = True  # bool: run classify_mechanism on each trained model

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.base, dict):
            raise ValueError(f"base must be a table of sections {list(_SECTIONS)}, got {type(self.base).__name__}")
        unknown = sorted(set(self.base) - set(_SECTIONS))
        if unknown:
            raise ValueError(f"base: unknown sections {unknown}; expected some of {list(_SECTIONS)}")
        for section, values in self.base.items():
            if not isinstance(values, dict):
                raise ValueError(f"base.{section} must be a table of options, got {values!r}")
            for field in values:
                _check_key(f"{section}.{field}", "base")
            if section == "train" and "seed" in values:
                raise ValueError("base.train.seed: give seeds with the top-level `seeds = [...]` list")
        if not isinstance(self.grid, dict):
            raise ValueError(f"grid must be a table of 'section.field' = [values], got {type(self.grid).__name__}")
        for key, values in self.grid.items():
            _check_key(key, "grid")
            if not isinstance(values, (list, tuple)) or len(values) == 0:
                raise ValueError(f"grid: {key!r} must be a non-empty list of values, got {values!r}")
        seeds = tuple(self.seeds) if isinstance(self.seeds, (list, tuple)) else self.seeds
        if not isinstance(seeds, tuple) or not seeds:
            raise ValueError(f"seeds must be a non-empty list of integers >= 0, got {self.seeds!r}")
        for seed in seeds:
            check_int("each of seeds", seed, minimum=0)
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"seeds has duplicates: {list(seeds)}")
        object.__setattr__(self, "seeds", seeds)
        exclude = tuple(self.exclude) if isinstance(self.exclude, (list, tuple)) else self.exclude
        if not isinstance(exclude, tuple):
            raise ValueError(f"exclude must be a list of tables, got {self.exclude!r}")
        for entry in exclude:
            if not isinstance(entry, dict) or not entry:
                raise ValueError(f"exclude: each entry must be a non-empty table of 'section.field' = value, got {entry!r}")
            for key in entry:
                _check_key(key, "exclude")
        object.__setattr__(self, "exclude", exclude)
        check_bool("probe", self.probe)

    @classmethod
    def from_dict(cls, data: Any, *, where: str = "spec") -> "SweepSpec":
        """A spec from a parsed TOML / JSON table; unknown top-level keys raise ValueError naming them."""
        try:
            return cls(**check_keys(cls, data))
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None

    # -- expansion
    def cells(self) -> list["Cell"]:
        """Every cell of the grid (grid order, then seeds), each with its validated `RunConfig`."""
        keys = list(self.grid)
        cells = []
        for values in itertools.product(*(self.grid[k] for k in keys)):
            point = dict(zip(keys, values))
            if any(all(point.get(k, _base_value(self.base, k)) == v for k, v in e.items()) for e in self.exclude):
                continue
            for seed in self.seeds:
                params = {**point, "seed": seed}
                try:
                    config = _build_run(self.base, point, seed)
                except (ValueError, TypeError) as err:
                    raise ValueError(f"sweep {self.name!r}: cell {params} is not a valid run: {err}") from None
                cells.append(Cell(cell_id=cell_id(config), sweep=self.name, params=params, config=config))
        return cells


def _base_value(base: dict, key: str) -> Any:
    section, field = key.split(".")
    return base.get(section, {}).get(field, _Missing)


class _Missing:
    pass


def _build_run(base: dict, point: dict, seed: int) -> RunConfig:
    return build_run(base, {**point, "train.seed": seed}, where="cell")


def cell_id(config: RunConfig) -> str:
    """A deterministic 16-hex-digit id of a run config (sha256 of its sorted JSON, the device left out: where
    a run executes does not change what it is)."""
    data = config.to_dict()
    data["train"] = {k: v for k, v in data["train"].items() if k != "device"}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class Cell:
    """One training run of a sweep: its id, the sweep it belongs to, its grid values and its full config."""

    cell_id: str
    sweep: str
    params: dict  # the cell's grid values and seed: {"model.tie_weights": True, "seed": 0}
    config: RunConfig


def load_spec(path: "str | os.PathLike") -> SweepSpec:
    """Read a sweep spec from a TOML file (or JSON when the name ends in .json).

    Errors name the file and the bad key or value.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no sweep spec at {path}")
    text = path.read_text()
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} is not valid JSON: {err}") from None
    else:
        try:
            import tomllib
        except ModuleNotFoundError:  # Python 3.10
            try:
                import tomli as tomllib  # type: ignore[no-redef]
            except ModuleNotFoundError:
                raise ValueError(f"reading {path} needs Python >= 3.11 or the 'tomli' package") from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as err:
            raise ValueError(f"{path} is not valid TOML: {err}") from None
    data.setdefault("name", path.stem)
    return SweepSpec.from_dict(data, where=str(path))


# ------------------------------------------------------------------------------------------- outcomes
def outcome(eval_loss: float, optimum: float, unigram: float) -> Optional[str]:
    """Where a final loss sits: "optimum", "unigram" or "above" (worse than the unigram plateau: not trained).

    With gap = unigram - optimum (entropy rate, or the in-context Bayes loss for random kernels):
    "optimum" below optimum + STUCK_FRACTION * gap; "unigram" from there up to unigram + STUCK_FRACTION * gap
    (the plateau of the tied single-layer model's bad local minimum, H(pi)); "above" beyond. None when the gap
    is below MIN_GAP nats (p + q near 1: the chain is nearly i.i.d. and the two solutions coincide).

    >>> outcome(0.665, 0.619, 0.666), outcome(0.620, 0.619, 0.666), outcome(0.693, 0.619, 0.666)
    ('unigram', 'optimum', 'above')
    """
    gap = unigram - optimum
    if not math.isfinite(eval_loss) or gap < MIN_GAP:
        return None
    if eval_loss <= optimum + STUCK_FRACTION * gap:
        return "optimum"
    return "unigram" if eval_loss <= unigram + STUCK_FRACTION * gap else "above"


# ------------------------------------------------------------------------------------------------ a cell
def _probe_settings() -> dict:
    """What a cell's probe columns depend on besides the trained model: the probes' source code. A finished
    cell whose record carries other settings is probed again (its training is reused) on the next run."""
    import markov_interp.probes as probes_pkg

    digest = hashlib.sha256()
    for path in sorted(Path(probes_pkg.__file__).parent.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return {"version": 1, "probes_source": digest.hexdigest()[:16]}


def _finite(value: Any) -> Optional[float]:
    """A float, or None where there is no finite number (a NaN score: nothing to report)."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProbeColumns:
    """A cell's mechanism and key probe scores, read off `probes.classify_mechanism`'s `MechanismReport`.

    The decision and its evidence ratios, the best previous-token / induction heads' scores above chance,
    the circuit heads and their ablations, the causal evidence (the gain g_1, the kernel-swap in-context
    fraction, the circuit's faithfulness), and the kernel readout (for binary chains the learned P(1|0)
    "p_hat" and P(0|1) "q_hat", the paper's comparison with p and q). In a table: `mechanism` and
    `probe.<field>` columns.
    """

    mechanism: Optional[str]  # None when the probes offer no classifier
    order: Optional[int] = None  # k of a "kernel" or "induction" label
    confident: Optional[bool] = None
    state_ratio: Optional[float] = None
    context_ratio: Optional[float] = None
    bigram_gain: Optional[float] = None
    icl_score: Optional[float] = None
    previous_token_excess: Optional[float] = None  # the best head's (score - chance) / (1 - chance)
    induction_excess: Optional[float] = None
    previous_token_head: Optional[tuple[int, int]] = None  # (layer, head)
    induction_head: Optional[tuple[int, int]] = None
    previous_token_ablation: Optional[float] = None  # loss change when mean-ablating that head (nats)
    induction_ablation: Optional[float] = None
    circuit_confirmed: Optional[bool] = None
    readout_max_abs_error: Optional[float] = None
    readout_weighted_kl: Optional[float] = None
    p_hat: Optional[float] = None  # binary chains: learned P(1 | 0)
    q_hat: Optional[float] = None  # binary chains: learned P(0 | 1)
    gain_1: Optional[float] = None  # fraction of the in-context unigram -> bigram step climbed (`gains`)
    in_context_fraction: Optional[float] = None  # kernel swap: 0 in weights, 1 in context
    faithfulness: Optional[float] = None  # of the circuit path patching kept

    @classmethod
    def from_report(cls, report: MechanismReport) -> "ProbeColumns":
        def best(name: str) -> Optional[float]:
            values = [v for v in report.attention.excess(name).flatten().tolist() if math.isfinite(v)]
            return max(values) if values else None

        implied = report.readout.implied
        binary = tuple(implied.shape) == (2, 2)
        return cls(
            mechanism=report.mechanism,
            order=report.order,
            confident=report.confident,
            state_ratio=_finite(report.state_ratio),
            context_ratio=_finite(report.context_ratio),
            bigram_gain=_finite(report.bigram_gain),
            icl_score=_finite(report.behaviour.icl_score),
            previous_token_excess=best("previous_token"),
            induction_excess=best("induction"),
            previous_token_head=report.previous_token_head,
            induction_head=report.induction_head,
            previous_token_ablation=_finite(report.previous_token_ablation),
            induction_ablation=_finite(report.induction_ablation),
            circuit_confirmed=report.circuit_confirmed,
            readout_max_abs_error=_finite(report.readout.max_abs_error),
            readout_weighted_kl=_finite(report.readout.weighted_kl),
            p_hat=_finite(implied[0, 1]) if binary else None,
            q_hat=_finite(implied[1, 0]) if binary else None,
            gain_1=_finite(report.gains.get(1)),
            in_context_fraction=_finite(report.in_context_fraction),
            faithfulness=_finite(report.circuit.faithfulness),
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class CellResult:
    """What a finished cell adds to its row: final losses beside `theory`'s references, where the final loss
    sits (`outcome`), when the run crossed each line of `dynamics` (`crossings`: {"dwell": K, "0.9": [after,
    by], ...}; `crossing(f)` reads one) and, when probed, the mechanism (`probe`). Losses in nats.

    `escape_step`, `censored` and `stuck_at_unigram` restate the crossing at `dynamics.ESCAPE_FRACTION` (the
    `by` step, or the censoring step; censored; stuck = censored) for tables and older readers."""

    final_step: int
    final_eval_loss: float
    final_train_loss: float  # mean training loss of the last logged row
    entropy_rate: float
    unigram_loss: float
    bayes_loss: Optional[float]  # random kernels only
    excess_loss: float  # final_eval_loss - optimum (the in-context Bayes loss, else the entropy rate)
    outcome: Optional[str]
    stuck_at_unigram: Optional[bool]  # = censored (one definition)
    escape_step: Optional[int]  # the escape crossing's `by` step, or its censoring step
    probe: Optional[ProbeColumns]  # None when the sweep does not probe
    seconds: float
    censored: Optional[bool] = None  # True: no confirmed escape within the budget (see `dynamics`)
    crossings: Optional[dict] = None  # `dynamics.crossings_to_json`; None in tables written before it

    @classmethod
    def from_training(cls, result: TrainResult, probe: Optional[ProbeColumns], seconds: float) -> "CellResult":
        f = result.final
        run = dynamics.from_metrics(result.metrics)  # None: no paired evaluation, or no plateau (p + q = 1)
        escape = run.escape if run else None
        return cls(
            final_step=f.step, final_eval_loss=f.eval_loss, final_train_loss=f.train_loss,
            entropy_rate=f.entropy_rate, unigram_loss=f.unigram_loss, bayes_loss=f.bayes_loss,
            excess_loss=f.excess_loss,
            outcome=outcome(f.eval_loss, f.optimum, f.unigram_loss),
            stuck_at_unigram=escape.censored if escape else None,
            escape_step=escape.step if escape else None,
            censored=escape.censored if escape else None,
            crossings=run.to_json() if run else None,
            probe=probe, seconds=seconds,
        )

    def crossing(self, fraction: float = dynamics.ESCAPE_FRACTION) -> Optional[dynamics.StepInterval]:
        """The run's crossing of the line `fraction` (`dynamics.StepInterval`), None where not recorded.

        Tables written before `crossings` hold only `escape_step` and `censored` (the escape line, with the
        previous evaluation not recorded): they are read as the exact step they were analysed as,
        (escape_step - 1, escape_step], or censored at escape_step."""
        if self.crossings is not None:
            return dynamics.crossings_from_json(self.crossings)[0].get(float(fraction))
        if fraction != dynamics.ESCAPE_FRACTION or self.escape_step is None or self.censored is None:
            return None
        if self.censored:
            return dynamics.StepInterval(self.escape_step, None)
        return dynamics.StepInterval(self.escape_step - 1, self.escape_step)

    def to_dict(self) -> dict:
        """JSON-ready (what a cell's record file holds)."""
        return json.loads(json.dumps(dataclasses.asdict(self)))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "CellResult":
        data = dict(data)
        probe = data.pop("probe", None)
        if probe is not None:
            probe = {k: tuple(v) if k.endswith("_head") and v is not None else v for k, v in probe.items()}
            probe = ProbeColumns(**probe)
        return cls(probe=probe, **data)


def _probe(model: TransformerBridge, config: RunConfig) -> tuple[ProbeColumns, Optional[dict]]:
    """Mechanism and key probe scores of a trained model, and the full `classify_mechanism` report as a dict
    (None when the probes offer no classifier)."""
    from markov_interp import probes

    classify = getattr(probes, "classify_mechanism", None)
    if classify is None:  # probes without a classifier: record that instead of failing the cell
        return ProbeColumns(mechanism=None), None
    report = classify(model, config.source.build(), seed=0)
    return ProbeColumns.from_report(report), report.to_dict()


def run_cell(cell: Cell, runs_dir: "str | os.PathLike", *, probe: bool = True, progress: bool = False) -> CellResult:
    """Train (or load) one cell into runs_dir/<cell_id> and return its results (without error handling).

    The final evaluation loss, the last logged training loss, the reference losses of `theory` (entropy rate,
    unigram loss, in-context Bayes loss for random kernels), `outcome`, the crossings of `dynamics` (with
    `escape_step`, `censored` and `stuck_at_unigram`) and, with `probe`, the mechanism and key probe scores
    (the full report goes to results/<cell_id>.probe.json).
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
        columns, report = _probe(result.model, cell.config)
        if report is not None:
            atomic_write(Path(runs_dir).parent / _RESULTS_DIR / f"{cell.cell_id}.probe.json",
                         json.dumps(report, indent=1, sort_keys=True, default=str))
    return CellResult.from_training(result, columns, round(time.perf_counter() - start, 3))


def _execute(cell: Cell, runs_dir: str, probe: bool, cell_fn: Optional[Callable]) -> dict:
    """Run one cell, catching any exception into a failed record (this is what a worker executes)."""
    try:
        result = (cell_fn or run_cell)(cell, runs_dir, probe=probe)
        return {"status": "ok", "error": None, "traceback": None, "result": result.to_dict()}
    except TrainingDiverged as err:  # a result, not a fault: the recipe diverges on this cell (not retried)
        return {"status": "diverged", "error": str(err), "traceback": None}
    except Exception as err:  # a failing cell is recorded; the sweep goes on
        return {"status": "failed", "error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}


def run_stack(cells: Sequence[Cell], runs_dir: "str | os.PathLike", *, probes: Sequence[bool]) -> list[dict]:
    """Train compatible cells as one stacked model (`training.train_many`) into runs_dir/<cell_id> and return
    one record per cell: "ok" with its `CellResult`, or "diverged" for a member whose loss went non-finite.
    Raises if the stack does."""
    start = time.perf_counter()
    results = train_many([c.config for c in cells], [Path(runs_dir) / c.cell_id for c in cells], progress=False,
                         models_out=any(probes))  # hooked models only for the probes
    records = []
    for cell, probe, result in zip(cells, probes, results):
        if result.failed:  # the recipe diverged on this member: a result, not a fault (as solo cells)
            records.append({"status": "diverged", "error": result.failed, "traceback": None,
                            "stack_size": len(cells)})
            continue
        try:
            cell_result = _cell_result(cell, result, runs_dir, probe=probe, start=start)
            records.append({"status": "ok", "error": None, "traceback": None, "result": cell_result.to_dict(),
                            "stack_size": len(cells)})
        except Exception as err:  # a probe failing on one member fails that cell only
            records.append({"status": "failed", "error": f"{type(err).__name__}: {err}",
                            "traceback": traceback.format_exc()})
    return records


def _execute_group(cells: Sequence[Cell], runs_dir: str, probes: Sequence[bool],
                   cell_fn: Optional[Callable]) -> list[dict]:
    """Run a group of cells: one cell alone, several as a stack; a stack that raises is retried cell by cell
    (each resumes from the checkpoints its stack wrote, which are solo checkpoints), so one bad cell cannot
    fail its neighbours."""
    if len(cells) == 1:
        return [_execute(cells[0], runs_dir, probes[0], cell_fn)]
    try:
        return run_stack(cells, runs_dir, probes=probes)
    except Exception as err:
        note = f"stack of {len(cells)} raised {type(err).__name__}: {err}; retried as solo cells"
        records = [_execute(c, runs_dir, p, cell_fn) for c, p in zip(cells, probes)]
        return [{**r, "stack_note": note} for r in records]


def _execute_group_in_worker(cells: Sequence[Cell], runs_dir: str, probes: Sequence[bool],
                             cell_fn: Optional[Callable]) -> list[dict]:
    _worker_init()
    return _execute_group(cells, runs_dir, probes, cell_fn)


# Cells per stack when `group` is not given: 1 on a CPU (a stack of 8 is 1.6x faster per core in
# benchmarks/bench_many.py, about what the process pool's parallel cells already give; a cell's weights are the
# same alone or stacked, see `training.loop`), 64 on a GPU (7.4x the model-steps/s of solo runs at the paper's
# size in the prototype of ../shared/gpu-findings.md; about 13 MB of activations per member at seq 1024, batch 16).
DEFAULT_GROUP = {"cpu": 1, "cuda": 64}


def default_group(cells: Sequence[Cell]) -> int:
    """The stack size for `cells` when the caller gives none: from the device their runs ask for."""
    import torch

    devices = {c.config.train.device for c in cells}
    cuda = any(d.startswith("cuda") or (d == "auto" and torch.cuda.is_available()) for d in devices)
    return DEFAULT_GROUP["cuda" if cuda else "cpu"]


def group_cells(cells: Sequence[Cell], group: int, runs_dir: "str | os.PathLike") -> list[list[Cell]]:
    """Split cells into stacks of at most `group` compatible cells (spec order within each stack).

    Cells stack when `training.stack_key` agrees (same shapes and recipe) and their folders hold the
    same newest checkpoint step (so an interrupted stack re-forms and resumes where it stopped). A pure
    function of the cells and their folders: the local and Ray backends form the same stacks.
    """
    if group <= 1:
        return [[c] for c in cells]
    buckets: dict[Any, list[Cell]] = {}
    groups: list[list[Cell]] = []
    for c in cells:
        key = stack_key(c.config)
        found = list_checkpoints(Path(runs_dir) / c.cell_id)
        buckets.setdefault((key, found[-1][0] if found else 0), []).append(c)
    for members in buckets.values():
        groups += [members[i:i + group] for i in range(0, len(members), group)]
    return groups


def _worker_init() -> None:
    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def _execute_child(group: tuple, *, runs_dir: str, probe_for: dict, cell_fn: Optional[Callable]) -> list[dict]:
    """What a local sweep's child process runs (`_workers.supervise`): one group of cells."""
    return _execute_group_in_worker(list(group), runs_dir, [probe_for[c.cell_id] for c in group], cell_fn)


def _split_group(group: tuple) -> list[tuple]:
    """A stack whose process died is retried as solo cells (`_workers.supervise`'s split)."""
    return [(c,) for c in group] if len(group) > 1 else []


def _death_record(death: Any) -> dict:
    """The record of a cell whose worker process died on every try (`_workers.WorkerDeath`)."""
    return {"status": "failed", "error": death.describe(), "traceback": None,
            "worker_exitcode": death.exitcode, "worker_signal": death.signal}


# ------------------------------------------------------------------------------------------------ files
def _record_path(out: Path, cell: Cell) -> Path:
    return out / _RESULTS_DIR / f"{cell.cell_id}.json"


_STATUSES = ("ok", "failed", "diverged")


def _read_record(path: Path) -> Optional[dict]:
    """The record of a finished cell, or None (the cell runs again; its training is reused) when there is none
    or it cannot be used: not JSON, an older format, or valid JSON that is incomplete (a status it does not
    know, an "ok" without a readable result)."""
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text())
    except (json.JSONDecodeError, OSError, UnicodeDecodeError):
        return None  # a damaged record is treated as absent
    if not isinstance(record, dict) or record.get("format") != _RECORD_FORMAT:
        return None
    if record.get("status") not in _STATUSES:
        return None
    if record["status"] == "ok":
        try:
            CellResult.from_dict(record["result"])
        except Exception:  # missing or mistyped fields: whatever the damage, the cell runs again
            return None
    return record


def _is_done(record: Optional[dict], probe: bool, settings: dict) -> bool:
    if record is not None and record.get("status") == "diverged":
        return True  # deterministic: the same config diverges again (training refuses the folder at once)
    if record is None or record.get("status") != "ok":
        return False
    return (not probe) or record.get("probe_settings") == settings


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
    stack_size: Optional[int] = None  # cells trained together as one stacked model (None: solo)
    stack_note: Optional[str] = None  # why a stack was retried as solo cells

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

        sections: dict[str, dict] = {s: {} for s in _SECTIONS}
        params = {}
        for name in columns:
            head, _, rest = name.partition(".")
            if head in _SECTIONS:
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
    cls = {"source": SourceConfig, "model": ModelConfig, "train": TrainConfig}[section]
    return {f.name: f.type for f in dataclasses.fields(cls)}[field]


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
        return json.loads(value)
    if kinds & {list, tuple} and value.startswith("["):
        decoded = json.loads(value)
        return tuple(decoded) if tuple in kinds and list not in kinds else decoded
    if str in kinds:
        return value
    raise ValueError(f"results row {cell}: column {column!r} holds {value!r}, which is not a {annotation}")


def _row(cell: Cell, record: dict) -> Row:
    result = CellResult.from_dict(record["result"]) if record["status"] == "ok" else None
    return Row(sweep=cell.sweep, cell_id=cell.cell_id, status=record["status"], error=record.get("error"),
               params=dict(cell.params), config=cell.config, result=result,
               run_dir=str(Path(_RUNS_DIR) / cell.cell_id), stack_size=record.get("stack_size"),
               stack_note=record.get("stack_note"))


def _cell_text(value: Any) -> Any:
    """A value as a CSV / Parquet cell: lists, tuples and dicts (kernels, head coordinates, crossings) as JSON,
    None as empty."""
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value)
    return value


def _write_table(out: Path, rows: list[Row]) -> Path:
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
    path = out / _TABLE
    atomic_write(path, buffer.getvalue())
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ModuleNotFoundError:
        return path
    table = pa.Table.from_pylist([{k: _cell_text(row.get(k)) for k in columns} for row in flat])
    with atomic_path(out / "results.parquet") as tmp:
        pq.write_table(table, tmp)
    return path


def read_table(path: "str | os.PathLike") -> list[Row]:
    """The rows of a sweep's results.csv (a sweep folder or the file) as typed `Row`s (`Row.from_columns`)."""
    import csv

    path = Path(path)
    if path.is_dir():
        path = path / _TABLE
    if not path.exists():
        raise FileNotFoundError(f"no results table at {path}")
    with path.open(newline="") as handle:
        return [Row.from_columns(row) for row in csv.DictReader(handle)]


# ------------------------------------------------------------------------------------------------ engine
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
    def failed(self) -> list:
        return [r for r in self.rows if r.status not in ("ok", "diverged")]

    @property
    def diverged(self) -> list:
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


_BACKENDS = ("local", "ray")


def run(
    spec: SpecLike,
    out_dir: "str | os.PathLike",
    *,
    backend: str = "local",
    workers: Optional[int] = None,
    progress: bool = True,
    retry_failed: bool = True,
    group: Optional[int] = None,
    _cell_fn: Optional[Callable] = None,
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
    node sees. A cell whose training diverges (non-finite loss) gets status "diverged" and outcome "diverged":
    counted apart from failures (`SweepResult.n_diverged`) and not run again. `group` (default
    `default_group`: 1 on a CPU, 64 on a GPU) trains up to that many compatible cells as one stacked model
    (`training.train_many`); a stack that raises, or whose process dies, is retried cell by cell. Same seeds and
    group give the same table on either backend. Writes out_dir/results.csv (and results.parquet when pyarrow
    is present); returns the rows.
    """
    if backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {list(_BACKENDS)}, got {backend!r}")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ValueError(f"workers must be None or an integer >= 1, got {workers!r}")
    if group is not None and (isinstance(group, bool) or not isinstance(group, int) or group < 1):
        raise ValueError(f"group must be None or an integer >= 1, got {group!r}")
    specs = _as_specs(spec)
    cells = _distinct_cells(specs)
    probe_of = {s.name: s.probe for s in specs}
    out = Path(out_dir)
    # one execution per distinct run; a cell shared by two sweeps runs once (probed if any sweep asks)
    probe_for: dict[str, bool] = {}
    for c in cells:
        probe_for[c.cell_id] = probe_for.get(c.cell_id, False) or probe_of[c.sweep]
    settings = _probe_settings()
    # one sweep at a time per folder: a second is refused at once, naming the first, before it writes anything
    with runfolder.lock(out):
        runfolder.remove_stale_tmp(out, subfolders=(_RESULTS_DIR,))
        (out / _RUNS_DIR).mkdir(exist_ok=True)
        (out / _RESULTS_DIR).mkdir(exist_ok=True)
        atomic_write(out / "spec.json", json.dumps([s.to_dict() for s in specs], indent=2, sort_keys=True,
                                                   default=str))
        pending, n_skipped = _pending(cells, out, probe_for, settings, retry_failed)

        def save(c: Cell, record: dict) -> None:
            stamp = {"format": _RECORD_FORMAT, "cell_id": c.cell_id,
                     "probe_settings": settings if probe_for[c.cell_id] else None}
            atomic_write(_record_path(out, c), json.dumps({**record, **stamp}, indent=1, sort_keys=True,
                                                          default=str))

        if pending:
            runs_dir = str(out / _RUNS_DIR)
            size = 1 if _cell_fn is not None else (group if group is not None else default_group(pending))
            groups = group_cells(pending, size, runs_dir)
            if backend == "ray":
                _run_ray(groups, runs_dir, probe_for, save, progress, _cell_fn)
            else:
                _run_local(groups, runs_dir, probe_for, save, progress, workers, _cell_fn)
        rows = []
        for c in cells:
            record = _read_record(_record_path(out, c)) or {"status": "missing", "error": "no record written"}
            rows.append(_row(c, record))
        table = _write_table(out, rows)
    n_diverged = sum(1 for r in rows if r.status == "diverged")
    n_failed = sum(1 for r in rows if r.status != "ok") - n_diverged
    return SweepResult(rows=rows, table=table, n_run=len(pending), n_skipped=n_skipped, n_failed=n_failed,
                       n_diverged=n_diverged)


def _pending(cells: list[Cell], out: Path, probe_for: dict, settings: dict,
             retry_failed: bool) -> tuple[list[Cell], int]:
    """The distinct cells still to run (not done with these probe settings; failed ones unless
    `retry_failed=False`) and how many cells are skipped."""
    todo: dict[str, Cell] = {}
    n_skipped = 0
    for c in cells:
        if c.cell_id in todo:
            continue
        record = _read_record(_record_path(out, c))
        if _is_done(record, probe_for[c.cell_id], settings) or (
            record is not None and record.get("status") == "failed" and not retry_failed
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


def _bar(total: int, progress: bool, desc: str) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, disable=not progress, desc=desc, unit="cell", dynamic_ncols=True)


def _start_method() -> str:
    """fork where the platform has it (workers inherit the imported package and need no `__main__` guard in
    the caller's script; torch re-creates its thread pool in the child), spawn elsewhere."""
    import multiprocessing

    return "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"


def _run_local(groups: list[list[Cell]], runs_dir: str, probe_for: dict, save: Callable, progress: bool,
               workers: Optional[int], cell_fn: Optional[Callable]) -> None:
    asked = workers or os.cpu_count() or 1
    n = min(asked, len(groups))  # with asked > 1 even a single cell runs in a child: its death stays its own
    bar = _bar(sum(len(g) for g in groups), progress, "sweep")
    failed = 0

    def done(g: tuple, records: Optional[list], death: Any) -> None:
        nonlocal failed
        got = records if death is None else [_death_record(death)] * len(g)
        failed += _record_group(list(g), lambda: got, "", save, bar, failed)

    try:
        if asked == 1:
            for g in groups:
                run_now = lambda: _execute_group(g, runs_dir, [probe_for[c.cell_id] for c in g], cell_fn)  # noqa: E731
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


def _record_group(cells: list[Cell], get: Callable[[], list], lost: str, save: Callable, bar: Any,
                  failed: int) -> int:
    """Save the records `get()` returns for a group of cells (failure records if the worker was lost)."""
    try:
        records = get()
    except Exception as err:
        records = [{"status": "failed", "error": f"{lost}: {type(err).__name__}: {err}",
                    "traceback": traceback.format_exc()}] * len(cells)
    bad = 0
    for cell, record in zip(cells, records):
        bad += _record(cell, lambda record=record: record, lost, save, bar, failed + bad)
    return bad


def _record(cell: Cell, get: Callable[[], dict], lost: str, save: Callable, bar: Any, failed: int) -> int:
    """Save the record `get()` returns for `cell` (or a failure record if the worker was lost); 1 if it failed."""
    try:
        record = get()
    except Exception as err:
        record = {"status": "failed", "error": f"{lost}: {type(err).__name__}: {err}",
                  "traceback": traceback.format_exc()}
    save(cell, record)
    bad = int(record["status"] not in ("ok", "diverged"))
    bar.set_postfix(failed=failed + bad, refresh=False)
    bar.update(1)
    return bad


def _run_ray(groups: list[list[Cell]], runs_dir: str, probe_for: dict, save: Callable, progress: bool,
             cell_fn: Optional[Callable]) -> None:
    try:
        import ray
    except ModuleNotFoundError:
        raise ValueError("backend='ray' needs the 'ray' package (pip install 'markov-interp[ray]')") from None
    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False)
    # Ray re-runs a task whose worker died max_retries times; after that ray.get raises and only its cells fail
    task = ray.remote(num_cpus=1, max_retries=1)(_execute_group_in_worker)
    refs = {task.remote(g, runs_dir, [probe_for[c.cell_id] for c in g], cell_fn): g for g in groups}
    bar = _bar(sum(len(g) for g in groups), progress, "sweep (ray)")
    failed = 0
    try:
        remaining = list(refs)
        while remaining:
            done, remaining = ray.wait(remaining, num_returns=1)
            # a raise here means the task's worker died or Ray lost it
            lost = "worker died (Ray retried it once)"
            failed += _record_group(refs[done[0]], lambda: ray.get(done[0]), lost, save, bar, failed)
    finally:
        bar.close()
