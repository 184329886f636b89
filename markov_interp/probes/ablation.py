"""Ablations: remove one head, attention layer or MLP and measure how much worse the next-state loss gets.

Three ways to remove a component's output (Olsson et al.; Wang et al.):
- "zero": replace it by 0;
- "mean": replace it by its mean over a reference batch at the same position (keeps what any context
  would give, removes what this context gives);
- "resample": replace it by its value on another sequence (a derangement of the batch by default).

A head is one slice of `blocks.L.attn.hook_z` (its output before W_O); an attention layer is
`blocks.L.hook_attn_out`; an MLP is `blocks.L.hook_mlp_out`. If ablating the previous-token head or the
induction head of a two-layer model wipes out its in-context gain, the circuit is what carries it.
"""

import dataclasses
import re
from collections.abc import Callable, Sequence
from typing import Any, Literal, Optional

import torch
from jaxtyping import Float
from torch import Tensor

from markov_interp.probes._common import (
    Model,
    Probs,
    Tokens,
    attn_out_hook,
    check_tokens,
    has_mlp,
    json_safe,
    mlp_out_hook,
    next_state_probs,
    target_losses,
    z_hook,
)

Method = Literal["zero", "mean", "resample"]
METHODS = ("zero", "mean", "resample")
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

    @property
    def hook_name(self) -> str:
        """The TransformerLens hook whose value this component's ablation replaces."""
        if self.kind == "head":
            return z_hook(self.layer)
        return attn_out_hook(self.layer) if self.kind == "attn" else mlp_out_hook(self.layer)

    @classmethod
    def parse(cls, name: str) -> "Component":
        """The component named "L0H1", "L1.attn" or "L0.mlp"."""
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


def _as_components(model: Model, components: Sequence[Any]) -> list[Component]:
    out = [c if isinstance(c, Component) else Component.parse(c) for c in components]
    for c in out:
        c.check(model)
    return out


def derangement(batch: int, *, seed: int) -> torch.Tensor:
    """A random permutation of 0..batch-1 with no fixed point (which sequence each one is resampled from)."""
    if batch < 2:
        raise ValueError(f"resample ablation needs at least 2 sequences, got {batch}")
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(batch, generator=gen)
    shifted = torch.empty_like(perm)
    shifted[perm] = perm.roll(1)  # one cycle through perm: nobody maps to itself
    return shifted


def _replacement_hook(component: Component, method: str, reference: Optional[Tensor]) -> Callable:
    def hook(activation: Tensor, hook: Any = None) -> Tensor:
        out = activation.clone()
        seq = activation.shape[1]
        if method == "zero":
            new = torch.zeros_like(activation)
        elif method == "mean":
            new = reference[:seq].to(activation.dtype).expand_as(activation)
        else:
            if reference.shape[0] != activation.shape[0]:
                raise ValueError(
                    f"resample ablation: reference batch has {reference.shape[0]} sequences, the run has "
                    f"{activation.shape[0]}"
                )
            new = reference[:, :seq].to(activation.dtype)
        if component.kind == "head":
            out[:, :, component.head] = new[:, :, component.head]
        else:
            out = new.clone()
        return out

    return hook


@torch.no_grad()
def reference_activations(
    model: Model,
    components: Sequence[Any],
    *,
    method: Method = "mean",
    tokens: Optional[Tokens] = None,
    reference_tokens: Optional[Tokens] = None,
    seed: int = 0,
    cache: Optional[Any] = None,
) -> dict[str, Tensor]:
    """What each ablated hook is replaced by: {} for "zero"; the per-position batch mean for "mean"; the
    activations of other sequences for "resample".

    "mean" averages over `reference_tokens` (default `tokens`); "resample" takes `reference_tokens` (default:
    `tokens` deranged with `seed`). `cache` may already hold the hooks of a run on `tokens` (only read; used
    when no `reference_tokens` are given).
    """
    if method not in METHODS:
        raise ValueError(f"ablation method must be one of {METHODS}, got {method!r}")
    comps = _as_components(model, components)
    if method == "zero":
        return {}
    names = sorted({c.hook_name for c in comps})
    perm = None
    if reference_tokens is None:
        if tokens is None:
            raise ValueError(f"{method} ablation needs tokens or reference_tokens")
        if method == "resample":
            perm = derangement(tokens.shape[0], seed=seed)
        if cache is None or any(name not in cache for name in names):
            _, cache = model.run_with_cache(check_tokens(model, tokens), names_filter=names)
    else:
        _, cache = model.run_with_cache(check_tokens(model, reference_tokens), names_filter=names)
    out = {}
    for name in names:
        act = cache[name].detach()
        if method == "mean":
            out[name] = act.mean(0)
        else:
            out[name] = act if perm is None else act[perm.to(act.device)]
    return out


def ablation_hooks(
    model: Model, components: Sequence[Any], *, method: Method = "mean", reference: dict[str, Tensor]
) -> list[tuple[str, Callable]]:
    """Forward hooks that ablate `components` together (for `run_with_hooks(fwd_hooks=...)`).

    `reference` comes from `reference_activations` with the same method.
    """
    if method not in METHODS:
        raise ValueError(f"ablation method must be one of {METHODS}, got {method!r}")
    comps = _as_components(model, components)
    missing = [c.hook_name for c in comps if method != "zero" and c.hook_name not in reference]
    if missing:
        raise ValueError(f"reference activations lack {sorted(set(missing))}")
    return [(c.hook_name, _replacement_hook(c, method, reference.get(c.hook_name))) for c in comps]


def ablated_probs(
    model: Model,
    tokens: Tokens,
    components: Sequence[Any],
    *,
    method: Method = "mean",
    reference_tokens: Optional[Tokens] = None,
    seed: int = 0,
    cache: Optional[Any] = None,
) -> Probs:
    """The model's next-state laws on `tokens` with `components` ablated together (see `reference_activations`).

    >>> # ablated_probs(model, tokens, ["L0H0"], method="mean")
    """
    reference = reference_activations(
        model, components, method=method, tokens=tokens, reference_tokens=reference_tokens, seed=seed, cache=cache
    )
    hooks = ablation_hooks(model, components, method=method, reference=reference)
    return next_state_probs(model, tokens, fwd_hooks=hooks)


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class AblationTable:
    """Loss (nats) with each component ablated on its own, beside the clean loss.

    `loss_change[i]` = ablated loss - clean loss for `components[i]`: large where the model needs the
    component. `head_grid()` lays the head rows out as a [layer, head] grid.
    """

    method: str
    clean_loss: float
    components: tuple[str, ...]
    losses: tuple[float, ...]
    n_layers: int
    n_heads: int

    @property
    def loss_change(self) -> tuple[float, ...]:
        return tuple(loss - self.clean_loss for loss in self.losses)

    def __getitem__(self, name: str) -> float:
        """Loss change of the component called `name` (e.g. "L0H1")."""
        if name not in self.components:
            raise KeyError(f"no component {name!r}; have {list(self.components)}")
        return self.loss_change[self.components.index(name)]

    def head_grid(self) -> Float[Tensor, "layer head"]:
        """Loss change of every head as a [layer, head] grid (NaN for heads not in the table)."""
        grid = torch.full((self.n_layers, self.n_heads), float("nan"))
        for name, change in zip(self.components, self.loss_change):
            comp = Component.parse(name)
            if comp.kind == "head":
                grid[comp.layer, comp.head] = change
        return grid

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: method, clean loss, and {component: loss change}."""
        return json_safe({
            "method": self.method,
            "clean_loss": self.clean_loss,
            "loss_change": dict(zip(self.components, self.loss_change)),
        })


def _mean_loss(probs: Probs, tokens: Tokens) -> float:
    return float(target_losses(probs, tokens.to(probs.device)).mean())


def ablation_loss_change(
    model: Model,
    tokens: Tokens,
    components: Sequence[Any],
    *,
    method: Method = "mean",
    reference_tokens: Optional[Tensor] = None,
    seed: int = 0,
) -> float:
    """Mean next-state loss with `components` ablated together minus the clean loss (nats)."""
    clean = _mean_loss(next_state_probs(model, tokens), tokens)
    probs = ablated_probs(model, tokens, components, method=method, reference_tokens=reference_tokens, seed=seed)
    return _mean_loss(probs, tokens) - clean


def ablation_table(
    model: Model,
    tokens: Tokens,
    *,
    method: Method = "mean",
    components: Optional[Sequence[Any]] = None,
    reference_tokens: Optional[Tensor] = None,
    seed: int = 0,
    cache: Optional[Any] = None,
    clean_probs: Optional[Probs] = None,
) -> AblationTable:
    """Ablate every component (default: all heads, attention layers and MLPs) one at a time; see `AblationTable`.

    `cache` (a run on `tokens` holding the needed hooks) and `clean_probs` (the model's laws on `tokens`)
    save forward passes when given; both are only read.

    >>> # ablation_table(model, tokens).head_grid()  # large at the heads the prediction relies on
    """
    comps = _as_components(model, model_components(model) if components is None else components)
    if clean_probs is None:
        clean_probs = next_state_probs(model, tokens)
    clean = _mean_loss(clean_probs, tokens)
    reference = reference_activations(
        model, comps, method=method, tokens=tokens, reference_tokens=reference_tokens, seed=seed, cache=cache
    )
    losses = []
    for comp in comps:
        hooks = ablation_hooks(model, [comp], method=method, reference=reference)
        losses.append(_mean_loss(next_state_probs(model, tokens, fwd_hooks=hooks), tokens))
    return AblationTable(
        method=method,
        clean_loss=clean,
        components=tuple(c.name for c in comps),
        losses=tuple(losses),
        n_layers=int(model.cfg.n_layers),
        n_heads=int(model.cfg.n_heads),
    )
