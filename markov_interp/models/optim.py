"""The optimiser of a stack: the one weight-decay rule and AdamW / SGD with per-member learning rates.

**Weight decay** falls on the weights of linear layers only, chosen by parameter name (`decayed`): the attention
and MLP weights and an untied unembedding; never embeddings (a tied unembedding is the embedding), positions,
LayerNorm scales or biases. The reference code's rule (nanoGPT's `configure_optimizers` decides by shape).

`StackedOptimizer` is AdamW or SGD written out elementwise over a `models.stack.Stack`, with per-member learning
rate and weight decay as tensors, in the order of operations of torch's foreach implementations. A member's
update reads only that member's numbers, so it is the same in a stack of one and in a stack of K. A member
marked not alive (its loss or gradient went non-finite) keeps its parameters and optimiser state while the
others go on. Its state is checkpointed per member in the format of a torch optimiser's `state_dict()` (two
parameter groups: decayed weights, then the rest), which is also what run folders written before the one engine
hold.

**No host state on the step's path** (what torch calls `capturable`): each parameter's update count is a device
tensor, and AdamW's bias corrections (1 - beta1^t, sqrt(1 - beta2^t)) are read from a device table indexed by it.
The table is computed with Python floats, as torch's foreach AdamW computes them, so the numbers are those of a host
computation bit for bit (`torch.pow` on a tensor rounds differently in the last bit at some t), and an update reads
no host value: it can run inside one compiled graph or CUDA graph with the rest of the step
(`training.step`). Only a checkpoint reads the counts back.
"""

import functools
import re
from collections.abc import Callable
from typing import Optional

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from markov_interp.models import _compile
from markov_interp.models.config import ModelConfig
from markov_interp.models.init import state_shapes
from markov_interp.models.stack import Stack

__all__ = ["decayed", "decay_names", "StackedOptimizer"]

_DECAYED = re.compile(r"blocks\.\d+\.(attn\.[qkvo]|mlp\.(in|out))\.weight|unembed\.weight")


def decayed(name: str) -> bool:
    """Whether the parameter named `name` (on-disk names, `models.init.state_shapes`) is under weight decay.

    >>> [decayed(n) for n in ("blocks.0.attn.q.weight", "blocks.0.attn.q.bias", "embed.weight", "unembed.weight")]
    [True, False, False, True]
    """
    return _DECAYED.fullmatch(name) is not None


def decay_names(cfg: ModelConfig) -> set[str]:
    """Names of the parameters of a model of `cfg` under weight decay.

    Args:
        cfg: the model config.

    Returns:
        The on-disk names (`models.init.state_shapes`) for which `decayed` holds.
    """
    return {name for name in state_shapes(cfg) if decayed(name)}


def _mask(alive: Tensor, like: Tensor) -> Tensor:
    """[member] booleans shaped to broadcast against `like`."""
    return alive.view(-1, *([1] * (like.ndim - 1)))


def _per_member(values: Tensor, like: Tensor) -> Tensor:
    """[member] values cast to `like`'s dtype and shaped to broadcast against it."""
    return values.to(device=like.device, dtype=like.dtype).view(-1, *([1] * (like.ndim - 1)))


class _MemberScalars:
    """The per-member numbers of one step ([member] float64 learning rates and decays), each computed once and
    cast / shaped for a parameter's dtype and rank on demand."""

    def __init__(self, lr64: Tensor, wd64: Tensor):
        self.lr64, self.wd64 = lr64, wd64
        self._cache: dict[tuple, Tensor] = {}

    def _shaped(self, key: str, values: "Callable[[], Tensor]", like: Tensor) -> Tensor:
        cache_key = (key, like.ndim, like.dtype)
        if cache_key not in self._cache:
            self._cache[cache_key] = _per_member(values(), like)
        return self._cache[cache_key]

    def decay(self, like: Tensor) -> Tensor:
        """AdamW's decoupled decay factor 1 - lr * wd."""
        return self._shaped("decay", lambda: 1 - self.lr64 * self.wd64, like)

    def weight_decay(self, like: Tensor) -> Tensor:
        return self._shaped("wd", lambda: self.wd64, like)

    def negative_lr(self, like: Tensor) -> Tensor:
        return self._shaped("-lr", lambda: -self.lr64, like)

    def step_size(self, like: Tensor, bias_correction1: Tensor) -> Tensor:
        """-lr / (1 - beta1^t) for one parameter's correction (0-dim: the parameter's; [member]: per member)."""
        return _per_member(-(self.lr64 / bias_correction1), like)


def _adamw_update(params: list[Tensor], state: list[Tensor], grads: list[Tensor], decay: list[Tensor],
                  step_sizes: list[Tensor], bias2: list, *, decay_at: tuple, betas: tuple, eps: float) -> None:
    """AdamW in place, in torch's foreach AdamW's order of operations: decoupled decay of the parameters at
    `decay_at` by `decay` (1 - lr * wd per member), the moments, then p += step_size * m / (sqrt(v) / bias2 + eps)
    with step_size = -lr / (1 - beta1^t). `state` is the first moments, then the second."""
    beta1, beta2 = betas
    n = len(params)
    exp_avgs, exp_avg_sqs = state[:n], state[n:]
    if decay_at:
        torch._foreach_mul_([params[i] for i in decay_at], decay)
    torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)
    denoms = torch._foreach_sqrt(exp_avg_sqs)
    torch._foreach_div_(denoms, bias2)
    torch._foreach_add_(denoms, eps)
    steps = torch._foreach_mul(exp_avgs, step_sizes)
    torch._foreach_addcdiv_(params, steps, denoms)


def _sgd_update(params: list[Tensor], state: list[Tensor], grads: list[Tensor], weight_decay: list[Tensor],
                negative_lr: list[Tensor], *, decay_at: tuple, first: tuple, momentum: float) -> None:
    """SGD in place: coupled decay (the gradient plus wd * param at `decay_at`), optional momentum (`state`: the
    buffers; at `first` a buffer starts as the gradient), then p += -lr * (buffer or gradient)."""
    grads = [g.clone() if i in decay_at else g for i, g in enumerate(grads)]
    if decay_at:
        torch._foreach_add_([grads[i] for i in decay_at],
                            torch._foreach_mul([params[i] for i in decay_at], weight_decay))
    if momentum != 0:
        for i in first:
            state[i].copy_(grads[i])
        rest = [i for i in range(len(params)) if i not in first]
        if rest:
            torch._foreach_mul_([state[i] for i in rest], momentum)
            torch._foreach_add_([state[i] for i in rest], [grads[i] for i in rest])
        grads = state
    torch._foreach_add_(params, torch._foreach_mul(grads, negative_lr))


def _masked_update(update: Callable) -> Callable:
    """`update` with members not alive restored afterwards (compiled, the masking is fused into the update)."""

    def stacked_optimizer_update(params: list[Tensor], state: list[Tensor], grads: list[Tensor], alive: Tensor,
                                 inputs: tuple) -> None:
        before = [t.clone() for t in params + state]
        update(params, state, grads, *inputs)
        for tensor, old in zip(params + state, before):
            tensor.copy_(torch.where(_mask(alive, tensor), tensor, old))

    return stacked_optimizer_update


class StackedOptimizer:
    """AdamW (decoupled decay) or SGD (coupled decay, optional momentum) over a stack, one step for all
    members, per-member `lr` and `weight_decay` ([member] tensors) and an `alive` mask.

    `compile` ("off", "default" or "max", `TrainConfig.compile`): the update runs compiled (`models._compile`),
    the same function as eager with the masking of members not alive fused in.

    State: `step_count` (steps taken, on the host: it only sizes the table of bias corrections), `counts` (a
    device tensor: the updates of each parameter, in `stack.params` order; a frozen parameter skips steps as
    torch's per-parameter `step` does; `param_steps` reads them back as a dict), with `count_members()` also
    `member_steps` (per parameter, the updates of each member: fp16 loss scaling skips a member's step when its
    gradient overflows), and per parameter name `exp_avg`, `exp_avg_sq` (AdamW) or `momentum_buffer` (SGD with
    momentum), each `[member, *shape]`.
    """

    def __init__(self, stack: Stack, *, kind: str, betas: tuple = (0.9, 0.95), momentum: float = 0.0,
                 eps: float = 1e-8, compile: str = "off"):
        if kind not in _RULES:
            raise ValueError(f"optimizer must be 'adamw' or 'sgd', got {kind!r}")
        if compile not in ("off", *_compile.TORCH_MODES):
            raise ValueError(f"compile must be 'off', 'default' or 'max', got {compile!r}")
        self.stack, self.kind, self.betas, self.momentum, self.eps = stack, kind, tuple(betas), momentum, eps
        self.rule = _RULES[kind]
        self.compile = compile
        self.decay = {name for name in stack.params if decayed(name)}
        self.step_count = 0
        self.counts = torch.zeros(len(stack.params), dtype=torch.long, device=stack.device)
        self._index = {name: i for i, name in enumerate(stack.params)}
        self._selections: dict[tuple, tuple[Tensor, Tensor]] = {}
        self.corrections = torch.zeros(0, 2, dtype=torch.float64, device=stack.device)
        self.member_steps: Optional[dict[str, Tensor]] = None
        self.state: dict[str, dict[str, Tensor]] = {name: {} for name in stack.params}

    @property
    def param_steps(self) -> dict[str, int]:
        """The updates of each parameter so far (read from the device: for checkpoints, not for steps)."""
        return dict(zip(self.stack.params, self.counts.tolist()))

    def count_members(self) -> None:
        """Keep step counts per member from now on (needed when members may skip steps)."""
        self.member_steps = {name: torch.full((self.stack.n_members,), float(count), dtype=torch.float64,
                                              device=self.stack.device)
                             for name, count in self.param_steps.items()}

    def reserve(self, steps: int) -> None:
        """Make the device table of AdamW's bias corrections cover update counts up to `steps` (host work, at most
        a doubling each time it grows; a captured step calls it once for the whole run first, since the table is
        one of its inputs). Row t is (1 - beta1^t, sqrt(1 - beta2^t)) in Python floats, as torch's foreach AdamW
        computes them."""
        if steps < len(self.corrections):
            return
        beta1, beta2 = self.betas
        size = max(steps + 1, 2 * len(self.corrections), 64)
        rows = [(1 - beta1**t, (1 - beta2**t) ** 0.5) for t in range(size)]
        self.corrections = torch.tensor(rows, dtype=torch.float64).to(self.stack.device)

    def _selection(self, names: list[str]) -> tuple[Tensor, Tensor]:
        """(index of `names` in `counts`, 0/1 increments of `counts` for a step of `names`), on the device, kept
        per set of names (one pair in a steady state)."""
        key = tuple(names)
        if key not in self._selections:
            index = [self._index[name] for name in names]
            ones = torch.zeros(len(self.counts), dtype=torch.long)
            ones[index] = 1
            self._selections[key] = (torch.tensor(index).to(self.counts.device), ones.to(self.counts.device))
        return self._selections[key]

    @torch.no_grad()
    def step(self, lr: Float[Tensor, " member"], weight_decay: Float[Tensor, " member"],
             alive: Bool[Tensor, " member"], frozen: frozenset = frozenset(),
             grads: Optional[dict[str, Tensor]] = None) -> None:
        """One update of every member with its own lr / weight decay; members with alive=False keep their
        parameters and state unchanged. Parameters named in `frozen` get no update at all (no step, moment,
        step count or decay: what torch's optimisers do for a parameter without a gradient).

        The update runs in place over all parameters at once (`torch._foreach_*`; with `compile`, the same
        function compiled into a few fused kernels). Where some member is not alive (and always on an
        accelerator or compiled, where reading the mask would wait for the device) the tensors are restored for
        those members afterwards; either way an alive member's numbers are the same.

        With `grads` ({name: gradient} instead of the parameters' `.grad`: the whole step of `training.step`,
        traced into one graph) the update is always masked, never compiled on its own, and reads nothing on the
        host; `step_count` is then the caller's to keep.
        """
        traced = grads is not None
        if not traced:
            self.step_count += 1
            self.reserve(self.step_count)
        names = [name for name in self.stack.params if name not in frozen]
        index, ones = self._selection(names)
        self.counts.add_(ones)
        if self.member_steps is not None:
            for name in names:
                self.member_steps[name] += alive.double()
        params = [self.stack.params[name] for name in names]
        grads = [p.grad for p in params] if grads is None else [grads[name] for name in names]
        assert all(g is not None for g in grads), "every updated parameter needs a gradient"
        fresh = {name for name in names if "momentum_buffer" not in self.state[name]}  # SGD: buffer = first grad
        state = self._state_tensors(names)
        scalars = _MemberScalars(lr.double(), weight_decay.double())
        decay_at = tuple(i for i, name in enumerate(names) if name in self.decay)
        update, inputs = self.rule.update(self, names, params, scalars, decay_at, fresh, index)
        if self.compile != "off" and not traced:
            key = ("optimizer", self.kind, tuple(names), tuple((tuple(p.shape), p.dtype) for p in params),
                   tuple(sorted(update.keywords.items())), self.member_steps is not None)
            _compile.compiled(key, _masked_update(update), mode=self.compile, device_type=self.stack.device.type)(
                params, state, grads, alive, inputs)
        elif traced or self.stack.device.type != "cpu" or not bool(alive.all()):  # traced: no host read
            _masked_update(update)(params, state, grads, alive, inputs)
        else:
            update(params, state, grads, *inputs)

    def _state_tensors(self, names: list[str]) -> list[Tensor]:
        """The optimiser state of `names` (created at zero on first use): exp_avg then exp_avg_sq (AdamW), or the
        momentum buffers (SGD with momentum), in `names`' order."""
        out = []
        for key in self.rule.state_keys(self):
            for name in names:
                state = self.state[name]
                if key not in state:
                    state[key] = torch.zeros_like(self.stack.params[name])
                out.append(state[key])
        return out

    def _adamw_inputs(self, names: list[str], params: list[Tensor], scalars: "_MemberScalars", decay_at: tuple,
                      index: Tensor) -> tuple[list, list, list]:
        """The per-step numbers of `_adamw_update`: decay factors, step sizes -lr / (1 - beta1^t) and
        sqrt(1 - beta2^t) per parameter, from the device: the rows of `corrections` at the parameters' counts
        (`index`: their places in `counts`), or with `member_steps` each member's count through `torch.pow`."""
        decay = [scalars.decay(params[i]) for i in decay_at]
        if self.member_steps is not None:  # per member (a member that skipped steps has its own count)
            beta1, beta2 = self.betas
            steps = [self.member_steps[name] for name in names]
            return (decay, [scalars.step_size(p, 1 - torch.pow(beta1, t)) for p, t in zip(params, steps)],
                    [_per_member(torch.pow(1 - torch.pow(beta2, t), 0.5), p) for p, t in zip(params, steps)])
        rows = self.corrections[self.counts[index]]  # [name, 2]: float64, bit for bit the host's floats
        sizes = -(scalars.lr64[None, :] / rows[:, :1])  # [name, member], each entry as -(lr / c1) alone
        cast = {dtype: (sizes.to(dtype).unbind(), rows[:, 1].to(dtype).unbind()) for dtype in {p.dtype for p in params}}
        return (decay, [cast[p.dtype][0][i].view(-1, *([1] * (p.ndim - 1))) for i, p in enumerate(params)],
                [cast[p.dtype][1][i] for i, p in enumerate(params)])

    # -- checkpoints: a torch optimiser's state_dict() per member
    def checkpoint_order(self) -> list[str]:
        """Parameter names in the numbering of the checkpointed state: decayed weights, then the rest, each in
        the model's parameter order (the two parameter groups of a torch optimiser)."""
        names = list(self.stack.params)
        return [n for n in names if n in self.decay] + [n for n in names if n not in self.decay]

    def member_state_dict(self, k: int, *, lr: float, weight_decay: float) -> dict:
        """Member k's state as a torch optimiser's `state_dict()` (AdamW / SGD, foreach, two parameter groups)."""
        order = self.checkpoint_order()
        state = {}
        param_steps = self.param_steps
        for index, name in enumerate(order):
            if self.member_steps is None and param_steps[name] == 0:
                continue  # never updated (frozen from the start): torch keeps no state for it
            entry = {key: value[k].detach().to("cpu").clone() for key, value in self.state[name].items()}
            if self.rule.counts_steps:
                count = param_steps[name] if self.member_steps is None else float(self.member_steps[name][k])
                entry["step"] = torch.tensor(float(count), dtype=torch.float32)
            if entry:
                state[index] = entry
        n_decay = sum(1 for n in order if n in self.decay)
        hyper = self.rule.hyper(self, lr)
        groups = [{**hyper, "weight_decay": weight_decay, "params": list(range(n_decay))},
                  {**hyper, "weight_decay": 0.0, "params": list(range(n_decay, len(order)))}]
        return {"state": state, "param_groups": groups}

    @torch.no_grad()
    def load_member_state(self, k: int, saved: dict) -> None:
        """Member k's state from a checkpointed `state_dict()` (inverse of `member_state_dict`)."""
        order = self.checkpoint_order()
        for index, entry in saved["state"].items():
            name = order[int(index)]
            for key, value in entry.items():
                if key == "step":
                    if self.member_steps is not None:
                        self.member_steps[name][k] = float(value)
                    self.counts[self._index[name]] = int(value)
                    continue
                if value is None:  # SGD without momentum (older torch): no buffer
                    continue
                target = self.state[name].setdefault(key, torch.zeros_like(self.stack.params[name]))
                target[k].copy_(value.to(target.device))

    def _grads(self, grads: Optional[dict[str, Tensor]]) -> list[Tensor]:
        """The gradients: `grads`' values, else the parameters' `.grad` (frozen ones have none)."""
        if grads is not None:
            return list(grads.values())
        return [p.grad for p in self.stack.params.values() if p.grad is not None]

    @torch.no_grad()
    def member_finite(self, grads: Optional[dict[str, Tensor]] = None) -> Bool[Tensor, " member"]:
        """Per member: are all its gradients (`grads`, else `.grad`) finite? (The largest |gradient| of each member
        and parameter, one reduction each: NaN and infinities survive a max, nothing else makes it non-finite.)"""
        grads = self._grads(grads)
        largest = torch.stack([torch.linalg.vector_norm(g.flatten(1), float("inf"), dim=1) for g in grads], dim=1)
        return torch.isfinite(largest).all(dim=1)

    @torch.no_grad()
    def clip_grad_norm(self, max_norm: float, grads: Optional[dict[str, Tensor]] = None) -> None:
        """Per-member `torch.nn.utils.clip_grad_norm_`: each member's gradients (`grads`, else `.grad`) scaled in
        place to total norm <= max_norm."""
        grads = self._grads(grads)
        # [member, parameter]: every reduction runs along a contiguous row of one member (the same arithmetic
        # whatever the number of members; a reduction across the member axis would not be)
        norms = torch.stack([torch.linalg.vector_norm(g.flatten(1), 2, dim=1) for g in grads], dim=1)
        total = torch.linalg.vector_norm(norms, 2, dim=1)
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for g in grads:
            g.mul_(_per_member(coef, g))

    def zero_grad(self) -> None:
        for p in self.stack.parameters():
            p.grad = None


class _AdamW:
    """AdamW's part of `StackedOptimizer`: its state (two moments), its update and inputs, the step count it keeps
    per parameter, and torch's AdamW hyperparameters (a checkpoint's `param_groups`)."""

    counts_steps = True  # torch's AdamW keeps a `step` per parameter in its state

    def state_keys(self, opt: StackedOptimizer) -> tuple[str, ...]:
        return ("exp_avg", "exp_avg_sq")

    def update(self, opt: StackedOptimizer, names: list[str], params: list[Tensor], scalars: _MemberScalars,
               decay_at: tuple, fresh: set, index: Tensor) -> tuple[Callable, tuple]:
        update = functools.partial(_adamw_update, decay_at=decay_at, betas=opt.betas, eps=opt.eps)
        return update, opt._adamw_inputs(names, params, scalars, decay_at, index)

    def hyper(self, opt: StackedOptimizer, lr: float) -> dict:
        return dict(lr=lr, betas=opt.betas, eps=opt.eps, amsgrad=False, maximize=False, foreach=True,
                    capturable=False, differentiable=False, fused=None, decoupled_weight_decay=True)


class _SGD:
    """SGD's part of `StackedOptimizer`: its state (a momentum buffer, with momentum), its update and inputs (the
    buffer starts at the first gradient), and torch's SGD hyperparameters."""

    counts_steps = False

    def state_keys(self, opt: StackedOptimizer) -> tuple[str, ...]:
        return ("momentum_buffer",) if opt.momentum else ()

    def update(self, opt: StackedOptimizer, names: list[str], params: list[Tensor], scalars: _MemberScalars,
               decay_at: tuple, fresh: set, index: Tensor) -> tuple[Callable, tuple]:
        first = tuple(i for i, name in enumerate(names) if name in fresh)
        update = functools.partial(_sgd_update, decay_at=decay_at, first=first, momentum=opt.momentum)
        return update, ([scalars.weight_decay(params[i]) for i in decay_at], [scalars.negative_lr(p) for p in params])

    def hyper(self, opt: StackedOptimizer, lr: float) -> dict:
        return dict(lr=lr, momentum=opt.momentum, dampening=0, nesterov=False, maximize=False, foreach=True,
                    differentiable=False, fused=None)


_RULES = {"adamw": _AdamW(), "sgd": _SGD()}  # TrainConfig.optimizer -> its part of the update
