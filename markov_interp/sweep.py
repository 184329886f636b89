"""Sweeps: grids of training runs, run in parallel, restartable, failure-isolated, summarised in one table.

The research questions of Makkuva et al. ("Attention with Markov", arXiv 2402.04161) are about regimes:
p + q, weight tying, depth, initialisation, precision and seeds. A `SweepSpec` names a base run config and a
grid over any source / model / training option plus a list of seeds; every point of the grid is a *cell*, one
training run whose folder name is a hash of its full config (so the same cell is the same folder in every
sweep that contains it). `run(spec, out_dir)` trains every cell (a process pool using all cores, one torch
thread each, or Ray tasks), probes each trained model with `probes.classify_mechanism`, and writes one tidy
results table: one row per cell with its config columns, final losses, the `theory` reference losses, the
"stuck at the unigram loss" flag and the mechanism with its key probe scores.

Layout of a sweep folder:

    out_dir/spec.json             the spec(s) of the latest call (informational)
    out_dir/runs/<cell_id>/       the training run folder (see `training`): config.json, metrics.jsonl, ...
    out_dir/results/<cell_id>.json  the cell's row once finished, or its error and traceback if it failed
    out_dir/results.csv           the table (also results.parquet when pyarrow is installed)

Restart: a cell whose results file says "ok" (with the same probe settings) is not run again; a cell that
failed is retried; a cell interrupted mid-training resumes from its newest checkpoint (`training.train`).

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
import hashlib
import itertools
import json
import math
import os
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Optional

from markov_interp._io import atomic_path, atomic_write

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
    "stuck_at_unigram",
    "outcome",
    "escape_step",
    "read_table",
    "STUCK_FRACTION",
    "MIN_GAP",
]

# A run is "stuck at the unigram loss" when its final evaluation loss lies closer to the unigram loss than to
# the optimum: eval_loss > optimum + STUCK_FRACTION * (unigram_loss - optimum). The optimum is the entropy
# rate for a fixed kernel (the bigram / k-gram loss) and the in-context Bayes loss for random kernels.
STUCK_FRACTION = 0.5
# Below this gap (nats) between unigram loss and optimum the two solutions are indistinguishable (p + q near
# 1 makes the chain nearly i.i.d.) and the flag is left undecided (None).
MIN_GAP = 0.005

_TOP_KEYS = ("name", "seeds", "base", "grid", "exclude", "probe")
_SECTIONS = ("source", "model", "train")
_RESULTS_DIR = "results"
_RUNS_DIR = "runs"
_TABLE = "results.csv"


# --------------------------------------------------------------------------------------------------- spec
def _fields(section: str) -> set[str]:
    from markov_interp.data import SourceConfig
    from markov_interp.models import ModelConfig
    from markov_interp.training import TrainConfig

    cls = {"source": SourceConfig, "model": ModelConfig, "train": TrainConfig}[section]
    names = {f.name for f in dataclasses.fields(cls)}
    if section == "model":
        names.add("preset")
    return names


def _check_key(key: str, where: str) -> tuple[str, str]:
    if not isinstance(key, str) or key.count(".") != 1:
        raise ValueError(
            f"{where}: key {key!r} must be 'section.field' with section one of {list(_SECTIONS)} "
            "(e.g. 'source.p', 'model.n_layers', 'train.lr')"
        )
    section, field = key.split(".")
    if section not in _SECTIONS:
        raise ValueError(f"{where}: key {key!r} has unknown section {section!r}; expected one of {list(_SECTIONS)}")
    valid = _fields(section)
    if field not in valid:
        raise ValueError(f"{where}: key {key!r} names no {section} option; valid {section} options are {sorted(valid)}")
    if key == "train.seed":
        raise ValueError(f"{where}: give seeds with the top-level `seeds = [...]` list, not {key!r}")
    return section, field


@dataclasses.dataclass(frozen=True, kw_only=True)
class SweepSpec:
    """A grid of training runs: a base run config, a grid over dotted options and a list of seeds.

    `base` holds up to three sections, "source", "model" (optionally with a `preset` name; `d_vocab` follows
    the source unless given) and "train", each a dict of `SourceConfig` / `ModelConfig` / `TrainConfig`
    fields. `grid` maps "section.field" to the list of values to try; the cells are the Cartesian product of
    the grid times `seeds`, minus grid points matching an entry of `exclude`. `probe=False` skips
    `classify_mechanism`. Unknown keys anywhere raise ValueError naming them.

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
        if not isinstance(seeds, tuple) or not seeds or not all(
            isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds
        ):
            raise ValueError(f"seeds must be a non-empty list of integers >= 0, got {self.seeds!r}")
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
        if not isinstance(self.probe, bool):
            raise ValueError(f"probe must be true or false, got {self.probe!r}")

    # -- serialisation
    def to_dict(self) -> dict:
        return {"name": self.name, "base": self.base, "grid": {k: list(v) for k, v in self.grid.items()},
                "seeds": list(self.seeds), "exclude": [dict(e) for e in self.exclude], "probe": self.probe}

    @classmethod
    def from_dict(cls, data: dict, *, where: str = "spec") -> "SweepSpec":
        """A spec from a parsed TOML / JSON table; unknown top-level keys raise ValueError naming them."""
        if not isinstance(data, dict):
            raise ValueError(f"{where}: a sweep spec must be a table, got {type(data).__name__}")
        unknown = sorted(set(data) - set(_TOP_KEYS))
        if unknown:
            raise ValueError(f"{where}: unknown keys {unknown}; valid top-level keys are {list(_TOP_KEYS)}")
        try:
            return cls(**data)
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


def _build_run(base: dict, point: dict, seed: int) -> Any:
    from markov_interp.data import SourceConfig
    from markov_interp.models import ModelConfig, preset
    from markov_interp.training import RunConfig, TrainConfig

    merged = {s: dict(base.get(s, {})) for s in _SECTIONS}
    for key, value in point.items():
        section, field = key.split(".")
        merged[section][field] = value
    source = SourceConfig.from_dict(merged["source"]) if merged["source"] else SourceConfig(kind="binary", p=0.2, q=0.3)
    model_opts = merged["model"]
    model_opts.setdefault("d_vocab", source.vocab_size)
    name = model_opts.pop("preset", None)
    model = preset(name, **model_opts) if name is not None else ModelConfig.from_dict(model_opts)
    train = TrainConfig.from_dict({**merged["train"], "seed": seed})
    return RunConfig(source=source, model=model, train=train)


def cell_id(config: Any) -> str:
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
    params: dict
    config: Any  # training.RunConfig


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


def stuck_at_unigram(eval_loss: float, optimum: float, unigram: float) -> Optional[bool]:
    """Whether a final loss sits on the unigram plateau: `outcome(...) == "unigram"` (None when undecidable).

    The loss is closer to the unigram loss H(pi) (the tied single-layer model's bad local minimum) than to the
    optimum, and not further above H(pi) than STUCK_FRACTION of the gap (a run still above the plateau has
    not learned even pi and is not called stuck).

    >>> stuck_at_unigram(0.665, 0.619, 0.666), stuck_at_unigram(0.620, 0.619, 0.666)
    (True, False)
    """
    label = outcome(eval_loss, optimum, unigram)
    return None if label is None else label == "unigram"


def escape_step(rows: Sequence[dict], optimum: float, unigram: float) -> Optional[int]:
    """The first logged step whose mean training loss is below the midpoint between the unigram loss and the
    optimum and stays below it in every later row (when a run leaves the unigram plateau); None if never, or
    when the two losses are closer than MIN_GAP."""
    if unigram - optimum < MIN_GAP:
        return None
    mid = optimum + STUCK_FRACTION * (unigram - optimum)
    losses = [(r["step"], r["train_loss"]) for r in rows if "train_loss" in r]
    escape = None
    for step, loss in losses:
        if loss < mid:
            if escape is None:
                escape = step
        else:
            escape = None
    return escape


# ------------------------------------------------------------------------------------------------ a cell
def _probe_settings() -> dict:
    """What a cell's probe columns depend on besides the trained model: the probes' source code. A finished
    cell whose record carries other settings is probed again (its training is reused) on the next run."""
    import markov_interp.probes as probes_pkg

    digest = hashlib.sha256()
    for path in sorted(Path(probes_pkg.__file__).parent.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return {"version": 1, "probes_source": digest.hexdigest()[:16]}


def _flat(prefix: str, data: Any, out: dict) -> None:
    """Flatten scalars of a nested dict into `out` with dotted keys (lists of scalars kept as JSON text)."""
    if isinstance(data, dict):
        for key, value in data.items():
            _flat(f"{prefix}.{key}" if prefix else str(key), value, out)
    elif data is None or isinstance(data, (bool, int, float, str)):
        out[prefix] = data
    elif isinstance(data, (list, tuple)):
        out[prefix] = json.dumps(data)


def _probe(model: Any, config: Any) -> tuple[dict, Optional[dict]]:
    """Mechanism and key probe scores of a trained model (columns `mechanism`, `probe.*`), and the full
    `classify_mechanism` report as a dict (None when the probes offer no classifier)."""
    from markov_interp import probes

    classify = getattr(probes, "classify_mechanism", None)
    if classify is None:  # probes without a classifier: record that instead of failing the cell
        return {"mechanism": None}, None
    report = classify(model, config.source.build(), seed=0).to_dict()
    return _probe_columns(report), report


def _probe_columns(report: dict) -> dict:
    """The table's probe columns: the decision, its evidence ratios, the circuit heads and the kernel readout
    (for binary chains the learned P(1|0) and P(0|1), the paper's "p_hat" beside p and pi_1)."""
    heads = report.get("heads") or {}
    readout = report.get("readout") or {}

    def best(name: str) -> Optional[float]:
        grid = heads.get(f"{name}_excess")
        values = [v for row in grid for v in row] if isinstance(grid, list) else []
        return max(values) if values else None

    implied = readout.get("implied")
    out = {
        "mechanism": report.get("mechanism"),
        "probe.confident": report.get("confident"),
        "probe.state_ratio": report.get("state_ratio"),
        "probe.context_ratio": report.get("context_ratio"),
        "probe.bigram_gain": report.get("bigram_gain"),
        "probe.icl_score": report.get("icl_score"),
        "probe.previous_token_excess": best("previous_token"),
        "probe.induction_excess": best("induction"),
        "probe.previous_token_head": json.dumps(report.get("previous_token_head")),
        "probe.induction_head": json.dumps(report.get("induction_head")),
        "probe.previous_token_ablation": report.get("previous_token_ablation"),
        "probe.induction_ablation": report.get("induction_ablation"),
        "probe.circuit_confirmed": report.get("circuit_confirmed"),
        "probe.readout_max_abs_error": readout.get("max_abs_error"),
        "probe.readout_weighted_kl": readout.get("weighted_kl"),
    }
    if isinstance(implied, list) and len(implied) == 2 and all(len(r) == 2 for r in implied):
        out["probe.p_hat"] = implied[0][1]  # learned P(1 | 0)
        out["probe.q_hat"] = implied[1][0]  # learned P(0 | 1)
    return out


def run_cell(cell: Cell, runs_dir: "str | os.PathLike", *, probe: bool = True, progress: bool = False) -> dict:
    """Train (or load) one cell into runs_dir/<cell_id> and return its results row (without error handling).

    The row holds the final evaluation loss, the last logged training loss, the reference losses of `theory`
    (entropy rate, unigram loss, in-context Bayes loss for random kernels), `stuck_at_unigram`, `escape_step`
    and, with `probe`, the mechanism and key probe scores.
    """
    from markov_interp.training import train

    start = time.perf_counter()
    run_dir = Path(runs_dir) / cell.cell_id
    result = train(cell.config, run_dir, progress=progress)
    return _result_row(cell, result, runs_dir, probe=probe, start=start)


def _result_row(cell: Cell, result: Any, runs_dir: "str | os.PathLike", *, probe: bool, start: float) -> dict:
    """The results row of a trained (or loaded) cell: losses, references, outcome, probes, seconds."""
    final = dict(result.final)
    rows = result.metrics
    train_rows = [r for r in rows if "train_loss" in r]
    optimum = final.get("bayes_loss", final.get("entropy_rate"))
    unigram = final.get("unigram_loss")
    row: dict = {
        "final_step": final["step"],
        "final_eval_loss": final["eval_loss"],
        "final_train_loss": train_rows[-1]["train_loss"] if train_rows else None,
        "entropy_rate": final.get("entropy_rate"),
        "unigram_loss": unigram,
        "bayes_loss": final.get("bayes_loss"),
        "excess_loss": final["eval_loss"] - optimum if optimum is not None else None,
        "outcome": outcome(final["eval_loss"], optimum, unigram) if optimum is not None and unigram is not None else None,
        "stuck_at_unigram": stuck_at_unigram(final["eval_loss"], optimum, unigram)
        if optimum is not None and unigram is not None else None,
        "escape_step": escape_step(train_rows, optimum, unigram) if optimum is not None and unigram is not None else None,
    }
    if probe:
        columns, report = _probe(result.model, cell.config)
        row.update(columns)
        if report is not None:
            atomic_write(Path(runs_dir).parent / _RESULTS_DIR / f"{cell.cell_id}.probe.json",
                               json.dumps(report, indent=1, sort_keys=True, default=str))
    row["seconds"] = round(time.perf_counter() - start, 3)
    return row


def _execute(cell: Cell, runs_dir: str, probe: bool, cell_fn: Optional[Callable]) -> dict:
    """Run one cell, catching any exception into a failed record (this is what a worker executes)."""
    try:
        row = (cell_fn or run_cell)(cell, runs_dir, probe=probe)
        return {"status": "ok", "error": None, "traceback": None, **row}
    except Exception as err:  # a failing cell is recorded; the sweep goes on
        return {"status": "failed", "error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}


def run_stack(cells: Sequence[Cell], runs_dir: "str | os.PathLike", *, probes: Sequence[bool]) -> list[dict]:
    """Train compatible cells as one stacked model (`training.train_many`) into runs_dir/<cell_id> and return
    one record per cell: "ok" with its row, or "failed" for a member that diverged. Raises if the stack does."""
    from markov_interp.stacked_training import train_many

    start = time.perf_counter()
    results = train_many([c.config for c in cells], [Path(runs_dir) / c.cell_id for c in cells], progress=False,
                         models_out=any(probes))  # hooked models only for the probes
    records = []
    for cell, probe, result in zip(cells, probes, results):
        if result.failed:
            records.append({"status": "failed", "error": result.failed, "traceback": None, "stack_size": len(cells)})
            continue
        try:
            row = _result_row(cell, result, runs_dir, probe=probe, start=start)
            records.append({"status": "ok", "error": None, "traceback": None, **row, "stack_size": len(cells)})
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
# benchmarks/bench_many.py, about what the process pool's parallel cells already give, and solo cells stay
# bit-identical to `training.train`), 64 on a GPU (7.4x the model-steps/s of solo runs at the paper's size in
# the prototype of ../shared/gpu-findings.md; about 13 MB of activations per member at seq 1024, batch 16).
DEFAULT_GROUP = {"cpu": 1, "cuda": 64}


def default_group(cells: Sequence[Cell]) -> int:
    """The stack size for `cells` when the caller gives none: from the device their runs ask for."""
    import torch

    devices = {c.config.train.device for c in cells}
    cuda = any(d.startswith("cuda") or (d == "auto" and torch.cuda.is_available()) for d in devices)
    return DEFAULT_GROUP["cuda" if cuda else "cpu"]


def group_cells(cells: Sequence[Cell], group: int, runs_dir: "str | os.PathLike") -> list[list[Cell]]:
    """Split cells into stacks of at most `group` compatible cells (spec order within each stack).

    Cells stack when `stacked_training.stack_key` agrees (same shapes and recipe) and their folders hold the
    same newest checkpoint step (so an interrupted stack re-forms and resumes where it stopped). A pure
    function of the cells and their folders: the local and Ray backends form the same stacks.
    """
    from markov_interp.stacked_training import stack_key
    from markov_interp.training import list_checkpoints

    if group <= 1:
        return [[c] for c in cells]
    buckets: dict[Any, list[Cell]] = {}
    groups: list[list[Cell]] = []
    for c in cells:
        key = stack_key(c.config)
        if key is None:
            groups.append([c])
            continue
        found = list_checkpoints(Path(runs_dir) / c.cell_id)
        buckets.setdefault((key, found[-1][0] if found else 0), []).append(c)
    for members in buckets.values():
        groups += [members[i:i + group] for i in range(0, len(members), group)]
    return groups


def _worker_init() -> None:
    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def _execute_in_worker(cell: Cell, runs_dir: str, probe: bool, cell_fn: Optional[Callable]) -> dict:
    _worker_init()
    return _execute(cell, runs_dir, probe, cell_fn)


# ------------------------------------------------------------------------------------------------ files
def _record_path(out: Path, cell: Cell) -> Path:
    return out / _RESULTS_DIR / f"{cell.cell_id}.json"


def _read_record(path: Path) -> Optional[dict]:
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, OSError):
        return None  # a damaged record is treated as absent: the cell runs again


def _is_done(record: Optional[dict], probe: bool, settings: dict) -> bool:
    if record is None or record.get("status") != "ok":
        return False
    return (not probe) or record.get("probe_settings") == settings


def _config_columns(cell: Cell) -> dict:
    out: dict = {}
    _flat("", cell.config.to_dict(), out)
    return out


def _row(cell: Cell, record: dict, out: Path) -> dict:
    row = {"sweep": cell.sweep, "cell_id": cell.cell_id}
    row.update({f"param.{k}": v for k, v in cell.params.items()})
    row.update({k: v for k, v in record.items() if k not in ("traceback", "probe_settings", "cell_id", "sweep")})
    row.update(_config_columns(cell))
    row["run_dir"] = str(Path(_RUNS_DIR) / cell.cell_id)
    return row


_FIRST = ("sweep", "cell_id", "status", "error")


def _write_table(out: Path, rows: list[dict]) -> Path:
    import csv
    import io

    columns: list[str] = [c for c in _FIRST]
    for row in rows:
        for key in row:
            if key not in columns:
                columns.append(key)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in columns})
    path = out / _TABLE
    atomic_write(path, buffer.getvalue())
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ModuleNotFoundError:
        return path
    table = pa.Table.from_pylist([{k: _parquet_value(row.get(k)) for k in columns} for row in rows])
    with atomic_path(out / "results.parquet") as tmp:
        pq.write_table(table, tmp)
    return path


def _parquet_value(value: Any) -> Any:
    return value if value is None or isinstance(value, str) else str(value) if isinstance(value, (list, dict)) else value


def read_table(path: "str | os.PathLike") -> list[dict]:
    """The rows of a sweep's results.csv (a sweep folder or the file), values parsed back to numbers,
    booleans and None where they look like them."""
    import csv

    path = Path(path)
    if path.is_dir():
        path = path / _TABLE
    if not path.exists():
        raise FileNotFoundError(f"no results table at {path}")
    with path.open(newline="") as handle:
        return [{k: _parse(v) for k, v in row.items()} for row in csv.DictReader(handle)]


def _parse(text: str) -> Any:
    if text == "":
        return None
    if text in ("True", "False"):
        return text == "True"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


# ------------------------------------------------------------------------------------------------ engine
@dataclasses.dataclass
class SweepResult:
    """What `run` returns: the table rows (one per cell, spec order), the table's path and counts."""

    rows: list
    table: Path
    n_run: int  # cells executed in this call
    n_skipped: int  # cells already finished before this call
    n_failed: int  # cells whose record says failed after this call

    @property
    def failed(self) -> list:
        return [r for r in self.rows if r["status"] != "ok"]


def _as_specs(spec: Any) -> list[SweepSpec]:
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
    spec: Any,
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
    the other cells go on. `backend="local"` runs a process pool of `workers` processes (default: all cores,
    one torch thread each; `workers=1` runs in this process); `backend="ray"` submits one Ray task per cell
    (num_cpus=1) to the cluster `ray.init()` connects to (RAY_ADDRESS, or a local instance); out_dir must
    then be on a filesystem every node sees. `group` (default `default_group`: 1 on a CPU, 64 on a GPU)
    trains up to that many compatible cells as one stacked model (`training.train_many`); a stack that
    raises is retried cell by cell. Same seeds and group give the same table on either backend. Writes
    out_dir/results.csv (and results.parquet when pyarrow is present); returns the rows.
    """
    if backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {list(_BACKENDS)}, got {backend!r}")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ValueError(f"workers must be None or an integer >= 1, got {workers!r}")
    if group is not None and (isinstance(group, bool) or not isinstance(group, int) or group < 1):
        raise ValueError(f"group must be None or an integer >= 1, got {group!r}")
    specs = _as_specs(spec)
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"sweep names must be distinct, got {names}")
    cells = [c for s in specs for c in s.cells()]
    probe_of = {s.name: s.probe for s in specs}
    seen: dict[str, Cell] = {}
    for c in cells:
        other = seen.get(c.cell_id)
        if other is not None and other.sweep == c.sweep:
            raise ValueError(
                f"sweep {c.sweep!r}: cells {other.params} and {c.params} are the same run (same config); "
                "remove the duplicate grid values"
            )
        seen.setdefault(c.cell_id, c)
    out = Path(out_dir)
    (out / _RUNS_DIR).mkdir(parents=True, exist_ok=True)
    (out / _RESULTS_DIR).mkdir(parents=True, exist_ok=True)
    atomic_write(out / "spec.json", json.dumps([s.to_dict() for s in specs], indent=2, sort_keys=True, default=str))

    # one execution per distinct run; a cell shared by two sweeps runs once (probed if any sweep asks)
    probe_for: dict[str, bool] = {}
    for c in cells:
        probe_for[c.cell_id] = probe_for.get(c.cell_id, False) or probe_of[c.sweep]
    settings = _probe_settings()
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

    def save(c: Cell, record: dict) -> None:
        record = {**record, "cell_id": c.cell_id, "probe_settings": settings if probe_for[c.cell_id] else None}
        atomic_write(_record_path(out, c), json.dumps(record, indent=1, sort_keys=True, default=str))

    pending = list(todo.values())
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
        rows.append(_row(c, record, out))
    table = _write_table(out, rows)
    n_failed = sum(1 for r in rows if r["status"] != "ok")
    return SweepResult(rows=rows, table=table, n_run=len(pending), n_skipped=n_skipped, n_failed=n_failed)


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
    n = min(workers or os.cpu_count() or 1, len(groups))
    bar = _bar(sum(len(g) for g in groups), progress, "sweep")
    failed = 0
    try:
        if n == 1:
            for g in groups:
                run_now = lambda: _execute_group(g, runs_dir, [probe_for[c.cell_id] for c in g], cell_fn)  # noqa: E731
                failed += _record_group(g, run_now, "cell raised", save, bar, failed)
            return
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        ctx = multiprocessing.get_context(_start_method())
        with ProcessPoolExecutor(max_workers=n, mp_context=ctx, initializer=_worker_init) as pool:
            futures = {pool.submit(_execute_group, g, runs_dir, [probe_for[c.cell_id] for c in g], cell_fn): g
                       for g in groups}
            for future in as_completed(futures):
                # a raise here means the worker process itself died (e.g. killed for memory)
                failed += _record_group(futures[future], future.result, "worker died", save, bar, failed)
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
    bad = int(record["status"] != "ok")
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
    task = ray.remote(num_cpus=1)(_execute_group_in_worker)
    refs = {task.remote(g, runs_dir, [probe_for[c.cell_id] for c in g], cell_fn): g for g in groups}
    bar = _bar(sum(len(g) for g in groups), progress, "sweep (ray)")
    failed = 0
    try:
        remaining = list(refs)
        while remaining:
            done, remaining = ray.wait(remaining, num_returns=1)
            # a raise here means the task's worker died or Ray lost it
            failed += _record_group(refs[done[0]], lambda: ray.get(done[0]), "ray task failed", save, bar, failed)
    finally:
        bar.close()
