"""The one memory plan: what a computation will hold, estimated before anything is allocated, against what the
device has.

A `Need` is one part of a plan: what it is, its bytes and the sizes (parameters, config fields) it grows with.
`check_needs` adds them up against `memory_limit(device)` (physical memory, or a cgroup limit below it, on the
CPU; the GPU's memory on CUDA) and raises `PlanTooLarge` naming the size behind the largest need and its
estimate. Every stage that allocates by a size a user gives uses it: samplers
(`sources.sampling.check_sample_plan`), the reference losses (`theory.reference_losses`), the probes
(`probes._common.checked`), training (`training.plan.check_plan`), the CLI's probe batch
(`models.memory.check_probe`); the estimates of model sizes live in `models.memory`. This module imports nothing
of the package but `_io`, so every stage can use it.

The estimates are lower bounds of the order of magnitude, meant to refuse absurd sizes before they are
allocated (an out-of-memory kill, or a raw allocation error naming no parameter), not to predict a peak.
"""

import dataclasses
import functools
import inspect
import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Optional

from markov_interp._io import size_text as human_bytes

__all__ = ["Need", "PlanTooLarge", "memory_limit", "check_needs", "human_bytes", "planned", "size", "power"]


class PlanTooLarge(ValueError):
    """A run or probe would need more memory (or disk) than the machine has; the message names the field."""


@dataclasses.dataclass(frozen=True)
class Need:
    """Memory one part of a plan needs: `what` it is, its `bytes`, and the fields it grows with as
    ((field, value), ...), largest value first: the first is the one a refusal names."""

    what: str
    bytes: int
    fields: tuple

    @classmethod
    def of(cls, what: str, n_bytes: "int | float", fields: Sequence[tuple[str, Any]]) -> "Need":
        """A need whose fields are sorted by value (the largest is the likeliest culprit)."""
        ordered = tuple(sorted(fields, key=lambda fv: -fv[1]))  # ints compared exactly (V**k may be huge)
        return cls(what=what, bytes=int(min(n_bytes, 2**62)), fields=ordered)


def memory_limit(device: Any) -> tuple[int, str]:
    """(bytes, description) of the memory a plan on `device` may use: the GPU's memory on CUDA; on the CPU the
    physical memory, or the cgroup (container) limit when lower."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        return int(total), f"the {human_bytes(total)} of {device}"
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - platforms without sysconf
        total = 2**62
    try:
        with open("/sys/fs/cgroup/memory.max") as handle:
            text = handle.read().strip()
        if text.isdigit():
            total = min(total, int(text))
    except OSError:
        pass
    return int(total), f"the {human_bytes(total)} of memory of this machine"


def check_needs(needs: Sequence[Need], limit: tuple[int, str], *, where: str, hint: Optional[str] = None,
                before: str = "anything was written") -> None:
    """Refuse a plan whose needs add up to more than `limit` (`memory_limit`); free disk is `training.plan`'s.

    Args:
        needs: what the plan needs.
        limit: (bytes, description) of what there is.
        where: who refuses ("train", "probe", "classify_mechanism", ...), the message's start.
        hint: what to do instead (default: lower the named field).
        before: what had not happened yet when it refused (the message's end).

    Raises:
        PlanTooLarge: naming the field behind the largest need, its value, that need's bytes and the total.
    """
    total = sum(n.bytes for n in needs)
    if total <= limit[0]:
        return
    worst = max(needs, key=lambda n: n.bytes)
    field, value = worst.fields[0] if worst.fields else ("?", "?")
    others = ", ".join(f"{f}={v}" for f, v in worst.fields[1:4])
    raise PlanTooLarge(
        f"{where}: {field}={value} is too large: {worst.what} would need {human_bytes(worst.bytes)} of memory"
        f"{f' (with {others})' if others else ''}, {human_bytes(total)} in all, more than {limit[1]}; "
        f"{hint or f'lower {field}'} (refused before {before})"
    )


def size(arguments: Mapping[str, Any], name: str) -> int:
    """A call's argument `name` as a size for a plan: its value when it is a plain integer (not a boolean), else 0
    (None, absent, a wrong type: the function's own checks name those after the plan).

    >>> size({"n": 10**20, "flag": True}, "n"), size({"flag": True}, "flag"), size({}, "n")
    (100000000000000000000, 0, 0)
    """
    value = arguments.get(name)
    return value if type(value) is int else 0


def power(base: int, exponent: int) -> int:
    """base**exponent for a plan, capped at 2**63 without computing the power of a huge exponent (V**k contexts
    with k = 10**9 would take the interpreter hours to write out).

    >>> power(3, 2), power(2, 10**12) == 2**63, power(0, 5)
    (9, True, 0)
    """
    if base <= 1 or exponent <= 0:
        return base**max(exponent, 0)
    return base**exponent if exponent * math.log2(base) < 63 else 2**63


_FITS_ANYWHERE = 1 << 24  # a plan under 16 MiB is not checked against the device (no read of its memory)


def planned(needs: Callable[[Mapping[str, Any]], Sequence[Need]]) -> Callable:
    """Decorate a public function that allocates by the sizes it is given: each call's `needs(arguments)`
    (its arguments by name, defaults filled in; read sizes with `size` and `power`) is checked against the memory of
    the device (`check_needs`; a `device` argument, else a `model` argument's, else the CPU) before the function
    runs, so a size beyond the plan raises `PlanTooLarge` naming the parameter and the estimate instead of an
    out-of-memory kill or a raw allocation error. The probes' entry check (`probes._common.checked`) is the same
    plan for the probes; this is its form for every other public module (`sources`, `theory`, `training`,
    `landscape`, `dynamics`, `experiments`, `clamps`, `report`).

    Args:
        needs: the call's lower-bound needs from its arguments (an empty list: nothing to plan).

    Returns:
        The decorator (the wrapped function keeps its signature and docstring; `__markov_planned__` is True).
    """
    def decorate(fn: Callable) -> Callable:
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError:  # a missing or surplus argument: Python's own error, from the function itself
                return fn(*args, **kwargs)
            bound.apply_defaults()
            found = [need for need in needs(bound.arguments) if need.bytes > 0]
            if sum(need.bytes for need in found) > _FITS_ANYWHERE:
                check_needs(found, memory_limit(_device(bound.arguments)), where=fn.__name__,
                            before="anything was allocated")
            return fn(*args, **kwargs)

        wrapper.__markov_planned__ = True
        return wrapper

    return decorate


def _device(arguments: Mapping[str, Any]) -> Any:
    """The device a call allocates on: its `device` argument, else its `model`'s weights', else the CPU."""
    import torch

    device = arguments.get("device")
    if isinstance(device, (torch.device, str)) and device != "auto":
        try:
            return torch.device(device)
        except (RuntimeError, ValueError):
            return torch.device("cpu")  # the function's own check names a bad device
    model = arguments.get("model")
    if isinstance(model, torch.nn.Module):
        return next((p.device for p in model.parameters()), torch.device("cpu"))
    return torch.device("cpu")
