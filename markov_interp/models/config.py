"""Model configs: `ModelConfig` (architecture and initialisation, heads per layer) and the named presets.

The single-layer model of Makkuva et al. ("Attention with Markov", arXiv 2402.04161) is
`preset("paper-1layer")`: pre-LayerNorm block, one head, d_model 8, MLP 8 -> 32 -> 8 with GELU, learned
absolute positions, LayerNorm without bias, attention and MLP linear layers without bias, an output layer with
bias, and weight tying (the unembedding matrix is the token embedding matrix).

Heads per layer: `n_heads` is one count for every block or one count per block (`(1, 2)`: layer 0 with one
head, layer 1 with two; a JSON list reads back as that tuple, equal counts as the single int). `d_head` is the
same in every block; by default it is d_model // (the largest count).
"""

import dataclasses
from typing import Any, ClassVar, Optional

from markov_interp.config import Config, check_bool, check_choice, check_int, check_keys, check_number, shown

__all__ = ["ModelConfig", "PRESETS", "preset", "INIT_FIELDS", "shape_config"]

_NORMALIZATIONS = ("LN", "LNPre", None)
_POSITIONAL = ("standard", "rotary")
_INITS = ("standard", "plain", "canonical")
_ACTIVATIONS = ("gelu", "gelu_new", "relu")
# ModelConfig fields that only change the initial weights: the members of one stack may differ in them.
INIT_FIELDS = ("init", "init_std", "canonical_e", "canonical_w", "canonical_b", "canonical_v_std", "canonical_a",
               "init_attention")
_ATTENTION_INITS = ("previous_token", "position_code")
POSITION_FREQUENCIES = 3  # frequencies of init_attention's position code (2 dimensions each)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig(Config):
    """Architecture and initialisation of a decoder-only transformer on V-state Markov data.

    Defaults are the paper's single-layer model (the base of every preset). `d_head` defaults to
    d_model // max(heads per layer) and `d_mlp` to 4 * d_model; both are resolved to integers at construction
    (use `cfg.replace(...)`, which re-derives them when d_model / n_heads change, rather than
    `dataclasses.replace`).

    Initialisations (`init`, see `models.init.initial_state`):
      - "standard": every weight N(0, init_std) (embeddings, positions, Q, K, V, MLP in, untied head), the
        output projections (attention O and MLP out) N(0, init_std / sqrt(2 n_layers)), biases 0,
        LayerNorm scales 1 -- the reference code's GPT-2 init.
      - "plain": every weight N(0, init_std), the output projections too (no 1 / sqrt(2 n_layers)): the
        init of plain PyTorch replications (a recipe factor of the clamp experiment).
      - "canonical": the low-rank init of the follow-up paper ("Local to Global", arXiv 2406.03072) along
        one random direction. Its negative-product variant (MLP in-weights +c, out-weights -c) is
        `canonical_w < 0`; w < -1/sqrt(2) starts the reduced model in the global basin.

    `init_attention` (on top of the standard init, learned positions): "previous_token" starts layer 0's first
    head as a previous-token head (the positions carry a code that its Q/K read so that query i attends to
    i - 1; a head start that training then changes freely), "position_code" the same positions and embeddings
    with standard Q/K (its control). See `models.init.initial_state`.
    """

    # Fields added after configs were first written: left out of the JSON at these values (same files, cell ids).
    _LATER_FIELDS: ClassVar[dict] = {"init_attention": None}

    n_layers: int = 1  # number of transformer blocks
    n_heads: int | tuple | list = 1  # attention heads: one count for every block, or one per block (layer 0 first)
    d_model: int = 8  # residual stream width
    d_head: Optional[int] = None  # per-head width, the same in every block; None -> d_model // max(heads)
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
    init: str = "standard"  # "standard", "plain" or "canonical" (see class docstring)
    init_std: float | int = 0.02  # std of the standard init (and of the random parts of the canonical one)
    canonical_e: float | int = 0.1  # canonical init: embedding scale e
    canonical_w: float | int = 0.1  # canonical init: signed MLP scale w
    canonical_b: float | int = 0.0  # canonical init: output bias b (logit of state 1 minus logit of state 0)
    canonical_v_std: float | int = 0.0  # canonical init: std of v in the rank-one value matrix u v^T (0: no attn)
    canonical_a: float | int | None = None  # canonical init, untied: output scale a (W_U row 1 = a u); None -> a = e
    init_attention: Optional[str] = None  # "previous_token": layer 0 starts as a previous-token head; "position_code"

    def __post_init__(self) -> None:
        for name in ("n_layers", "d_model", "d_vocab", "n_ctx"):
            check_int(name, getattr(self, name), minimum=2 if name == "d_vocab" else 1)
        object.__setattr__(self, "n_heads", _head_counts(self.n_heads, self.n_layers))
        if self.d_head is None:
            if self.d_model % self.max_heads:
                raise ValueError(
                    f"d_model={self.d_model} is not divisible by n_heads={self.max_heads}"
                    f"{' (the largest count of ' + str(self.n_heads) + ')' if isinstance(self.n_heads, tuple) else ''}"
                    "; give d_head explicitly"
                )
            object.__setattr__(self, "d_head", self.d_model // self.max_heads)
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
                f"layernorm_bias=True needs normalization='LN' (got normalization={shown(self.normalization)}, "
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
        if self.init_attention is not None:
            self._check_attention_init()

    def _check_attention_init(self) -> None:
        check_choice("init_attention", self.init_attention, _ATTENTION_INITS)
        if self.init != "standard" or self.positional != "standard":
            raise ValueError(f"init_attention={shown(self.init_attention)} needs init='standard' and learned positions "
                             f"(positional='standard'), got init={shown(self.init)}, positional={shown(self.positional)}")
        code = 2 * POSITION_FREQUENCIES
        if self.d_head < code or self.d_model < code + 1 + self.d_vocab:
            raise ValueError(f"init_attention={shown(self.init_attention)} needs d_head >= {code} and d_model >= "
                             f"{code + 1 + self.d_vocab} (a {code}-dimensional position code beside the states), got "
                             f"d_head={self.d_head}, d_model={self.d_model}")

    def _check_canonical(self) -> None:
        if self.d_vocab != 2:
            raise ValueError(f"init='canonical' is defined for binary chains (d_vocab=2), got d_vocab={self.d_vocab}")
        if self.positional != "standard":
            raise ValueError("init='canonical' needs learned positions (positional='standard')")
        bad = [h for h in self.heads_per_layer if h * self.d_head != self.d_model]
        if self.canonical_v_std > 0 and bad:
            raise ValueError(
                f"init='canonical' with canonical_v_std > 0 needs n_heads * d_head == d_model in every layer, got "
                f"{bad[0]} * {self.d_head} != {self.d_model}"
            )

    def replace(self, **changes: Any) -> "ModelConfig":
        """A copy with `changes` (`dataclasses.replace`); d_head / d_mlp are re-derived when they held their
        defaults and a size they derive from changes (unless given explicitly). Unknown field names raise
        ValueError."""
        check_keys(ModelConfig, changes, what="fields")
        derived = {}
        if "d_head" not in changes and self.d_head_is_default:
            derived["d_head"] = None
        if "d_mlp" not in changes and self.d_mlp == 4 * self.d_model:
            derived["d_mlp"] = None
        return dataclasses.replace(self, **derived, **changes)

    @property
    def d_head_is_default(self) -> bool:
        """Whether d_head is what it defaults to (d_model // the largest head count)."""
        return self.d_head * self.max_heads == self.d_model

    @property
    def heads_per_layer(self) -> tuple[int, ...]:
        """Attention heads in each block, layer 0 first."""
        if isinstance(self.n_heads, tuple):
            return self.n_heads
        return (self.n_heads,) * self.n_layers

    @property
    def max_heads(self) -> int:
        """The largest head count of any block (what a hooked model has in every block)."""
        return max(self.heads_per_layer)

    @property
    def n_params(self) -> int:
        """Number of trainable parameters (tied weights counted once)."""
        d, v = self.d_model, self.d_vocab
        n = v * d + (self.n_ctx * d if self.positional == "standard" else 0)
        ln = {"LN": d * (2 if self.layernorm_bias else 1), "LNPre": 0, None: 0}[self.normalization]
        for heads in self.heads_per_layer:
            h = heads * self.d_head
            n += ln + 4 * d * h + ((3 * h + d) if self.attn_bias else 0)
            if not self.attn_only:
                n += ln + 2 * d * self.d_mlp + ((self.d_mlp + d) if self.mlp_bias else 0)
        n += ln
        n += 0 if self.tie_weights else v * d
        n += v if self.unembed_bias else 0
        return n


def _head_counts(value: Any, n_layers: int) -> int | tuple[int, ...]:
    """`n_heads` as an int, or a tuple of one count per layer (a list from JSON reads as a tuple; equal counts
    become the int)."""
    if not isinstance(value, (list, tuple)):
        check_int("n_heads", value, minimum=1)
        return value
    counts = tuple(value)
    if len(counts) != n_layers:
        raise ValueError(f"n_heads={list(counts)} gives {len(counts)} head counts but n_layers={n_layers}; give one "
                         "count per layer or a single int")
    for count in counts:
        check_int("n_heads (each layer's count)", count, minimum=1)
    return counts[0] if len(set(counts)) == 1 else counts


def shape_config(cfg: ModelConfig) -> ModelConfig:
    """`cfg` with its initialisation options reset to the defaults: what decides a stack's shapes."""
    default = ModelConfig()
    return cfg.replace(**{name: getattr(default, name) for name in INIT_FIELDS})


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
    >>> preset("paper-2layer", n_heads=[1, 2]).heads_per_layer, preset("paper-2layer", n_heads=[1, 2]).d_head
    ((1, 2), 4)
    """
    if name not in PRESETS:
        raise ValueError(f"unknown preset {shown(name)}; valid presets are {sorted(PRESETS)}")
    return ModelConfig().replace(**{**PRESETS[name], **overrides})
