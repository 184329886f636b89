"""The one initialiser: `initial_state(cfg, seed)`, a model's first weights as a state dict in the on-disk layout.

The on-disk layout (`state_shapes`) is what `models.save` writes and every other part reads: TransformerLens
state-dict names (`embed.weight`, `pos_embed.weight`, `blocks.{i}.ln1.weight`, `blocks.{i}.attn.q.weight`, ...,
`blocks.{i}.mlp.in.weight`, `ln_final.weight`, `unembed.weight`, `unembed.bias`), `nn.Linear` weight layout
`[out, in]`, each layer with its real head count (`blocks.{i}.attn.q.weight` is `[heads_i * d_head, d_model]`),
and a tied unembedding stored once, as `embed.weight`. The stacked training engine (`models.stack`) and the
hooked model (`models.hooked.hooked_model`) both start from this dict, so every entry point starts from the
same weights; nothing here imports transformer_lens.
"""

import functools
import itertools
import math

import torch
from jaxtyping import Float
from torch import Tensor

from markov_interp.config import check_int
from markov_interp.models.config import POSITION_FREQUENCIES, ModelConfig

__all__ = ["state_shapes", "initial_state", "position_frequencies"]

# the head-start position code's norm, in standard position rows (init_std sqrt(d_model)): at 2, AdamW at lr 1e-2
# scrambles it within 10 steps (previous-token score 0.99 -> 0.63-0.76 on the 3-state task); at 8 it stays >= 0.87
# through 200 steps (3 seeds, batch 64). In the factorial's cells (d_head 8, seeds 0-2, fp32 CPU) it held on
# Dirichlet kernels (0.79-0.91 at step 200 with one layer-1 head, 0.74-0.78 with two) but not on zero-diagonal
# kernels (0.37-0.49 by step 20, 0.28-0.46 at step 200): there training undoes the head start.
HEAD_START_RADIUS = 8.0


def state_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the weights of a model of `cfg`, in the model's parameter order.

    Args:
        cfg: the model config.

    Returns:
        {state-dict name: shape}; what `initial_state` returns, `models.save` writes and freeze globs match.
    """
    d, v = cfg.d_model, cfg.d_vocab
    ln = ("weight", "bias") if cfg.layernorm_bias else ("weight",)
    norm = {f"{p}": (d,) for p in ln} if cfg.normalization == "LN" else {}
    shapes: dict[str, tuple[int, ...]] = {"embed.weight": (v, d)}
    if cfg.positional == "standard":
        shapes["pos_embed.weight"] = (cfg.n_ctx, d)
    for i, heads in enumerate(cfg.heads_per_layer):
        b, h = f"blocks.{i}.", heads * cfg.d_head
        shapes.update({f"{b}ln1.{p}": s for p, s in norm.items()})
        for name, out_in in (("q", (h, d)), ("k", (h, d)), ("v", (h, d)), ("o", (d, h))):
            shapes[f"{b}attn.{name}.weight"] = out_in
            if cfg.attn_bias:
                shapes[f"{b}attn.{name}.bias"] = (out_in[0],)
        if not cfg.attn_only:
            shapes.update({f"{b}ln2.{p}": s for p, s in norm.items()})
            for name, out_in in (("in", (cfg.d_mlp, d)), ("out", (d, cfg.d_mlp))):
                shapes[f"{b}mlp.{name}.weight"] = out_in
                if cfg.mlp_bias:
                    shapes[f"{b}mlp.{name}.bias"] = (out_in[0],)
    shapes.update({f"ln_final.{p}": s for p, s in norm.items()})
    if not cfg.tie_weights:
        shapes["unembed.weight"] = (v, d)
    if cfg.unembed_bias:
        shapes["unembed.bias"] = (v,)
    return shapes


@torch.no_grad()
def initial_state(cfg: ModelConfig, seed: int) -> dict[str, Float[Tensor, "..."]]:
    """The initial weights of a model of `cfg`: CPU float32 tensors in the on-disk layout (`state_shapes`).

    Draws come from one `torch.Generator` seeded with `seed`, in a fixed order (embedding, positions, then per
    block Q, K, V, O and MLP in / out, then an untied head), so the same (cfg, seed) gives the same weights on
    any device and the global RNG is neither read nor advanced. "standard": those N(0, init_std), the output
    projections (O, MLP out) N(0, init_std / sqrt(2 n_layers)), biases 0, LayerNorm scales 1; "plain": the same
    draws with the output projections at init_std too.

    Canonical init (`cfg.init == "canonical"`, binary chains; after the standard init of everything else):
    draw alpha in {-1, +1}^d_model uniformly and let u = alpha / sqrt(d_model) (unit norm). Then W_E[0] = 0,
    W_E[1] = e u; every position row W_pos[n] = -(e/2) u, so the residual stream starts at (x - 1/2) e u for
    state x; in every block W_V = u v^T with v ~ N(0, canonical_v_std^2) (zero when canonical_v_std = 0, so
    attention adds nothing), W_Q, W_K, W_O standard; MLP in-weights (2|w| / sqrt(d_mlp)) 1 u^T and out-weights
    (2w / sqrt(d_mlp)) u 1^T; output bias b_U = (0, b); an untied unembedding starts at W_U[0] = 0,
    W_U[1] = a u with a = canonical_a (default a = e). With normalization=None, act_fn="relu",
    canonical_v_std=0 and e > 0, the logit of state 1 minus that of state 0 is exactly the reduced model of the
    notes, f_1 = (1/2 + 2 w|w|) e^2 + b after state 1 and f_0 = b - e^2/2 after state 0 (times a/e untied).

    Two cautions, measured with `markov_interp.landscape`: (1) the reduction does NOT hold with LayerNorm,
    which normalises the scale e away, so use normalization=None to study the landscape; (2) untied with a = e,
    gradient flow keeps a = e (it conserves e^2 - a^2), so pass canonical_a != e to leave that symmetric start.

    Attention head start (`cfg.init_attention`, after the standard init; learned positions). The positions
    carry a code in a 2K-dimensional subspace S (K = `POSITION_FREQUENCIES`; an orthonormal basis B drawn from
    the generator, orthogonal to the all-ones vector, so LayerNorm's centring leaves it alone): W_pos[n] =
    (r / sqrt(K)) B c(n) with c(n) = (cos theta_k n, sin theta_k n)_k and r = 8 init_std sqrt(d_model) (eight
    standard rows' norm, `HEAD_START_RADIUS`, so that the first optimiser steps do not scramble it). The
    frequencies theta_k = 2 pi m_k / (n_ctx + 1) are the K integers m_k that maximise the margin
    K - max_{m != 0} sum_k cos(theta_k m) over the lags m = i - 1 - j a causal query sees. The token embeddings
    are projected off S. "previous_token" then sets the first 2K rows of layer 0's head-0 W_K to g B^T and of W_Q
    to g Rot(-theta) B^T, so the score of query i on key j is proportional to
    sum_k cos(theta_k (i - 1 - j)): largest at j = i - 1, by at least a logit gap log(9 n_ctx) (g is set from
    the margin and the expected normalised size of the code). Every other weight keeps its standard draw, and
    nothing is clamped: training changes Q and K freely. "position_code" is the same init with the standard
    Q / K (the control for what the positions and embeddings alone do).

    Args:
        cfg: the model config.
        seed: the generator's seed (an integer).

    Returns:
        {name: tensor} in `state_shapes(cfg)`'s order.
    """
    check_int("seed", seed)
    if not isinstance(cfg, ModelConfig):
        raise ValueError(f"cfg must be a ModelConfig, got {type(cfg).__name__}")
    shapes = state_shapes(cfg)
    state = _blank_state(shapes)
    gen = torch.Generator().manual_seed(seed)
    for name, std in _standard_draws(cfg):
        state[name] = torch.randn(shapes[name], generator=gen) * std
    if cfg.init == "canonical":
        _canonical(state, cfg, gen)
    if cfg.init_attention is not None:
        _attention_head_start(state, cfg, gen)
    return state


def _blank_state(shapes: dict[str, tuple[int, ...]]) -> dict[str, Float[Tensor, "..."]]:
    """Zeros of `shapes`, with the LayerNorm scales at 1: what the draws start from."""
    state = {name: torch.zeros(shape) for name, shape in shapes.items()}
    for name in state:
        if name.endswith(("ln1.weight", "ln2.weight")) or name == "ln_final.weight":
            state[name].fill_(1.0)
    return state


def _standard_draws(cfg: ModelConfig) -> list[tuple[str, float]]:
    """(name, std) of the normally drawn weights, in draw order."""
    std = cfg.init_std
    out_std = std if cfg.init == "plain" else std / math.sqrt(2 * cfg.n_layers)
    draws = [("embed.weight", std)] + ([("pos_embed.weight", std)] if cfg.positional == "standard" else [])
    for i in range(cfg.n_layers):
        b = f"blocks.{i}."
        draws += [(f"{b}attn.{n}.weight", std) for n in "qkv"] + [(f"{b}attn.o.weight", out_std)]
        if not cfg.attn_only:
            draws += [(f"{b}mlp.in.weight", std), (f"{b}mlp.out.weight", out_std)]
    return draws + ([] if cfg.tie_weights else [("unembed.weight", std)])


def _canonical(state: dict[str, Tensor], cfg: ModelConfig, gen: torch.Generator) -> None:
    """Overwrite `state` with the canonical init along a random direction u (see `initial_state`)."""
    alpha = torch.randint(0, 2, (cfg.d_model,), generator=gen).float() * 2 - 1
    u = alpha / math.sqrt(cfg.d_model)
    e, w, b = cfg.canonical_e, cfg.canonical_w, cfg.canonical_b
    state["embed.weight"].zero_()
    state["embed.weight"][1] = e * u
    state["pos_embed.weight"].copy_((-e / 2) * u.expand_as(state["pos_embed.weight"]))
    v = torch.randn(cfg.d_model, generator=gen) * cfg.canonical_v_std
    ones = torch.ones(cfg.d_mlp)
    scale = 2.0 / math.sqrt(cfg.d_mlp)
    for i in range(cfg.n_layers):
        value = state[f"blocks.{i}.attn.v.weight"]
        if value.shape == (cfg.d_model, cfg.d_model):
            value.copy_(torch.outer(u, v))  # zero when canonical_v_std == 0
        else:  # v_std == 0 here (ModelConfig refuses v_std > 0 unless heads * d_head == d_model)
            value.zero_()
        if not cfg.attn_only:
            state[f"blocks.{i}.mlp.in.weight"].copy_(torch.outer(ones, u) * (scale * abs(w)))
            state[f"blocks.{i}.mlp.out.weight"].copy_(torch.outer(u, ones) * (scale * w))
    if not cfg.tie_weights:
        a = e if cfg.canonical_a is None else cfg.canonical_a
        state["unembed.weight"].zero_()
        state["unembed.weight"][1] = a * u
    if "unembed.bias" in state:
        state["unembed.bias"].zero_()
        state["unembed.bias"][1] = b


@functools.lru_cache(maxsize=16)
def position_frequencies(n_ctx: int, k: int = POSITION_FREQUENCIES) -> tuple[tuple[float, ...], float]:
    """The K angular frequencies of the head-start position code and their margin.

    theta = 2 pi m / (n_ctx + 1) for the K integers m in 1..min(24, n_ctx // 2) that maximise
    margin = K - max over lags l in [-1, n_ctx - 1], l != 0, of sum_k cos(theta_k l): how much more a query's
    code rotated back one step matches key i - 1 than any other key it can see.

    Args:
        n_ctx: the longest sequence.
        k: the number of frequencies.

    Returns:
        (the frequencies, the margin).
    """
    lags = torch.tensor([m for m in range(-1, n_ctx) if m != 0], dtype=torch.float64)
    best = (-math.inf, ())
    for combo in itertools.combinations(range(1, max(k, min(24, n_ctx // 2)) + 1), k):
        theta = 2 * math.pi * torch.tensor(combo, dtype=torch.float64) / (n_ctx + 1)
        margin = k - float(torch.cos(torch.outer(lags, theta)).sum(1).max())
        best = max(best, (margin, combo))
    theta = tuple(2 * math.pi * m / (n_ctx + 1) for m in best[1])
    return theta, best[0]


def _attention_head_start(state: dict[str, Tensor], cfg: ModelConfig, gen: torch.Generator) -> None:
    """Overwrite positions, embeddings and (for "previous_token") layer 0's head-0 Q / K with the head start of
    `initial_state`'s docstring."""
    d, k = cfg.d_model, POSITION_FREQUENCIES
    theta, margin = position_frequencies(cfg.n_ctx, k)
    ones = torch.ones(d, 1) / math.sqrt(d)
    raw = torch.randn(d, 2 * k, generator=gen)
    basis, _ = torch.linalg.qr(raw - ones @ (ones.T @ raw))  # [d, 2K], orthonormal, orthogonal to 1
    angles = torch.arange(cfg.n_ctx, dtype=torch.float64)[:, None] * torch.tensor(theta, dtype=torch.float64)
    code = torch.stack([angles.cos(), angles.sin()], dim=-1).flatten(1).float()  # [n_ctx, 2K]: (cos, sin) pairs
    radius = HEAD_START_RADIUS * cfg.init_std * math.sqrt(d)
    state["pos_embed.weight"] = (radius / math.sqrt(k)) * code @ basis.T
    state["embed.weight"] = state["embed.weight"] - state["embed.weight"] @ basis @ basis.T
    if cfg.init_attention != "previous_token":
        return
    # the code's norm after the first LayerNorm (centring leaves it, the scale divides by the input's std)
    rest = (d - 1 - 2 * k) * cfg.init_std**2  # expected squared norm of a centred embedding off S
    size = radius if cfg.normalization is None else radius * math.sqrt(d / (radius**2 + rest))
    gain = math.sqrt(math.log(9 * cfg.n_ctx) * math.sqrt(cfg.d_head) * k / (size**2 * margin))
    c, s = torch.tensor(theta).cos().float(), torch.tensor(theta).sin().float()
    back = torch.zeros(2 * k, 2 * k)  # rotates each (cos, sin) pair by -theta_k: c(i) -> c(i - 1)
    for i in range(k):
        back[2 * i: 2 * i + 2, 2 * i: 2 * i + 2] = torch.tensor([[c[i], s[i]], [-s[i], c[i]]])
    state["blocks.0.attn.k.weight"][: 2 * k] = gain * basis.T
    state["blocks.0.attn.q.weight"][: 2 * k] = gain * back @ basis.T
