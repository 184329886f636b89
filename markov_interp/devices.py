"""The one device check of every entry point: `train`, `probe`, `report`, sweeps and experiments.

markov-interp runs on the CPU, on CUDA GPUs and on Apple's MPS. `resolve_device` turns what a user wrote ("auto",
"cpu", "cuda", "cuda:1", "mps", or a `torch.device`) into a `torch.device` after checking that it is one of those
kinds and that this machine has it; anything else is a `ValueError` naming the value and saying what this machine
offers. Without it, torch's own errors surfaced from deep inside a run: "META device type not an accelerator" for
`--set train.device=meta`, a raw RuntimeError for mps on a build without it, and a "weight tying broken" assertion
for `probe RUN --device meta` (docs/faults.md).

>>> resolve_device("cpu"), resolve_device("auto").type in ("cpu", "cuda")
(device(type='cpu'), True)
>>> resolve_device("meta")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
ValueError: device 'meta' is not one markov-interp runs on (auto, cpu, cuda, cuda:N, mps); available here: ...
"""

import re
from typing import Any, Optional

import torch

from markov_interp.config import shown

__all__ = ["resolve_device", "check_device_name", "available_devices", "KINDS"]

KINDS = ("cpu", "cuda", "mps")  # the device types a run, probe or report may use ("auto" picks one)
_NAME = re.compile(r"^(cpu|cuda|mps)(?::(\d+))?$")


def _mps_built() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_built())


def _mps_available() -> bool:
    return _mps_built() and bool(torch.backends.mps.is_available())


def available_devices() -> list[str]:
    """The devices this process can use, as names `resolve_device` accepts: "cpu", each "cuda:N", "mps".

    >>> available_devices()[0]
    'cpu'
    """
    names = ["cpu"]
    if torch.cuda.is_available():
        names += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if _mps_available():
        names.append("mps")
    return names


def check_device_name(device: Any, *, what: str = "device") -> str:
    """`device` as a name of a kind markov-interp runs on ("auto", "cpu", "cuda", "cuda:N", "mps"), without asking
    whether this machine has it (a sweep on a Ray cluster checks its cells' devices where they run).

    Args:
        device: a name or a `torch.device`.
        what: how an error names the value.

    Returns:
        The name ("cuda:0" for `torch.device("cuda", 0)`).

    Raises:
        ValueError: not a string or device, an unknown kind ("meta", "xla", a typo) or a malformed name.
    """
    if isinstance(device, torch.device):
        device = str(device)
    if not isinstance(device, str):
        raise ValueError(f"{what} must be a device name such as 'auto', 'cpu' or 'cuda', got {shown(device)}")
    if device != "auto" and _NAME.match(device) is None:
        raise ValueError(f"{what} {shown(device)} is not one markov-interp runs on (auto, cpu, cuda, cuda:N, mps); "
                         f"available here: {', '.join(available_devices())}")
    return device


def resolve_device(device: Any, *, what: str = "device") -> torch.device:
    """The `torch.device` that `device` names, checked: one markov-interp runs on, and present here.

    Args:
        device: "auto" (the first CUDA GPU when there is one, else the CPU), "cpu", "cuda", "cuda:N", "mps", or a
            `torch.device` of those kinds.
        what: how an error names the value ("device", "--device", "train.device").

    Returns:
        The device ("auto" resolved; "cuda" stays the current CUDA device, as torch reads it).

    Raises:
        ValueError: an unknown kind ("meta", "xla", a typo), a malformed name (`check_device_name`), a CUDA index
            this machine lacks, CUDA or MPS where this torch build or machine has none; the message says what is
            available here.
    """
    device = check_device_name(device, what=what)
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    kind, index = _NAME.match(device).groups()  # type: ignore[union-attr]
    problem = _PROBLEMS[kind](index, f"available here: {', '.join(available_devices())}")
    if problem is not None:
        raise ValueError(f"{what} {shown(device)}: {problem}")
    return torch.device(device)


def _mps_problem(index: Optional[str], here: str) -> Optional[str]:
    """Why MPS cannot run here (None: it can)."""
    if not _mps_built():
        return f"this torch build has no MPS support ({here})"
    if index is not None:
        return f"MPS takes no index ({here})"
    return None if _mps_available() else f"MPS is not available on this machine ({here})"


def _cuda_problem(index: Optional[str], here: str) -> Optional[str]:
    """Why CUDA (device `index`) cannot run here (None: it can)."""
    if not torch.cuda.is_available():
        return (f"CUDA is not available (torch {torch.__version__}, "
                f"{'built without CUDA' if torch.version.cuda is None else 'no GPU found'}; {here})")
    if index is not None and int(index) >= torch.cuda.device_count():
        return f"this machine has {torch.cuda.device_count()} CUDA device(s) ({here})"
    return None


# a device kind -> why it cannot run here (None: it can); the kinds `check_device_name` accepts
_PROBLEMS = {"cpu": lambda index, here: None, "mps": _mps_problem, "cuda": _cuda_problem}
