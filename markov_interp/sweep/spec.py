"""Sweep specs: a base run config, a grid over dotted options, seeds and exclusions; their cells (one training
run each, named by a hash of its config) and the TOML / JSON spec file."""

import dataclasses
import hashlib
import itertools
import json
import math
import os
from pathlib import Path
from typing import Any

from markov_interp._io import MAX_JSON_DEPTH, check_depth, loads_json, read_text
from markov_interp.config import Config, check_bool, check_keys, check_seed, shown
from markov_interp.runs import EXECUTION_FIELDS, RunConfig, build_run, split_key

__all__ = ["SweepSpec", "Cell", "load_spec", "cell_id", "SECTIONS", "MAX_CELLS"]

SECTIONS = ("source", "model", "train")  # the sections of a run config a spec's keys name
MAX_CELLS = 100_000  # cells one spec may expand to (grid points times seeds, before exclusions)


def _check_key(key: str, where: str) -> tuple[str, str]:
    """`training.split_key` (the one dotted-key parser) plus the sweep's rule: seeds come from `seeds`."""
    section, field = split_key(key, where=where)
    if key == "train.seed":
        raise ValueError(f"{where}: give seeds with the top-level `seeds = [...]` list, not {shown(key)}")
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
            raise ValueError(f"name must be a non-empty string, got {shown(self.name)}")
        if not isinstance(self.base, dict):
            raise ValueError(f"base must be a table of sections {list(SECTIONS)}, got {type(self.base).__name__}")
        unknown = sorted(set(self.base) - set(SECTIONS))
        if unknown:
            raise ValueError(f"base: unknown sections {unknown}; expected some of {list(SECTIONS)}")
        for section, values in self.base.items():
            if not isinstance(values, dict):
                raise ValueError(f"base.{section} must be a table of options, got {shown(values)}")
            for field in values:
                _check_key(f"{section}.{field}", "base")
            if section == "train" and "seed" in values:
                raise ValueError("base.train.seed: give seeds with the top-level `seeds = [...]` list")
        if not isinstance(self.grid, dict):
            raise ValueError(f"grid must be a table of 'section.field' = [values], got {type(self.grid).__name__}")
        for key, values in self.grid.items():
            _check_key(key, "grid")
            if not isinstance(values, (list, tuple)) or len(values) == 0:
                raise ValueError(f"grid: {shown(key)} must be a non-empty list of values, got {shown(values)}")
        seeds = tuple(self.seeds) if isinstance(self.seeds, (list, tuple)) else self.seeds
        if not isinstance(seeds, tuple) or not seeds:
            raise ValueError(f"seeds must be a non-empty list of integers >= 0, got {shown(self.seeds)}")
        for seed in seeds:
            check_seed("each of seeds", seed)
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"seeds has duplicates: {list(seeds)}")
        object.__setattr__(self, "seeds", seeds)
        exclude = tuple(self.exclude) if isinstance(self.exclude, (list, tuple)) else self.exclude
        if not isinstance(exclude, tuple):
            raise ValueError(f"exclude must be a list of tables, got {shown(self.exclude)}")
        for entry in exclude:
            if not isinstance(entry, dict) or not entry:
                raise ValueError(
                    f"exclude: each entry must be a non-empty table of 'section.field' = value, got {shown(entry)}")
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
        """Every cell of the grid (grid order, then seeds), each with its validated `RunConfig`. A grid of more than
        `MAX_CELLS` points times seeds is refused before one is built."""
        keys = list(self.grid)
        count = math.prod(len(self.grid[k]) for k in keys) * len(self.seeds)
        if count > MAX_CELLS:
            sizes = " x ".join(f"{len(self.grid[k])} {k}" for k in keys)
            raise ValueError(f"sweep {shown(self.name)}: the grid has {count} cells ({sizes}{' x ' if keys else ''}"
                             f"{len(self.seeds)} seeds), more than the {MAX_CELLS} a sweep may have; split it")
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
                    raise ValueError(f"sweep {shown(self.name)}: cell {params} is not a valid run: {err}") from None
                cells.append(Cell(cell_id=cell_id(config), sweep=self.name, params=params, config=config))
        return cells


def _base_value(base: dict[str, dict], key: str) -> Any:
    section, field = key.split(".")
    return base.get(section, {}).get(field, _Missing)


class _Missing:
    pass


def _build_run(base: dict[str, dict], point: dict[str, Any], seed: int) -> RunConfig:
    return build_run(base, {**point, "train.seed": seed}, where="cell")


def cell_id(config: RunConfig) -> str:
    """A deterministic 16-hex-digit id of a run config (sha256 of its sorted JSON, the device and the resume
    cadence left out (`runs.config.EXECUTION_FIELDS`): where a run executes and how often it saves do not change
    what it is).

    Args:
        config: the run config.

    Returns:
        The id, also the name of the cell's run folder.
    """
    data = config.to_dict()
    data["train"] = {k: v for k, v in data["train"].items() if k not in EXECUTION_FIELDS}
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

    Args:
        path: the spec file; its stem is the sweep's name unless the file gives one.

    Returns:
        The validated `SweepSpec`. Errors (FileNotFoundError, ValueError) name the file and the bad key or value.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no sweep spec at {path}")
    text = read_text(path, "sweep spec")  # a regular file of at most READ_LIMITS["sweep spec"]: not /dev/zero
    if path.suffix == ".json":
        try:
            data = loads_json(text, f"sweep spec {path}")
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
            data = check_depth(tomllib.loads(text), f"sweep spec {path}")  # the same depth limit as JSON
        except tomllib.TOMLDecodeError as err:
            raise ValueError(f"{path} is not valid TOML: {err}") from None
        except RecursionError:
            raise ValueError(f"sweep spec {path} is nested more than {MAX_JSON_DEPTH} deep") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a sweep spec is a table of options, got {type(data).__name__}")
    data.setdefault("name", path.stem)
    return SweepSpec.from_dict(data, where=str(path))
