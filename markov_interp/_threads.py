"""Torch's CPU thread count, and the default of one thread for the package's tiny models.

The models here are small (the quickstart's one-layer model has 9,002 parameters, the two-layer one 18,579): their
matrix products are too small to split, so torch's thread pool (one thread per core) mostly spins, and on a shared
machine that costs the others: `benchmarks/bench_threads.py` measures the CPU seconds and wall time of training and
of probing the quickstart model with one thread and with torch's default, on the machine as found and with every
core busy (docs/cli.md has the numbers). So training, `classify_mechanism`, `discover_circuit` and the report run a
model of fewer than `TINY_PARAMS` parameters on one thread, restoring torch's setting afterwards, unless a count was
chosen:

- `markov_interp.set_threads(n)`: n threads for everything from now on (`set_threads(None)`: the default rule);
- `with markov_interp.threads(n): ...`: n threads inside the block only;
- `markov-interp train|probe|report --threads N`: the same as `set_threads(N)`.

Only CPU threads are concerned: a model on a GPU is left alone.

>>> import torch
>>> with threads(2):
...     torch.get_num_threads()
2
"""

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any, Optional, TypeVar

from markov_interp.config import check_int

__all__ = ["TINY_PARAMS", "chosen_threads", "set_threads", "threads", "tiny_model_threads"]

TINY_PARAMS = 1_000_000  # models with fewer parameters than this run on one CPU thread unless a count was chosen

_CHOSEN: list[Optional[int]] = [None]  # the count `set_threads` / `threads` chose (None: the default rule)

F = TypeVar("F", bound=Callable[..., Any])


def chosen_threads() -> Optional[int]:
    """The thread count chosen by `set_threads` or an enclosing `threads` block (None: the default rule)."""
    return _CHOSEN[0]


def set_threads(n: Optional[int]) -> None:
    """Use `n` CPU threads for torch from now on, for every model (None: back to the default, one thread for
    models under `TINY_PARAMS` parameters and torch's own count for the others).

    Args:
        n: threads (>= 1), or None.
    """
    import torch

    check_int("threads", n, minimum=1, none_ok=True)
    if n is not None:
        torch.set_num_threads(n)
    _CHOSEN[0] = n


@contextlib.contextmanager
def threads(n: int) -> Iterator[None]:
    """`n` CPU threads for torch inside the block (for every model), torch's previous count and the previous choice
    restored after it.

    Args:
        n: threads (>= 1).
    """
    import torch

    check_int("threads", n, minimum=1)
    before, chosen = torch.get_num_threads(), _CHOSEN[0]
    torch.set_num_threads(n)
    _CHOSEN[0] = n
    try:
        yield
    finally:
        torch.set_num_threads(before)
        _CHOSEN[0] = chosen


def _n_params(model: Any) -> Optional[int]:
    """The model's parameter count when it lives on the CPU, else None (nothing to decide)."""
    params = list(model.parameters()) if hasattr(model, "parameters") else []
    if not params or params[0].device.type != "cpu":
        return None
    return sum(p.numel() for p in params)


@contextlib.contextmanager
def one_thread_if_tiny(model: Any) -> Iterator[None]:
    """One torch thread inside the block when `model` is on the CPU, has fewer than `TINY_PARAMS` parameters and
    no count was chosen (`set_threads`, `threads`); nothing changes otherwise."""
    n = _n_params(model)
    if _CHOSEN[0] is not None or n is None or n >= TINY_PARAMS:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def tiny_model_threads(fn: F) -> F:
    """Decorator: `fn(model, ...)` runs inside `one_thread_if_tiny(model)`."""

    @functools.wraps(fn)
    def wrapper(model: Any, *args: Any, **kwargs: Any) -> Any:
        with one_thread_if_tiny(model):
            return fn(model, *args, **kwargs)

    return wrapper  # type: ignore[return-value]
