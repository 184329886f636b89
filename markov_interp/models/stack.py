"""K models as one: parameters with a leading member axis and the one fused forward (K >= 1).

The research questions of Makkuva et al. ("Attention with Markov", arXiv 2402.04161) are statistical: which
fraction of seeds stays on the unigram plateau, how the escape time is distributed. That needs tens of runs
per condition of a model so small that one run leaves a GPU idle. A `Stack` holds K models of the same
shapes (same `ModelConfig` up to its initialisation options, `config.INIT_FIELDS`) as tensors `[member, ...]`
keyed by the on-disk names (`models.init.state_shapes`); member k starts at `initial_state(cfg_k, seed_k)`. One
run is a stack of one: this is the only training forward of the package.

`stacked_forward(stack, tokens)` computes every member's logits at once: batched matmuls over the member axis,
fused causal attention (`scaled_dot_product_attention`) over member x batch, no hooks. Member k's numbers do
not depend on the other members or on K (every operation acts on each member alone with the same arithmetic;
tested bit for bit on the CPU), so a run gives the same weights alone or in any stack. Its
named intervention points are TransformerLens hook names (`models.hooks.intervention_points`), so code written
for the hooked model's activations applies: pass `{hook name: fn}` and each `fn` replaces that activation (with
a leading member axis) by its return value (`clamps.clamp_hooks(..., member_axis=True)` builds clamps). The
logits equal the hooked model's (`models.hooked`, tested at 1e-5) for every architecture option.
"""

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

import einops
import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from markov_interp.models import _compile, hooked
from markov_interp.models.config import INIT_FIELDS, ModelConfig, shape_config
from markov_interp.models.hooks import act_name, check_points
from markov_interp.models.init import initial_state

__all__ = [
    "Stack",
    "build_stack",
    "stacked_forward",
    "stacked_loss",
    "stacked_losses",
    "compiled_losses",
    "pattern_input",
    "causal_pattern",
]

_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),  # TransformerLens's gelu_new is this formula
    "relu": F.relu,
}
_ROTARY_BASE = 10000.0  # TransformerLens's default rotary base


class Stack:
    """K models of one architecture as stacked parameters `[member, *shape]`, keyed by the on-disk names of
    `models.init.state_shapes` (a tied unembedding is `embed.weight`).

    `configs[k]` is member k's own `ModelConfig` (its init options may differ from the others'); `cfg` is
    the shared architecture.
    """

    def __init__(self, configs: Sequence[ModelConfig], params: dict[str, Tensor]):
        self.configs = list(configs)
        self.cfg = self.configs[0]
        self.params = params
        self.act = _ACTIVATIONS[self.cfg.act_fn]
        self._rotary: Optional[tuple[Tensor, Tensor]] = None

    @classmethod
    def from_states(cls, configs: Sequence[ModelConfig], states: Sequence[Mapping[str, Tensor]], *,
                    device: Any = None) -> "Stack":
        """A stack holding `states[k]` (on-disk layout, checked against `configs[k]`) as member k.

        Args:
            configs: one config per member; they must agree on everything but `INIT_FIELDS` (else ValueError
                naming the field).
            states: one state dict per member.
            device: where the parameters live (default CPU).

        Returns:
            The stack, its parameters leaf tensors that require gradients.
        """
        if len(configs) != len(states) or not configs:
            raise ValueError(f"need one state per config and at least one member, got {len(configs)} configs and "
                             f"{len(states)} states")
        shared = shape_config(configs[0])
        for i, cfg in enumerate(configs):
            if shape_config(cfg) != shared:
                field = next(f for f, v in shape_config(cfg).to_dict().items() if shared.to_dict()[f] != v)
                raise ValueError(f"model config {i} differs from config 0 in model.{field}: members of a stack "
                                 f"may differ only in {list(INIT_FIELDS)}")
        for k, (cfg, state) in enumerate(zip(configs, states)):
            hooked.check_state(cfg, state, source=f"stack member {k}")
        dev = torch.device(device) if device is not None else torch.device("cpu")
        params = {name: torch.stack([s[name] for s in states]).to(dev, torch.float32).requires_grad_(True)
                  for name in states[0]}
        return cls(configs, params)

    @property
    def n_members(self) -> int:
        return len(self.configs)

    @property
    def device(self) -> torch.device:
        return next(iter(self.params.values())).device

    def parameters(self) -> list[Tensor]:
        return list(self.params.values())

    def member_state(self, k: int) -> dict[str, Tensor]:
        """Member k's weights in the on-disk layout (CPU copies)."""
        return {name: p[k].detach().to("cpu").contiguous().clone() for name, p in self.params.items()}

    def save_member(self, k: int, path: "str | Path", *, train_seq_len: Optional[int] = None,
                    step: Optional[int] = None) -> Path:
        """Write member k as `models.save` would (`models.hooked.save_state`, with the training length and step
        when given) to `path`, a `.safetensors` file or a folder that gets `model.safetensors`; `models.load`
        reads it."""
        return hooked.save_state(self.configs[k], self.member_state(k), path, train_seq_len=train_seq_len, step=step)

    def hooked_model(self, k: int, device: Any = None, *,
                     metadata: Optional[hooked.WeightsMetadata] = None) -> hooked.HookedModel:
        """Member k as a hooked TransformerLens model (`models.hooked.hooked_model` of its weights; `metadata`: what
        its weights file would record, `models.weights_metadata`)."""
        return hooked.hooked_model(self.configs[k], self.member_state(k), device, source=f"stack member {k}",
                                   metadata=metadata)

    @torch.no_grad()
    def load_member(self, k: int, state: Mapping[str, Tensor]) -> None:
        """Overwrite member k's weights with `state` (on-disk layout, checked against member k's config)."""
        hooked.check_state(self.configs[k], state, source=f"stack member {k}")
        for name, p in self.params.items():
            p[k].copy_(state[name].to(device=p.device, dtype=p.dtype))

    def rotary_tables(self, seq: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos and sin `[pos, d_head]` of rotary positions (TransformerLens's native tables: adjacent pairs)."""
        if self._rotary is None:
            d_head = self.cfg.d_head
            inv_freq = 1.0 / (_ROTARY_BASE ** (torch.arange(0, d_head, 2).float() / d_head))
            freqs = torch.outer(torch.arange(self.cfg.n_ctx).float(), inv_freq)
            self._rotary = tuple(t.repeat_interleave(2, dim=-1).to(self.device) for t in (freqs.cos(), freqs.sin()))
        cos, sin = self._rotary
        return cos[:seq].to(dtype), sin[:seq].to(dtype)


def build_stack(configs: Sequence[ModelConfig], seeds: Sequence[int], *, device: Any = None) -> Stack:
    """A stack whose member k starts at `initial_state(configs[k], seeds[k])` (what `models.build` holds).

    Args:
        configs: one config per member; they must agree on everything but `INIT_FIELDS` (else ValueError naming
            the field).
        seeds: one initialiser seed per member.
        device: where the parameters live (default CPU).

    Returns:
        The stack.
    """
    if len(configs) != len(seeds):
        raise ValueError(f"need one seed per config, got {len(configs)} configs and {len(seeds)} seeds")
    return Stack.from_states(configs, [initial_state(cfg, seed) for cfg, seed in zip(configs, seeds)], device=device)


# ------------------------------------------------------------------------------------------------ forward
def _linear(x: Float[Tensor, "member batch pos d_in"], weight: Float[Tensor, "member d_out d_in"],
            bias: Optional[Float[Tensor, "member d_out"]]) -> Float[Tensor, "member batch pos d_out"]:
    """Per-member `F.linear` (nn.Linear weight layout [out, in]): one batched matmul over the member axis."""
    n_members, batch, pos, d_in = x.shape
    y = torch.bmm(x.reshape(n_members, batch * pos, d_in), weight.transpose(1, 2)).view(n_members, batch, pos, -1)
    return y if bias is None else y + bias[:, None, None, :]


def _normed_linear(stack: Stack, x: Float[Tensor, "member batch pos d_model"], norm: str,
                   weight: Float[Tensor, "member d_out d_model"],
                   bias: Optional[Float[Tensor, "member d_out"]]) -> Float[Tensor, "member batch pos d_out"]:
    """`linear(norm(x))` for the pre-LN norm named `norm` ("ln1", "blocks.0.ln2", "ln_final", ...).

    A LayerNorm's scale s and bias c are folded into the linear layer, (x_hat * s + c) W^T + b =
    x_hat (W diag(s))^T + (W c + b): the same function, one multiply of the small weight matrix instead of a pass
    over the activations (forward and backward) -- which is what makes a stack of one as fast per step as a
    plain loop with fused LayerNorm.
    """
    cfg = stack.cfg
    if cfg.normalization is None:
        return _linear(x, weight, bias)
    if cfg.normalization == "LNPre":  # TransformerLens's parameter-free LayerNorm, same arithmetic
        return _linear(_two_reduction_norm(x, cfg.eps), weight, bias)
    scale, shift = stack.params[norm + ".weight"], stack.params.get(norm + ".bias")
    if shift is not None:
        folded = einops.einsum(weight, shift, "member d_out d_model, member d_model -> member d_out")
        bias = folded if bias is None else bias + folded
    return _linear(_layer_norm(x, cfg.eps), weight * scale[:, None, :], bias)


# Rows up to this long are normalised by two reductions on CUDA, where F.layer_norm's kernel is slow on short rows.
# On an H200, [256, 16, 1024, d] fp32, forward + backward (docs/reproduction/gpu/): two reductions ran at 4.4x
# F.layer_norm's speed for d = 8, 2.3x for d = 16 and 0.74x for d = 64; the stack of 256 paper-1layer runs then
# trained 1.32x faster eager. The CPU keeps the fused kernel, faster there (two reductions 0.58x, docs/training.md).
SHORT_ROWS_ON_CUDA = 16


def _layer_norm(x: Float[Tensor, "*rows d_model"], eps: float) -> Float[Tensor, "*rows d_model"]:
    """(x - mean) / sqrt(var + eps) over the last axis, without scale or shift (folded into the next layer)."""
    if x.is_cuda and x.shape[-1] <= SHORT_ROWS_ON_CUDA:
        return _two_reduction_norm(x, eps)
    return F.layer_norm(x, x.shape[-1:], eps=eps)


def _two_reduction_norm(x: Float[Tensor, "*rows d_model"], eps: float) -> Float[Tensor, "*rows d_model"]:
    """The same normalisation as a mean and a mean of squares, in float32 (as F.layer_norm computes it)."""
    x32 = x.float()
    x32 = x32 - x32.mean(dim=-1, keepdim=True)
    return (x32 / (x32.pow(2).mean(dim=-1, keepdim=True) + eps).sqrt()).to(x.dtype)


def _hook(hooks: Mapping[str, Callable], kind: str, layer: Optional[int], x: Tensor) -> Tensor:
    """`x`, or what the hook on activation `kind` of `layer` makes of it (names only formed when hooks exist)."""
    if not hooks:
        return x
    fn = hooks.get(act_name(kind, layer))
    return x if fn is None else fn(x)


def stacked_forward(
    stack: Stack,
    tokens: Int[Tensor, "member batch pos"],
    interventions: Optional[Mapping[str, Callable[[Tensor], Tensor]]] = None,
) -> Float[Tensor, "member batch pos vocab"]:
    """Logits of every member, `tokens[k]` through member k, in one pass.

    Args:
        stack: the models.
        tokens: one batch of states per member.
        interventions: {hook name: fn} (`models.hooks.intervention_points`); each fn receives the activation
            with a leading member axis (q, k, v, z as `[member, batch, pos, head, d_head]` with the layer's real
            head count, like TransformerLens) and returns its replacement. Unknown names raise ValueError
            listing the valid ones.

    Returns:
        The logits (what each member's hooked model gives for its tokens, up to float rounding).
    """
    cfg, p = stack.cfg, stack.params
    hooks = dict(interventions or {})
    if hooks:
        check_points(cfg, hooks)
    n_members, batch, seq = tokens.shape
    if n_members != stack.n_members:
        raise ValueError(f"tokens have {n_members} members, the stack has {stack.n_members}")
    if seq > cfg.n_ctx:
        raise ValueError(f"sequence length {seq} exceeds the model's n_ctx={cfg.n_ctx}")
    # member k's states index rows k*V .. k*V+V-1 of the flattened embeddings (one gather for all members)
    offsets = torch.arange(n_members, device=tokens.device)[:, None, None] * cfg.d_vocab
    x = _hook(hooks, "embed", None, F.embedding(tokens + offsets, p["embed.weight"].reshape(-1, cfg.d_model)))
    if cfg.positional == "standard":
        x = x + _hook(hooks, "pos_embed", None, p["pos_embed.weight"][:, None, :seq].expand(-1, batch, -1, -1))
    for i in range(cfg.n_layers):
        x = _block(stack, hooks, i, x)
    head = p["embed.weight"] if cfg.tie_weights else p["unembed.weight"]
    return _normed_linear(stack, x, "ln_final", head, p.get("unembed.bias"))


def _attention_inputs(stack: Stack, hooks: Mapping[str, Callable], i: int,
                      x: Float[Tensor, "member batch pos d_model"]) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v of layer i (from the residual stream `x`, through ln1) as `[(member batch), head, pos, d_head]`,
    after their hooks and rotary positions."""
    cfg, p, b = stack.cfg, stack.params, f"blocks.{i}."
    # q, k and v in one matmul (three small ones cost about twice as much on a CPU)
    weight = torch.cat([p[f"{b}attn.{name}.weight"] for name in "qkv"], dim=1)
    bias = torch.cat([p[f"{b}attn.{name}.bias"] for name in "qkv"], dim=1) if cfg.attn_bias else None
    heads = []
    for name, act in zip("qkv", _normed_linear(stack, x, b + "ln1", weight, bias).chunk(3, dim=-1)):
        # member batch pos (head d_head) -> member batch pos head d_head -> (member batch) head pos d_head
        act = _hook(hooks, name, i, act.unflatten(-1, (cfg.heads_per_layer[i], cfg.d_head)))
        heads.append(act.transpose(2, 3).flatten(0, 1))
    q, k, v = heads
    if cfg.positional == "rotary":
        cos, sin = stack.rotary_tables(q.shape[-2], q.dtype)
        q, k = (_rotate(t, cos, sin) for t in (q, k))
    return q, k, v


def _rotate(x: Float[Tensor, "... pos d_head"], cos: Tensor, sin: Tensor) -> Float[Tensor, "... pos d_head"]:
    """Rotary positions, adjacent-pair format ((x0, x1) -> (-x1, x0)), as TransformerLens's native rotary."""
    half = torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)
    return x * cos + half * sin


def _block(stack: Stack, hooks: Mapping[str, Callable], i: int,
           x: Float[Tensor, "member batch pos d_model"]) -> Float[Tensor, "member batch pos d_model"]:
    """One pre-LN transformer block for all members."""
    cfg, p, b = stack.cfg, stack.params, f"blocks.{i}."
    n_members = x.shape[0]
    x = _hook(hooks, "resid_pre", i, x)
    q, k, v = _attention_inputs(stack, hooks, i, x)
    fn = hooks.get(act_name("pattern", i)) if hooks else None
    if fn is not None:  # explicit attention: the pattern is formed only when hooked
        q5, k5 = (einops.rearrange(a, "(member batch) head pos d_head -> member batch head pos d_head",
                                   member=n_members) for a in (q, k))
        pattern = fn(pattern_input(fn, q5, k5))  # [member, batch, head, q, k]
        pattern = pattern.reshape(-1, *pattern.shape[2:])  # a view also for a zero-stride constant pattern
        z = pattern.to(v.dtype) @ v
    else:
        z = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    z = _hook(hooks, "z", i, z.unflatten(0, (n_members, -1)).transpose(2, 3))  # member batch pos head d_head
    z = z.flatten(-2)  # member batch pos (head d_head)
    attn_out = _hook(hooks, "attn_out", i, _linear(z, p[b + "attn.o.weight"], p.get(b + "attn.o.bias")))
    x = _hook(hooks, "resid_mid", i, x + attn_out)
    if not cfg.attn_only:
        pre = _hook(hooks, "pre", i,
                    _normed_linear(stack, x, b + "ln2", p[b + "mlp.in.weight"], p.get(b + "mlp.in.bias")))
        post = _hook(hooks, "post", i, stack.act(pre))
        x = x + _hook(hooks, "mlp_out", i, _linear(post, p[b + "mlp.out.weight"], p.get(b + "mlp.out.bias")))
    return _hook(hooks, "resid_post", i, x)


def stacked_loss(logits: Float[Tensor, "member batch pos vocab"],
                 targets: Int[Tensor, "member batch pos"]) -> Float[Tensor, " member"]:
    """Each member's mean next-state cross-entropy (nats), computed in fp32 (per member, on its own row).

    Args:
        logits: `stacked_forward`'s output.
        targets: the next states.

    Returns:
        [member] losses.
    """
    n_members, _, _, vocab = logits.shape
    flat = F.cross_entropy(logits.float().reshape(-1, vocab), targets.reshape(-1), reduction="none")
    return flat.view(n_members, -1).mean(dim=1)


def stacked_losses(stack: Stack, tokens: Int[Tensor, "member batch pos"], *, dtype: Optional[torch.dtype] = None,
                   interventions: Optional[Mapping[str, Callable[[Tensor], Tensor]]] = None,
                   ) -> Float[Tensor, " member"]:
    """Each member's next-state loss on its sequences: `stacked_forward` of `tokens[..., :-1]` (under autocast to
    `dtype`, None: fp32) and `stacked_loss` against `tokens[..., 1:]` (in fp32). What a training step and an
    evaluation compute, and what `compiled_losses` compiles.

    Args:
        stack: the models.
        tokens: one batch of `seq_len + 1` states per member.
        dtype: the autocast dtype (torch.float16 / torch.bfloat16), or None.
        interventions: as in `stacked_forward`.

    Returns:
        [member] mean cross-entropies (nats).
    """
    with torch.autocast(stack.device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
        logits = stacked_forward(stack, tokens[..., :-1], interventions)
    return stacked_loss(logits, tokens[..., 1:])


def compiled_losses(stack: Stack, *, dtype: Optional[torch.dtype], mode: str,
                    sample: Optional[Callable[[Tensor], Tensor]] = None) -> Callable[[Tensor], Tensor]:
    """`tokens -> stacked_losses(stack, tokens, dtype=dtype)` compiled with torch.compile (`mode`: "default" or
    "max", `TrainConfig.compile`), forward, loss and (through AOTAutograd) backward, without interventions.

    With `sample` (a function of a 0-dim int64 step tensor returning the [member, batch, pos] tokens, reading no
    device value, with a hashable `signature` naming what its code depends on besides its tensors:
    `sources.stream_sampler` of kernel sources) the callable takes the step tensor instead of the tokens, and the
    batch is drawn inside the compiled graph: sampling, forward and loss are one graph (with mode "max" on CUDA,
    one CUDA graph with the forward; the step tensor, updated in place, is its input).

    Compiled once per (architecture, members, tokens' shape, device, precision, mode, the sampler's signature) in
    a process (`models._compile`): a second stack of the same shapes reuses the code (its weights, keys and tables
    are the graph's inputs). Where torch.compile is unavailable it is eager itself, after one warning. Results
    equal the eager ones up to float rounding (tests/models/test_compile.py states the tolerance); the compiled
    arithmetic is deterministic on the CPU, and a compiled sampler draws the eager sampler's tokens there.

    Args:
        stack: the models (the callable reads `stack.params` at every call: updates in place are seen).
        dtype: the autocast dtype, or None (fp32).
        mode: "default" or "max".
        sample: the sampler to compile with the step, or None (the callable takes tokens).

    Returns:
        A function of the tokens `[member, batch, seq_len + 1]` (or, with `sample`, of the step tensor) returning
        the [member] losses.
    """
    configs = [stack.cfg] * stack.n_members
    arch = shape_config(stack.cfg).to_json()

    def stacked_step_losses(params: dict[str, Tensor], tokens: Tensor) -> Tensor:
        return stacked_losses(Stack(configs, params), tokens, dtype=dtype)

    def sampled_step_losses(params: dict[str, Tensor], draw: Callable[[Tensor], Tensor], step: Tensor) -> Tensor:
        return stacked_losses(Stack(configs, params), draw(step), dtype=dtype)

    def call(tokens: Int[Tensor, "member batch pos"]) -> Float[Tensor, " member"]:
        key = ("stacked_losses", arch, stack.n_members, tuple(tokens.shape), str(dtype))
        out = _compile.compiled(key, stacked_step_losses, mode=mode, device_type=stack.device.type)(stack.params,
                                                                                                     tokens)
        # "max" captures CUDA graphs, whose outputs the next replay overwrites: keep a copy (K numbers)
        return out.clone() if mode == "max" else out

    def call_sampled(step: Int[Tensor, ""]) -> Float[Tensor, " member"]:
        key = ("sampled_losses", arch, stack.n_members, sample.signature, str(dtype))
        out = _compile.compiled(key, sampled_step_losses, mode=mode, device_type=stack.device.type)(
            stack.params, sample, step)
        return out.clone() if mode == "max" else out

    return call if sample is None else call_sampled


def pattern_input(fn: Any, q: Float[Tensor, "*batch head query_pos d_head"],
                  k: Float[Tensor, "*batch head key_pos d_head"]) -> Float[Tensor, "*batch head query_pos key_pos"]:
    """What a pattern hook `fn` receives: the causal pattern, or, when `fn.ignores_input` (a clamp replacing every
    head by a constant), a zero-stride placeholder of its shape (no scores or softmax formed: the clamp only reads
    the shape)."""
    if getattr(fn, "ignores_input", False):
        return q.new_zeros(()).expand(*q.shape[:-1], k.shape[-2])
    return causal_pattern(q, k)


def causal_pattern(q: Float[Tensor, "*batch head query_pos d_head"],
                   k: Float[Tensor, "*batch head key_pos d_head"]) -> Float[Tensor, "*batch head query_pos key_pos"]:
    """The attention pattern of fused causal attention, formed explicitly: softmax over keys <= query of
    q . k / sqrt(d_head) (what `scaled_dot_product_attention(is_causal=True)` multiplies v by)."""
    seq = q.shape[-2]
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    future = torch.triu(torch.ones(seq, seq, dtype=torch.bool, device=q.device), diagonal=1)
    return torch.softmax(scores.masked_fill(future, float("-inf")).float(), dim=-1).to(q.dtype)
