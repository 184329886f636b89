"""The committed result files read back for rendering, each once per file version, and the few formats the
rendered text shares. Every statistic comes from the package's own code: `experiments.load` (an experiment's
results.json, its statistics recomputed from the per-seed rows), `experiments.paper.summarise` (the reproduction's
results.csv) and `dynamics` (the first session's files, which hold one escape step per seed)."""

import hashlib
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Optional

from markov_interp import dynamics
from markov_interp._io import read_json, read_regular

__all__ = ["experiment", "reproduction", "recorded", "recorded_escapes", "provenance_text", "mean_text",
           "bounds_text", "percent_text", "p_text"]


_CACHE: dict[tuple[str, str], tuple[str, Any]] = {}  # (reader, file) -> (digest of its bytes, what was read)


def _cached(kind: str, path: Path, read: Callable[[Path], Any]) -> Any:
    """`read(path)`, once per version of the file's bytes (a block reads a source its neighbours read too)."""
    digest = hashlib.sha1(read_regular(path, "results file")).hexdigest()
    key = (kind, str(path.resolve()))
    if key not in _CACHE or _CACHE[key][0] != digest:
        _CACHE[key] = (digest, read(path))
    return _CACHE[key][1]


def experiment(path: Path) -> Any:
    """An experiment's results.json read back (`experiments.load`: the typed result, budget and provenance)."""
    from markov_interp import experiments

    return _cached("experiment", path, experiments.load)


def reproduction(path: Path) -> list:
    """The reproduction's conditions (`experiments.paper.summarise`) from its committed results.csv."""
    from markov_interp import sweep
    from markov_interp.experiments import paper

    return _cached("reproduction", path, lambda p: paper.summarise(sweep.read_table(p)))


def recorded(path: Path) -> dict:
    """A JSON file as it is (the first session's escape_times.json and interventions/long/results.json)."""
    return _cached("json", path, lambda p: read_json(p, "results file"))


def recorded_escapes(data: dict, *, budget: int, every: int) -> list[dynamics.StepInterval]:
    """The escapes of one condition of a first-session file ({"escape_steps": [...], "censored": [...]}), read
    on its evaluation grid (every `every` steps up to `budget`) by `dynamics.recorded_escape`; failed runs (step
    None) left out."""
    grid = range(every, budget + 1, every)
    return [dynamics.recorded_escape(s, c, grid) for s, c in zip(data["escape_steps"], data["censored"])
            if s is not None]


def provenance_text(provenance: Any) -> str:
    """Where and how a result was made, from its provenance: "`COMMAND`; x86_64 with 2 CPU cores, device cpu,
    torch 2.13.0+cpu, fp32; 6.9 min of wall time for that call" (a call that reused trained runs is short)."""
    return (f"`{provenance.command}`; {provenance.machine}, device {provenance.device}, torch {provenance.torch}, "
            f"{provenance.precision}; {provenance.seconds / 60:.1f} min of wall time for that call")


def bounds_text(interval: Sequence[Optional[float]], digits: int = 2) -> str:
    """[lo, hi] of an interval ("?" for an unknown bound).

    >>> bounds_text((0.571, None))
    '[0.57, ?]'
    """
    return "[" + ", ".join("?" if v is None or not math.isfinite(v) else f"{v:.{digits}f}" for v in interval) + "]"


def mean_text(mean: float, interval: Sequence[float], digits: int = 2) -> str:
    """A mean over seeds with its interval: "0.76 [0.75, 0.77]"."""
    return f"{mean:.{digits}f} {bounds_text(interval, digits)}"


def percent_text(k: int, n: int) -> str:
    """k/n with its Wilson 95% interval: "13/16 [0.57, 0.93]"."""
    return f"{k}/{n} {bounds_text(dynamics.wilson_interval(k, n))}"


def p_text(p: Optional[float]) -> str:
    """A p-value in two significant digits ("not valid" without one)."""
    return "not valid" if p is None else f"{p:.2g}"
