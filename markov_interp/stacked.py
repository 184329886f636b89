"""K models as one: parameters with a leading member axis, one batched forward, one elementwise optimiser.

The research questions of Makkuva et al. ("Attention with Markov", arXiv 2402.04161) are statistical: which
fraction of seeds stays on the unigram plateau, how the escape time is distributed. That needs tens of runs
per condition of a model so small that one run leaves a GPU idle. A `Stack` holds K models of the same
shapes (same `ModelConfig` up to its initialisation options) as tensors `[member, ...]`: member k is built by
`models.build(cfg_k, seed=seed_k)` and stacked, so it starts exactly at its solo initialisation (a tied member
keeps one embedding matrix, used as its unembedding).

`stacked_forward(stack, tokens)` is `models.fast_forward` for every member at once: batched matmuls
(`einsum` over the member axis), fused causal attention over member x batch, no hooks. Its named intervention
points carry TransformerLens hook names (`stacked_hook_names`), so code written for the hooked model's
activations applies to a stack: pass `{hook name: fn}` and each `fn` replaces that activation (with a
leading member axis) by its return value (`intervene.clamp_hooks(..., member_axis=True)` builds clamps).

`StackedOptimizer` is AdamW or SGD written out elementwise, with per-member learning rate and weight decay as
tensors, in the order of operations of torch's foreach implementations (so a member follows its solo run's
`torch.optim.AdamW` up to float rounding), weight decay on the linear weights only (training's decay groups).
A member whose loss or gradient is not finite is frozen (parameters and optimiser state kept) while the
others go on.
"""

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Optional

import einops
import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor

from markov_interp import models
from markov_interp._io import atomic_write
from markov_interp.models import ModelConfig

__all__ = [
    "Stack",
    "build_stack",
    "stacked_forward",
    "stacked_hook_names",
    "check_intervention_points",
    "shape_config",
    "StackedOptimizer",
    "INIT_FIELDS",
]

# ModelConfig fields that only change the initial weights: members of one stack may differ in them.
INIT_FIELDS = ("init", "init_std", "canonical_e", "canonical_w", "canonical_b", "canonical_v_std", "canonical_a")


def shape_config(cfg: ModelConfig) -> ModelConfig:
    """`cfg` with its initialisation options reset to the defaults: what decides a stack's shapes."""
    default = ModelConfig()
    return cfg.replace(**{name: getattr(default, name) for name in INIT_FIELDS})


class Stack:
    """K models of one architecture as stacked parameters `[member, *solo shape]`, keyed by the
    TransformerLens state-dict names of `models.save` (a tied unembedding is `embed.weight`).

    `configs[k]` is member k's own `ModelConfig` (its init options may differ from the others'); `cfg` is
    the shared architecture. `act` and `rotary` are the parameter-free modules of the solo fast path.
    """

    def __init__(self, configs: Sequence[ModelConfig], params: dict[str, Tensor], act: Optional[Callable],
                 rotary: Optional[torch.nn.Module]):
        self.configs = list(configs)
        self.cfg = configs[0]
        self.params = params
        self.act = act
        self.rotary = rotary

    @property
    def n_members(self) -> int:
        return len(self.configs)

    def parameters(self) -> list[Tensor]:
        return list(self.params.values())

    def member_state(self, k: int) -> dict[str, Tensor]:
        """Member k's weights as `models.save` writes them (CPU copies, TransformerLens names)."""
        return {name: p[k].detach().to("cpu").contiguous().clone() for name, p in self.params.items()}

    def save_member(self, k: int, path: Any) -> None:
        """Write member k as `models.save` would (TransformerLens names, config in the metadata, atomically) to
        `path`, a `.safetensors` file or a folder that gets `model.safetensors`; `models.load` reads it."""
        from pathlib import Path

        from safetensors.torch import save as st_save

        path = Path(path)
        if path.suffix != ".safetensors":
            path = path / models.WEIGHTS_FILE
        metadata = {models._CONFIG_KEY: self.configs[k].to_json(), "format": "pt"}
        atomic_write(path, st_save(self.member_state(k), metadata=metadata))

    def hooked_model(self, k: int, device: Any = None) -> Any:
        """Member k as a hooked TransformerLens model (`models.hooked_model` of its weights)."""
        return models.hooked_model(self.configs[k], self.member_state(k), device=device)

    @torch.no_grad()
    def load_member(self, k: int, state: Mapping[str, Tensor]) -> None:
        """Overwrite member k's weights with `state` (names and shapes as `member_state`)."""
        missing = sorted(set(self.params) - set(state))
        unexpected = sorted(set(state) - set(self.params))
        if missing or unexpected:
            raise ValueError(f"member weights: missing tensors {missing}, unexpected tensors {unexpected}")
        for name, p in self.params.items():
            p[k].copy_(state[name].to(device=p.device, dtype=p.dtype))


def build_stack(configs: Sequence[ModelConfig], seeds: Sequence[int], *, device: Any = None) -> Stack:
    """A stack of `models.build(configs[k], seed=seeds[k])`: each member starts at its solo init.

    The configs must agree on everything but `INIT_FIELDS` (else ValueError naming the field).
    """
    if len(configs) != len(seeds) or not configs:
        raise ValueError(f"need one seed per config and at least one member, got {len(configs)} configs and "
                         f"{len(seeds)} seeds")
    shared = shape_config(configs[0])
    for i, cfg in enumerate(configs):
        if shape_config(cfg) != shared:
            field = next(f for f, v in shape_config(cfg).to_dict().items() if shared.to_dict()[f] != v)
            raise ValueError(f"model config {i} differs from config 0 in model.{field}: members of a stack "
                             f"may differ only in {list(INIT_FIELDS)}")
    dev = torch.device(device) if device is not None else torch.device("cpu")
    states = [models.initial_state(cfg, seed) for cfg, seed in zip(configs, seeds)]
    act = None if shared.attn_only else models.ACTIVATIONS[shared.act_fn]
    rotary = models.Rotary(shared.d_head, shared.n_ctx).to(dev) if shared.positional == "rotary" else None
    params = {name: torch.stack([s[name] for s in states]).to(dev).requires_grad_(True) for name in states[0]}
    return Stack(configs, params, act, rotary)


# ------------------------------------------------------------------------------------------------ forward
def stacked_hook_names(cfg: ModelConfig) -> list[str]:
    """The intervention points of `stacked_forward`, in forward order (TransformerLens hook names).

    `attn.hook_pattern` (`[member, batch, head, query_pos, key_pos]`) is formed only in a layer whose pattern
    is intervened (that layer then computes its attention explicitly); otherwise the fused attention never
    forms it.
    """
    names = ["hook_embed"] + (["hook_pos_embed"] if cfg.positional == "standard" else [])
    for i in range(cfg.n_layers):
        b = f"blocks.{i}."
        names += [b + "hook_resid_pre", b + "attn.hook_q", b + "attn.hook_k", b + "attn.hook_v",
                  b + "attn.hook_pattern", b + "attn.hook_z", b + "hook_attn_out", b + "hook_resid_mid"]
        if not cfg.attn_only:
            names += [b + "mlp.hook_pre", b + "mlp.hook_post", b + "hook_mlp_out"]
        names.append(b + "hook_resid_post")
    return names


def check_intervention_points(cfg: ModelConfig, hooks: Mapping[str, Any]) -> None:
    """Refuse hook names that are not intervention points of the fused forwards (ValueError listing them)."""
    unknown = sorted(set(hooks) - set(stacked_hook_names(cfg))) if hooks else []
    if unknown:
        raise ValueError(f"unknown intervention points {unknown}; valid names are {stacked_hook_names(cfg)}")


def _linear(x: Float[Tensor, "member batch pos d_in"], weight: Float[Tensor, "member d_out d_in"],
            bias: Optional[Float[Tensor, "member d_out"]]) -> Float[Tensor, "member batch pos d_out"]:
    """Per-member `F.linear` (nn.Linear weight layout [out, in])."""
    y = einops.einsum(x, weight, "member batch pos d_in, member d_out d_in -> member batch pos d_out")
    return y if bias is None else y + bias[:, None, None, :]


def _norm(stack: Stack, x: Float[Tensor, "member batch pos d_model"], prefix: str) -> Tensor:
    cfg = stack.cfg
    if cfg.normalization is None:
        return x
    if cfg.normalization == "LNPre":  # TransformerLens's parameter-free LayerNorm, same arithmetic
        x32 = x.float()
        x32 = x32 - x32.mean(dim=-1, keepdim=True)
        return (x32 / (x32.pow(2).mean(dim=-1, keepdim=True) + cfg.eps).sqrt()).to(x.dtype)
    out = F.layer_norm(x, (cfg.d_model,), eps=cfg.eps) * stack.params[prefix + ".weight"][:, None, None, :]
    bias = stack.params.get(prefix + ".bias")
    return out if bias is None else out + bias[:, None, None, :]


def _hook(hooks: Mapping[str, Callable], name: str, x: Tensor) -> Tensor:
    fn = hooks.get(name)
    return x if fn is None else fn(x)


def stacked_forward(
    stack: Stack,
    tokens: Int[Tensor, "member batch pos"],
    interventions: Optional[Mapping[str, Callable[[Tensor], Tensor]]] = None,
) -> Float[Tensor, "member batch pos vocab"]:
    """Logits of every member: `models.fast_forward(member_k, tokens[k])` for all k in one pass.

    `interventions` maps hook names (`stacked_hook_names`) to functions that receive the activation with a
    leading member axis (q, k, v, z as `[member, batch, pos, head, d_head]`, like TransformerLens) and return
    its replacement. Unknown names raise ValueError listing the valid ones.
    """
    cfg, p = stack.cfg, stack.params
    hooks = dict(interventions or {})
    check_intervention_points(cfg, hooks)
    n_members, batch, seq = tokens.shape
    if n_members != stack.n_members:
        raise ValueError(f"tokens have {n_members} members, the stack has {stack.n_members}")
    if seq > cfg.n_ctx:
        raise ValueError(f"sequence length {seq} exceeds the model's n_ctx={cfg.n_ctx}")
    embed = p["embed.weight"]
    # member k's states index rows k*V .. k*V+V-1 of the flattened embeddings (one gather for all members)
    offsets = torch.arange(n_members, device=tokens.device)[:, None, None] * cfg.d_vocab
    x = _hook(hooks, "hook_embed", F.embedding(tokens + offsets, embed.reshape(-1, cfg.d_model)))
    if cfg.positional == "standard":
        x = x + _hook(hooks, "hook_pos_embed", p["pos_embed.weight"][:, None, :seq].expand(-1, batch, -1, -1))
    for i in range(cfg.n_layers):
        x = _block(stack, hooks, i, x)
    x = _norm(stack, x, "ln_final")
    head = p["embed.weight"] if cfg.tie_weights else p["unembed.weight"]
    return _linear(x, head, p.get("unembed.bias"))


def _block(stack: Stack, hooks: Mapping[str, Callable], i: int,
           x: Float[Tensor, "member batch pos d_model"]) -> Float[Tensor, "member batch pos d_model"]:
    """One pre-LN transformer block for all members (the solo fast path's arithmetic)."""
    cfg, p, b = stack.cfg, stack.params, f"blocks.{i}."
    n_members = x.shape[0]
    x = _hook(hooks, b + "hook_resid_pre", x)
    h = _norm(stack, x, b + "ln1")
    # q, k and v in one batched matmul (three small ones cost about twice as much on a CPU)
    weight = torch.cat([p[f"{b}attn.{name}.weight"] for name in "qkv"], dim=1)
    bias = torch.cat([p[f"{b}attn.{name}.bias"] for name in "qkv"], dim=1) if cfg.attn_bias else None
    heads = {}
    for name, act in zip("qkv", _linear(h, weight, bias).chunk(3, dim=-1)):
        act = einops.rearrange(act, "member batch pos (head d_head) -> member batch pos head d_head",
                               head=cfg.n_heads)
        act = _hook(hooks, f"{b}attn.hook_{name}", act)
        heads[name] = einops.rearrange(act, "member batch pos head d_head -> (member batch) head pos d_head")
    q, k, v = heads["q"], heads["k"], heads["v"]
    if stack.rotary is not None:
        q, k = stack.rotary.apply_rope(q, k)
    if b + "attn.hook_pattern" in hooks:  # explicit attention: the pattern is formed only when intervened
        fn = hooks[b + "attn.hook_pattern"]
        q5, k5 = (einops.rearrange(a, "(member batch) head pos d_head -> member batch head pos d_head",
                                   member=n_members) for a in (q, k))
        pattern = fn(models.pattern_input(fn, q5, k5))  # [member, batch, head, q, k]
        pattern = pattern.reshape(-1, *pattern.shape[2:])  # a view also for a zero-stride constant pattern
        z = pattern.to(v.dtype) @ v
    else:
        z = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    z = einops.rearrange(z, "(member batch) head pos d_head -> member batch pos head d_head", member=n_members)
    z = _hook(hooks, b + "attn.hook_z", z)
    z = einops.rearrange(z, "member batch pos head d_head -> member batch pos (head d_head)")
    attn_out = _hook(hooks, b + "hook_attn_out", _linear(z, p[b + "attn.o.weight"], p.get(b + "attn.o.bias")))
    x = _hook(hooks, b + "hook_resid_mid", x + attn_out)
    if not cfg.attn_only:
        pre = _hook(hooks, b + "mlp.hook_pre",
                    _linear(_norm(stack, x, b + "ln2"), p[b + "mlp.in.weight"], p.get(b + "mlp.in.bias")))
        post = _hook(hooks, b + "mlp.hook_post", stack.act(pre))
        x = x + _hook(hooks, b + "hook_mlp_out", _linear(post, p[b + "mlp.out.weight"], p.get(b + "mlp.out.bias")))
    return _hook(hooks, b + "hook_resid_post", x)


def stacked_loss(logits: Float[Tensor, "member batch pos vocab"],
                 targets: Int[Tensor, "member batch pos"]) -> Float[Tensor, " member"]:
    """Each member's mean next-state cross-entropy (nats), in fp32 like the solo loss."""
    n_members, _, _, vocab = logits.shape
    flat = F.cross_entropy(logits.float().reshape(-1, vocab), targets.reshape(-1), reduction="none")
    return flat.view(n_members, -1).mean(dim=1)


# ---------------------------------------------------------------------------------------------- optimiser
def decay_names(cfg: ModelConfig) -> set[str]:
    """Names of the parameters under weight decay: the linear weights (attention, MLP, an untied head), as
    `training`'s decay groups; embeddings, positions, LayerNorm and biases are not decayed."""
    names = set()
    for i in range(cfg.n_layers):
        names |= {f"blocks.{i}.attn.{n}.weight" for n in "qkvo"}
        if not cfg.attn_only:
            names |= {f"blocks.{i}.mlp.in.weight", f"blocks.{i}.mlp.out.weight"}
    if not cfg.tie_weights:
        names.add("unembed.weight")
    return names


def _mask(alive: Tensor, like: Tensor) -> Tensor:
    """[member] booleans shaped to broadcast against `like`."""
    return alive.view(-1, *([1] * (like.ndim - 1)))


def _per_member(values: Tensor, like: Tensor) -> Tensor:
    """[member] values cast to `like`'s dtype and shaped to broadcast against it."""
    return values.to(device=like.device, dtype=like.dtype).view(-1, *([1] * (like.ndim - 1)))


class StackedOptimizer:
    """AdamW (decoupled decay) or SGD (coupled decay, optional momentum) over a stack, one step for all
    members, per-member `lr` and `weight_decay` ([member] tensors) and an `alive` mask.

    The arithmetic follows torch's foreach AdamW / SGD step by step, so a member's trajectory is its solo run's
    up to float rounding. State: `step` (int), `param_steps` (updates per parameter name: a frozen parameter,
    `step(..., frozen=...)`, skips steps as torch's per-parameter `step` does), and per parameter name `exp_avg`,
    `exp_avg_sq` (AdamW) or `momentum_buffer` (SGD with momentum), each `[member, *shape]`.
    """

    def __init__(self, stack: Stack, *, kind: str, betas: tuple = (0.9, 0.95), momentum: float = 0.0,
                 eps: float = 1e-8):
        if kind not in ("adamw", "sgd"):
            raise ValueError(f"optimizer must be 'adamw' or 'sgd', got {kind!r}")
        self.stack, self.kind, self.betas, self.momentum, self.eps = stack, kind, tuple(betas), momentum, eps
        self.decay = decay_names(stack.cfg)
        self.step_count = 0
        # per-member update counts, kept when members may skip steps (fp16 loss scaling skips a member's step when
        # its gradient overflows, as torch's GradScaler does); None: every member counts `step_count`
        self.member_steps: Optional[Tensor] = None
        # per parameter: updates it received (frozen parameters skip steps, as torch's per-parameter `step`)
        self.param_steps: dict[str, int] = {name: 0 for name in stack.params}
        self.state: dict[str, dict[str, Tensor]] = {name: {} for name in stack.params}

    def count_members(self) -> None:
        """Keep a step count per member from now on (needed when members may skip steps)."""
        device = next(iter(self.stack.params.values())).device
        self.member_steps = torch.full((self.stack.n_members,), float(self.step_count), dtype=torch.float64,
                                       device=device)

    @torch.no_grad()
    def step(self, lr: Float[Tensor, " member"], weight_decay: Float[Tensor, " member"],
             alive: Bool[Tensor, " member"], frozen: frozenset = frozenset()) -> None:
        """One update of every member with its own lr / weight decay; members with alive=False keep their
        parameters and state unchanged. Parameters named in `frozen` get no update at all (no step, moment,
        step count or decay: what torch's optimisers do for a parameter without a gradient)."""
        if frozen and self.member_steps is not None:
            raise ValueError("freezing parameters is not supported with fp16 loss scaling in stacked training")
        self.step_count += 1
        if self.member_steps is not None:
            self.member_steps += alive.double()
        lr64, wd64 = lr.double(), weight_decay.double()
        for name, param in self.stack.params.items():
            if name in frozen:
                continue
            self.param_steps[name] += 1
            grad = param.grad
            assert grad is not None, f"no gradient for {name}"
            decay = _per_member(1 - lr64 * wd64, param) if name in self.decay else None
            if self.kind == "adamw":
                new = self._adamw(name, param, grad, lr64, decay, alive)
            else:
                new = self._sgd(name, param, grad, lr64, _per_member(wd64, param) if name in self.decay else None,
                                alive)
            param.copy_(torch.where(_mask(alive, param), new, param))

    def _adamw(self, name: str, param: Tensor, grad: Tensor, lr64: Tensor, decay: Optional[Tensor],
               alive: Tensor) -> Tensor:
        beta1, beta2 = self.betas
        state = self.state[name]
        if not state:
            state["exp_avg"] = torch.zeros_like(param)
            state["exp_avg_sq"] = torch.zeros_like(param)
        keep = _mask(alive, param)
        new = param * decay if decay is not None else param.clone()
        exp_avg = state["exp_avg"].lerp(grad, 1 - beta1)
        exp_avg_sq = state["exp_avg_sq"].mul(beta2).addcmul_(grad, grad, value=1 - beta2)
        if self.member_steps is None:  # python floats, as torch's foreach AdamW computes them (per parameter)
            t = self.param_steps[name]
            bias_correction1, bias_correction2_sqrt = 1 - beta1**t, (1 - beta2**t) ** 0.5
        else:  # the same per member (a member that skipped steps has its own count)
            t = self.member_steps
            bias_correction1 = 1 - torch.pow(beta1, t)
            bias_correction2_sqrt = _per_member(torch.pow(1 - torch.pow(beta2, t), 0.5), param)
        step_size = _per_member(-(lr64 / bias_correction1), param)
        denom = exp_avg_sq.sqrt().div_(bias_correction2_sqrt).add_(self.eps)
        new.addcdiv_(exp_avg * step_size, denom)
        state["exp_avg"] = torch.where(keep, exp_avg, state["exp_avg"])
        state["exp_avg_sq"] = torch.where(keep, exp_avg_sq, state["exp_avg_sq"])
        return new

    def _sgd(self, name: str, param: Tensor, grad: Tensor, lr64: Tensor, weight_decay: Optional[Tensor],
             alive: Tensor) -> Tensor:
        if weight_decay is not None:
            grad = grad + weight_decay * param
        if self.momentum != 0:
            state = self.state[name]
            if "momentum_buffer" not in state:
                buf = grad.detach().clone()
                state["momentum_buffer"] = buf
            else:
                buf = state["momentum_buffer"].mul(self.momentum).add_(grad)
                state["momentum_buffer"] = torch.where(_mask(alive, param), buf, state["momentum_buffer"])
            grad = buf
        return param + grad * _per_member(-lr64, param)

    def solo_order(self) -> list[str]:
        """Parameter names in the order of the torch optimiser solo training builds (`training._decay_groups`:
        decayed linear weights, then the rest, each in the model's parameter order)."""
        names = list(self.stack.params)
        return [n for n in names if n in self.decay] + [n for n in names if n not in self.decay]

    def solo_state_dict(self, k: int, *, lr: float, initial_lr: float, weight_decay: float) -> dict:
        """Member k's state as the `state_dict()` of the torch optimiser a solo run holds (`training`'s
        `_make_optimizer`: foreach AdamW / SGD, two decay groups), so solo `train` can resume from it."""
        order = self.solo_order()
        n_decay = sum(1 for n in order if n in self.decay)
        slots = [torch.zeros(0) for _ in order]  # stand-ins: a state dict only numbers the parameters
        groups = [{"params": slots[:n_decay], "weight_decay": weight_decay},
                  {"params": slots[n_decay:], "weight_decay": 0.0}]
        if self.kind == "adamw":
            optimizer = torch.optim.AdamW(groups, lr=initial_lr, betas=self.betas, foreach=True)
        else:
            optimizer = torch.optim.SGD(groups, lr=initial_lr, momentum=self.momentum, foreach=True)
        for group in optimizer.param_groups:
            group["lr"] = lr
        for slot, name in zip(slots, order):
            if self.member_steps is None and self.param_steps[name] == 0:
                continue  # never updated (frozen from the start): torch keeps no state for it
            state = {key: value[k].detach().to("cpu").clone() for key, value in self.state[name].items()}
            if self.kind == "adamw":
                count = self.param_steps[name] if self.member_steps is None else float(self.member_steps[k])
                state["step"] = torch.tensor(float(count), dtype=torch.float32)
            if state:
                optimizer.state[slot] = state
        return optimizer.state_dict()

    @torch.no_grad()
    def load_solo_state(self, k: int, saved: dict) -> None:
        """Member k's state from a solo optimiser `state_dict()` (inverse of `solo_state_dict`)."""
        order = self.solo_order()
        for index, entry in saved["state"].items():
            name = order[int(index)]
            for key, value in entry.items():
                if key == "step":
                    if self.member_steps is not None:
                        self.member_steps[k] = float(value)
                    self.param_steps[name] = int(value)
                    continue
                target = self.state[name].setdefault(key, torch.zeros_like(self.stack.params[name]))
                target[k].copy_(value.to(target.device))

    @torch.no_grad()
    def member_finite(self) -> Bool[Tensor, " member"]:
        """Per member: are all its gradients finite?"""
        ok = None
        for param in self.stack.params.values():
            if param.grad is None:  # frozen
                continue
            finite = torch.isfinite(param.grad).flatten(1).all(dim=1)
            ok = finite if ok is None else ok & finite
        return ok

    @torch.no_grad()
    def clip_grad_norm(self, max_norm: float) -> None:
        """Per-member `torch.nn.utils.clip_grad_norm_`: each member's gradients scaled to total norm <= max_norm."""
        params = [p for p in self.stack.parameters() if p.grad is not None]  # frozen ones have none
        norms = torch.stack([torch.linalg.vector_norm(p.grad.flatten(1), 2, dim=1) for p in params])
        total = torch.linalg.vector_norm(norms, 2, dim=0)
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for p in params:
            p.grad.mul_(_per_member(coef, p.grad))

    def zero_grad(self) -> None:
        for p in self.stack.parameters():
            p.grad = None

