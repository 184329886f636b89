"""torch.compile for the engine: one cache of compiled callables and one fallback to eager.

The stacked loss (`models.stack.compiled_losses`) and the optimiser update (`models.optim`) are compiled with
`torch.compile` when a run asks for it (`TrainConfig.compile`). Each is compiled **once per key** in a process
(the key names the shapes, member count, precision and mode): the compiled callable is kept here, so a sweep
that trains many stacks of one shape compiles once. Every key gets its own code object, because TorchDynamo keeps
its guards per code object with a small recompile limit (8): keys sharing one would fall back to eager silently
after eight shapes.

Where compiling is unavailable (no C++ compiler for the CPU backend, no Triton for CUDA, a Python that TorchDynamo
does not support), training runs eagerly after **one** warning per process that says why; where one function
fails to compile (on the CPU, torch 2.13's "max-autotune" fails on the stacked loss with an assertion in
inductor's C++ GEMM template), that function runs eagerly, with the same one warning. Eager is the reference the
compiled path is tested against (tests/models/test_compile.py).
"""

import functools
import shutil
import types
import warnings
from collections.abc import Callable, Hashable
from typing import Optional

import torch

__all__ = ["compiled", "unavailable", "TORCH_MODES", "clear"]

# TrainConfig.compile -> torch.compile's mode. "max" autotunes kernels (and, on CUDA, captures CUDA graphs).
TORCH_MODES = {"default": "default", "max": "max-autotune"}

_CACHE: dict[Hashable, Callable] = {}
_WARNED: list[str] = []  # the one fallback warning of this process, once given


def clear() -> None:
    """Forget every compiled callable of this process (tests; the next call compiles again)."""
    _CACHE.clear()


@functools.cache
def unavailable(device_type: str) -> Optional[str]:
    """Why torch.compile cannot run on `device_type` in this process, or None when it can.

    >>> unavailable("cpu") is None or isinstance(unavailable("cpu"), str)
    True
    """
    try:
        torch._dynamo.eval_frame.check_if_dynamo_supported()
    except RuntimeError as err:
        return f"TorchDynamo does not support this Python ({err})"
    if device_type == "cpu":
        from torch._inductor import config as inductor_config

        cxx = inductor_config.cpp.cxx[-1] or "g++"
        if shutil.which(cxx) is None and not any(shutil.which(c) for c in ("g++", "clang++", "c++")):
            return f"no C++ compiler found for inductor's CPU backend (looked for {cxx}, g++, clang++, c++)"
    elif device_type == "cuda":
        from torch.utils._triton import has_triton

        if not has_triton():
            return "Triton is not installed (inductor's CUDA backend needs it)"
    return None


def _warn_once(message: str) -> None:
    if not _WARNED:
        _WARNED.append(message)
        warnings.warn(f"{message} (the compile='off' arithmetic: the same results up to float rounding)",
                      RuntimeWarning, stacklevel=4)


def _own_code(fn: Callable, name: str) -> Callable:
    """`fn` with a code object of its own (TorchDynamo caches compiled frames per code object)."""
    code = fn.__code__.replace(co_name=name)
    return types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)


def compiled(key: Hashable, fn: Callable, *, mode: str, device_type: str, graphs: bool = True) -> Callable:
    """`fn` compiled with torch.compile (`TORCH_MODES[mode]`, whole graph, static shapes), once per `key` in this
    process; `fn` itself where compiling is unavailable or its first call fails to compile (one warning).

    Args:
        key: what the compiled code depends on besides the tensors' shapes (config, members, precision, mode).
        fn: the function; its closure holds the constants the key names.
        mode: "default" or "max" (`TrainConfig.compile`).
        device_type: "cpu" or "cuda": where it runs (what backend it needs).
        graphs: False for code the caller captures in a CUDA graph of its own (`training.step`): "max" then
            autotunes without capturing graphs itself (a capture cannot nest another).

    Returns:
        A callable with `fn`'s signature.
    """
    full_key = (key, mode, device_type, graphs)
    if full_key in _CACHE:
        return _CACHE[full_key]
    reason = unavailable(device_type)
    if reason is not None:
        _warn_once(f"torch.compile is not available here ({reason}); training runs eagerly")
        _CACHE[full_key] = fn
        return fn
    torch_mode = TORCH_MODES[mode] if graphs or mode != "max" else "max-autotune-no-cudagraphs"
    program = torch.compile(_own_code(fn, f"compiled_{len(_CACHE)}_{fn.__name__}"), mode=torch_mode,
                            fullgraph=True, dynamic=False)
    state = {"compiled": False}

    def call(*args, **kwargs):
        if state["compiled"]:
            return program(*args, **kwargs)
        try:  # the first call compiles (fullgraph: a failure is raised before anything has run)
            out = program(*args, **kwargs)
        except (torch._dynamo.exc.TorchDynamoException, torch._inductor.exc.InductorError, OSError) as err:
            first_line = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
            _warn_once(f"torch.compile failed on {fn.__name__} ({type(err).__name__}: {first_line}); it runs eagerly")
            _CACHE[full_key] = fn
            return fn(*args, **kwargs)
        state["compiled"] = True
        return out

    _CACHE[full_key] = call
    return call
