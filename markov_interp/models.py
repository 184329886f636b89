"""Models: the paper's transformers as hooked TransformerLens models, plus a fast training forward.

A `ModelConfig` (frozen, JSON round-trip) describes a GPT-2-style decoder: the single-layer model of Makkuva
et al. ("Attention with Markov", arXiv 2402.04161) is `preset("paper-1layer")`: pre-LayerNorm block, one
head, d_model 8, MLP 8 -> 32 -> 8 with GELU, learned absolute positions, LayerNorm without bias, attention and
MLP linear layers without bias, an output layer with bias, and **weight tying** (the unembedding matrix is the
token embedding matrix).

`build(cfg, seed=...)` returns a hooked TransformerLens model, so every TransformerLens tool works on it
(`run_with_cache`, `cache["pattern", 0]`, `run_with_hooks` with `blocks.0.attn.hook_pattern`, ...): a
`HookedTransformer` on TransformerLens 2.x / 3.x and a `TransformerBridge` (`TransformerBridge.boot_native`) on
4.x. `markov_interp._tl` is the version adapter: `hooked_model(cfg, state)` builds either kind from the on-disk
weights and `native_state(model)` reads them back; see it for what each kind expresses (the bridge is exactly
the paper's architecture, tied = one Parameter; the HookedTransformer has zero biases where the config has none
and a tied unembedding as an equal copy, so it is for analysis). Move models with
`model.to(device, print_details=False)` to keep TransformerLens quiet.

Weights live in one layout on every TransformerLens version: the names and `nn.Linear` layout `save` writes
(`_tl.disk_shapes`); safetensors refuses shared tensors, so a tied unembedding is stored once and re-tied on
load. `tl_config` / `tl_state_dict` convert a saved model for TransformerLens's unmodified model of the
installed version (strict `load_state_dict`).

Training does not need TransformerLens: it optimises a `native_module` (plain torch modules in the native
layout) through `fast_forward`, the same logits with `torch.nn.functional.scaled_dot_product_attention(
is_causal=True)`, and builds the hooked model from its weights at the end.

The hooked model carries its config as `model.markov_config` (a `ModelConfig`).
"""

import dataclasses
import functools
import json
import math
import os
from pathlib import Path
from typing import Any, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange
from jaxtyping import Float, Int
from torch import Tensor

from markov_interp import _tl, runfolder
from markov_interp._io import atomic_write
from markov_interp.config import Config, check_bool, check_choice, check_int, check_keys, check_number

# transformer_lens takes seconds to import (datasets, transformers); `_tl` imports it where a hooked model is
# built, so a process that builds none (training, `markov-interp train`) never pays for it.

__all__ = [
    "ModelConfig",
    "PRESETS",
    "preset",
    "build",
    "hooked_model",
    "native_state",
    "tl_config",
    "tl_state_dict",
    "initial_state",
    "native_module",
    "disk_parameters",
    "ACTIVATIONS",
    "Rotary",
    "fast_forward",
    "FastParams",
    "fast_params",
    "save",
    "load",
    "read_weights",
    "state_dict_for_save",
    "load_weights_into",
    "check_tied",
    "heads_per_layer",
    "WEIGHTS_FILE",
]

WEIGHTS_FILE = "model.safetensors"
_CONFIG_KEY = "markov_interp.model_config"
_NORMALIZATIONS = ("LN", "LNPre", None)
_POSITIONAL = ("standard", "rotary")
_INITS = ("standard", "canonical")
_ACTIVATIONS = ("gelu", "gelu_new", "relu")


# ------------------------------------------------------------------------------------------------ config
@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig(Config):
    """Architecture and initialisation of a decoder-only transformer on V-state Markov data.

    Defaults are the paper's single-layer model (the base of every preset). `d_head` defaults to
    d_model // n_heads and `d_mlp` to 4 * d_model; both are resolved to integers at construction (use
    `cfg.replace(...)`, which re-derives them when d_model / n_heads change, rather than `dataclasses.replace`).

    Initialisations (`init`):
      - "standard": every weight N(0, init_std) (embeddings, positions, Q, K, V, MLP in, untied head), the
        output projections (attention O and MLP out) N(0, init_std / sqrt(2 n_layers)), biases 0,
        LayerNorm scales 1 -- the reference code's GPT-2 init.
      - "canonical": the low-rank init of the follow-up paper ("Local to Global", arXiv 2406.03072) along
        one random direction; see `build` for the exact map from (canonical_e, canonical_w, canonical_b,
        canonical_v_std) to weights. Its negative-product variant (MLP in-weights +c, out-weights -c) is
        `canonical_w < 0`; w < -1/sqrt(2) starts the reduced model in the global basin.
    """

    n_layers: int = 1  # number of transformer blocks
    n_heads: int = 1  # attention heads per block
    d_model: int = 8  # residual stream width
    d_head: Optional[int] = None  # per-head width; None -> d_model // n_heads
    d_mlp: Optional[int] = None  # MLP hidden width; None -> 4 * d_model (unused when attn_only)
    attn_only: bool = False  # True: blocks without MLP
    act_fn: str = "gelu"  # MLP nonlinearity: "gelu" (exact, as torch.nn.GELU), "gelu_new" (tanh), "relu"
    normalization: Optional[str] = "LN"  # "LN" (pre-LN with scale), "LNPre" (no parameters), None
    layernorm_bias: bool = False  # the paper's LayerNorm has no bias
    eps: float | int = 1e-5  # LayerNorm epsilon
    positional: str = "standard"  # "standard" learned absolute positions, or "rotary"
    d_vocab: int = 2  # number of Markov states
    n_ctx: int = 1024  # longest sequence the model accepts
    tie_weights: bool = True  # unembedding matrix = token embedding matrix (the paper's default)
    unembed_bias: bool = True  # output layer bias
    attn_bias: bool = False  # biases on Q, K, V, O
    mlp_bias: bool = False  # biases on MLP in / out
    init: str = "standard"  # "standard" or "canonical" (see class docstring)
    init_std: float | int = 0.02  # std of the standard init (and of the random parts of the canonical one)
    canonical_e: float | int = 0.1  # canonical init: embedding scale e
    canonical_w: float | int = 0.1  # canonical init: signed MLP scale w
    canonical_b: float | int = 0.0  # canonical init: output bias b (logit of state 1 minus logit of state 0)
    canonical_v_std: float | int = 0.0  # canonical init: std of v in the rank-one value matrix u v^T (0: no attn)
    canonical_a: float | int | None = None  # canonical init, untied: output scale a (W_U row 1 = a u); None -> a = e

    def __post_init__(self) -> None:
        for name in ("n_layers", "n_heads", "d_model", "d_vocab", "n_ctx"):
            check_int(name, getattr(self, name), minimum=2 if name == "d_vocab" else 1)
        if self.d_head is None:
            if self.d_model % self.n_heads:
                raise ValueError(
                    f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; give d_head explicitly"
                )
            object.__setattr__(self, "d_head", self.d_model // self.n_heads)
        if self.d_mlp is None:
            object.__setattr__(self, "d_mlp", 4 * self.d_model)
        check_int("d_head", self.d_head, minimum=1)
        check_int("d_mlp", self.d_mlp, minimum=1)
        for name in ("attn_only", "layernorm_bias", "tie_weights", "unembed_bias", "attn_bias", "mlp_bias"):
            check_bool(name, getattr(self, name))
        check_choice("act_fn", self.act_fn, _ACTIVATIONS)
        check_choice("normalization", self.normalization, _NORMALIZATIONS)
        check_choice("positional", self.positional, _POSITIONAL)
        check_choice("init", self.init, _INITS)
        if self.layernorm_bias and self.normalization != "LN":
            raise ValueError(
                f"layernorm_bias=True needs normalization='LN' (got normalization={self.normalization!r}, "
                "which has no LayerNorm parameters)"
            )
        if self.positional == "rotary" and self.d_head % 2:
            raise ValueError(f"positional='rotary' needs an even d_head, got d_head={self.d_head}")
        for name in ("eps", "init_std"):
            check_number(name, getattr(self, name), positive=True)
        if self.canonical_a is not None:
            check_number("canonical_a", self.canonical_a)
            if self.tie_weights:
                raise ValueError("canonical_a sets the untied output scale; it needs tie_weights=False")
        for name in ("canonical_e", "canonical_w", "canonical_b"):
            check_number(name, getattr(self, name))
        check_number("canonical_v_std", self.canonical_v_std, minimum=0)
        if self.init == "canonical":
            self._check_canonical()

    def _check_canonical(self) -> None:
        if self.d_vocab != 2:
            raise ValueError(f"init='canonical' is defined for binary chains (d_vocab=2), got d_vocab={self.d_vocab}")
        if self.positional != "standard":
            raise ValueError("init='canonical' needs learned positions (positional='standard')")
        if self.canonical_v_std > 0 and self.n_heads * self.d_head != self.d_model:
            raise ValueError(
                f"init='canonical' with canonical_v_std > 0 needs n_heads * d_head == d_model, got "
                f"{self.n_heads} * {self.d_head} != {self.d_model}"
            )

    def replace(self, **changes: Any) -> "ModelConfig":
        """A copy with `changes` (`dataclasses.replace`); d_head / d_mlp are re-derived when they held their
        defaults and a size they derive from changes (unless given explicitly). Unknown field names raise
        ValueError."""
        check_keys(ModelConfig, changes, what="fields")
        derived = {}
        if "d_head" not in changes and self.d_head * self.n_heads == self.d_model:
            derived["d_head"] = None
        if "d_mlp" not in changes and self.d_mlp == 4 * self.d_model:
            derived["d_mlp"] = None
        return dataclasses.replace(self, **derived, **changes)

    @property
    def heads_per_layer(self) -> tuple[int, ...]:
        """Attention heads in each block, layer 0 first."""
        return (self.n_heads,) * self.n_layers

    @property
    def n_params(self) -> int:
        """Number of trainable parameters (tied weights counted once)."""
        d, v, h = self.d_model, self.d_vocab, self.n_heads * self.d_head
        n = v * d + (self.n_ctx * d if self.positional == "standard" else 0)
        ln = {"LN": d * (2 if self.layernorm_bias else 1), "LNPre": 0, None: 0}[self.normalization]
        per_block = ln + 4 * d * h
        per_block += (3 * h + d) if self.attn_bias else 0
        if not self.attn_only:
            per_block += ln + 2 * d * self.d_mlp + ((self.d_mlp + d) if self.mlp_bias else 0)
        n += self.n_layers * per_block + ln
        n += 0 if self.tie_weights else v * d
        n += v if self.unembed_bias else 0
        return n


# ----------------------------------------------------------------------------------------------- presets
# Every preset is the base preset, ModelConfig() (the paper's single-layer model: pre-LN GPT-2 block, 1 head,
# d_model 8, MLP 4d GELU, learned positions, LN without bias, bias-free attention/MLP, tied embedding, output
# bias; ~9k parameters, 8k of them positions), with these fields replaced.
PRESETS: dict[str, dict] = {
    "paper-1layer": {},
    # Its two-layer variant (the depth experiment: leaves the unigram plateau at p=0.5, q=0.8).
    "paper-2layer": {"n_layers": 2},
    # Two attention-only layers for the in-context task (random kernels): room for a previous-token head
    # in layer 0 and an induction head in layer 1. Untied, so the readout is free of the tying minima.
    "attn-only-2layer": {"n_layers": 2, "d_model": 16, "attn_only": True, "tie_weights": False},
}


def preset(name: str, **overrides: Any) -> ModelConfig:
    """The named preset as a `ModelConfig`, with `overrides` applied (e.g. `d_vocab=3`, `n_ctx=256`).

    The preset is `ModelConfig().replace(**PRESETS[name], **overrides)`: d_head and d_mlp follow d_model /
    n_heads unless given. Unknown names or fields raise ValueError listing the valid ones.

    >>> preset("paper-1layer").d_mlp
    32
    >>> preset("paper-1layer", d_model=16).d_mlp
    64
    """
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; valid presets are {sorted(PRESETS)}")
    return ModelConfig().replace(**{**PRESETS[name], **overrides})


# ------------------------------------------------------------------------------------------------- build
# ACT_FN -> the MLP nonlinearity of every forward (TransformerLens's "gelu_new" is the tanh approximation)
ACTIVATIONS = {"gelu": F.gelu, "gelu_new": functools.partial(F.gelu, approximate="tanh"), "relu": F.relu}


def _plain_norm(cfg: ModelConfig) -> nn.Module:
    if cfg.normalization == "LN":
        return nn.LayerNorm(cfg.d_model, eps=cfg.eps, bias=cfg.layernorm_bias)
    if cfg.normalization == "LNPre":  # centre and scale, no parameters (TransformerLens's LayerNormPre)
        return nn.LayerNorm(cfg.d_model, eps=cfg.eps, elementwise_affine=False)
    return nn.Identity()


def _plain_native(cfg: ModelConfig) -> nn.Module:
    """Plain torch modules in TransformerLens's native layout (`tok_embed`, `pos`, `layers[i].ln1`, `attn.q/k/v/o`,
    `ln2`, `mlp.fc_in/fc_out`, `ln_out`, `head`; `nn.Linear` weights) with exactly the config's parameters: what
    the fused forward trains and the initialiser writes. No transformer_lens import."""
    with torch.random.fork_rng(devices=[]):  # constructors draw from the global RNG; the init overwrites them
        native = nn.Module()
        native.tok_embed = nn.Embedding(cfg.d_vocab, cfg.d_model)
        native.pos = nn.Embedding(cfg.n_ctx, cfg.d_model) if cfg.positional == "standard" else None
        layers = []
        for heads in cfg.heads_per_layer:
            block, h = nn.Module(), heads * cfg.d_head
            block.ln1 = _plain_norm(cfg)
            block.attn = nn.Module()
            for name in "qkv":
                setattr(block.attn, name, nn.Linear(cfg.d_model, h, bias=cfg.attn_bias))
            block.attn.o = nn.Linear(h, cfg.d_model, bias=cfg.attn_bias)
            if not cfg.attn_only:
                block.ln2 = _plain_norm(cfg)
                block.mlp = nn.Module()
                block.mlp.fc_in = nn.Linear(cfg.d_model, cfg.d_mlp, bias=cfg.mlp_bias)
                block.mlp.fc_out = nn.Linear(cfg.d_mlp, cfg.d_model, bias=cfg.mlp_bias)
            layers.append(block)
        native.layers = nn.ModuleList(layers)
        native.ln_out = _plain_norm(cfg)
        native.head = nn.Linear(cfg.d_model, cfg.d_vocab, bias=cfg.unembed_bias)
        if cfg.tie_weights:
            native.head.weight = native.tok_embed.weight
    return native


def _tl_name(name: str) -> str:
    """A native parameter name as the on-disk (TransformerBridge) name: `layers.0.mlp.fc_in.weight` ->
    `blocks.0.mlp.in.weight`, `tok_embed` -> `embed`, `pos` -> `pos_embed`, `ln_out` -> `ln_final`, `head` ->
    `unembed`."""
    head, _, rest = name.partition(".")
    if head == "layers":
        index, _, inner = rest.partition(".")
        inner = inner.replace("mlp.fc_in.", "mlp.in.").replace("mlp.fc_out.", "mlp.out.")
        return f"blocks.{index}.{inner}"
    prefix = {"tok_embed": "embed", "pos": "pos_embed", "ln_out": "ln_final", "head": "unembed"}[head]
    return f"{prefix}.{rest}"


def _is_native(model: Any) -> bool:
    """A plain native module (`native_module`), as opposed to a TransformerLens hooked model."""
    return hasattr(model, "tok_embed") and not _tl.is_bridge(model)


@torch.no_grad()
def _initialise(native: nn.Module, cfg: ModelConfig, seed: int) -> None:
    """Write the init of `cfg.init` into `native` (CPU float32 draws from one seeded generator)."""
    gen = torch.Generator().manual_seed(seed)

    def normal(param: Tensor, std: float) -> None:
        param.copy_(torch.randn(param.shape, generator=gen) * std)

    std = cfg.init_std
    out_std = std / math.sqrt(2 * cfg.n_layers)
    normal(native.tok_embed.weight, std)
    if native.pos is not None:
        normal(native.pos.weight, std)
    for block in native.layers:
        for name in ("q", "k", "v"):
            normal(getattr(block.attn, name).weight, std)
        normal(block.attn.o.weight, out_std)
        if not cfg.attn_only:
            normal(block.mlp.fc_in.weight, std)
            normal(block.mlp.fc_out.weight, out_std)
    if not cfg.tie_weights:
        normal(native.head.weight, std)
    for module in native.modules():
        if isinstance(module, nn.Linear) and module.bias is not None:
            module.bias.zero_()
        if isinstance(module, nn.LayerNorm) and module.weight is not None:
            module.weight.fill_(1.0)
            if module.bias is not None:
                module.bias.zero_()
    if cfg.init == "canonical":
        _canonical_init(native, cfg, gen)


@torch.no_grad()
def _canonical_init(native: nn.Module, cfg: ModelConfig, gen: torch.Generator) -> None:
    alpha = torch.randint(0, 2, (cfg.d_model,), generator=gen).float() * 2 - 1
    u = alpha / math.sqrt(cfg.d_model)
    e, w, b = cfg.canonical_e, cfg.canonical_w, cfg.canonical_b
    native.tok_embed.weight.zero_()
    native.tok_embed.weight[1] = e * u
    native.pos.weight.copy_((-e / 2) * u.expand_as(native.pos.weight))
    v = torch.randn(cfg.d_model, generator=gen) * cfg.canonical_v_std
    ones = torch.ones(cfg.d_mlp)
    scale = 2.0 / math.sqrt(cfg.d_mlp)
    for block in native.layers:
        block.attn.v.weight.copy_(torch.outer(u, v))  # zero when canonical_v_std == 0
        if not cfg.attn_only:
            block.mlp.fc_in.weight.copy_(torch.outer(ones, u) * (scale * abs(w)))
            block.mlp.fc_out.weight.copy_(torch.outer(u, ones) * (scale * w))
    if not cfg.tie_weights:
        a = e if cfg.canonical_a is None else cfg.canonical_a
        native.head.weight.zero_()
        native.head.weight[1] = a * u
    if native.head.bias is not None:
        native.head.bias.zero_()
        native.head.bias[1] = b


def build(cfg: ModelConfig, *, seed: int, device: Any = None) -> Any:
    """A freshly initialised hooked model for `cfg`: `hooked_model(cfg, initial_state(cfg, seed))` (a
    `HookedTransformer` on TransformerLens 2/3, a `TransformerBridge` on 4).

    The same (cfg, seed) gives the same weights on any device; the global RNG is neither read nor advanced.
    The model's config is `model.markov_config`; tied models share one Parameter between `model.embed`
    and `model.unembed`.

    Canonical init (`cfg.init == "canonical"`, binary chains; after the standard init of everything else):
    draw alpha in {-1, +1}^d_model uniformly (from the seed) and let u = alpha / sqrt(d_model) (unit norm).
    Then W_E[0] = 0, W_E[1] = e u; every position row W_pos[n] = -(e/2) u, so the residual stream starts at
    (x - 1/2) e u for state x; in every block W_V = u v^T with v ~ N(0, canonical_v_std^2) (zero when
    canonical_v_std = 0, so attention adds nothing), W_Q, W_K, W_O standard; MLP in-weights
    fc_in.weight = (2|w| / sqrt(d_mlp)) 1 u^T and out-weights fc_out.weight = (2w / sqrt(d_mlp)) u 1^T
    (shape [d_mlp, d_model] and [d_model, d_mlp], nn.Linear layout); unembedding bias b_U = (0, b); an
    untied unembedding starts at W_U[0] = 0, W_U[1] = a u with a = canonical_a (default a = e, i.e. equal to
    W_E). With normalization=None, act_fn="relu", canonical_v_std=0 and e > 0, the model's logit of state 1
    minus that of state 0 is exactly the reduced model of the notes, f_1 = (1/2 + 2 w|w|) e^2 + b after
    state 1 and f_0 = b - e^2/2 after state 0, at every position (times a/e when untied).

    Two cautions, measured with `markov_interp.landscape`: (1) the reduction does NOT hold with LayerNorm,
    which normalises the scale e away (at e=0.7, w=-0.4, b=0.2 the logit gap is -3.83 with the paper's
    LayerNorm+GELU block against 0.333 in the reduced model; GELU alone keeps the gap exact and shifts both
    logits by +0.075), so use normalization=None to study the landscape; (2) untied with a = e, gradient flow
    keeps a = e (it conserves e^2 - a^2), so it gets stuck like the tied model: pass canonical_a != e to leave
    that symmetric start.
    """
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    if not isinstance(cfg, ModelConfig):
        raise ValueError(f"cfg must be a ModelConfig, got {type(cfg).__name__}")
    return hooked_model(cfg, initial_state(cfg, seed), device=device)


def initial_state(cfg: ModelConfig, seed: int) -> dict[str, Tensor]:
    """The on-disk state of `build(cfg, seed=seed)` (names of `save`), computed on plain torch modules: no
    transformer_lens import. The one initialiser (`_initialise`) on the native layout."""
    native = _plain_native(cfg)
    _initialise(native, cfg, seed)
    return _native_state(native, cfg)


def native_module(cfg: ModelConfig, state: dict[str, Tensor], *, device: Any = None) -> nn.Module:
    """Plain torch modules in the native layout holding the on-disk `state` (tied = one Parameter), with
    `markov_config`: what `training.train` optimises through `fast_forward` (no hooks, no transformer_lens).

    Args:
        cfg: the model's config.
        state: on-disk tensors (`save`'s names; ValueError naming any missing, unexpected or misshapen).
        device: where the parameters live (default CPU).

    Returns:
        The module; `hooked_model(cfg, state_dict_for_save(module))` is its hooked TransformerLens model.
    """
    module = _plain_native(cfg)
    module.markov_config = cfg
    load_weights_into(module, state, source="native_module state")
    return module.to(torch.device(device)) if device is not None else module


def hooked_model(cfg: ModelConfig, state: dict[str, Tensor], device: Any = None) -> Any:
    """The hooked TransformerLens model of `cfg` holding the on-disk `state`: a `HookedTransformer` on
    TransformerLens 2.x / 3.x, a `TransformerBridge` (`TransformerBridge.boot_native`) on 4.x. See
    `markov_interp._tl.hooked_model` for what each kind can express (tying, zero biases, padded heads).

    Args:
        cfg: the model's config.
        state: on-disk tensors as `save` writes them (ValueError naming any missing or misshapen).
        device: where the model lives (default CPU).

    Returns:
        The model (eval mode) with `model.markov_config == cfg`.
    """
    model = _tl.hooked_model(cfg, state, device=device)
    check_tied(model)
    return model


def tl_config(cfg: ModelConfig) -> Any:
    """TransformerLens's own config for `cfg` on the installed version (`HookedTransformerConfig` on TL 2/3,
    `TransformerBridgeConfig` on TL 4): the converter's target, see `tl_state_dict`."""
    return _tl.tl_config(cfg)


def tl_state_dict(cfg: ModelConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Convert a saved model for TransformerLens's unmodified model of the installed version.

    `HookedTransformer(tl_config(cfg)).load_state_dict(tl_state_dict(cfg, state), strict=True)` (TL 2/3) or
    `TransformerBridge.boot_native(tl_config(cfg)).load_state_dict(..., strict=True)` (TL 4) gives a model with
    the logits of `hooked_model(cfg, state)`: zero biases where the config has none, a tied unembedding as a
    copy, smaller layers padded with zero heads. `native_state(model, cfg)` converts back.

    Args:
        cfg: the saved config (`read_weights(path)[0]`).
        state: the saved tensors (`read_weights(path)[1]`).

    Returns:
        TL's state dict (new tensors).
    """
    return _tl.tl_state_dict(cfg, state)


def native_state(model: Any, cfg: Optional[ModelConfig] = None) -> dict[str, Tensor]:
    """The on-disk state of a hooked model of either kind (or a `native_module`): CPU copies, `save`'s names.

    Args:
        model: a `HookedTransformer`, a `TransformerBridge` or a `native_module`.
        cfg: its config; default `model.markov_config`.

    Returns:
        `{name: tensor}`; ValueError where the config cannot hold the model (a non-zero bias it lacks, weights in
        a padded head, a tied unembedding that differs from the embedding).
    """
    if _is_native(model):
        return _native_state(model, cfg if cfg is not None else model.markov_config)
    return _tl.native_state(model, cfg)


def _native_state(native: nn.Module, cfg: ModelConfig) -> dict[str, Tensor]:
    state = {}
    for name, tensor in native.state_dict().items():
        tl_name = _tl_name(name)
        if cfg.tie_weights and tl_name == "unembed.weight":
            continue  # one matrix, stored as the embedding
        state[tl_name] = tensor.detach().to("cpu").contiguous().clone()
    return state


def heads_per_layer(model: Any) -> tuple[int, ...]:
    """The heads each layer of a hooked model really has, layer 0 first.

    A plain TransformerLens model has `cfg.n_heads` in every layer. A markov-interp model whose layers have
    different head counts is built with the largest count in every layer, the surplus heads' weights at zero
    (they exist in `hook_pattern` / `hook_z` but write nothing): probes, interventions and reports skip them.
    """
    cfg = getattr(model, "markov_config", None)
    if cfg is not None:
        return tuple(cfg.heads_per_layer)
    return (int(model.cfg.n_heads),) * int(model.cfg.n_layers)


# ------------------------------------------------------------------------------------------ fast forward
class Rotary(nn.Module):
    """Rotary position embedding of the fused forwards: adjacent pairs (2i, 2i+1) rotate together by angle
    pos / 10000^(2i / d_head) over the whole head (TransformerLens's native rotary, and `HookedTransformer`'s
    with `rotary_adjacent_pairs=True`)."""

    def __init__(self, d_head: int, n_ctx: int, base: float = 10000.0):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, d_head, 2).float() / d_head))
        angles = torch.outer(torch.arange(n_ctx).float(), inv_freq)
        self.register_buffer("cos", angles.cos().repeat_interleave(2, dim=-1), persistent=False)
        self.register_buffer("sin", angles.sin().repeat_interleave(2, dim=-1), persistent=False)

    def apply_rope(self, q: Float[Tensor, "*batch pos d_head"],
                   k: Float[Tensor, "*batch pos d_head"]) -> tuple[Tensor, Tensor]:
        """q and k rotated by their position (the second-to-last axis, counted from 0)."""
        seq = q.shape[-2]
        cos, sin = self.cos[:seq].to(q.dtype), self.sin[:seq].to(q.dtype)

        def rotate(x: Tensor) -> Tensor:
            half = torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)
            return x * cos + half * sin

        return rotate(q), rotate(k)


def _native(model: Any) -> nn.Module:
    """The native-layout module holding `model`'s weights: a `native_module` itself, a bridge's
    `original_model`, or for a `HookedTransformer` (another layout) a plain copy of its weights."""
    if _is_native(model):
        return model
    if _tl.is_bridge(model):
        return model.original_model
    return native_module(model.markov_config, _tl.native_state(model), device=model.W_E.device)


@dataclasses.dataclass
class FastParams:
    """References to the model's parameter-holding modules, in the order a forward pass uses them (for a
    `HookedTransformer`, modules holding a copy)."""

    cfg: ModelConfig
    embed: nn.Embedding
    pos: Optional[nn.Embedding]
    rotary: Optional[Rotary]
    blocks: list  # per block: (ln1, q, k, v, o, ln2, fc_in, fc_out, act)
    ln_final: nn.Module
    head: nn.Linear


def fast_params(model: Any) -> FastParams:
    """Collect the modules holding `model`'s parameters for `fast_forward` (cheap; re-run after swaps).

    `model`: a `native_module` or a TransformerBridge (the fused forward then reads and trains its very
    parameters), or a `HookedTransformer` (read from a copy: analysis only)."""
    cfg: ModelConfig = model.markov_config
    native = _native(model)
    raw, act = _tl.raw, ACTIVATIONS[cfg.act_fn]  # raw: the torch module behind a bridge's component
    blocks = []
    for block in native.layers:
        entry = [raw(block.ln1)] + [raw(getattr(block.attn, name)) for name in "qkvo"]
        mlp = None if cfg.attn_only else block.mlp
        entry += [None] * 4 if mlp is None else [raw(block.ln2), raw(mlp.fc_in), raw(mlp.fc_out), act]
        blocks.append(tuple(entry))
    embed = raw(native.tok_embed)
    rotary = Rotary(cfg.d_head, cfg.n_ctx).to(embed.weight.device) if cfg.positional == "rotary" else None
    pos = raw(native.pos) if native.pos is not None else None
    return FastParams(cfg=cfg, embed=embed, pos=pos, rotary=rotary, blocks=blocks, ln_final=raw(native.ln_out),
                      head=raw(native.head))


def fast_forward(
    model: Any,
    tokens: Int[Tensor, "batch pos"],
    interventions: Optional[dict] = None,
) -> Float[Tensor, "batch pos vocab"]:
    """Logits of the hooked model computed without hooks, with fused causal attention.

    Reads the very parameter tensors of `model` (gradients flow into them), so training through this is
    training the hooked model. Equal to `model(tokens)` up to float rounding (tested at 1e-5).

    `interventions` maps hook names (the points of `stacked.stacked_hook_names`, TransformerLens names and
    shapes: q, k, v, z as `[batch, pos, head, d_head]`, `attn.hook_pattern` as `[batch, head, query_pos,
    key_pos]`) to functions returning the activation's replacement (`intervene.clamp_hooks` builds them). A
    layer whose pattern is intervened computes its attention explicitly (scores, causal softmax, hook,
    pattern @ v; no scores when the hook replaces every head by a constant, `pattern_input`); without
    interventions the forward is the fused one below, unchanged.
    """
    p = model if isinstance(model, FastParams) else fast_params(model)
    cfg = p.cfg
    seq = tokens.shape[1]
    if seq > cfg.n_ctx:
        raise ValueError(f"sequence length {seq} exceeds the model's n_ctx={cfg.n_ctx}")
    if interventions:
        return _hooked_fast_forward(p, tokens, interventions)
    x = F.embedding(tokens, p.embed.weight)
    if p.pos is not None:
        x = x + p.pos.weight[:seq]
    for ln1, q, k, v, o, ln2, fc_in, fc_out, act in p.blocks:
        h = ln1(x)  # heads per layer follow from the weights' rows
        qh, kh, vh = (rearrange(proj(h), "batch pos (head d_head) -> batch head pos d_head", d_head=cfg.d_head)
                      for proj in (q, k, v))
        if p.rotary is not None:
            qh, kh = p.rotary.apply_rope(qh, kh)
        z = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True)
        x = x + o(rearrange(z, "batch head pos d_head -> batch pos (head d_head)"))
        if fc_in is not None:
            x = x + fc_out(act(fc_in(ln2(x))))
    return p.head(p.ln_final(x))


def _hooked_fast_forward(p: FastParams, tokens: Int[Tensor, "batch pos"],
                         hooks: dict) -> Float[Tensor, "batch pos vocab"]:
    """`fast_forward` with `{hook name: fn}` applied at the stacked path's named points (same names)."""
    from markov_interp.stacked import check_intervention_points

    cfg = p.cfg
    check_intervention_points(cfg, hooks)

    def hook(name: str, x: Tensor) -> Tensor:
        fn = hooks.get(name)
        return x if fn is None else fn(x)

    seq = tokens.shape[1]
    x = hook("hook_embed", F.embedding(tokens, p.embed.weight))
    if p.pos is not None:
        x = x + hook("hook_pos_embed", p.pos.weight[:seq].expand(tokens.shape[0], -1, -1))
    for i, (ln1, q, k, v, o, ln2, fc_in, fc_out, act) in enumerate(p.blocks):
        b = f"blocks.{i}."
        x = hook(b + "hook_resid_pre", x)
        h = ln1(x)
        heads = [hook(f"{b}attn.hook_{name}", rearrange(proj(h), "batch pos (head d_head) -> batch pos head d_head",
                                                        d_head=cfg.d_head))
                 for name, proj in zip("qkv", (q, k, v))]
        qh, kh, vh = (rearrange(a, "batch pos head d_head -> batch head pos d_head") for a in heads)
        if p.rotary is not None:
            qh, kh = p.rotary.apply_rope(qh, kh)
        if b + "attn.hook_pattern" in hooks:
            pattern = hooks[b + "attn.hook_pattern"](pattern_input(hooks[b + "attn.hook_pattern"], qh, kh))
            z = pattern.to(vh.dtype) @ vh
        else:
            z = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True)
        z = hook(b + "attn.hook_z", rearrange(z, "batch head pos d_head -> batch pos head d_head"))
        x = hook(b + "hook_resid_mid", x + hook(b + "hook_attn_out", o(rearrange(
            z, "batch pos head d_head -> batch pos (head d_head)"))))
        if fc_in is not None:
            pre = hook(b + "mlp.hook_pre", fc_in(ln2(x)))
            x = x + hook(b + "hook_mlp_out", fc_out(hook(b + "mlp.hook_post", act(pre))))
        x = hook(b + "hook_resid_post", x)
    return p.head(p.ln_final(x))


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


# ------------------------------------------------------------------------------------------- tying check
def check_tied(model: Any) -> None:
    """Assert that a tied model's embedding and unembedding are one Parameter (a `native_module`, a bridge) or,
    in a `HookedTransformer` (TL has no tying), equal copies (internal invariant)."""
    cfg: ModelConfig = model.markov_config
    if not _is_native(model) and not _tl.is_bridge(model):
        assert not cfg.tie_weights or torch.equal(model.W_U.T, model.W_E), "tied copies W_U.T and W_E differ"
        return
    native = _native(model)
    embed, head = _tl.raw(native.tok_embed).weight, _tl.raw(native.head).weight
    if cfg.tie_weights:
        assert embed is head, "weight tying broken: embedding and unembedding are different tensors"
    else:
        assert embed is not head, "untied model shares embedding and unembedding"


# ------------------------------------------------------------------------------------------ save / load
def state_dict_for_save(model: Any) -> dict[str, Tensor]:
    """The on-disk state of `model` (`native_state`): contiguous CPU copies in TransformerLens bridge names; a
    tied unembedding is stored once (as `embed.weight`), biases the config lacks are left out."""
    return native_state(model)


def disk_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """The parameters of a `native_module` (or a bridge) by their on-disk names (live references, for
    freezing); a tied unembedding appears once, as `embed.weight`."""
    if _is_native(model):
        return {_tl_name(name): param for name, param in model.named_parameters()}
    if not _tl.is_bridge(model):
        raise ValueError(f"disk_parameters needs a native_module or a TransformerBridge, got {type(model).__name__}")
    names = _tl.disk_shapes(model.markov_config)
    return {name: p for name, p in model.state_dict(keep_vars=True).items() if name in names}


@torch.no_grad()
def load_weights_into(model: Any, state: dict[str, Tensor], *, source: str = "weights") -> None:
    """Copy `state` (as written by `save`) into `model` (a `native_module` or a hooked model of either kind) in
    place, keeping tying. Missing, unexpected or wrongly shaped tensors raise ValueError naming them."""
    _tl.check_state(model.markov_config, state, source=source)
    if not _is_native(model):
        _tl.load_native_state(model, state)
    else:
        targets = disk_parameters(model)
        for name, tensor in state.items():  # non-finite values are loaded as they are (a diverged run is data)
            targets[name].copy_(tensor.to(device=targets[name].device, dtype=targets[name].dtype))
    check_tied(model)


def save(model: Any, path: "str | os.PathLike", cfg: Optional[ModelConfig] = None) -> Path:
    """Write `model`'s weights to `path` (a `.safetensors` file, or a folder that gets `model.safetensors`).

    TransformerLens state-dict names; a tied unembedding is stored once; the `ModelConfig` is embedded as
    JSON in the file's metadata, so `load(path)` needs nothing else. Written atomically. Returns the file.
    """
    from safetensors.torch import save as st_save

    cfg = cfg if cfg is not None else model.markov_config
    if cfg != model.markov_config:
        raise ValueError("cfg does not match the model's markov_config")
    path = Path(path)
    if path.suffix != ".safetensors":
        path.mkdir(parents=True, exist_ok=True)
        path = path / WEIGHTS_FILE
    check_tied(model)
    data = st_save(state_dict_for_save(model), metadata={_CONFIG_KEY: cfg.to_json(), "format": "pt"})
    atomic_write(path, data)
    return path


def _resolve_weights_path(path: "str | os.PathLike") -> Path:
    path = Path(path)
    if path.is_dir():
        path = path / WEIGHTS_FILE
    if not path.exists():
        raise FileNotFoundError(f"no model weights at {path}")
    return path


def read_weights(path: "str | os.PathLike") -> tuple[ModelConfig, dict[str, Tensor]]:
    """The config and raw tensors of a file written by `save`; corrupt files raise ValueError."""
    from safetensors import safe_open

    path = _resolve_weights_path(path)
    try:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            metadata = handle.metadata() or {}
            state = {name: handle.get_tensor(name) for name in handle.keys()}
    except Exception as err:  # safetensors raises its own error types on corrupt headers / truncation
        raise ValueError(f"{path} is not a readable safetensors file ({type(err).__name__}: {err})") from None
    if _CONFIG_KEY not in metadata:
        raise ValueError(f"{path} has no markov-interp model config in its metadata (not written by models.save?)")
    try:
        cfg = ModelConfig.from_dict(json.loads(metadata[_CONFIG_KEY]))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: model config in metadata is not valid JSON ({err})") from None
    except (ValueError, TypeError) as err:
        raise ValueError(f"{path}: invalid model config in metadata: {err}") from None
    return cfg, state


def load(path: "str | os.PathLike", *, device: Any = None, expect: Optional[ModelConfig] = None) -> Any:
    """The hooked model saved at `path` (a run folder, or a `.safetensors` file written by `save`).

    Tying is restored (one shared Parameter in a bridge, an equal copy in a HookedTransformer). A missing file raises FileNotFoundError; a corrupt file, a
    missing / unexpected / wrongly shaped tensor, or a config different from `expect` raise ValueError
    naming the problem. `model.markov_config` holds the config; `model.markov_train_seq_len` the training
    sequence length when the weights sit in a run folder (its config.json), else None: the probes' default
    length (`probes._common.probe_length`).
    """
    cfg, state = read_weights(path)
    if expect is not None and expect != cfg:
        diff = {k: (v, getattr(expect, k)) for k, v in cfg.to_dict().items() if getattr(expect, k) != v}
        raise ValueError(f"{path}: model config differs from the expected one (saved, expected): {diff}")
    _tl.check_state(cfg, state, source=str(path))
    model = hooked_model(cfg, state, device=device)
    model.markov_train_seq_len = runfolder.training_seq_len(_resolve_weights_path(path).parent)
    return model
