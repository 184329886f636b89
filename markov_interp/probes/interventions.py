"""The one intervention engine of the probes: a component type, one setter, one loop.

Ablation (replace a component's output by zero, its mean, or its value on another sequence) and activation
patching (replace it by its value on a clean run) are the same operation with different replacement values:
run the model with some components' outputs overwritten and read the next-state laws. Here:

- `Component`: a head (one slice of `blocks.L.attn.hook_z`, its output before W_O), a whole attention layer
  (`blocks.L.hook_attn_out`), an MLP (`blocks.L.hook_mlp_out`), the token embedding (`hook_embed`), one input
  of a head after its projection (its queries, keys or values: a slice of `blocks.L.attn.hook_q/k/v`) or the
  residual stream a block reads (`blocks.L.hook_resid_pre`), with its TransformerLens hook name;
- `set_component`: the setter, which writes a replacement into a component's slice of an activation
  (optionally at some positions only);
- `intervened_run`: the loop body, one forward pass with some components replaced together, which can also
  record what other hooks computed in that pass (path patching reads a receiver's input that way);
  `intervened_probs` runs it once per group of components and returns the next-state laws of every run.

`ablation`, `patching` and `paths` (path patching of edges) only choose the replacement values.
"""

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Optional

import torch
from jaxtyping import Float
from torch import Tensor

from markov_interp.config import bounds, check_fields
from markov_interp.models import HookedModel, forward_from, heads_per_layer
from markov_interp.models.hooks import act_name, parse_name, write
from markov_interp.probes._common import (
    Probs,
    Tokens,
    check_tokens,
    has_mlp,
)
from markov_interp.probes._display import ProbeResult, dataframe

__all__ = ["intervened_probs", "intervened_run", "set_component", "Component", "model_components"]

_NAME = re.compile(r"^(?:(embed|pos)|L(\d+)(?:H(\d+)(?:\.([qkv]))?|\.(attn|mlp|resid)))$")
Kind = Literal["head", "attn", "mlp", "embed", "pos", "q", "k", "v", "resid"]
KINDS = ("head", "attn", "mlp", "embed", "pos", "q", "k", "v", "resid")
HEAD_KINDS = ("head", "q", "k", "v")  # kinds that are one head's slice (axis 2) of their hook


@dataclasses.dataclass(frozen=True, kw_only=True)
class Component:
    """One part of the model an intervention overwrites.

    Writers to the residual stream: a head "L{layer}H{head}" (its output before W_O), a whole attention layer
    "L{layer}.attn", an MLP "L{layer}.mlp", the token embedding "embed" and the position embedding "pos" (what
    `hook_pos_embed` adds; path patching corrupts it in its positional pass). Readers: a head's queries, keys or values "L{layer}H{head}.q" / ".k" / ".v"
    (after the projection, so one head's input alone), and the residual stream a block reads "L{layer}.resid".
    `Component.parse` reads those names back.

    >>> Component.parse("L1H0")
    Component(kind='head', layer=1, head=0)
    >>> Component(kind="mlp", layer=0).hook_name
    'blocks.0.hook_mlp_out'
    >>> Component.parse("L1H0.k").hook_name, Component.parse("embed").name
    ('blocks.1.attn.hook_k', 'embed')
    """

    kind: Kind
    layer: int = bounds(minimum=0, default=0)
    head: Optional[int] = bounds(minimum=0, default=None)

    def __post_init__(self) -> None:
        check_fields(self, prefix="component ")  # kind one of KINDS, layer and head integers >= 0
        if self.kind in ("embed", "pos") and self.layer != 0:
            raise ValueError(f"the {self.kind} embedding has no layer, got layer={self.layer!r}")
        if (self.kind in HEAD_KINDS) != (self.head is not None):
            needs = "needs" if self.kind in HEAD_KINDS else "takes no"
            raise ValueError(f"a {self.kind!r} component {needs} head index")

    @property
    def name(self) -> str:
        if self.kind in ("embed", "pos"):
            return self.kind
        if self.kind == "head":
            return f"L{self.layer}H{self.head}"
        if self.kind in HEAD_KINDS:
            return f"L{self.layer}H{self.head}.{self.kind}"
        return f"L{self.layer}.{self.kind}"

    def __str__(self) -> str:
        return self.name

    @property
    def hook_name(self) -> str:
        """The TransformerLens hook whose value an intervention on this component overwrites
        (`models.hooks.act_name`)."""
        if self.kind in ("embed", "pos"):
            return act_name("embed" if self.kind == "embed" else "pos_embed")
        kind = {"head": "z", "attn": "attn_out", "mlp": "mlp_out", "resid": "resid_pre"}.get(self.kind, self.kind)
        return act_name(kind, self.layer)

    @classmethod
    def parse(cls, name: "str | Component") -> "Component":
        """The component named "L0H1", "L1.attn", "L0.mlp", "embed", "pos", "L1H0.k" or "L1.resid" (a `Component`
        is returned as is)."""
        if isinstance(name, Component):
            return name
        match = _NAME.match(name) if isinstance(name, str) else None
        if match is None:
            raise ValueError(f"component name must look like 'L0H1', 'L1.attn', 'L0.mlp', 'embed', 'pos', 'L1H0.q' "
                             f"or 'L1.resid', got {name!r}")
        embed, layer, head, channel, block = match.groups()
        if embed:
            return cls(kind=embed)
        if head is not None:
            return cls(kind=channel or "head", layer=int(layer), head=int(head))
        return cls(kind=block, layer=int(layer))

    def check(self, model: HookedModel) -> None:
        """Raise ValueError if the model has no such component (heads counted per layer:
        `models.heads_per_layer`)."""
        if self.kind == "embed":
            return
        if self.kind == "pos":
            if self.hook_name not in model.hook_dict:
                raise ValueError("pos: the model has no position-embedding hook (hook_pos_embed)")
            return
        if self.layer >= model.cfg.n_layers:
            raise ValueError(f"{self.name}: the model has only {model.cfg.n_layers} layers")
        if self.kind in HEAD_KINDS and self.head >= heads_per_layer(model)[self.layer]:
            raise ValueError(f"{self.name}: layer {self.layer} has only {heads_per_layer(model)[self.layer]} heads")
        if self.kind == "mlp" and not has_mlp(model, self.layer):
            raise ValueError(f"{self.name}: layer {self.layer} has no MLP (attention-only model)")


class ComponentValues(ProbeResult):
    """One value per component (an ablation table's loss changes, a patching run's recoveries): lookup by
    `Component` or name, the [layer, head] grid and a table. A subclass holds `components`, `n_layers`,
    `n_heads` and says which of its fields are the values (`_values`)."""

    components: tuple[Component, ...]
    n_layers: int
    n_heads: int

    def _values(self) -> tuple[float, ...]:
        raise NotImplementedError

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.components)

    def __getitem__(self, component: "Component | str") -> float:
        """The value of `component` (a `Component` or its name, e.g. "L0H1")."""
        comp = Component.parse(component)
        if comp not in self.components:
            raise KeyError(f"no component {comp.name!r}; have {list(self.names)}")
        return self._values()[self.components.index(comp)]

    def _rows(self, **columns: Sequence[float]) -> Any:
        """A DataFrame, one row per component (index its name): kind, layer, head (empty for layers), `columns`."""
        frame = dataframe(({"component": c.name, "kind": c.kind, "layer": c.layer, "head": c.head,
                            **{name: values[i] for name, values in columns.items()}}
                           for i, c in enumerate(self.components)), index="component")
        return frame.astype({"head": "Int64"}) if len(frame) else frame

    def _largest(self, n: int = 3, fmt: str = "+.4f") -> str:
        """The `n` components with the largest values, as "L1H0 +0.0700, ..." (NaN values left out)."""
        pairs = [(v, c.name) for c, v in zip(self.components, self._values()) if v == v]
        pairs.sort(key=lambda pair: -pair[0])
        return ", ".join(f"{name} {value:{fmt}}" for value, name in pairs[:n]) or "none"

    def head_grid(self) -> Float[Tensor, "layer head"]:
        """The value of every head as a [layer, head] grid (NaN for heads not in the table)."""
        grid = torch.full((self.n_layers, self.n_heads), float("nan"))
        for comp, value in zip(self.components, self._values()):
            if comp.kind == "head":
                grid[comp.layer, comp.head] = value
        return grid


def model_components(model: HookedModel, *, kinds: Sequence[str] = ("head", "attn", "mlp")) -> tuple[Component, ...]:
    """Every head, attention layer and MLP of the model (restricted to `kinds`), layer by layer (the heads each
    layer really has: `models.heads_per_layer`)."""
    out = []
    heads = heads_per_layer(model)
    for layer in range(model.cfg.n_layers):
        if "head" in kinds:
            out += [Component(kind="head", layer=layer, head=h) for h in range(heads[layer])]
        if "attn" in kinds:
            out.append(Component(kind="attn", layer=layer))
        if "mlp" in kinds and has_mlp(model, layer):
            out.append(Component(kind="mlp", layer=layer))
    return tuple(out)


def as_components(model: HookedModel, components: Sequence[Any]) -> list[Component]:
    """`components` (Components or their names) as checked `Component`s of `model`."""
    out = [Component.parse(c) for c in components]
    for c in out:
        c.check(model)
    return out


# ----------------------------------------------------------------------------------------------- setter
def set_component(
    activation: Tensor, component: Component, replacement: Tensor, *, positions: Optional[Sequence[int]] = None
) -> Tensor:
    """A copy of `activation` (the value of `component.hook_name`) with the component's part replaced: the
    probes' vocabulary over the package's one activation writer, `models.hooks.write`.

    `replacement` broadcasts against `activation` (a 0-d tensor, a per-position mean [pos, ...] or a full
    [batch, pos, ...] tensor; longer in pos than the run is fine); for a head only its slice (axis 2 of
    hook_z, or of hook_q / hook_k / hook_v for a head's input) is written; `positions` restricts the write to
    those sequence positions.
    """
    if replacement.ndim == activation.ndim and replacement.shape[0] != activation.shape[0]:
        raise ValueError(
            f"replacement for {component.name} has {replacement.shape[0]} sequences, the run has {activation.shape[0]}"
        )
    heads = [component.head] if component.kind in HEAD_KINDS else None
    out = write(activation, replacement, parse_name(component.hook_name)[0], heads=heads, positions=positions)
    # written whole, `write` gives the replacement broadcast (a view of it): a copy, as the probes' callers expect
    return out.clone() if heads is None and positions is None else out


def replacement_hooks(
    components: Sequence[Component], replacements: Mapping[str, Tensor], *,
    positions: Optional[Sequence[int]] = None, record: Optional[dict[str, Tensor]] = None,
) -> list[tuple[str, Callable]]:
    """Forward hooks (for `run_with_hooks`) writing `replacements[hook name]` into each component together.

    With `record` (a dict), each hook first stores the value the model computed there under its hook name.
    """
    missing = sorted({c.hook_name for c in components} - set(replacements))
    if missing:
        raise ValueError(f"no replacement values for hooks {missing}")
    by_hook: dict[str, list[Component]] = {}
    for c in components:
        by_hook.setdefault(c.hook_name, []).append(c)

    def make(name: str, comps: list[Component]) -> Callable:
        def hook(activation: Tensor, hook: Any = None) -> Tensor:
            if record is not None:
                record[name] = activation
            for c in comps:
                activation = set_component(activation, c, replacements[name], positions=positions)
            return activation

        return hook

    return [(name, make(name, comps)) for name, comps in by_hook.items()]


class _Recorded(Exception):
    """Raised by a recording hook once every hook a pass was asked to record has fired (the rest is not needed)."""


def _recorder(name: str, record: dict[str, Tensor], stop_when: Optional[set] = None) -> Callable:
    def hook(activation: Tensor, hook: Any = None) -> Tensor:
        record[name] = activation
        if stop_when is not None and stop_when <= record.keys():
            raise _Recorded
        return activation

    return hook


def _stopping(fn: Callable, store: dict[str, Tensor], wanted: set) -> Callable:
    def hook(activation: Tensor, hook: Any = None) -> Tensor:
        out = fn(activation, hook)
        if wanted <= store.keys():
            raise _Recorded
        return out

    return hook


# ------------------------------------------------------------------------------------------------- loop
def intervened_run(
    model: HookedModel,
    tokens: Tokens,
    components: Sequence[Component],
    replacements: Mapping[str, Tensor],
    *,
    positions: Optional[Sequence[int]] = None,
    record: Sequence[str] = (),
    stop: bool = False,
    edits: Sequence[tuple[str, Callable]] = (),
    start: Optional[tuple[int, Tensor]] = None,
) -> tuple[Optional[Float[Tensor, "batch pos vocab"]], dict[str, Tensor]]:
    """One forward pass of `tokens` with `components` replaced together: (logits, {hook name: value}).

    `record` names hooks whose value this pass computed is returned (for a replaced hook, the value before the
    replacement): path patching reads a receiver's input in a pass whose senders are set this way. With `stop`,
    the pass ends as soon as every recorded hook has fired (nothing later is computed) and the logits are None.
    `edits` are further (hook name, function) pairs that edit an activation in place of a replacement (path
    patching moves the residual stream by one sender's change for one copy of the batch: `paths`); they fire
    after any replacement of the same hook. `start` = (layer, the residual stream entering that block, [batch, pos,
    d_model]) starts the pass there (`models.forward_from`): the blocks before it are not run and their
    hooks do not fire, so it is only for passes that change nothing before that layer (path patching's single
    edges start at their receiver's layer, from the clean run's stream).
    """
    store: dict[str, Tensor] = {}
    hooks = replacement_hooks(components, replacements, positions=positions, record=store)
    hooked = {name for name, _ in hooks}
    wanted = set(record) if stop and record else None
    if wanted:  # a replacement hook records before it replaces; the last wanted hook to fire stops the pass
        hooks = [(name, _stopping(fn, store, wanted)) if name in wanted else (name, fn) for name, fn in hooks]
    hooks += [(name, _recorder(name, store, wanted)) for name in dict.fromkeys(record) if name not in hooked]
    hooks += list(edits)
    tokens = check_tokens(model, tokens)
    try:
        if start is not None:
            logits = forward_from(model, start[1], start[0], tokens=tokens, fwd_hooks=hooks)
        else:
            logits = model.run_with_hooks(tokens, fwd_hooks=hooks) if hooks else model(tokens)
    except _Recorded:
        logits = None
    return logits, {name: store[name] for name in record}


@torch.no_grad()
def intervened_probs(
    model: HookedModel,
    tokens: Tokens,
    groups: Sequence[Sequence[Component]],
    replacements: Mapping[str, Tensor],
    *,
    positions: Optional[Sequence[int]] = None,
) -> list[Probs]:
    """Next-state laws of `tokens` with each group of components replaced together, one run per group.

    The engine behind every ablation (replacements: zeros, means, other sequences' activations) and every
    patch (replacements: a clean run's activations).
    """
    return [
        torch.softmax(intervened_run(model, tokens, group, replacements, positions=positions)[0].double(), dim=-1)
        for group in groups
    ]
