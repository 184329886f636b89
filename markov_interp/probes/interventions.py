"""The one intervention engine of the probes: a component type, one setter, one loop.

Ablation (replace a component's output by zero, its mean, or its value on another sequence) and activation
patching (replace it by its value on a clean run) are the same operation with different replacement values:
run the model with some components' outputs overwritten and read the next-state laws. Here:

- `Component`: a head (one slice of `blocks.L.attn.hook_z`, its output before W_O), a whole attention layer
  (`blocks.L.hook_attn_out`) or an MLP (`blocks.L.hook_mlp_out`), with its TransformerLens hook name;
- `set_component`: the setter, which writes a replacement into a component's slice of an activation
  (optionally at some positions only);
- `intervened_probs`: the loop, which runs the model once per group of components with each group's
  replacements set together and returns the next-state laws of every run.

`ablation` and `patching` only choose the replacement values.
"""

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Optional

import torch
from jaxtyping import Float
from torch import Tensor

from markov_interp.probes._common import (
    Model,
    Probs,
    Tokens,
    attn_out_hook,
    has_mlp,
    mlp_out_hook,
    next_state_probs,
    z_hook,
)
from markov_interp.probes._display import ProbeResult, dataframe

_NAME = re.compile(r"^L(\d+)(?:H(\d+)|\.(attn|mlp))$")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Component:
    """One part of the model that writes to the residual stream: a head, a whole attention layer or an MLP.

    Named "L{layer}H{head}", "L{layer}.attn" or "L{layer}.mlp" (`Component.parse` reads those names back).

    >>> Component.parse("L1H0")
    Component(kind='head', layer=1, head=0)
    >>> Component(kind="mlp", layer=0).hook_name
    'blocks.0.hook_mlp_out'
    """

    kind: Literal["head", "attn", "mlp"]
    layer: int
    head: Optional[int] = None

    def __post_init__(self) -> None:
        if self.kind not in ("head", "attn", "mlp"):
            raise ValueError(f"component kind must be 'head', 'attn' or 'mlp', got {self.kind!r}")
        if isinstance(self.layer, bool) or not isinstance(self.layer, int) or self.layer < 0:
            raise ValueError(f"component layer must be an integer >= 0, got {self.layer!r}")
        if (self.kind == "head") != (self.head is not None):
            raise ValueError(f"a {self.kind!r} component {'needs' if self.kind == 'head' else 'takes no'} head index")
        if self.head is not None and (isinstance(self.head, bool) or not isinstance(self.head, int) or self.head < 0):
            raise ValueError(f"component head must be an integer >= 0, got {self.head!r}")

    @property
    def name(self) -> str:
        return f"L{self.layer}H{self.head}" if self.kind == "head" else f"L{self.layer}.{self.kind}"

    def __str__(self) -> str:
        return self.name

    @property
    def hook_name(self) -> str:
        """The TransformerLens hook whose value an intervention on this component overwrites."""
        if self.kind == "head":
            return z_hook(self.layer)
        return attn_out_hook(self.layer) if self.kind == "attn" else mlp_out_hook(self.layer)

    @classmethod
    def parse(cls, name: "str | Component") -> "Component":
        """The component named "L0H1", "L1.attn" or "L0.mlp" (a `Component` is returned as is)."""
        if isinstance(name, Component):
            return name
        match = _NAME.match(name) if isinstance(name, str) else None
        if match is None:
            raise ValueError(f"component name must look like 'L0H1', 'L1.attn' or 'L0.mlp', got {name!r}")
        layer = int(match.group(1))
        if match.group(2) is not None:
            return cls(kind="head", layer=layer, head=int(match.group(2)))
        return cls(kind=match.group(3), layer=layer)

    def check(self, model: Model) -> None:
        """Raise ValueError if the model has no such component."""
        if self.layer >= model.cfg.n_layers:
            raise ValueError(f"{self.name}: the model has only {model.cfg.n_layers} layers")
        if self.kind == "head" and self.head >= model.cfg.n_heads:
            raise ValueError(f"{self.name}: the model has only {model.cfg.n_heads} heads per layer")
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


def model_components(model: Model, *, kinds: Sequence[str] = ("head", "attn", "mlp")) -> tuple[Component, ...]:
    """Every head, attention layer and MLP of the model (restricted to `kinds`), layer by layer."""
    out = []
    for layer in range(model.cfg.n_layers):
        if "head" in kinds:
            out += [Component(kind="head", layer=layer, head=h) for h in range(model.cfg.n_heads)]
        if "attn" in kinds:
            out.append(Component(kind="attn", layer=layer))
        if "mlp" in kinds and has_mlp(model, layer):
            out.append(Component(kind="mlp", layer=layer))
    return tuple(out)


def as_components(model: Model, components: Sequence[Any]) -> list[Component]:
    """`components` (Components or their names) as checked `Component`s of `model`."""
    out = [Component.parse(c) for c in components]
    for c in out:
        c.check(model)
    return out


# ----------------------------------------------------------------------------------------------- setter
def set_component(
    activation: Tensor, component: Component, replacement: Tensor, *, positions: Optional[Sequence[int]] = None
) -> Tensor:
    """A copy of `activation` (the value of `component.hook_name`) with the component's part replaced.

    `replacement` broadcasts against `activation` (a 0-d tensor, a per-position mean [pos, ...] or a full
    [batch, pos, ...] tensor; longer in pos than the run is fine); for a head only its slice (axis 2 of
    hook_z) is written; `positions` restricts the write to those sequence positions.
    """
    if replacement.ndim == activation.ndim and replacement.shape[0] != activation.shape[0]:
        raise ValueError(
            f"replacement for {component.name} has {replacement.shape[0]} sequences, the run has {activation.shape[0]}"
        )
    out = activation.clone()
    seq = activation.shape[1]
    new = replacement
    if new.ndim:  # a 0-d replacement (zero ablation) broadcasts as it is
        new = new[..., :seq, :, :] if component.kind == "head" else new[..., :seq, :]
    new = new.to(activation.dtype).expand_as(activation)
    pos = slice(None) if positions is None else list(positions)
    if component.kind == "head":
        out[:, pos, component.head] = new[:, pos, component.head]
    else:
        out[:, pos] = new[:, pos]
    return out


def replacement_hooks(
    components: Sequence[Component], replacements: Mapping[str, Tensor], *,
    positions: Optional[Sequence[int]] = None,
) -> list[tuple[str, Callable]]:
    """Forward hooks (for `run_with_hooks`) writing `replacements[hook name]` into each component together."""
    missing = sorted({c.hook_name for c in components} - set(replacements))
    if missing:
        raise ValueError(f"no replacement values for hooks {missing}")
    by_hook: dict[str, list[Component]] = {}
    for c in components:
        by_hook.setdefault(c.hook_name, []).append(c)

    def make(name: str, comps: list[Component]) -> Callable:
        def hook(activation: Tensor, hook: Any = None) -> Tensor:
            for c in comps:
                activation = set_component(activation, c, replacements[name], positions=positions)
            return activation

        return hook

    return [(name, make(name, comps)) for name, comps in by_hook.items()]


# ------------------------------------------------------------------------------------------------- loop
def intervened_probs(
    model: Model,
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
        next_state_probs(model, tokens, fwd_hooks=replacement_hooks(group, replacements, positions=positions))
        for group in groups
    ]
