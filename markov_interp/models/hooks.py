"""Hook names: the one registry of activation names, TransformerLens's, as its `get_act_name` is.

Every activation the package names -- the hooked model's hook points, the fused forward's intervention points
(`models.stack.stacked_forward`), clamps during training (`clamps`), the probes' caches -- is named here:

    >>> act_name("pattern", 0), act_name("resid_post", 1), act_name("embed")
    ('blocks.0.attn.hook_pattern', 'blocks.1.hook_resid_post', 'hook_embed')
    >>> parse_name("blocks.1.attn.hook_z")
    ('z', 1)

Per-head activations (q, k, v, z as `[batch, pos, head, d_head]`, the pattern as `[batch, head, query_pos,
key_pos]`) have the layer's real head count in the fused forward; a hooked model whose layers differ in head
count has the largest count in every layer (the surplus heads write nothing), see `models.hooked`.

`write` is the one activation writer, as TransformerLens's patch setters are for its patching: it writes a value
into some heads and positions of an activation of a given kind. Training clamps (`clamps`) and the probes'
interventions (`probes.interventions.set_component`) both call it, each in its own vocabulary (a clamp's hook and
heads; a probe's `Component`).
"""

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Optional

import torch
from torch import Tensor

from markov_interp.config import check_int
from markov_interp.models.config import ModelConfig

__all__ = [
    "act_name",
    "parse_name",
    "pattern_hook",
    "z_hook",
    "attn_out_hook",
    "mlp_out_hook",
    "intervention_points",
    "check_points",
    "feature_shape",
    "write",
    "PER_HEAD",
    "KINDS",
]

# kind -> the hook's name inside block i (blocks.{i}.<name>), in forward order
_BLOCK = {
    "resid_pre": "hook_resid_pre", "q": "attn.hook_q", "k": "attn.hook_k", "v": "attn.hook_v",
    "pattern": "attn.hook_pattern", "z": "attn.hook_z", "attn_out": "hook_attn_out", "resid_mid": "hook_resid_mid",
    "pre": "mlp.hook_pre", "post": "mlp.hook_post", "mlp_out": "hook_mlp_out", "resid_post": "hook_resid_post",
}
_GLOBAL = {"embed": "hook_embed", "pos_embed": "hook_pos_embed"}
_MLP = ("pre", "post", "mlp_out")
KINDS = (*_GLOBAL, *_BLOCK)  # every activation kind `act_name` takes, embeddings first then in forward order
_KIND_OF = {**{v: k for k, v in _BLOCK.items()}, **{v: k for k, v in _GLOBAL.items()}}


def act_name(kind: str, layer: Optional[int] = None) -> str:
    """The hook name of activation `kind` ("embed", "pos_embed"; per block "resid_pre", "q", "k", "v",
    "pattern", "z", "attn_out", "resid_mid", "pre", "post", "mlp_out", "resid_post") in block `layer`.

    Args:
        kind: the activation, as above.
        layer: the block (required for per-block kinds, refused for the embeddings).

    Returns:
        The TransformerLens hook name, e.g. "blocks.0.attn.hook_pattern".
    """
    if kind in _GLOBAL:
        if layer is not None:
            raise ValueError(f"{kind!r} is not a per-block activation; give no layer")
        return _GLOBAL[kind]
    if kind not in _BLOCK:
        raise ValueError(f"unknown activation {kind!r}; valid kinds are {sorted({**_GLOBAL, **_BLOCK})}")
    check_int(f"the layer of activation {kind!r}", layer, minimum=0)
    return f"blocks.{layer}.{_BLOCK[kind]}"


def parse_name(name: str) -> tuple[str, Optional[int]]:
    """(kind, layer) of a hook name (`act_name`'s inverse; layer None for the embeddings); ValueError if
    `name` is not one of these hook names."""
    if name in _KIND_OF:
        return _KIND_OF[name], None
    head, _, rest = name.partition(".")
    index, _, inner = rest.partition(".")
    if head == "blocks" and index.isdigit() and inner in _BLOCK.values():
        return _KIND_OF[inner], int(index)
    raise ValueError(f"{name!r} is not a hook name of this package (see models.hooks.act_name)")


def pattern_hook(layer: int) -> str:
    """Attention pattern of a layer, [batch head query_pos key_pos]."""
    return act_name("pattern", layer)


def z_hook(layer: int) -> str:
    """Per-head attention output before W_O (the attended values), [batch pos head d_head]."""
    return act_name("z", layer)


def attn_out_hook(layer: int) -> str:
    """A whole attention layer's contribution to the residual stream, [batch pos d_model]."""
    return act_name("attn_out", layer)


def mlp_out_hook(layer: int) -> str:
    """An MLP's contribution to the residual stream, [batch pos d_model]."""
    return act_name("mlp_out", layer)


def intervention_points(cfg: ModelConfig) -> list[str]:
    """The hook names of a model of `cfg`, in forward order: what the fused forward and clamps may name.

    `attn.hook_pattern` is formed by the fused forward only in a layer whose pattern is hooked (that
    layer then computes its attention explicitly); otherwise fused attention never forms it.
    """
    names = [act_name("embed")] + ([act_name("pos_embed")] if cfg.positional == "standard" else [])
    for layer in range(cfg.n_layers):
        names += [act_name(kind, layer) for kind in _BLOCK if not (cfg.attn_only and kind in _MLP)]
    return names


def check_points(cfg: ModelConfig, names: Iterable[str]) -> None:
    """Refuse hook names that are not intervention points of a model of `cfg` (ValueError listing them)."""
    unknown = sorted(set(names) - set(intervention_points(cfg)))
    if unknown:
        raise ValueError(f"unknown intervention points {unknown}; valid names are {intervention_points(cfg)}")


def feature_shape(cfg: ModelConfig, kind: str, layer: int) -> tuple[int, ...]:
    """The per-position shape of the activation `kind` of block `layer` in the fused forward: (heads, d_head) for
    q / k / v / z (the layer's real head count), (d_mlp,) inside the MLP, (d_model,) on the residual stream. Not
    for the pattern, which has no per-position shape.

    Args:
        cfg: the model's config.
        kind: the activation's kind (`act_name`'s, e.g. `parse_name(name)[0]`).
        layer: its block (None for the embeddings).

    Returns:
        The shape after the batch and position axes.

    >>> feature_shape(ModelConfig(d_model=8, n_heads=2, d_head=4), "z", 0)
    (2, 4)
    """
    feature = _LAYOUTS[kind].feature
    if feature is None:
        raise ValueError(f"{act_name(kind, layer)}: a {kind} is [head, query_pos, key_pos], not a per-position "
                         "activation")
    return feature(cfg, layer)


@dataclasses.dataclass(frozen=True)
class _Layout:
    """How an activation kind lays out its trailing axes: its position axes and head axis, counted from the end
    (leading axes -- batch, a stack's member axis -- are free; a pattern's positions are its query and key
    positions, and `positions` select queries), and its per-position shape (None: the pattern has none)."""

    positions: tuple[int, ...]
    head: Optional[int]
    feature: Optional[Callable[[ModelConfig, Optional[int]], tuple[int, ...]]]


_RESIDUAL = _Layout((2,), None, lambda cfg, layer: (cfg.d_model,))  # [..., pos, d_model]
_LAYOUTS = {
    **dict.fromkeys(_GLOBAL, _RESIDUAL),
    **dict.fromkeys(_BLOCK, _RESIDUAL),
    "pattern": _Layout((2, 1), 3, None),  # [..., head, query_pos, key_pos]
    # [..., pos, head, d_head]
    **dict.fromkeys(("q", "k", "v", "z"), _Layout((3,), 2, lambda cfg, layer: (cfg.heads_per_layer[layer],
                                                                                cfg.d_head))),
    **dict.fromkeys(("pre", "post"), _Layout((2,), None, lambda cfg, layer: (cfg.d_mlp,))),  # [..., pos, d_mlp]
}
PER_HEAD = tuple(kind for kind, layout in _LAYOUTS.items() if layout.head is not None)  # kinds with a head axis


def _selected(size: int, index: Sequence[int], what: str, device: torch.device) -> Tensor:
    chosen = [int(i) for i in index]
    if any(i < -size or i >= size for i in chosen):
        raise ValueError(f"{what} {chosen} out of range: the activation has {size}")
    mask = torch.zeros(size, dtype=torch.bool, device=device)
    mask[chosen] = True
    return mask


def write(activation: Tensor, value: Tensor, kind: str, *, heads: Optional[Sequence[int]] = None,
          positions: Optional[Sequence[int]] = None) -> Tensor:
    """`activation` with `value` written into the selected heads and positions: the package's one activation
    writer (training clamps and probe interventions both call it).

    `activation` is never modified. Where everything is written the result is `value` broadcast to the activation
    (a view: no copy of a clamped pattern per step); otherwise a new tensor (`torch.where`, so gradients reach the
    part that is not written).

    Args:
        activation: an activation of `kind`: [..., pos, feature], [..., pos, head, d_head] (q, k, v, z) or
            [..., head, query_pos, key_pos] (pattern), with any leading axes (batch, a stack's member axis).
        value: what to write, broadcasting against `activation` (a 0-d zero, a per-position mean [pos, *feature],
            a full tensor) on any device (it is moved to the activation's); longer in positions than the activation
            it is cut to them.
        kind: the activation's kind, as `act_name` takes it ("z", "pattern", "resid_pre", ...).
        heads: the heads written (None: all); only for kinds with a head axis (`PER_HEAD`).
        positions: the positions written (a pattern's query positions; None: all).

    Returns:
        The written activation, shaped and typed as `activation`.

    >>> z = torch.zeros(1, 3, 2, 1)  # [batch, pos, head, d_head]
    >>> write(z, torch.ones(()), "z", heads=[1], positions=[0, 2])[0, :, :, 0].tolist()
    [[0.0, 1.0], [0.0, 0.0], [0.0, 1.0]]
    """
    pos_axes, head_axis = _LAYOUTS[kind].positions, _LAYOUTS[kind].head
    if heads is not None and head_axis is None:
        raise ValueError(f"a {kind!r} activation has no head axis; heads={list(heads)} cannot be selected")
    for axis in pos_axes:  # a value longer than the run (a mean over longer sequences, a file) is cut to it
        if value.ndim >= axis and value.shape[-axis] > activation.shape[-axis]:
            value = value.narrow(value.ndim - axis, 0, activation.shape[-axis])
    value = value.to(device=activation.device, dtype=activation.dtype).expand_as(activation)
    if heads is None and positions is None:
        return value
    mask = torch.ones((), dtype=torch.bool, device=activation.device)
    for index, axis, what in ((heads, head_axis, "heads"), (positions, pos_axes[0], "positions")):
        if index is not None:
            chosen = _selected(activation.shape[-axis], index, what, activation.device)
            mask = mask & chosen.view(-1, *([1] * (axis - 1)))
    return torch.where(mask, value, activation)
