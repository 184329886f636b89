"""Models: the paper's transformers as hooked TransformerLens models, plus a fast training forward.

A `ModelConfig` (frozen, JSON round-trip) describes a GPT-2-style decoder: the single-layer model of Makkuva
et al. ("Attention with Markov", arXiv 2402.04161) is `preset("paper-1layer")`: pre-LayerNorm block, one
head, d_model 8, MLP 8 -> 32 -> 8 with GELU, learned absolute positions, LayerNorm without bias, attention and
MLP linear layers without bias, an output layer with bias, and **weight tying** (the unembedding matrix is the
token embedding matrix).

`build(cfg, seed=...)` returns a `transformer_lens` `TransformerBridge` around TransformerLens's native model
(`TransformerBridge.boot_native`'s architecture), so every TransformerLens tool works on it:
`run_with_cache`, `cache["pattern", 0]`, `run_with_hooks` with `blocks.0.attn.hook_pattern`, ... The native
model has biases everywhere and an untied, bias-free head, so `build` swaps those modules for the paper's
before wrapping (LayerNorm without bias is `nn.LayerNorm(bias=False)`, which TransformerLens's
NormalizationBridge supports: it adds a bias only when the module has one). Tying is one shared
`nn.Parameter` (`model.embed.W_E` and `model.unembed.W_U.T` are the same storage); it survives training,
`.to(device)` and `save`/`load` (safetensors refuses shared tensors, so `save` writes one copy and `load`
re-ties). Move models with `model.to(device, print_details=False)` to keep TransformerLens quiet.

Training does not pay for hooks: `fast_forward(model, tokens)` computes the same logits from the same
parameter tensors (no copy) with `torch.nn.functional.scaled_dot_product_attention(is_causal=True)`.

The hooked model carries its config as `model.markov_config` (a `ModelConfig`).
"""

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange
from jaxtyping import Float, Int
from torch import Tensor

from markov_interp import runfolder
from markov_interp._io import atomic_write
from markov_interp.config import Config, check_bool, check_choice, check_int, check_keys, check_number

if TYPE_CHECKING:
    from transformer_lens.config import TransformerBridgeConfig
    from transformer_lens.model_bridge import TransformerBridge
    from transformer_lens.model_bridge.sources.native import NativeModel
else:
    # transformer_lens takes seconds to import (datasets, transformers); it is imported where a hooked model is
    # built, so a process that builds none (stacked training, `markov-interp train`) never pays for it.
    TransformerBridge = TransformerBridgeConfig = NativeModel = Any

__all__ = [
    "ModelConfig",
    "PRESETS",
    "preset",
    "build",
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
def _tl_config(cfg: ModelConfig, seed: Optional[int]) -> TransformerBridgeConfig:
    from transformer_lens.config import TransformerBridgeConfig

    return TransformerBridgeConfig(
        d_model=cfg.d_model,
        d_head=cfg.d_head,
        n_layers=cfg.n_layers,
        n_ctx=cfg.n_ctx,
        n_heads=cfg.n_heads,
        d_mlp=cfg.d_mlp,
        d_vocab=cfg.d_vocab,
        act_fn=cfg.act_fn,
        eps=cfg.eps,
        normalization_type=cfg.normalization,
        positional_embedding_type=cfg.positional,
        attn_only=cfg.attn_only,
        seed=seed,
        initializer_range=cfg.init_std,
        tie_word_embeddings=cfg.tie_weights,
        default_prepend_bos=False,
        tokenizer_prepends_bos=False,
        model_name="markov-interp",
    )


def _norm(cfg: ModelConfig) -> nn.Module:
    if cfg.normalization == "LN":
        return nn.LayerNorm(cfg.d_model, eps=cfg.eps, bias=cfg.layernorm_bias)
    if cfg.normalization is None:
        return nn.Identity()
    from transformer_lens.model_bridge.sources.native.model import NativeLayerNormPre

    return NativeLayerNormPre(eps=cfg.eps)


def _native_model(cfg: ModelConfig, tl_cfg: TransformerBridgeConfig) -> NativeModel:
    """TransformerLens's native model with the paper's bias / norm / head choices swapped in."""
    from transformer_lens.model_bridge.sources.native import NativeModel

    native = NativeModel(tl_cfg)
    h = cfg.n_heads * cfg.d_head
    for block in native.layers:
        block.ln1 = _norm(cfg)
        block.attn.q = nn.Linear(cfg.d_model, h, bias=cfg.attn_bias)
        block.attn.k = nn.Linear(cfg.d_model, h, bias=cfg.attn_bias)
        block.attn.v = nn.Linear(cfg.d_model, h, bias=cfg.attn_bias)
        block.attn.o = nn.Linear(h, cfg.d_model, bias=cfg.attn_bias)
        if not cfg.attn_only:
            block.ln2 = _norm(cfg)
            block.mlp.fc_in = nn.Linear(cfg.d_model, cfg.d_mlp, bias=cfg.mlp_bias)
            block.mlp.fc_out = nn.Linear(cfg.d_mlp, cfg.d_model, bias=cfg.mlp_bias)
    native.ln_out = _norm(cfg)
    native.head = nn.Linear(cfg.d_model, cfg.d_vocab, bias=cfg.unembed_bias)
    if cfg.tie_weights:
        native.head.weight = native.tok_embed.weight
    return native


@torch.no_grad()
def _initialise(native: NativeModel, cfg: ModelConfig, seed: int) -> None:
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
        if isinstance(module, nn.LayerNorm):
            module.weight.fill_(1.0)
            if module.bias is not None:
                module.bias.zero_()
    if cfg.init == "canonical":
        _canonical_init(native, cfg, gen)


@torch.no_grad()
def _canonical_init(native: NativeModel, cfg: ModelConfig, gen: torch.Generator) -> None:
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


def build(cfg: ModelConfig, *, seed: int, device: Any = None) -> TransformerBridge:
    """A freshly initialised hooked model for `cfg` (a TransformerLens `TransformerBridge`).

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
    from transformer_lens.model_bridge.sources._bridge_builder import build_bridge_from_module

    tl_cfg = _tl_config(cfg, seed)
    with torch.random.fork_rng(devices=[]):  # nn.Linear's constructor draws from the global RNG
        native = _native_model(cfg, tl_cfg)
    _initialise(native, cfg, seed)
    model = build_bridge_from_module(
        native, architecture="TransformerLensNative", tl_config=tl_cfg, model_name="markov-interp"
    )
    object.__setattr__(model, "markov_config", cfg)
    if device is not None:
        model.to(torch.device(device), print_details=False)
    check_tied(model)
    return model


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
def _raw(module: nn.Module) -> nn.Module:
    """The native module behind a bridge component."""
    inner = getattr(module, "original_component", None)
    return inner if isinstance(inner, nn.Module) else module


@dataclasses.dataclass
class FastParams:
    """References (not copies) to the hooked model's parameters, in the order a forward pass uses them."""

    cfg: ModelConfig
    embed: nn.Embedding
    pos: Optional[nn.Embedding]
    rotary: Optional[nn.Module]
    blocks: list  # per block: (ln1, q, k, v, o, ln2, fc_in, fc_out, act)
    ln_final: nn.Module
    head: nn.Linear


def fast_params(model: TransformerBridge) -> FastParams:
    """Collect the modules holding `model`'s parameters for `fast_forward` (cheap; re-run after swaps)."""
    cfg: ModelConfig = model.markov_config
    native = model.original_model
    blocks = []
    for block in model.blocks:
        attn = block.attn
        entry = [_raw(block.ln1), _raw(attn.q), _raw(attn.k), _raw(attn.v), _raw(attn.o)]
        if cfg.attn_only:
            entry += [None, None, None, None]
        else:
            mlp = _raw(block.mlp)
            entry += [_raw(block.ln2), _raw(getattr(block.mlp, "in")), _raw(block.mlp.out), mlp.act]
        blocks.append(tuple(entry))
    return FastParams(
        cfg=cfg,
        embed=_raw(model.embed),
        pos=_raw(model.pos_embed) if cfg.positional == "standard" else None,
        rotary=native.rotary if cfg.positional == "rotary" else None,
        blocks=blocks,
        ln_final=_raw(model.ln_final),
        head=_raw(model.unembed),
    )


def fast_forward(
    model: "TransformerBridge | FastParams",
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
    n_heads, d_head = cfg.n_heads, cfg.d_head
    for ln1, q, k, v, o, ln2, fc_in, fc_out, act in p.blocks:
        h = ln1(x)
        qh, kh, vh = (rearrange(proj(h), "batch pos (head d_head) -> batch head pos d_head", head=n_heads,
                                d_head=d_head) for proj in (q, k, v))
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
                                                        head=cfg.n_heads))
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
def check_tied(model: TransformerBridge) -> None:
    """Assert that a tied model's embedding and unembedding are one Parameter (internal invariant)."""
    cfg: ModelConfig = model.markov_config
    embed, head = _raw(model.embed).weight, _raw(model.unembed).weight
    if cfg.tie_weights:
        assert embed is head, "weight tying broken: embedding and unembedding are different tensors"
    else:
        assert embed is not head, "untied model shares embedding and unembedding"


# ------------------------------------------------------------------------------------------ save / load
def state_dict_for_save(model: TransformerBridge) -> dict[str, Tensor]:
    """TransformerLens-named weights, contiguous CPU copies; a tied unembedding is stored once (as
    `embed.weight`) and the synthetic zero head bias of a bias-free head is left out."""
    cfg: ModelConfig = model.markov_config
    state = {}
    for name, tensor in model.state_dict().items():
        if cfg.tie_weights and name == "unembed.weight":
            continue
        if name == "unembed.bias" and not cfg.unembed_bias:
            continue
        state[name] = tensor.detach().to("cpu").contiguous().clone()
    return state


def _expected_shapes(model: TransformerBridge) -> dict[str, tuple]:
    return {name: tuple(t.shape) for name, t in state_dict_for_save(model).items()}


@torch.no_grad()
def load_weights_into(model: TransformerBridge, state: dict[str, Tensor], *, source: str = "weights") -> None:
    """Copy `state` (as written by `save`) into `model` in place, keeping tying. Missing, unexpected or
    wrongly shaped tensors raise ValueError naming them."""
    expected = _expected_shapes(model)
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ValueError(f"{source}: missing tensors {missing}, unexpected tensors {unexpected}")
    bad = {k: (tuple(state[k].shape), expected[k]) for k in expected if tuple(state[k].shape) != expected[k]}
    if bad:
        detail = ", ".join(f"{k} has shape {got}, expected {want}" for k, (got, want) in sorted(bad.items()))
        raise ValueError(f"{source}: wrong shapes: {detail}")
    targets = model.state_dict(keep_vars=True)
    for name, tensor in state.items():  # non-finite values are loaded as they are (a diverged run is data)
        targets[name].copy_(tensor.to(device=targets[name].device, dtype=targets[name].dtype))
    check_tied(model)


def save(model: TransformerBridge, path: "str | os.PathLike", cfg: Optional[ModelConfig] = None) -> Path:
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


def load(path: "str | os.PathLike", *, device: Any = None, expect: Optional[ModelConfig] = None) -> TransformerBridge:
    """The hooked model saved at `path` (a run folder, or a `.safetensors` file written by `save`).

    Tying is restored (one shared Parameter). A missing file raises FileNotFoundError; a corrupt file, a
    missing / unexpected / wrongly shaped tensor, or a config different from `expect` raise ValueError
    naming the problem. `model.markov_config` holds the config; `model.markov_train_seq_len` the training
    sequence length when the weights sit in a run folder (its config.json), else None: the probes' default
    length (`probes._common.probe_length`).
    """
    cfg, state = read_weights(path)
    if expect is not None and expect != cfg:
        diff = {k: (v, getattr(expect, k)) for k, v in cfg.to_dict().items() if getattr(expect, k) != v}
        raise ValueError(f"{path}: model config differs from the expected one (saved, expected): {diff}")
    model = build(cfg, seed=0)
    load_weights_into(model, state, source=str(path))
    if device is not None:
        model.to(torch.device(device), print_details=False)
    model.eval()
    model.markov_train_seq_len = runfolder.training_seq_len(_resolve_weights_path(path).parent)
    return model
