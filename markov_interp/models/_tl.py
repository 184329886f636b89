"""TransformerLens versions, for `models.hooked`: the on-disk state as TransformerLens's model of the installed
version, and back. Only public TransformerLens API (tests/models/test_tl.py reads this package's source for it).

The package keeps its weights in one layout whatever TransformerLens is installed (`models.init.state_shapes`:
TL 4's bridge names, `nn.Linear` layout, each layer's real head count, only the tensors the config has). Here
it crosses into TransformerLens:

- **TransformerBridge (TL 4)**: `TransformerBridge.boot_native`, then the config's choices set on the native
  torch modules of the public `bridge.original_model`: absent biases become `None`, the output bias a Parameter
  in place of the bridge's zero buffer, and a tied unembedding *is* the embedding Parameter. The bridge is then
  exactly the package's architecture.
- **HookedTransformer (TL 2.x, 3.x)**: every bias exists; the config's absent ones are zero. TL has no tying
  (`W_U [d, V]` cannot share storage with `W_E [V, d]`): a tied model holds an equal copy, so it is for analysis;
  reading it back refuses copies that have drifted apart. Rotary positions rotate adjacent pairs
  (`rotary_adjacent_pairs=True`), as the fused forward (`models.stack`) and TL 4's native rotary do.
- **Heads per layer**: TL has one head count. Every layer is widened to the largest count with zero heads
  (`padded`); reading back drops them (`head_slices`) and refuses non-zero weights there.

TransformerLens takes seconds to import (datasets, transformers), so it is imported inside the functions that
build a model: a process that builds none (training, `markov-interp train`) never pays for it.
"""

import functools
import warnings
from collections.abc import Mapping
from importlib import metadata
from typing import Any

import torch
from einops import rearrange
from torch import Tensor

from markov_interp.models.config import ModelConfig
from markov_interp.models.init import state_shapes

__all__ = ["tl_version", "hooked_kind", "is_bridge", "raw", "forward_from", "first_norm", "head_slices", "padded",
           "tl_config", "tl_state_dict", "build", "disk_state"]

_LINEARS = ("q", "k", "v", "o")
_HT_QKV = {"q": "Q", "k": "K", "v": "V"}


@functools.cache
def tl_version() -> tuple[int, int]:
    """The installed TransformerLens version as (major, minor)."""
    major, minor = metadata.version("transformer-lens").split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def hooked_kind() -> str:
    """"HookedTransformer" (TL 2.x, 3.x) or "TransformerBridge" (TL 4.x): what `models.hooked_model` builds."""
    return "HookedTransformer" if tl_version()[0] < 4 else "TransformerBridge"


def is_bridge(model: Any) -> bool:
    """Whether `model` is a TransformerBridge (it wraps a public `original_model`), not a HookedTransformer."""
    return hasattr(type(model), "original_model")


def raw(module: Any) -> Any:
    """The torch module behind a bridge component (its public `original_component`), else `module` itself."""
    inner = getattr(module, "original_component", None)
    return inner if isinstance(inner, torch.nn.Module) else module


def forward_from(model: Any, stream: Tensor, layer: int, *, tokens: Tensor, fwd_hooks: list) -> Tensor:
    """The logits of a forward pass that starts at block `layer` from the residual stream `stream` entering it
    ([batch, pos, d_model]; `tokens` [batch, pos] the tokens it stands for), with `fwd_hooks` held: the hooks of
    the blocks before it do not fire. A HookedTransformer skips those blocks itself (`start_at_layer`); TL 4's
    bridge runs them on the discarded input (4.3), so a standard bridge is run block by block from `layer` (its
    own blocks, final norm and unembedding: the same logits, tests/models/test_tl.py). Bridges with rotary
    positions or a logit soft cap, which need the whole model's call, keep `start_at_layer`."""
    cfg = model.cfg
    plain = (getattr(cfg, "positional_embedding_type", "standard") == "standard"
             and not float(getattr(cfg, "output_logits_soft_cap", 0.0) or 0.0) > 0)
    if not is_bridge(model) or not plain:
        return model.run_with_hooks(stream, start_at_layer=layer, tokens=tokens, fwd_hooks=fwd_hooks)
    with model.hooks(fwd_hooks=fwd_hooks):
        for block in model.blocks[layer:]:
            stream = block(stream)
            stream = stream[0] if isinstance(stream, tuple) else stream
        return model.unembed(model.ln_final(stream))


def first_norm(model: Any, layer: int) -> Any:
    """The norm block `layer`'s attention reads the residual stream through, as a torch module to call: a bridge's
    own norm (its hooked wrapper recomputes it step by step for its hooks, ten times slower on CPU), a
    HookedTransformer's `ln1` (an identity where the model has no norm)."""
    return raw(model.blocks[layer].ln1)


# ------------------------------------------------------------------------------------------- head layout
def head_slices(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """{on-disk name: (axis, real width)} of the attention tensors whose layer has fewer heads than the largest
    count (what a hooked model widens with zero heads)."""
    out = {}
    for i, heads in enumerate(cfg.heads_per_layer):
        if heads == cfg.max_heads:
            continue
        width, b = heads * cfg.d_head, f"blocks.{i}.attn."
        out.update({f"{b}{n}.weight": (0, width) for n in "qkv"} | {f"{b}o.weight": (1, width)})
        if cfg.attn_bias:
            out.update({f"{b}{n}.bias": (0, width) for n in "qkv"})
    return out


def padded(cfg: ModelConfig, state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """`state` (real shapes) with every layer widened to the largest head count by zero heads."""
    out = dict(state)
    for name, (axis, width) in head_slices(cfg).items():
        shape = list(state[name].shape)
        shape[axis] = cfg.max_heads * cfg.d_head
        out[name] = state[name].new_zeros(shape)
        out[name].narrow(axis, 0, width).copy_(state[name])
    return out


def _complete(cfg: ModelConfig, state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The on-disk `state` with every tensor TL's models insist on (bridge names, `nn.Linear` layout): zero
    biases where the config has none, the tied unembedding as the embedding, zero heads widening smaller layers."""
    full = padded(cfg, state)
    like = state["embed.weight"]
    zeros = functools.partial(torch.zeros, dtype=like.dtype, device=like.device)
    rows, d = cfg.max_heads * cfg.d_head, cfg.d_model
    norms = ["ln_final"] + [f"blocks.{i}.ln{j}" for i in range(cfg.n_layers) for j in (1, 2)]
    for norm in norms:
        if f"{norm}.weight" in full:
            full.setdefault(f"{norm}.bias", zeros(d))
    for i in range(cfg.n_layers):
        b = f"blocks.{i}."
        for name in "qkv":
            full.setdefault(f"{b}attn.{name}.bias", zeros(rows))
        full.setdefault(b + "attn.o.bias", zeros(d))
        if not cfg.attn_only:
            full.setdefault(b + "mlp.in.bias", zeros(cfg.d_mlp))
            full.setdefault(b + "mlp.out.bias", zeros(d))
    if cfg.tie_weights:
        full["unembed.weight"] = full["embed.weight"]
    full.setdefault("unembed.bias", zeros(cfg.d_vocab))
    return full


def _reduce(cfg: ModelConfig, full: Mapping[str, Tensor], what: str) -> dict[str, Tensor]:
    """Inverse of `_complete`: the on-disk state (contiguous CPU copies, `state_shapes` order). ValueError where
    `cfg` cannot hold `full`: a missing or misshapen tensor, a non-zero tensor where the config has none (an absent
    bias, a padded head), a tied unembedding unlike the embedding."""
    shapes, slices = state_shapes(cfg), head_slices(cfg)
    missing = sorted(set(shapes) - set(full))
    if missing:
        raise ValueError(f"{what}: has no tensors {missing} (a model of another config?)")
    out = {}
    for name, t in full.items():
        t = t.detach()
        if name == "unembed.weight" and cfg.tie_weights:
            continue
        axis, width = slices.get(name, (0, t.shape[0] if t.ndim else 0))
        surplus = t.narrow(axis, width, t.shape[axis] - width) if name in shapes else t
        if surplus.numel() and bool(surplus.ne(0).any()):
            raise ValueError(f"{what}: {name} is non-zero where the model's config has no weights (an absent bias "
                             "or a head beyond the layer's count); its config cannot represent this model")
        if name in shapes:
            out[name] = t.narrow(axis, 0, width).to("cpu").contiguous().clone()
    wrong = [f"{k} has shape {tuple(out[k].shape)}, expected {want}" for k, want in shapes.items()
             if tuple(out[k].shape) != want]
    if wrong:
        raise ValueError(f"{what}: wrong shapes for its config: {', '.join(wrong)}")
    copy = full["unembed.weight"].detach().cpu() if cfg.tie_weights else None
    if copy is not None and not torch.allclose(copy, out["embed.weight"], rtol=0, atol=0, equal_nan=True):
        raise ValueError(f"{what}: the config ties the unembedding to the embedding but they differ (a "
                         "HookedTransformer keeps two copies, and training it moves them apart); TL has no tying, "
                         "so such a model is for analysis: set tie_weights=False in its config to keep both")
    return {name: out[name] for name in shapes}


# --------------------------------------------------------------------------------- TL 2.x / 3.x: names
def _hooked_names(cfg: ModelConfig) -> list[tuple[str, str, str]]:
    """(bridge name, HookedTransformer name, einops pattern from the first to the second) of every parameter of
    `_complete`'s state (`h`: the largest head count)."""
    same, t = "a -> a", "a b -> b a"
    pairs = [("embed.weight", "embed.W_E", "a b -> a b")]
    if cfg.positional == "standard":
        pairs.append(("pos_embed.weight", "pos_embed.W_pos", "a b -> a b"))
    norms = [f"blocks.{i}.ln{j}" for i in range(cfg.n_layers) for j in ((1,) if cfg.attn_only else (1, 2))]
    for norm in (norms + ["ln_final"]) if cfg.normalization == "LN" else []:
        pairs += [(f"{norm}.weight", f"{norm}.w", same), (f"{norm}.bias", f"{norm}.b", same)]
    for i in range(cfg.n_layers):
        b = f"blocks.{i}."
        for name, tl in _HT_QKV.items():
            pairs += [(f"{b}attn.{name}.weight", f"{b}attn.W_{tl}", "(h d) m -> h m d"),
                      (f"{b}attn.{name}.bias", f"{b}attn.b_{tl}", "(h d) -> h d")]
        pairs += [(b + "attn.o.weight", b + "attn.W_O", "m (h d) -> h d m"), (b + "attn.o.bias", b + "attn.b_O", same)]
        if not cfg.attn_only:
            pairs += [(b + "mlp.in.weight", b + "mlp.W_in", t), (b + "mlp.in.bias", b + "mlp.b_in", same),
                      (b + "mlp.out.weight", b + "mlp.W_out", t), (b + "mlp.out.bias", b + "mlp.b_out", same)]
    return pairs + [("unembed.weight", "unembed.W_U", t), ("unembed.bias", "unembed.b_U", same)]


def _convert(cfg: ModelConfig, tensors: Mapping[str, Tensor], to_hooked: bool) -> dict[str, Tensor]:
    """Bridge-named, `nn.Linear`-layout tensors (`_complete`) as HookedTransformer parameters, or back (a
    HookedTransformer's buffers ignored; names it lacks left out)."""
    out = {}
    for bridge, hooked, pattern in _hooked_names(cfg):
        if not to_hooked:
            bridge, hooked, pattern = hooked, bridge, " -> ".join(reversed(pattern.split(" -> ")))
        if bridge not in tensors:  # reading back a model of another config: `_reduce` names what is missing
            continue
        lengths = {"h": cfg.max_heads} if "h" in pattern else {}
        out[hooked] = rearrange(tensors[bridge], pattern, **lengths).contiguous()
    return out


# ------------------------------------------------------------------------------------------ configs
def tl_config(cfg: ModelConfig) -> Any:
    """TransformerLens's config for `cfg` on the installed version: a `HookedTransformerConfig` (TL 2/3) or a
    `TransformerBridgeConfig` for `TransformerBridge.boot_native` (TL 4); every layer with the largest head
    count. `init_weights=False`: every parameter is loaded."""
    common = dict(n_layers=cfg.n_layers, d_model=cfg.d_model, n_ctx=cfg.n_ctx, d_head=cfg.d_head,
                  n_heads=cfg.max_heads, d_mlp=cfg.d_mlp, d_vocab=cfg.d_vocab, act_fn=cfg.act_fn, eps=cfg.eps,
                  normalization_type=cfg.normalization, positional_embedding_type=cfg.positional,
                  attn_only=cfg.attn_only, default_prepend_bos=False, model_name="markov-interp",
                  init_weights=False)
    if hooked_kind() == "HookedTransformer":
        from transformer_lens import HookedTransformerConfig

        rotary = dict(rotary_dim=cfg.d_head, rotary_adjacent_pairs=True) if cfg.positional == "rotary" else {}
        return HookedTransformerConfig(**common, **rotary, device="cpu")
    from transformer_lens.config import TransformerBridgeConfig

    return TransformerBridgeConfig(**common, tokenizer_prepends_bos=False, tie_word_embeddings=cfg.tie_weights)


def tl_state_dict(cfg: ModelConfig, state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The on-disk `state` (checked by the caller) as the state dict of TL's unmodified model of the installed
    version (`HookedTransformer(tl_config(cfg))`, with its buffers, or `TransformerBridge.boot_native(...)`)."""
    full = _complete(cfg, state)
    if hooked_kind() == "TransformerBridge":
        return {k: v.clone() for k, v in full.items()}
    params = _convert(cfg, full, to_hooked=True)
    buffers = {name: b for name, b in _empty_hooked(cfg).state_dict().items() if name not in params}
    return {**{k: v.clone() for k, v in params.items()}, **buffers}


# ------------------------------------------------------------------------------------------ building
def _empty_hooked(cfg: ModelConfig) -> Any:
    from transformer_lens import HookedTransformer

    # TL 3.x deprecates HookedTransformer in favour of TL 4's bridge, which is what TL 4 gets here: the warning
    # says nothing to our users. Constructors may draw from the global RNG: it is left as it was.
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="HookedTransformer is deprecated", category=DeprecationWarning)
        return HookedTransformer(tl_config(cfg), move_to_device=False)


def _booted(cfg: ModelConfig) -> Any:
    """`TransformerBridge.boot_native` with the config's biases, output bias and tying set on its native modules."""
    from transformer_lens.model_bridge import TransformerBridge

    with torch.random.fork_rng(devices=[]):  # nn.Linear's constructor draws from the global RNG
        bridge = TransformerBridge.boot_native(tl_config(cfg))
    native = bridge.original_model  # its submodules are bridge components around the native torch modules
    blocks = list(native.layers)
    norms = [raw(native.ln_out)] + [raw(b.ln1) for b in blocks] + [raw(b.ln2) for b in blocks if not cfg.attn_only]
    linears = [(raw(getattr(b.attn, n)), cfg.attn_bias) for b in blocks for n in _LINEARS]
    linears += [(raw(m), cfg.mlp_bias) for b in blocks if not cfg.attn_only for m in (b.mlp.fc_in, b.mlp.fc_out)]
    for module, keep in linears + [(n, cfg.layernorm_bias) for n in norms if isinstance(n, torch.nn.LayerNorm)]:
        if not keep:
            module.bias = None  # torch's nn.Linear / nn.LayerNorm forwards accept a missing bias
    head = raw(native.head)
    if cfg.unembed_bias:  # the bridge's zero buffer becomes a trainable output bias
        bias = head.bias.detach().clone()
        delattr(head, "bias")
        head.bias = torch.nn.Parameter(bias)
    if cfg.tie_weights:
        head.weight = raw(native.tok_embed).weight
    return bridge


def build(cfg: ModelConfig, state: Mapping[str, Tensor]) -> Any:
    """TL's model of the installed version holding the on-disk `state` (checked by the caller), on the CPU, in
    eval mode; the global RNG is neither read nor advanced."""
    full = _complete(cfg, state)
    model = _empty_hooked(cfg) if hooked_kind() == "HookedTransformer" else _booted(cfg)
    target = model.state_dict()
    new = {k: full[k] for k in target} if is_bridge(model) else _convert(cfg, full, to_hooked=True)
    model.load_state_dict({**target, **new}, strict=True)
    return model.eval()


def disk_state(model: Any, cfg: ModelConfig) -> dict[str, Tensor]:
    """The on-disk state of a hooked model of either kind (`build`'s, or TL's own booted from `tl_config(cfg)`):
    contiguous CPU copies; ValueError where `cfg` cannot hold the model (see `_reduce`)."""
    sd = model.state_dict()
    full = dict(sd) if is_bridge(model) else _convert(cfg, sd, to_hooked=False)
    return _reduce(cfg, full, type(model).__name__)
