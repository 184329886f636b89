"""The on-disk cache of reference values (`$MARKOV_INTERP_CACHE`, default ~/.cache/markov-interp; "off"
disables) and the schemas its entries are checked against when read.
"""

import dataclasses
import functools
import hashlib
import json
import math
import os
import stat
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from markov_interp._io import atomic_write, describe_kind, read_json
from markov_interp.config import Checked, bounds
from markov_interp.theory._stats import MAX_KERNELS, MAX_SEQUENCES


# ------------------------------------------------------------------------------------------ disk cache
# An entry is a JSON file {"key": ..., "value": ...} named by a hash of its key: the inputs, this version and a
# hash of the code that computes the values. Reading one never trusts it: a file that is not a regular file,
# not JSON, for another key, or whose value is incomplete, not finite or out of the range the quantity can take
# is reported (one warning naming the file) and recomputed, and the fresh value replaces it.
_CACHE_VERSION = 3  # 3: keys hold the code hash; values are validated


def _cache_dir() -> Path | None:
    """$MARKOV_INTERP_CACHE (a folder; "off" or "" disables), else ~/.cache/markov-interp."""
    value = os.environ.get("MARKOV_INTERP_CACHE")
    if value is None:
        return Path.home() / ".cache" / "markov-interp"
    return None if value in ("", "off", "0") else Path(value)


@functools.lru_cache(maxsize=1)
def _code_version() -> str:
    """A hash of the modules that compute the cached values (every module of theory/ and of sources/): after an
    edit to any of them entries get new keys, so a changed computation never reads an old result."""
    from markov_interp import sources

    digest = hashlib.sha256()
    folders = (Path(__file__).parent, Path(sources.__file__).parent)
    for source in (path for folder in folders for path in sorted(folder.glob("*.py"))):
        try:
            digest.update(Path(source).read_bytes())
        except (OSError, TypeError):  # no source on disk (a frozen install): the installed version decides
            import importlib.metadata

            digest.update(importlib.metadata.version("markov-interp").encode())
    return digest.hexdigest()[:16]


def _full_key(key: dict) -> dict:
    """`key` with the cache version and code hash, as JSON gives it back (tuples become lists)."""
    return json.loads(json.dumps({**key, "version": _CACHE_VERSION, "code": _code_version()}, sort_keys=True))


def _cache_file(key: dict) -> Path | None:
    folder = _cache_dir()
    if folder is None:
        return None
    text = json.dumps(_full_key(key), sort_keys=True)
    return folder / "references" / f"{hashlib.sha256(text.encode()).hexdigest()[:24]}.json"


def _disk_cache_read(key: dict, schema: "type[_KernelEntry] | type[_InContextEntry]") -> dict | None:
    """The cached value of `key`, or None (compute it) when there is none or it is unusable, with a one-line
    warning naming the file. The value must be an entry of `schema` (its fields, types and ranges) whose values
    agree with the entry's own key (`schema.check_key`: the ordering theory's quantities obey, the key's sizes)."""
    path = _cache_file(key)
    if path is None:
        return None
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as err:
        return _bad_entry(path, f"unreadable: {err.strerror}")
    if not stat.S_ISREG(mode):  # a FIFO would hang the read; a link may lead anywhere
        return _bad_entry(path, f"it is {describe_kind(mode)}, not a regular file")
    try:
        entry = read_json(path, "reference-cache entry")  # bounded, depth-limited
    except OSError as err:
        return _bad_entry(path, f"unreadable: {err.strerror}")
    except ValueError as err:  # truncated, not JSON, not UTF-8, too large or too deep
        return _bad_entry(path, str(err).replace(f"reference-cache entry {path} is ", ""))
    full = _full_key(key)
    if not isinstance(entry, dict) or entry.get("key") != full:
        return _bad_entry(path, "it holds another key")
    value = entry.get("value")
    try:
        schema.from_dict(value).check_key(full)
    except ValueError as err:
        return _bad_entry(path, str(err))
    return value


def _bad_entry(path: Path, reason: str) -> None:
    warnings.warn(f"reference-loss cache entry {path} is unusable ({reason}); recomputing it", stacklevel=4)
    return None


def _disk_cache_write(key: dict, value: dict) -> None:
    path = _cache_file(key)
    if path is None:
        return
    try:
        atomic_write(path, json.dumps({"key": _full_key(key), "value": value}, allow_nan=False))
    except (OSError, ValueError):  # a read-only home (or a link in the cache) is no reason to fail: recomputed
        pass


# The schemas of the two kinds of entry (`config.Checked`: every field typed and finite, standard errors >= 0;
# `check_key`: the values against the entry's own key). Each bound holds up to 6 standard errors.
def _within(name: str, x: float, low: float, high: float) -> None:
    if not low <= x <= high:
        raise ValueError(f"{name} = {x!r} is outside [{low:.6g}, {high:.6g}]")


def _se_at_most(name: str, se: float, allowed: float, why: str) -> None:
    """An entry's standard error within what its own key allows (so it cannot widen the checks that use it)."""
    if not se <= allowed:
        raise ValueError(f"{name} = {se!r} is larger than its key allows ({allowed:.3g}: {why})")


def _popoviciu(spread: float, n: int) -> float:
    """Twice the largest standard error of a mean of `n` draws of a value confined to an interval of width
    `spread` (Popoviciu: a standard deviation of at most spread / 2): the bound the regressions with control
    variates stay under (they lower the spread; twice covers their estimated coefficients)."""
    return spread / math.sqrt(max(n - 1, 1))


def _at_most(small: str, x: float, large: str, y: float, se: float) -> None:
    """`small` <= `large` up to 6 standard errors (the order theory's quantities obey)."""
    if x > y + 6 * se + 1e-9:
        raise ValueError(f"{small} = {x!r} exceeds {large} = {y!r} (by more than 6 standard errors, {6 * se:.2g}); "
                         f"the references must obey {small} <= {large}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class _KernelEntry(Checked):
    """A kernel-expectations entry: E[entropy rate] and E[H(pi)] (under its old name `unigram_loss`) by Monte Carlo.
    `check_key`: E[entropy rate] <= E[H(pi)] <= log V, each >= 0, standard errors <= log V."""

    entropy_rate: float = bounds()
    entropy_rate_se: float = bounds(minimum=0)
    unigram_loss: float = bounds()
    unigram_loss_se: float = bounds(minimum=0)
    method: str

    def check(self) -> None:
        if self.method != "monte carlo":  # quadrature and pool averages are not cached
            raise ValueError(f"method is {self.method!r}, expected 'monte carlo'")

    def check_key(self, key: Mapping[str, Any]) -> None:
        top, se = math.log(key["vocab"]), self.entropy_rate_se + self.unigram_loss_se
        # the Monte Carlo stops once both standard errors are below the key's tol, or at MAX_KERNELS kernels
        allowed = max(key["tol"], _popoviciu(top, MAX_KERNELS))
        for name in ("entropy_rate_se", "unigram_loss_se"):
            _se_at_most(name, getattr(self, name), allowed, f"below tol={key['tol']:g}, or {MAX_KERNELS} kernels drawn")
        _within("entropy_rate", self.entropy_rate, -6 * se - 1e-9, math.inf)
        _at_most("entropy_rate", self.entropy_rate, "E[H(pi)] (unigram_loss)", self.unigram_loss, se)
        _at_most("E[H(pi)] (unigram_loss)", self.unigram_loss, "log V", top, self.unigram_loss_se)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _InContextEntry(Checked):
    """An in-context entry: the add-alpha, in-context unigram and in-context Bayes losses with their curves over the
    T - 1 targets, and for a finite pool the pool-Bayes loss and curve (present exactly when the key has a pool).

    `check_key`, against the key's vocabulary V, alpha, length T, sequence count and kernel expectations:
    - ranges: every add-beta loss and curve point in [0, log((T + V alpha) / alpha)] (such an estimator gives each
      state at least alpha / (T + V alpha)); curves of T - 1 points; standard errors no larger than the key and the
      sample size allow (`_se_allowed`: below the key's tol where the Monte Carlo stopped there), so an entry's own
      standard error cannot widen the checks below;
    - the order of the references, where it is a theorem: for fresh kernels the Bayes loss is optimal under the
      sampler's law, so Bayes <= add-alpha, Bayes <= in-context unigram and Bayes <= log V (uniform guessing); for
      a finite pool the pool-Bayes loss is, so pool Bayes <= each of those (and the in-context Bayes loss); with a
      stationary first state the oracle that knows the kernel loses E[entropy rate] (the key's) per target at
      best, so E[entropy rate] <= the optimum (with a uniform or fixed first law the oracle's average over T
      targets is not the stationary rate, so that bound is left out).
    add-alpha <= in-context unigram <= log V is not a theorem and is not checked: with a stationary first state
    add-alpha is not the Bayes predictor, and on nearly i.i.d. chains every estimator pays for its estimate beyond
    log V (V = 3, alpha = 50, T = 16: in-context unigram 1.0987 against log 3 = 1.0986).
    """

    add_alpha_loss: float = bounds()
    add_alpha_loss_se: float = bounds(minimum=0)
    unigram_loss: float = bounds()
    unigram_loss_se: float = bounds(minimum=0)
    bayes_loss: float = bounds()
    bayes_loss_se: float = bounds(minimum=0)
    add_alpha_curve: tuple[float, ...] = bounds()
    add_alpha_curve_se: tuple[float, ...] = bounds(minimum=0)
    unigram_curve: tuple[float, ...] = bounds()
    unigram_curve_se: tuple[float, ...] = bounds(minimum=0)
    n_sequences: int = bounds(minimum=2)
    pool_bayes_loss: float | None = bounds(default=None)
    pool_bayes_loss_se: float | None = bounds(minimum=0, default=None)
    pool_bayes_curve: tuple[float, ...] | None = bounds(default=None)
    pool_bayes_curve_se: tuple[float, ...] | None = bounds(minimum=0, default=None)

    def check_key(self, key: Mapping[str, Any]) -> None:
        vocab, alpha, seq_len, wanted = key["vocab"], key["alpha"], key["seq_len"], key["n_sequences"]
        top, cap = math.log(vocab), math.log((seq_len + vocab * alpha) / alpha)
        pool = [getattr(self, f"pool_bayes_{n}") for n in ("loss", "loss_se", "curve", "curve_se")]
        if any(v is None for v in pool) != ("pool_size" not in key) or len({v is None for v in pool}) > 1:
            raise ValueError("its pool-Bayes values must be present exactly when its key has a pool")
        if wanted is not None and self.n_sequences != wanted:
            raise ValueError(f"n_sequences is {self.n_sequences}, expected {wanted}")
        names = ("add_alpha_loss", "unigram_loss", "bayes_loss") + (("pool_bayes_loss",) if pool[0] is not None else ())
        for name in names:
            se = getattr(self, f"{name}_se")
            _se_at_most(f"{name}_se", se, *self._se_allowed(key, cap, name))
            _within(name, getattr(self, name), -6 * se - 1e-9, cap + 6 * se + 1e-9)
        curve_se = _popoviciu(cap, self.n_sequences) + key["kernel"]["entropy_rate_se"] \
            + key["kernel"]["unigram_loss_se"]  # the draws' spread, and what the controls' means add
        for curve in [n.replace("_loss", "_curve") for n in names if n != "bayes_loss"]:
            self._check_curve(curve, seq_len, top if curve == "pool_bayes_curve" else cap, curve_se)
        optimum = "pool_bayes_loss" if pool[0] is not None else "bayes_loss"
        for other in [n for n in names if n != optimum] + ["log V"]:
            y, se = (top, 0.0) if other == "log V" else (getattr(self, other), getattr(self, f"{other}_se"))
            _at_most(optimum, getattr(self, optimum), other, y, getattr(self, f"{optimum}_se") + se)
        if key["initial"] == "stationary":
            kernel = key["kernel"]
            _at_most("E[entropy rate]", kernel["entropy_rate"], optimum, getattr(self, optimum),
                     kernel["entropy_rate_se"] + getattr(self, f"{optimum}_se"))

    def _se_allowed(self, key: Mapping[str, Any], cap: float, name: str) -> tuple[float, str]:
        """The largest standard error of the loss `name` that the entry's key and sample size allow, and why. With
        the key's tol the Monte Carlo stops once every standard error is below it, unless it drew `MAX_SEQUENCES`
        (pool Bayes runs its own draws, whose count is not recorded); with the key's n_sequences it draws exactly
        those. A mean of n losses in [0, cap] has a standard error of at most `_popoviciu(cap, n)`. (A cached
        bayes_loss of 0.5 with an SE of 0.1 used to pass the order checks by 6 x 0.1; the computation's own SE
        is below 5e-4.)"""
        if key["n_sequences"] is not None:
            return _popoviciu(cap, self.n_sequences), f"{self.n_sequences} sequences of losses in [0, {cap:.3g}]"
        if name != "pool_bayes_loss" and self.n_sequences < MAX_SEQUENCES:
            return key["tol"], f"the Monte Carlo stopped below tol={key['tol']:g} after {self.n_sequences} sequences"
        return (max(key["tol"], _popoviciu(cap, MAX_SEQUENCES)),
                f"below tol={key['tol']:g} unless {MAX_SEQUENCES} sequences were drawn")

    def _check_curve(self, curve: str, seq_len: int, high: float, se_allowed: float) -> None:
        points, ses = getattr(self, curve), getattr(self, f"{curve}_se")
        if len(points) != seq_len - 1 or len(ses) != seq_len - 1:
            raise ValueError(f"{curve} has {len(points)} points, expected {seq_len - 1}")
        for t, (x, se) in enumerate(zip(points, ses)):
            _within(f"{curve}_se[{t}]", se, 0.0, min(high, se_allowed))
            _within(f"{curve}[{t}]", x, -6 * se - 1e-9, high + 6 * se + 1e-9)
