"""The canonical (e, w, b) family as a training constraint: gradients projected onto the three scalars.

The canonical init (`models.init`, `ModelConfig(init="canonical")`) puts a one-layer binary-chain model on a
three-parameter family along a unit direction u:

    W_E[0] = 0, W_E[1] = e u, W_pos[n] = -(e/2) u,
    W_in = (2|w| / sqrt(d_mlp)) 1 u^T, W_out = (2w / sqrt(d_mlp)) u 1^T, b_U = (0, b), W_V = 0,

on which, without normalisation and with a relu MLP, the logit gap is the reduced model of `landscape`
(f1 = (1/2 + 2 w|w|) e^2 + b, f0 = b - e^2/2). Free training leaves the family (positions, embedding row 0,
attention and the bias's row 0 all get gradients), so the reduction is exact only at initialisation.

`reduction="canonical"` keeps training on it. For a fixed sign of w the family is linear in (e, w, b):
theta = e D_e + w D_w + b D_b with D_e = (W_E[1] = u, W_pos[n] = -u/2), D_w = (W_in = s c 1 u^T, W_out =
c u 1^T) (c = 2 / sqrt(d_mlp), s = sign w) and D_b = (b_U[1] = 1). Replacing the weight gradient G by
sum_i <G, D_i> D_i is the chain rule of theta(e, w, b): a plain SGD step (with or without momentum, weight
decay or clipping, all linear in the gradient) is then a step on (e, w, b) with g_i = <G, D_i> =
dL/d(e, w, b), exactly, and every other weight keeps its init. Gradient flow keeps the sign of w (dw/dt is
proportional to |w|), and so does a small step. Adam is refused: its per-coordinate scale moves W_E[1] and
W_pos by equal amounts, which leaves the family (Adam on (e, w, b) itself is `landscape.adam_descent`).

`release` frees one part at a time (the experiment `reduction` asks which one moves the separatrix):
"positions" (W_pos gets its whole gradient; e is then W_E[1] alone), "embedding_row0" (W_E[0]),
"attention" (every attention weight), "mlp" (W_in, W_out whole) and "output_bias" (b_U whole). The direction u
is member k's init direction, recomputed from `initial_state(cfg_k, seed_k)` (so a resumed run projects on the
same u, bit for bit).
"""

import math
from collections.abc import Iterable, Sequence

import einops
import torch
from jaxtyping import Float
from torch import Tensor

from markov_interp.models.config import ModelConfig
from markov_interp.models.init import initial_state

__all__ = ["REDUCTIONS", "RELEASABLE", "exact_model_options", "check_reduction", "CanonicalConstraint"]

REDUCTIONS = ("canonical",)
RELEASABLE = ("positions", "embedding_row0", "attention", "mlp", "output_bias")

_EMBED, _POS, _BIAS = "embed.weight", "pos_embed.weight", "unembed.bias"
_IN, _OUT = "blocks.0.mlp.in.weight", "blocks.0.mlp.out.weight"


def exact_model_options(*, n_ctx: int, e0: float) -> dict:
    """The model options (a `ModelConfig` preset and its changes; add `canonical_w`) on which the reduction is
    exact: the paper's one-layer shape without normalisation, a relu MLP, the canonical init from (e0, w, b0 = 0)
    with a zero value matrix. What `check_reduction` asks of a model, as a sweep's "model" section.

    Args:
        n_ctx: the longest sequence.
        e0: the canonical init's embedding scale.

    Returns:
        {"preset": "paper-1layer", ...}.
    """
    return {"preset": "paper-1layer", "n_ctx": n_ctx, "normalization": None, "act_fn": "relu", "init": "canonical",
            "canonical_e": e0, "canonical_b": 0.0, "canonical_v_std": 0.0}


def check_reduction(reduction: object, release: Sequence[str], model: ModelConfig, *, optimizer: str) -> None:
    """Refuse a reduction the model or optimiser cannot keep exact, with a ValueError naming the problem.

    Args:
        reduction: None (no constraint) or "canonical".
        release: parts set free (`RELEASABLE`); only with a reduction.
        model: the run's model config.
        optimizer: the run's optimiser ("sgd" or "adamw").
    """
    bad = [r for r in release if r not in RELEASABLE]
    if bad:
        raise ValueError(f"release: unknown part(s) {bad}; choose from {list(RELEASABLE)}")
    if len(set(release)) != len(release):
        raise ValueError(f"release names a part twice: {list(release)}")
    if reduction is None:
        if release:
            raise ValueError("release frees parts of a reduction: set reduction='canonical' too")
        return
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be None or one of {list(REDUCTIONS)}, got {reduction!r}")
    needs = {
        "init='canonical'": model.init == "canonical",
        "d_vocab=2": model.d_vocab == 2,
        "n_layers=1": model.n_layers == 1,
        "normalization=None (LayerNorm normalises e away)": model.normalization is None,
        "act_fn='relu'": model.act_fn == "relu",
        "canonical_v_std=0 (a zero value matrix)": model.canonical_v_std == 0,
        "canonical_e > 0 (u is read from W_E[1])": model.canonical_e > 0,
        "tie_weights=True": model.tie_weights,
        "unembed_bias=True (b is b_U[1])": model.unembed_bias,
        "an MLP (attn_only=False)": not model.attn_only,
        "no MLP bias": not model.mlp_bias,
    }
    missing = [k for k, ok in needs.items() if not ok]
    if missing:
        raise ValueError(f"reduction='canonical' keeps a model on the canonical (e, w, b) family; it needs "
                         f"{', '.join(missing)}")
    if optimizer != "sgd":
        raise ValueError("reduction='canonical' needs optimizer='sgd': Adam's per-coordinate scale moves W_E[1] "
                         "and W_pos alike and leaves the family (Adam on (e, w, b): landscape.adam_descent)")


class CanonicalConstraint:
    """The projection of a stack's gradients onto the canonical family (see the module docstring).

    Args:
        configs: member k's model config (they share the architecture).
        seeds: member k's init seed (its direction u is that init's).
        release: the parts set free.
        device: where the stack lives.
    """

    def __init__(self, configs: Sequence[ModelConfig], seeds: Sequence[int], release: Iterable[str], *,
                 device: torch.device):
        self.release = frozenset(release)
        rows = [initial_state(cfg, seed)[_EMBED][1] for cfg, seed in zip(configs, seeds)]
        self.u: Float[Tensor, "member d_model"] = torch.stack([r / r.norm() for r in rows]).to(device)
        self.c = 2.0 / math.sqrt(configs[0].d_mlp)

    def fixed_names(self, names: Iterable[str]) -> set[str]:
        """The weights that stay at their init: all but the family's and the released parts'."""
        family = {_EMBED, _POS, _IN, _OUT, _BIAS}
        free = {n for n in names if ".attn." in n} if "attention" in self.release else set()
        return {n for n in names if n not in family and n not in free}

    @torch.no_grad()
    def project_(self, params: dict[str, Tensor]) -> None:
        """Replace the family's gradients (in place) by their projection; released parts keep theirs."""
        u = self.u
        embed = params[_EMBED].grad  # [member, 2, d]
        g_e = einops.einsum(embed[:, 1], u, "m d, m d -> m")
        if "positions" not in self.release:
            pos = params[_POS].grad  # [member, n_ctx, d]
            g_e = g_e - 0.5 * einops.einsum(pos, u, "m n d, m d -> m")
            pos.copy_(einops.repeat(-0.5 * g_e[:, None] * u, "m d -> m n d", n=pos.shape[1]))
        embed[:, 1] = g_e[:, None] * u
        if "embedding_row0" not in self.release:
            embed[:, 0] = 0
        if "mlp" not in self.release:
            self._project_mlp(params[_IN], params[_OUT])
        if "output_bias" not in self.release:
            params[_BIAS].grad[:, 0] = 0

    def _project_mlp(self, w_in: Tensor, w_out: Tensor) -> None:
        """g_w = <G_in, s c 1 u^T> + <G_out, c u 1^T>; then G_in = g_w s c 1 u^T, G_out = g_w c u 1^T."""
        u, c = self.u, self.c
        sign = torch.sign(einops.einsum(w_out.detach(), u, "m d h, m d -> m"))  # s = sign w (0 at w = 0)
        g_in = einops.einsum(w_in.grad, u, "m h d, m d -> m")
        g_out = einops.einsum(w_out.grad, u, "m d h, m d -> m")
        g_w = c * (sign * g_in + g_out)
        w_in.grad.copy_(einops.repeat((g_w * sign * c)[:, None] * u, "m d -> m h d", h=w_in.shape[1]))
        w_out.grad.copy_(einops.repeat((g_w * c)[:, None] * u, "m d -> m d h", h=w_out.shape[2]))
