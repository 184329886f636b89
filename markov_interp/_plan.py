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
import os
from collections.abc import Sequence
from typing import Any, Optional

from markov_interp._io import size_text as human_bytes

__all__ = ["Need", "PlanTooLarge", "memory_limit", "check_needs", "human_bytes"]


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
