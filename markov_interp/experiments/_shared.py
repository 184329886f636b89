"""What the experiments share: statistics over seeds, training a grid of runs through `sweep` and per-run
measurement caches (the summary itself is written by `_base`).

The experiments train through `sweep.run` (stacks of compatible runs, worker processes, restartable run folders
and records), then load each finished model from its run folder and measure it in this process; a measurement is
cached in `work/measures/<cell_id>.json` under a key naming what was measured, so a rerun measures only what is new.
"""

import dataclasses
import json
import math
import random
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Optional

from markov_interp import dynamics
from markov_interp._io import atomic_write, read_json
from markov_interp.experiments._base import Summary

__all__ = ["mean", "mean_interval", "proportion", "train_grid", "cached_measure", "GridResult", "log2_label"]

MEASURES_DIR = "measures"


def mean(values: Sequence[float]) -> float:
    """The mean of the finite values (nan when there are none)."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.fmean(finite) if finite else math.nan


def mean_interval(values: Sequence[float], confidence: float = 0.95, n_boot: int = 2000) -> tuple[float, float]:
    """Percentile bootstrap interval for the mean of `values` over seeds (fixed resamples: `random.Random(0)`;
    nan below two finite values).

    Args:
        values: one value per seed (non-finite values are left out).
        confidence: of the interval.
        n_boot: resamples.

    Returns:
        (low, high).
    """
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if len(finite) < 2:
        return math.nan, math.nan
    rng = random.Random(0)
    means = sorted(statistics.fmean(rng.choices(finite, k=len(finite))) for _ in range(n_boot))
    tail = (1 - confidence) / 2
    return means[math.floor(tail * (n_boot - 1))], means[math.ceil((1 - tail) * (n_boot - 1))]


def proportion(successes: int, n: int) -> dict:
    """{"k", "n", "fraction", "interval"}: a fraction of seeds with its Wilson 95% interval (None for n = 0)."""
    if n == 0:
        return {"k": successes, "n": 0, "fraction": None, "interval": None}
    return {"k": successes, "n": n, "fraction": successes / n,
            "interval": list(dynamics.wilson_interval(successes, n))}


def train_grid(specs: list, work: Path, *, workers: Optional[int], group: int, progress: bool) -> Any:
    """Train every cell of `specs` (`sweep.SweepSpec`s, probe off) into `work` as stacks of up to `group` runs,
    `workers` processes at a time; finished cells are skipped. Returns the `sweep.SweepResult`."""
    from markov_interp import sweep

    return sweep.run(specs, work, workers=workers, group=group, progress=progress)


def cached_measure(work: Path, cell_id: str, key: str, measure: Callable[[], dict]) -> dict:
    """`measure()` of one finished run, cached in work/measures/<cell_id>.json under `key` (a string naming what
    was measured and how: a changed key measures again)."""
    path = work / MEASURES_DIR / f"{cell_id}.json"
    if path.exists():
        try:
            stored = read_json(path, "results file")  # a regular file, bounded, depth-limited
            if stored.get("key") == key:
                return stored["value"]
        except (ValueError, OSError, KeyError, AttributeError):
            pass  # a damaged cache entry is measured again
    value = measure()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps({"key": key, "value": value}, sort_keys=True))
    return value


@dataclasses.dataclass(frozen=True, kw_only=True)
class GridResult(Summary):
    """What a grid experiment's result holds (an experiment's result subclasses it): the budget, one record per
    run, one summary per cell, and the sweep's failed cells."""

    budget: Any
    records: tuple
    cells: list
    n_failed: int

    @property
    def failed(self) -> int:
        return self.n_failed


def log2_label(n: Optional[int]) -> str:
    """"∞" for None, else the integer."""
    return "∞" if n is None else str(n)
