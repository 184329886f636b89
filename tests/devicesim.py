"""A second device simulated on the CPU: the probes' device handling tested on a machine without a GPU.

A model trained on a GPU meets tensors made on the CPU after training: probe batches (`probes.sample_batch`),
kernels, theory's laws, 0-d zeros, index grids. On a CPU-only machine every tensor is on the CPU, so a probe that
mixes the two passes every test and fails on the first GPU (as `circuit_scores_at` did: "Expected all tensors to
be on the same device"). `SimulatedDevice` (a `TorchFunctionMode`) keeps the numbers on the CPU and simulates
only the bookkeeping: a tensor is on the simulated device `DEVICE` (reported as `torch.device("cpu", 1)`) when it
was moved or made there or computed from tensors there, else on the host, and an operation is refused with
`DeviceMismatch` where CUDA refuses it:

- an operation mixing tensors of both devices, except 0-d host tensors (CUDA takes a 0-d CPU tensor as a
  scalar); `expand_as`, `view_as`, `reshape_as` read only the other tensor's shape;
- indexing a host tensor with indices on the device; writing a value of one device into a tensor of the other
  by advanced (tensor, list) indexing (basic slicing copies across devices, as `copy_` does);
- `numpy()` of a tensor on the device.

Results live where CUDA puts them: on the device when any input is there, or where `device=` / `.to()` says.
A model enters with `model.to(DEVICE)` (as `model.to("cuda")`), which also records `cfg.device = DEVICE`
(TransformerLens records the device type, "cpu" here, and makes tensors there). The numbers are the CPU's,
bit for bit: a probe under the simulation must return exactly what it returns on the CPU.

    with SimulatedDevice():
        model.to(DEVICE)
        probes.attention_scores(model, probes.sample_batch(...))  # DeviceMismatch if a CPU tensor meets the model

`host_work(fn, monkeypatch)`: the aten operations `fn()` dispatches (`OpCounter`: the kernel launches a GPU would
see) and how often it reads a tensor's value on the host (a GPU sync).
"""

import collections
from typing import Any, Optional

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakTensorKeyDictionary

DEVICE = torch.device("cpu", 1)  # the simulated device, as `Tensor.device` reports it
HOST = torch.device("cpu")
_SHAPE_ONLY = (torch.Tensor.expand_as, torch.Tensor.view_as, torch.Tensor.reshape_as)
_NUMPY = (torch.Tensor.numpy, torch.Tensor.__array__)


class DeviceMismatch(RuntimeError):
    """An operation CUDA would refuse: tensors of the simulated device and of the host mixed."""


def _is_device(value: Any) -> bool:
    """Whether `value` (a device, a device name, anything else) names the simulated device."""
    if isinstance(value, str):
        try:
            value = torch.device(value)
        except RuntimeError:
            return False
    return isinstance(value, torch.device) and value == DEVICE


def _attribute(func: Any) -> Optional[tuple[str, str]]:
    """(name, "__get__" | "__set__") when `func` is a tensor attribute's getter or setter, else None."""
    owner = getattr(func, "__self__", None)
    if type(owner).__name__ == "getset_descriptor" and getattr(owner, "__objclass__", None) is torch._C.TensorBase:
        return owner.__name__, func.__name__
    return None


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]


class SimulatedDevice(TorchFunctionMode):
    """The simulation (module docstring): a context manager; `on_device(t)` says where a tensor is, `moved` lists
    the models moved to the device."""

    def __init__(self) -> None:
        super().__init__()
        self._on = WeakTensorKeyDictionary()  # tensor -> True while it is on the simulated device
        self.moved: list[torch.nn.Module] = []  # the models moved to the device (`model.to(DEVICE)`), in order

    def on_device(self, t: Any) -> bool:
        """Whether tensor `t` is on the simulated device."""
        return isinstance(t, torch.Tensor) and self._on.get(t, False)

    def __enter__(self) -> "SimulatedDevice":
        original = self._module_to = torch.nn.Module.to

        def to(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
            out = original(module, *args, **kwargs)
            if any(_is_device(a) for a in (*args, kwargs.get("device"))) and hasattr(module, "cfg"):
                module.cfg.device = DEVICE  # where TransformerLens makes its tensors (it records "cuda" for "cuda")
                self.moved.append(module)
            return out

        torch.nn.Module.to = to
        return super().__enter__()

    def __exit__(self, *exc: Any) -> Any:
        torch.nn.Module.to = self._module_to
        return super().__exit__(*exc)

    def _place(self, out: Any, on_device: bool, source: Optional[torch.Tensor] = None) -> Any:
        """`out` with its tensors on the device (or the host); a result that is `source` itself (a move that
        changed nothing on the CPU) becomes a view of it, so that the original stays where it was."""
        def mark(t: Any) -> Any:
            if not isinstance(t, torch.Tensor):
                return t
            if t is source and self.on_device(t) != on_device:
                t = t.view_as(t)
            if on_device:
                self._on[t] = True
            else:
                self._on.pop(t, None)
            return t

        return pytree.tree_map(mark, out)

    def _refuse_mixed(self, what: str, tensors: list[torch.Tensor]) -> None:
        here = [t for t in tensors if self.on_device(t)]
        host = [t for t in tensors if not self.on_device(t) and t.ndim > 0]  # a 0-d CPU tensor: a scalar to CUDA
        if here and host:
            raise DeviceMismatch(f"{what}: tensors on the simulated device (shapes {[tuple(t.shape) for t in here]}) "
                                 f"and on the CPU (shapes {[tuple(t.shape) for t in host]})")

    def _to(self, args: tuple, kwargs: dict) -> torch.Tensor:
        """`Tensor.to(...)`: the move itself is simulated (the CPU call keeps the dtype change)."""
        tensor, rest, target = args[0], list(args[1:]), None
        for i, a in enumerate(rest):
            if isinstance(a, torch.Tensor):  # .to(other): other's device and dtype
                target, rest[i] = self.on_device(a), a.dtype
            elif isinstance(a, (str, torch.device)):
                target, rest[i] = _is_device(a), HOST if _is_device(a) else a
        if kwargs.get("device") is not None:
            target = _is_device(kwargs["device"])
            kwargs["device"] = HOST if target else kwargs["device"]
        out = torch.Tensor.to(tensor, *rest, **kwargs)
        return self._place(out, self.on_device(tensor) if target is None else target, source=tensor)

    def _index(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """`t[index]` and `t[index] = value`: CPU indices may index a tensor on the device, not the reverse; a
        value written by advanced indexing must be where the tensor is (unless it is 0-d)."""
        tensor, index = args[0], args[1]
        indices = _tensors(index)
        if not self.on_device(tensor) and any(self.on_device(i) for i in indices):
            raise DeviceMismatch("a tensor on the CPU indexed with indices on the simulated device")
        if func is torch.Tensor.__getitem__:
            return self._place(func(*args, **kwargs), self.on_device(tensor))
        value = args[2]
        advanced = bool(indices) or isinstance(index, list)
        if advanced and isinstance(value, torch.Tensor) and value.ndim > 0 and \
                self.on_device(value) != self.on_device(tensor):
            where = lambda t: "the simulated device" if self.on_device(t) else "the CPU"  # noqa: E731
            raise DeviceMismatch(f"a value on {where(value)} written by index into a tensor on {where(tensor)}")
        return func(*args, **kwargs)

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = dict(kwargs or {})
        attribute = _attribute(func)
        if attribute == ("device", "__get__"):
            return DEVICE if self.on_device(args[0]) else func(*args, **kwargs)
        if attribute == ("data", "__set__"):  # nn.Module.to swaps each parameter's data
            func(*args, **kwargs)
            self._place(args[0], self.on_device(args[1]))
            return None
        if func is torch.Tensor.to:
            return self._to(args, kwargs)
        if func is torch.Tensor.cpu:
            return self._place(func(*args, **kwargs), False, source=args[0])
        if func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__):
            return self._index(func, args, kwargs)
        if func in _NUMPY and self.on_device(args[0]):
            raise DeviceMismatch("numpy() of a tensor on the simulated device (call .cpu() first)")
        if func in _SHAPE_ONLY:
            return self._place(func(*args, **kwargs), self.on_device(args[0]))
        if func in (torch.Tensor.copy_, torch._has_compatible_shallow_copy_type):
            return func(*args, **kwargs)  # across devices, as on CUDA
        tensors = _tensors((args, kwargs))
        if func is torch.autograd.grad:  # each gradient is where its input is
            inputs = kwargs["inputs"] if "inputs" in kwargs else args[1]
            inputs = [inputs] if isinstance(inputs, torch.Tensor) else list(inputs)
            return tuple(self._place(g, self.on_device(i)) for g, i in zip(func(*args, **kwargs), inputs))
        made_on = None
        if kwargs.get("device") is not None:  # a factory, or new_*(device=...)
            made_on = _is_device(kwargs["device"])
            kwargs["device"] = HOST if made_on else kwargs["device"]
        self._refuse_mixed(getattr(func, "__qualname__", getattr(func, "__name__", str(func))), tensors)
        out = func(*args, **kwargs)
        if isinstance(out, torch.Tensor) and any(out is t for t in tensors):
            return out  # in place: it stays where it is
        return self._place(out, made_on if made_on is not None else any(self.on_device(t) for t in tensors))


class OpCounter(TorchDispatchMode):
    """Counts every aten operation dispatched inside it (what would be a kernel launch on a GPU): `ops`, a Counter
    by operation name."""

    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


_READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__")  # a tensor's value


def host_work(fn, monkeypatch) -> tuple[collections.Counter, int]:
    """(operations dispatched, host reads of tensor values) while `fn()` runs."""
    reads = []
    with monkeypatch.context() as patch:
        for name in _READS:
            original = getattr(torch.Tensor, name)
            patch.setattr(torch.Tensor, name, (lambda original, name: lambda self, *a, **k: (
                reads.append(name), original(self, *a, **k))[1])(original, name))
        with OpCounter() as counter:
            fn()
    return counter.ops, len(reads)
