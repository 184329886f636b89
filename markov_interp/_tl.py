"""TransformerLens-version adapter: one hooked model from the package's on-disk weights, on TL 2.x, 3.x and 4.x.

The package keeps its weights in one layout whatever TransformerLens is installed (the names and `nn.Linear`
layout `models.save` writes, `disk_shapes(cfg)`): `embed.weight [V, d]`, `pos_embed.weight [n_ctx, d]`,
`blocks.{i}.ln1.weight`, `blocks.{i}.attn.q.weight [heads_i * d_head, d]`, `blocks.{i}.attn.o.weight
[d, heads_i * d_head]`, `blocks.{i}.mlp.in.weight [d_mlp, d]`, `blocks.{i}.mlp.out.weight [d, d_mlp]`,
`ln_final.weight`, `unembed.weight [V, d]` (absent when tied) and the biases the config has. Two functions
cross into TransformerLens and back:

- `hooked_model(cfg, state)`: a `HookedTransformer` on TL 2.x / 3.x, a `TransformerBridge` from the public
  `TransformerBridge.boot_native` on TL 4 (the installed major version decides, `hooked_kind()`).
- `native_state(model)`: the on-disk state of either kind (the inverse), so saving works from both.

What each TransformerLens model can and cannot express:

- **Bridge (TL 4)**: `boot_native` builds biases everywhere, a bias-free untied head and LayerNorms with bias.
  The config's choices are set on the native modules after booting (plain torch attributes of the public
  `bridge.original_model`): absent biases become `None`, an output bias becomes a Parameter in place of the
  bridge's zero buffer, and a tied unembedding *is* the embedding Parameter. The bridge is then exactly the
  package's architecture (trainable; tying survives training).
- **HookedTransformer (TL 2/3)**: every bias exists; the config's absent ones are zero. TL has no tying
  (`W_U [d, V]` is not `W_E [V, d]`): a tied model gets an equal copy, so it is for analysis; `native_state`
  refuses a tied model whose copies have drifted apart.
- **Heads per layer**: TL has one head count; a layer with fewer heads is padded to the largest count with
  zero weights (its surplus heads appear in `hook_pattern` / `hook_z` and write nothing). `native_state`
  drops them again and refuses non-zero weights there.

`tl_config(cfg)` and `tl_state_dict(cfg, state)` convert for TL's *unmodified* model of this version:
`HookedTransformer(tl_config(cfg))` or `TransformerBridge.boot_native(tl_config(cfg))` loads
`tl_state_dict(cfg, state)` with `load_state_dict(..., strict=True)` and computes the same logits.
"""

from __future__ import annotations

import functools
import warnings
from importlib import metadata
from typing import Any, Optional

import torch
from einops import rearrange
from torch import Tensor

__all__ = ["tl_version", "hooked_kind", "raw", "disk_shapes", "check_state", "tl_config", "tl_state_dict",
           "hooked_model", "native_state", "load_native_state", "is_bridge"]

_LINEARS = ("q", "k", "v", "o")


@functools.cache
def tl_version() -> tuple[int, int]:
    """The installed TransformerLens version as (major, minor)."""
    major, minor = metadata.version("transformer-lens").split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def hooked_kind() -> str:
    """"HookedTransformer" (TL 2.x, 3.x) or "TransformerBridge" (TL 4.x): what `hooked_model` builds."""
    return "HookedTransformer" if tl_version()[0] < 4 else "TransformerBridge"


def raw(module: Any) -> Any:
    """The torch module behind a bridge component (its public `original_component`), else `module` itself."""
    inner = getattr(module, "original_component", None)
    return inner if isinstance(inner, torch.nn.Module) else module


def is_bridge(model: Any) -> bool:
    """Whether `model` is a TransformerBridge (any TL version that has one), not a HookedTransformer."""
    return hasattr(type(model), "original_model")


# --------------------------------------------------------------------------------------------- layout
def _norm_names(cfg: Any, prefix: str) -> dict[str, tuple]:
    if cfg.normalization != "LN":
        return {}
    d = cfg.d_model
    return {f"{prefix}.weight": (d,), **({f"{prefix}.bias": (d,)} if cfg.layernorm_bias else {})}


def _linear_names(prefix: str, d_out: int, d_in: int, bias: bool) -> dict[str, tuple]:
    return {f"{prefix}.weight": (d_out, d_in), **({f"{prefix}.bias": (d_out,)} if bias else {})}


def disk_shapes(cfg: Any) -> dict[str, tuple]:
    """Names and shapes of the on-disk state of `cfg` (what `models.save` writes), in forward order.

    A layer with h heads has `h * d_head` rows in q / k / v and columns in o (`cfg.heads_per_layer`)."""
    d, v = cfg.d_model, cfg.d_vocab
    shapes = {"embed.weight": (v, d)}
    if cfg.positional == "standard":
        shapes["pos_embed.weight"] = (cfg.n_ctx, d)
    for i, heads in enumerate(cfg.heads_per_layer):
        b, h = f"blocks.{i}.", heads * cfg.d_head
        shapes.update(_norm_names(cfg, b + "ln1"))
        for name in "qkv":
            shapes.update(_linear_names(f"{b}attn.{name}", h, d, cfg.attn_bias))
        shapes.update(_linear_names(b + "attn.o", d, h, cfg.attn_bias))
        if not cfg.attn_only:
            shapes.update(_norm_names(cfg, b + "ln2"))
            shapes.update(_linear_names(b + "mlp.in", cfg.d_mlp, d, cfg.mlp_bias))
            shapes.update(_linear_names(b + "mlp.out", d, cfg.d_mlp, cfg.mlp_bias))
    shapes.update(_norm_names(cfg, "ln_final"))
    if not cfg.tie_weights:
        shapes["unembed.weight"] = (v, d)
    if cfg.unembed_bias:
        shapes["unembed.bias"] = (v,)
    return shapes


def check_state(cfg: Any, state: dict[str, Tensor], *, source: str = "weights") -> None:
    """Refuse a state whose names or shapes differ from `disk_shapes(cfg)` (ValueError naming them)."""
    expected = disk_shapes(cfg)
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ValueError(f"{source}: missing tensors {missing}, unexpected tensors {unexpected}")
    bad = {k: (tuple(state[k].shape), want) for k, want in expected.items() if tuple(state[k].shape) != want}
    if bad:
        detail = ", ".join(f"{k} has shape {got}, expected {want}" for k, (got, want) in sorted(bad.items()))
        raise ValueError(f"{source}: wrong shapes: {detail}")


def _max_heads(cfg: Any) -> int:
    return max(cfg.heads_per_layer)


def _complete(cfg: Any, state: dict[str, Tensor]) -> dict[str, Tensor]:
    """The on-disk state with every tensor TL's models insist on: zero biases, LayerNorm biases, a zero output
    bias, the tied unembedding as a copy, and each layer padded with zero heads to the largest count
    (bridge names, `nn.Linear` layout)."""
    d, rows = cfg.d_model, _max_heads(cfg) * cfg.d_head
    full = {name: t for name, t in state.items()}
    like = state["embed.weight"]
    zeros = functools.partial(torch.zeros, dtype=like.dtype, device=like.device)
    norms = ["ln_final"] + [f"blocks.{i}.ln{j}" for i in range(cfg.n_layers) for j in (1, 2)]
    for norm in norms:
        if f"{norm}.weight" in full:
            full.setdefault(f"{norm}.bias", zeros(d))
    for i in range(cfg.n_layers):
        b = f"blocks.{i}."
        for name in "qkv":
            full[f"{b}attn.{name}.weight"] = _pad(full[f"{b}attn.{name}.weight"], rows, 0)
            full[f"{b}attn.{name}.bias"] = _pad(full.get(f"{b}attn.{name}.bias", zeros(0)), rows, 0)
        full[b + "attn.o.weight"] = _pad(full[b + "attn.o.weight"], rows, 1)
        full.setdefault(b + "attn.o.bias", zeros(d))
        if not cfg.attn_only:
            full.setdefault(b + "mlp.in.bias", zeros(cfg.d_mlp))
            full.setdefault(b + "mlp.out.bias", zeros(d))
    if cfg.tie_weights:
        full["unembed.weight"] = full["embed.weight"]
    full.setdefault("unembed.bias", zeros(cfg.d_vocab))
    return full


def _pad(t: Tensor, size: int, dim: int) -> Tensor:
    """`t` with zeros appended along `dim` up to `size`."""
    missing = size - t.shape[dim]
    if missing == 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t, t.new_zeros(shape)], dim=dim)


def _reduce(cfg: Any, full: dict[str, Tensor], what: str) -> dict[str, Tensor]:
    """Inverse of `_complete`: the on-disk state of a full (bridge-named) state, refusing non-zero tensors where
    the config has none (an absent bias, a padded head) and a tied unembedding that differs from the embedding."""
    out = {}
    for name, want in disk_shapes(cfg).items():
        t = full[name]
        if tuple(t.shape) != want:  # a padded layer: keep its own heads
            t = t[: want[0]] if t.shape[0] != want[0] else t[:, : want[1]]
        out[name] = t.detach().to("cpu").contiguous().clone()
    for name, t in full.items():
        if name == "unembed.weight" and cfg.tie_weights:
            continue
        kept = out.get(name)
        if kept is None:
            surplus = t
        elif t.shape == kept.shape:
            continue
        else:
            surplus = t[kept.shape[0]:] if t.shape[0] != kept.shape[0] else t[:, kept.shape[1]:]
        if surplus.numel() and bool(surplus.detach().ne(0).any()):
            raise ValueError(f"{what}: {name} is non-zero where the model's config has no weights (an absent bias "
                             "or a head beyond the layer's count); its config cannot represent this model")
    if cfg.tie_weights and not torch.equal(full["unembed.weight"].detach().cpu(), out["embed.weight"]):
        raise ValueError(f"{what}: the config ties the unembedding to the embedding but they differ (a "
                         "HookedTransformer keeps two copies, and training it moves them apart); TL has no tying, "
                         "so such a model is for analysis: set tie_weights=False in its config to keep both")
    return out


# --------------------------------------------------------------------------------- TL 2.x / 3.x: HookedTransformer
_HT_LINEARS = {"q": "Q", "k": "K", "v": "V"}


def _to_hooked_names(cfg: Any, full: dict[str, Tensor]) -> dict[str, Tensor]:
    """Bridge-named, `nn.Linear`-layout tensors (`_complete`) as HookedTransformer parameters."""
    h = _max_heads(cfg)
    out = {"embed.W_E": full["embed.weight"]}
    if cfg.positional == "standard":
        out["pos_embed.W_pos"] = full["pos_embed.weight"]
    norms = [(f"blocks.{i}.ln{j}", f"blocks.{i}.ln{j}") for i in range(cfg.n_layers) for j in (1, 2)]
    for src, dst in norms + [("ln_final", "ln_final")]:
        if f"{src}.weight" in full:
            out[f"{dst}.w"], out[f"{dst}.b"] = full[f"{src}.weight"], full[f"{src}.bias"]
    for i in range(cfg.n_layers):
        b = f"blocks.{i}."
        for name, tl in _HT_LINEARS.items():
            out[f"{b}attn.W_{tl}"] = rearrange(full[f"{b}attn.{name}.weight"], "(h d) m -> h m d", h=h)
            out[f"{b}attn.b_{tl}"] = rearrange(full[f"{b}attn.{name}.bias"], "(h d) -> h d", h=h)
        out[b + "attn.W_O"] = rearrange(full[b + "attn.o.weight"], "m (h d) -> h d m", h=h)
        out[b + "attn.b_O"] = full[b + "attn.o.bias"]
        if not cfg.attn_only:
            out[b + "mlp.W_in"], out[b + "mlp.b_in"] = full[b + "mlp.in.weight"].T, full[b + "mlp.in.bias"]
            out[b + "mlp.W_out"], out[b + "mlp.b_out"] = full[b + "mlp.out.weight"].T, full[b + "mlp.out.bias"]
    out["unembed.W_U"], out["unembed.b_U"] = full["unembed.weight"].T, full["unembed.bias"]
    return {k: v.contiguous() for k, v in out.items()}


def _from_hooked_names(cfg: Any, sd: dict[str, Tensor]) -> dict[str, Tensor]:
    """Inverse of `_to_hooked_names` (buffers ignored)."""
    full = {"embed.weight": sd["embed.W_E"], "unembed.weight": sd["unembed.W_U"].T, "unembed.bias": sd["unembed.b_U"]}
    if cfg.positional == "standard":
        full["pos_embed.weight"] = sd["pos_embed.W_pos"]
    for name in [f"blocks.{i}.ln{j}" for i in range(cfg.n_layers) for j in (1, 2)] + ["ln_final"]:
        if f"{name}.w" in sd:
            full[f"{name}.weight"], full[f"{name}.bias"] = sd[f"{name}.w"], sd[f"{name}.b"]
    for i in range(cfg.n_layers):
        b = f"blocks.{i}."
        for name, tl in _HT_LINEARS.items():
            full[f"{b}attn.{name}.weight"] = rearrange(sd[f"{b}attn.W_{tl}"], "h m d -> (h d) m")
            full[f"{b}attn.{name}.bias"] = rearrange(sd[f"{b}attn.b_{tl}"], "h d -> (h d)")
        full[b + "attn.o.weight"] = rearrange(sd[b + "attn.W_O"], "h d m -> m (h d)")
        full[b + "attn.o.bias"] = sd[b + "attn.b_O"]
        if not cfg.attn_only:
            full[b + "mlp.in.weight"], full[b + "mlp.in.bias"] = sd[b + "mlp.W_in"].T, sd[b + "mlp.b_in"]
            full[b + "mlp.out.weight"], full[b + "mlp.out.bias"] = sd[b + "mlp.W_out"].T, sd[b + "mlp.b_out"]
    return full


# ------------------------------------------------------------------------------------------------ configs
def tl_config(cfg: Any) -> Any:
    """TransformerLens's config for `cfg` on the installed version: a `HookedTransformerConfig` (TL 2/3) or a
    `TransformerBridgeConfig` for `TransformerBridge.boot_native` (TL 4). Heads: the largest layer's count."""
    common = dict(n_layers=cfg.n_layers, d_model=cfg.d_model, n_ctx=cfg.n_ctx, d_head=cfg.d_head,
                  n_heads=_max_heads(cfg), d_mlp=cfg.d_mlp, d_vocab=cfg.d_vocab, act_fn=cfg.act_fn, eps=cfg.eps,
                  normalization_type=cfg.normalization, positional_embedding_type=cfg.positional,
                  attn_only=cfg.attn_only, default_prepend_bos=False, model_name="markov-interp")
    if hooked_kind() == "HookedTransformer":
        from transformer_lens import HookedTransformerConfig

        rotary = dict(rotary_dim=cfg.d_head, rotary_adjacent_pairs=True) if cfg.positional == "rotary" else {}
        # init_weights=False: every parameter is loaded; the device is chosen by `hooked_model`'s caller
        return HookedTransformerConfig(**common, **rotary, init_weights=False, device="cpu")
    from transformer_lens.config import TransformerBridgeConfig

    return TransformerBridgeConfig(**common, tokenizer_prepends_bos=False, tie_word_embeddings=cfg.tie_weights,
                                   init_weights=False)


def tl_state_dict(cfg: Any, state: dict[str, Tensor]) -> dict[str, Tensor]:
    """The on-disk `state` of `cfg` as the state dict of TL's unmodified model of this version, loadable with
    `strict=True` into `HookedTransformer(tl_config(cfg))` (TL 2/3, with its buffers) or
    `TransformerBridge.boot_native(tl_config(cfg))` (TL 4): zero biases where the config has none, the tied
    unembedding as a copy, zero heads padding smaller layers. Same logits as `hooked_model(cfg, state)`."""
    check_state(cfg, state)
    full = _complete(cfg, state)
    if hooked_kind() == "TransformerBridge":
        return {k: v.clone() for k, v in full.items()}
    params = _to_hooked_names(cfg, full)
    buffers = {name: b for name, b in _empty_hooked(cfg).state_dict().items() if name not in params}
    return {**{k: v.clone() for k, v in params.items()}, **buffers}


# ------------------------------------------------------------------------------------------------ building
def _empty_hooked(cfg: Any) -> Any:
    from transformer_lens import HookedTransformer

    # no construction reads or advances the caller's RNG; TL 3.x deprecates HookedTransformer in favour of TL 4's
    # bridge, which is what this adapter builds there: the warning says nothing to our users
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="HookedTransformer is deprecated", category=DeprecationWarning)
        return HookedTransformer(tl_config(cfg), move_to_device=False)


def _booted(cfg: Any) -> Any:
    """`TransformerBridge.boot_native` with the config's biases, output bias and tying set on its native modules."""
    from transformer_lens.model_bridge import TransformerBridge

    with torch.random.fork_rng(devices=[]):
        bridge = TransformerBridge.boot_native(tl_config(cfg))
    native = bridge.original_model  # its submodules are bridge components around the native torch modules
    blocks = list(native.layers)
    norms = [raw(native.ln_out)] + [raw(b.ln1) for b in blocks] + [raw(b.ln2) for b in blocks if not cfg.attn_only]
    linears = [(raw(getattr(b.attn, n)), cfg.attn_bias) for b in blocks for n in _LINEARS]
    linears += [(raw(m), cfg.mlp_bias) for b in blocks if not cfg.attn_only for m in (b.mlp.fc_in, b.mlp.fc_out)]
    for module, keep in linears + [(n, cfg.layernorm_bias) for n in norms if isinstance(n, torch.nn.LayerNorm)]:
        if not keep:
            module.bias = None  # torch modules accept a missing bias (nn.Linear / nn.LayerNorm forwards)
    head = raw(native.head)
    if cfg.unembed_bias:  # the bridge's zero buffer becomes a trainable output bias
        bias = head.bias.detach().clone()
        delattr(head, "bias")
        head.bias = torch.nn.Parameter(bias)
    if cfg.tie_weights:
        head.weight = raw(native.tok_embed).weight
    return bridge


def hooked_model(cfg: Any, state: dict[str, Tensor], device: Any = None) -> Any:
    """The hooked TransformerLens model of `cfg` holding the on-disk `state` (names and shapes of
    `disk_shapes(cfg)`, as `models.save` writes them; ValueError naming any that differ).

    TL 2.x / 3.x: a `HookedTransformer` (zero biases where the config has none; a tied unembedding is a copy:
    analysis only). TL 4: a `TransformerBridge` from `TransformerBridge.boot_native`, exactly the config's
    architecture (bias-free modules, trainable output bias, tied = one Parameter). Either way
    `model.markov_config` is `cfg`, the global RNG is neither read nor advanced, and the logits are those of the
    package's fused forward on the same weights (tested at 1e-5).

    Args:
        cfg: a `models.ModelConfig` (anything with its fields and `heads_per_layer`).
        state: on-disk tensors (CPU or any device; copied).
        device: where the model lives (default CPU).

    Returns:
        The model, in eval mode.
    """
    check_state(cfg, state)
    full = _complete(cfg, state)
    if hooked_kind() == "HookedTransformer":
        model = _empty_hooked(cfg)
        params = _to_hooked_names(cfg, full)
        target = model.state_dict()
        model.load_state_dict({**target, **params}, strict=True)
    else:
        model = _booted(cfg)
        expected = model.state_dict()
        model.load_state_dict({k: full[k] for k in expected}, strict=True)
    object.__setattr__(model, "markov_config", cfg)
    if device is not None:
        model.to(torch.device(device), print_details=False)
    return model.eval()


def load_native_state(model: Any, state: dict[str, Tensor]) -> None:
    """Copy the on-disk `state` into a model built by `hooked_model` (either kind) in place, keeping tying."""
    cfg = model.markov_config
    check_state(cfg, state)
    full = _complete(cfg, state)
    target = model.state_dict()
    new = _to_hooked_names(cfg, full) if not is_bridge(model) else {k: full[k] for k in target}
    with torch.no_grad():
        model.load_state_dict({**target, **new}, strict=True)


def native_state(model: Any, cfg: Optional[Any] = None) -> dict[str, Tensor]:
    """The on-disk state (contiguous CPU copies, `disk_shapes(cfg)`) of a hooked model of either kind.

    Args:
        model: a `HookedTransformer` or `TransformerBridge` (`hooked_model`'s, or TL's own booted from
            `tl_config(cfg)`).
        cfg: its `ModelConfig`; default `model.markov_config`.

    Returns:
        `{name: tensor}` as `models.save` writes it. ValueError where the config cannot hold the model: a
        non-zero bias the config lacks, non-zero weights in a padded head, or a tied unembedding that differs
        from the embedding (a trained HookedTransformer's copies).
    """
    cfg = cfg if cfg is not None else model.markov_config
    sd = model.state_dict()
    full = dict(sd) if is_bridge(model) else _from_hooked_names(cfg, sd)
    return _reduce(cfg, full, type(model).__name__)
