"""A trained model's place on the canonical landscape: its weights projected onto (e, w, b).

The only part of `markov_interp.landscape` that reads a model: tensors by their TransformerLens state-dict
names (a `TransformerBridge`'s or a HookedTransformer's), from a state dict or anything with `state_dict()`.
Exact for the canonical init of `models.build`; a best-effort summary for trained models.
"""

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from markov_interp._display import displayed
from markov_interp.landscape.canonical import ArrayLike, Real, Trajectory, canonical_loss

# A model (a TransformerBridge, a HookedTransformer: anything with `state_dict()`) or its state dict.
ModelOrState = nn.Module | Mapping[str, Any]

# TransformerLens names of the tensors read, as (bridge / nn.Linear layout name, HookedTransformer name).
_NAMES = {
    "embed": ("embed.weight", "embed.W_E"),  # [vocab, d_model] in both
    "unembed": ("unembed.weight", "unembed.W_U"),  # [vocab, d_model] / [d_model, vocab]
    "unembed_bias": ("unembed.bias", "unembed.b_U"),
    "mlp_in": ("blocks.0.mlp.in.weight", "blocks.0.mlp.W_in"),  # [d_mlp, d_model] / [d_model, d_mlp]
    "mlp_out": ("blocks.0.mlp.out.weight", "blocks.0.mlp.W_out"),  # [d_model, d_mlp] / [d_mlp, d_model]
}


def _read_tensor(state: Mapping[str, Any], key: str) -> tuple[np.ndarray, bool] | None:
    """The tensor under either name of `key` as float64 numpy in the bridge's layout, or None if absent."""
    bridge_name, hooked_name = _NAMES[key]
    for name, transpose in ((bridge_name, False), (hooked_name, key in ("unembed", "mlp_in", "mlp_out"))):
        if name in state:
            value = state[name]
            arr = value.detach().to("cpu", torch.float64).numpy() if isinstance(value, Tensor) else np.asarray(
                value, dtype=np.float64)
            return (arr.T if transpose else arr), True
    return None


@displayed
@dataclass(frozen=True)
class CanonicalProjection:
    """A model's weights projected onto the canonical (e, w, b) coordinates along the unit direction u.

    e = (W_E[1] - W_E[0]) . u (embedding scale), a = (W_U[1] - W_U[0]) . u (output scale; a = e when tied),
    coupling = u^T W_out W_in u (the MLP's linear coupling along u, 4 w|w| at the canonical init), w the signed
    root of w|w| = coupling / 4, b = b_U[1] - b_U[0]. embedding_alignment = |e| / |W_E[1] - W_E[0]| (1 when the
    embedding difference lies along u).
    """

    e: float
    w: float
    b: float
    a: float
    coupling: float
    tied: bool
    direction: np.ndarray
    embedding_alignment: float


def canonical_projection(model_or_state: ModelOrState, *, direction: ArrayLike | None = None) -> CanonicalProjection:
    """Project a single-layer binary-chain model of the package onto the canonical coordinates (see
    `CanonicalProjection` for the formulas); exact for the canonical init of `models.build`.

    Reads tensors by TransformerLens state-dict names (the bridge's `embed.weight`, `blocks.0.mlp.in.weight`,
    ..., or HookedTransformer's `embed.W_E`, `blocks.0.mlp.W_in`, ...) from a state dict or anything with a
    `state_dict()` method. `direction` is the unit vector u to project on; by default the embedding difference
    W_E[1] - W_E[0], normalised (pass the init's direction to follow a run's checkpoints consistently).

    Why these formulas: without LayerNorm and attention, with a residual stream +-(e/2) u after the embedding,
    the model's logit gap between the two states is e a (1 + coupling / 2) for ReLU and GELU alike
    (phi(x) - phi(-x) = x for both), which is the canonical delta(w) e^2 with coupling = 4 w|w|. For trained
    models with LayerNorm the projection is a best-effort summary, not a reduction.
    """
    state = model_or_state.state_dict() if callable(getattr(model_or_state, "state_dict", None)) else model_or_state
    if not isinstance(state, Mapping):
        raise ValueError(f"expected a model or a state dict, got {type(model_or_state).__name__}")
    if any(str(k).startswith("blocks.1.") for k in state):
        raise ValueError("canonical coordinates are defined for single-layer models; this state has blocks.1.*")
    found = {key: _read_tensor(state, key) for key in _NAMES}
    for key in ("embed", "mlp_in", "mlp_out"):
        if found[key] is None:
            raise ValueError(f"the state has no {_NAMES[key][0]!r} (or {_NAMES[key][1]!r}) tensor")
    w_e = found["embed"][0]
    if w_e.shape[0] != 2:
        raise ValueError(f"canonical coordinates are defined for binary chains (d_vocab=2), got d_vocab={w_e.shape[0]}")
    diff = w_e[1] - w_e[0]
    if direction is None:
        norm = np.linalg.norm(diff)
        if norm == 0:
            raise ValueError("the embedding rows are equal (e = 0): pass the direction to project on")
        u = diff / norm
    else:
        u = np.asarray(direction, dtype=np.float64).ravel()
        if u.shape != diff.shape or not np.linalg.norm(u) > 0:
            raise ValueError(f"direction must be a nonzero vector of length d_model={diff.size}, got shape {u.shape}")
        u = u / np.linalg.norm(u)
    e = float(diff @ u)
    w_in, w_out = found["mlp_in"][0], found["mlp_out"][0]
    coupling = float(u @ w_out @ w_in @ u)
    w = math.copysign(math.sqrt(abs(coupling) / 4.0), coupling)
    tied = found["unembed"] is None or np.array_equal(found["unembed"][0], w_e)
    a = e if tied else float((found["unembed"][0][1] - found["unembed"][0][0]) @ u)
    bias = found["unembed_bias"]
    b = 0.0 if bias is None else float(bias[0][1] - bias[0][0])
    alignment = abs(e) / float(np.linalg.norm(diff)) if np.linalg.norm(diff) > 0 else 0.0
    return CanonicalProjection(e=e, w=w, b=b, a=a, coupling=coupling, tied=tied, direction=u,
                               embedding_alignment=alignment)


def canonical_coordinates(model_or_state: ModelOrState, *,
                          direction: ArrayLike | None = None) -> tuple[float, float, float]:
    """(e, w, b) of a single-layer tied binary-chain model: where it sits on the canonical landscape.

    Exact for the low-rank canonical init of `models.build` (`ModelConfig(init="canonical")` gives back its
    canonical_e, canonical_w, canonical_b); a best-effort projection along the embedding direction for trained
    models (see `canonical_projection`, which also gives the untied output scale a).
    """
    proj = canonical_projection(model_or_state, direction=direction)
    return proj.e, proj.w, proj.b


def coordinates_trajectory(states: Sequence[ModelOrState], *, p: Real, q: Real, direction: ArrayLike | None = None) -> Trajectory:
    """Project a run's checkpoints (state dicts or models, in order) onto (e, w, b) along one direction (the
    first checkpoint's embedding direction unless given), with the canonical loss at each: a `Trajectory` to
    draw with `report.figures.landscape_figure(trajectory=...)` next to `gradient_flow`."""
    if not states:
        raise ValueError("states is empty: pass at least one checkpoint")
    first = canonical_projection(states[0], direction=direction)
    points = np.array([canonical_coordinates(s, direction=first.direction) for s in states])
    loss = np.asarray(canonical_loss(points[:, 0], points[:, 1], points[:, 2], p=p, q=q))
    return Trajectory(names=("e", "w", "b"), points=points, loss=loss)
