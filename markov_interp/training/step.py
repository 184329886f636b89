"""The whole steady-state training step as one function of device tensors, and its capture as one CUDA graph.

`whole_step` is the loop's step (`training.loop`) with nothing on the host between its parts: the batch drawn from
the step tensor (`DataStreams.capturable`, the counter stream's kernel sources), the stacked losses, their
gradients (`torch.func.grad`: no `.grad` fields, no backward call that would end a traced graph), the finite check,
clipping and the optimiser's update (`models.optim.StackedOptimizer.step` with the gradients: update counts and
bias corrections on the device). Eager, it gives the loop's numbers bit for bit on the CPU; with
`TrainConfig.compile` it is compiled as one graph (`fullgraph`: a host read or a graph break inside it fails);
with `TrainConfig.capture="graph"` on CUDA it is recorded once as a CUDA graph (`torch.cuda.CUDAGraph`, static
input buffers: the step, learning rates and alive mask are copied in, the weights and optimiser state are updated
in place) and replayed every step after: one launch per step, whatever the number of members and kernels.

A step is captured only where all of it is device work; otherwise `capture_problem` says why in one line, and
the run records it (`TrainResult.engine`): no CUDA device (the whole step still runs, uncaptured, so the CPU runs
the code a GPU captures), interventions (clamps and freezes run Python hooks with running state), the canonical
reduction, fp16 loss scaling, or a batch not drawn from the step tensor (stream "torch-1", hidden Markov sources).
What the loop does besides the step (metrics rows, evaluations, checkpoints) runs between replays, on its own
cadence, never inside the step.
"""

import functools
import warnings
from typing import Optional

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from markov_interp.models import _compile, shape_config
from markov_interp.models.optim import StackedOptimizer
from markov_interp.models.stack import Stack, stacked_losses
from markov_interp.runs.config import PRECISIONS, TrainConfig
from markov_interp.training.batches import DataStreams

__all__ = ["capture_problem", "whole_step_problem", "whole_step", "WholeStep"]

_WARM_UP = 2  # uncaptured steps on a side stream before the capture (allocator and compiled code settle)


def capture_problem(tc: TrainConfig, device: torch.device, data: DataStreams) -> Optional[str]:
    """Why the steady-state step of a run cannot be one CUDA graph, in one line, or None when it can.

    Args:
        tc: the run's training config.
        device: where it trains.
        data: its data streams.

    Returns:
        The reason, or None.

    >>> from markov_interp.sources import BinaryChain
    >>> from markov_interp.training.batches import data_streams
    >>> cpu = torch.device("cpu")
    >>> capture_problem(TrainConfig(), cpu, data_streams("counter-1", [BinaryChain(0.2, 0.3)], [0], 4, 9, cpu))
    'CUDA graphs need a CUDA device (this run trains on cpu)'
    """
    problem = whole_step_problem(tc, data)
    if problem is None and device.type != "cuda":
        return f"CUDA graphs need a CUDA device (this run trains on {device.type})"
    return problem


def whole_step_problem(tc: TrainConfig, data: DataStreams) -> Optional[str]:
    """Why a run's steps cannot run as `whole_step` on any device (`capture_problem` without the device), or None.

    Args:
        tc: the run's training config.
        data: its data streams.

    Returns:
        The reason, or None.
    """
    if tc.interventions:
        return "interventions run Python hooks with running state at every step"
    if tc.reduction is not None:
        return "the canonical reduction projects the gradients outside the traced step"
    if tc.loss_scaling:
        return "fp16 loss scaling is not part of the traced step"
    if data.capturable is None:
        return f"the batch is not drawn from the step tensor (stream {data.stream!r} or a source without a stream sampler)"
    return None


def whole_step(params: dict[str, Tensor], draw, optimizer: StackedOptimizer, step: Int[Tensor, ""],
               lr: Float[Tensor, " member"], wd: Float[Tensor, " member"], alive: Bool[Tensor, " member"], *,
               configs: list, dtype: Optional[torch.dtype],
               grad_clip: Optional[float]) -> tuple[Float[Tensor, " member"], Bool[Tensor, " member"]]:
    """One update t -> t + 1 of every member, reading no host value (what `WholeStep` compiles and captures).

    The loop's step in the loop's order: the batch of step t (`draw(step)`), the [member] losses, their gradients,
    which members stayed finite (loss and gradients), per-member clipping (`grad_clip`), then the optimiser's
    update of the members alive and finite.

    Args:
        params: the stack's parameters (updated in place).
        draw: the sampler of the step tensor (`DataStreams.capturable`).
        optimizer: the stack's optimiser (its state updated in place).
        step: the 0-dim step tensor t.
        lr, wd: the [member] learning rates of this update and weight decays.
        alive: the members still training.
        configs: the stack's member configs; dtype: the autocast dtype or None; grad_clip: max norm or None.

    Returns:
        ([member] losses of the batch, [member] whether each stayed finite).
    """
    tokens = draw(step)

    def summed(p: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        with torch.enable_grad():
            losses = stacked_losses(Stack(configs, p), tokens, dtype=dtype)
        return losses.sum(), losses.detach()

    grads, losses = torch.func.grad(summed, has_aux=True)(params)
    grads = {name: _laid_out(g, params[name]) for name, g in grads.items()}
    ok = torch.isfinite(losses) & optimizer.member_finite(grads)
    if grad_clip is not None:
        optimizer.clip_grad_norm(grad_clip, grads)
    optimizer.step(lr, wd, alive & ok, grads=grads)
    return losses, ok


def _laid_out(grad: Tensor, param: Tensor) -> Tensor:
    """`grad` in `param`'s strides, as backward's `.grad` is (autograd's layout contract): the update's kernels
    then see the layout the loop's step gives them, whatever layout `torch.func.grad` returns (a copy only where
    the strides differ; they are known when the step is traced: no host read)."""
    if grad.stride() == param.stride():
        return grad
    return param.new_empty_strided(param.shape, param.stride()).copy_(grad)


class WholeStep:
    """The whole step of one stack, compiled as `TrainConfig.compile` says and, where `capture_problem` finds
    nothing, captured as one CUDA graph after `_WARM_UP` uncaptured steps. Each call is one real update.

    `engine` says in one line how the steps ran ("one CUDA graph per step", or why not).
    """

    def __init__(self, stack: Stack, optimizer: StackedOptimizer, data: DataStreams, tc: TrainConfig,
                 problem: Optional[str]):
        self.stack, self.optimizer, self.data = stack, optimizer, data
        self.capture = problem is None
        self.engine = "one CUDA graph per step" if self.capture else f"not captured: {problem}"
        fn = functools.partial(whole_step, configs=[stack.cfg] * stack.n_members, dtype=PRECISIONS[tc.precision],
                               grad_clip=tc.grad_clip)
        if tc.compile != "off":
            key = ("whole_step", shape_config(stack.cfg).to_json(), stack.n_members, data.capturable.signature,
                   tc.precision, tc.optimizer, tc.betas, tc.momentum, tc.grad_clip,
                   tuple(sorted(optimizer.decay)))
            fn = _compile.compiled(key, _own(fn), mode=tc.compile, device_type=stack.device.type,
                                   graphs=not self.capture)
        self.fn = fn
        self.warm = 0
        self.graph: Optional[torch.cuda.CUDAGraph] = None
        if self.capture:
            optimizer.reserve(tc.steps)  # the corrections table is a graph input: never regrown after capture

    @torch.no_grad()  # gradients come from torch.func.grad inside; nothing outside it records a graph
    def __call__(self, t: int, lr: Tensor, wd: Tensor, alive: Tensor) -> tuple[Tensor, Tensor]:
        """Update t -> t + 1 (`whole_step`); returns ([member] losses, [member] finite), owned by the caller."""
        self.optimizer.step_count += 1
        self.optimizer.reserve(self.optimizer.step_count)
        step = self.data.step(t)
        if not self.capture:
            return self.fn(self.stack.params, self.data.capturable, self.optimizer, step, lr, wd, alive)
        if self.graph is None and self.warm < _WARM_UP:
            self.warm += 1
            side = torch.cuda.Stream(device=self.stack.device)
            side.wait_stream(torch.cuda.current_stream(self.stack.device))
            with torch.cuda.stream(side):
                out = self.fn(self.stack.params, self.data.capturable, self.optimizer, step, lr, wd, alive)
            torch.cuda.current_stream(self.stack.device).wait_stream(side)
            return out
        if self.graph is None and not self._record(step, lr, wd, alive):
            return self.fn(self.stack.params, self.data.capturable, self.optimizer, step, lr, wd, alive)
        self.inputs[0].copy_(lr)
        self.inputs[1].copy_(wd)
        self.inputs[2].copy_(alive)
        self.graph.replay()
        return self.outputs[0].clone(), self.outputs[1].clone()

    def _record(self, step: Tensor, lr: Tensor, wd: Tensor, alive: Tensor) -> bool:
        """Capture the step (nothing runs: the first replay is this step's update) on static copies of the
        inputs that change between steps; the step tensor is already one (`DataStreams.step`, filled in place).
        Where CUDA refuses the capture, the run goes on uncaptured (nothing was updated) after one warning that
        says why, and `engine` records it; returns whether it captured."""
        self.inputs = (lr.clone(), wd.clone(), alive.clone())
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                self.outputs = self.fn(self.stack.params, self.data.capturable, self.optimizer, step, *self.inputs)
        except RuntimeError as err:
            first_line = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
            self.capture, self.engine = False, f"not captured: the CUDA graph capture failed ({first_line})"
            warnings.warn(f"capture='graph': {self.engine}; the steps run uncaptured", RuntimeWarning, stacklevel=3)
            return False
        self.graph = graph
        return True


def _own(fn: functools.partial):
    """A partial of `whole_step` as a plain function (`models._compile` compiles functions with a name)."""

    def whole_training_step(*args):
        return fn(*args)

    return whole_training_step
