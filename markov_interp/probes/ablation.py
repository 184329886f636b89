"""Ablations: remove one head, attention layer or MLP and measure how much worse the next-state loss gets.

Three ways to remove a component's output (Olsson et al.; Wang et al.):
- "zero": replace it by 0;
- "mean": replace it by its mean over a reference batch at the same position (keeps what any context
  would give, removes what this context gives);
- "resample": replace it by its value on another sequence (a derangement of the batch by default).

A head is one slice of `blocks.L.attn.hook_z` (its output before W_O); an attention layer is
`blocks.L.hook_attn_out`; an MLP is `blocks.L.hook_mlp_out` (`interventions.Component`). Every ablation
runs through `interventions.intervened_probs`; this module only chooses the replacement values. If
ablating the set of previous-token heads or the set of induction heads of a two-layer model wipes out its
in-context gain, the circuit is what carries it (`set_ablation_losses` removes a set at once).
"""

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Literal, Optional, Union

import torch
from jaxtyping import Float
from torch import Tensor

from markov_interp.models import HookedModel
from markov_interp.probes._common import (
    Probs,
    Tokens,
    TokensOrBatch,
    as_tokens,
    check_tokens,
    json_safe,
    next_state_probs,
    target_losses,
)
from markov_interp.probes.interventions import (
    Component,
    ComponentValues,
    as_components,
    intervened_probs,
    model_components,
    replacement_hooks,
)

__all__ = ["METHODS", "AblationTable", "ablated_probs", "ablation_hooks", "ablation_loss_change", "ablation_table",
           "reference_activations", "set_ablation_losses"]

Method = Literal["zero", "mean", "resample"]
METHODS = ("zero", "mean", "resample")
def derangement(batch: int, *, seed: int) -> torch.Tensor:
    """A random permutation of 0..batch-1 with no fixed point (which sequence each one is resampled from)."""
    if batch < 2:
        raise ValueError(f"resample ablation needs at least 2 sequences, got {batch}")
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(batch, generator=gen)
    shifted = torch.empty_like(perm)
    shifted[perm] = perm.roll(1)  # one cycle through perm: nobody maps to itself
    return shifted


@torch.no_grad()
def reference_activations(
    model: HookedModel,
    components: Sequence[Any],
    *,
    method: Method = "mean",
    tokens: Optional[TokensOrBatch] = None,
    reference_tokens: Optional[TokensOrBatch] = None,
    seed: int = 0,
    cache: Optional[Any] = None,
) -> dict[str, Tensor]:
    """What each ablated hook is replaced by ({hook name: tensor}): a 0-d zero for "zero"; the per-position
    batch mean for "mean"; the activations of other sequences for "resample".

    "mean" averages over `reference_tokens` (default `tokens`); "resample" takes `reference_tokens` (default:
    `tokens` deranged with `seed`). `cache` may already hold the hooks of a run on `tokens` (only read; used
    when no `reference_tokens` are given).
    """
    if method not in METHODS:
        raise ValueError(f"ablation method must be one of {METHODS}, got {method!r}")
    tokens, reference_tokens = as_tokens(tokens), as_tokens(reference_tokens)
    comps = as_components(model, components)
    names = sorted({c.hook_name for c in comps})
    if method == "zero":
        return {name: torch.zeros(()) for name in names}
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
    model: HookedModel, components: Sequence[Any], *, method: Method = "mean", reference: dict[str, Tensor]
) -> list[tuple[str, Callable]]:
    """Forward hooks that ablate `components` together (for `run_with_hooks(fwd_hooks=...)`).

    `reference` comes from `reference_activations` with the same method.
    """
    if method not in METHODS:
        raise ValueError(f"ablation method must be one of {METHODS}, got {method!r}")
    comps = as_components(model, components)
    if method == "zero":
        reference = {c.hook_name: torch.zeros(()) for c in comps}
    missing = sorted({c.hook_name for c in comps} - set(reference))
    if missing:
        raise ValueError(f"reference activations lack {missing}")
    return replacement_hooks(comps, reference)


def ablated_probs(
    model: HookedModel,
    tokens: TokensOrBatch,
    components: Sequence[Any],
    *,
    method: Method = "mean",
    reference_tokens: Optional[Tokens] = None,
    seed: int = 0,
    cache: Optional[Any] = None,
) -> Probs:
    """The model's next-state laws on `tokens` with `components` ablated together (see `reference_activations`).

    >>> ablated_probs(model, tokens, ["L0H0"], method="mean").shape  # [batch, pos, next state]
    torch.Size([16, 32, 3])
    """
    tokens = as_tokens(tokens)
    reference = reference_activations(
        model, components, method=method, tokens=tokens, reference_tokens=reference_tokens, seed=seed, cache=cache
    )
    comps = as_components(model, components)
    if method == "zero":
        reference = {c.hook_name: torch.zeros(()) for c in comps}
    return intervened_probs(model, tokens, [comps], reference)[0]


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False, repr=False)
class AblationTable(ComponentValues):
    """Loss (nats) with each component ablated on its own, beside the clean loss.

    `loss_change[i]` = ablated loss - clean loss for `components[i]`: large where the model needs the
    component. `table[c]` takes a `Component` or its name ("L0H1"); `head_grid()` lays the head rows out as a
    [layer, head] grid.
    """

    method: str
    clean_loss: float
    components: tuple[Union[Component, str], ...]  # Components (names given here are parsed into them)
    losses: tuple[float, ...]
    n_layers: int
    n_heads: int

    def __post_init__(self) -> None:  # names ("L0H1") are accepted and stored as Components
        object.__setattr__(self, "components", tuple(Component.parse(c) for c in self.components))
        if len(self.components) != len(self.losses):
            raise ValueError(f"{len(self.components)} components but {len(self.losses)} losses")

    @property
    def loss_change(self) -> tuple[float, ...]:
        return tuple(loss - self.clean_loss for loss in self.losses)

    def _values(self) -> tuple[float, ...]:  # table[component] and head_grid() give the loss change
        return self.loss_change

    def __contains__(self, component: Any) -> bool:
        try:
            return Component.parse(component) in self.components
        except ValueError:
            return False

    def to_dataframe(self) -> Any:
        """One row per component (index "L0H1", "L0.attn", "L0.mlp"): kind, layer, head, the ablated loss and the
        loss change (nats).

        Returns:
            A pandas DataFrame.
        """
        return self._rows(loss=self.losses, loss_change=self.loss_change)

    def summary(self) -> str:
        """The components the loss depends on most (largest loss change when ablated alone)."""
        return (f"{self.method} ablation of {len(self.components)} components, clean loss {self.clean_loss:.4f} nats; "
                f"largest loss changes: {self._largest()}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: method, clean loss, and {component name: loss change}."""
        return json_safe({
            "method": self.method,
            "clean_loss": self.clean_loss,
            "loss_change": dict(zip(self.names, self.loss_change)),
        })


def _mean_loss(probs: Probs, tokens: Tokens) -> float:
    return float(target_losses(probs, tokens.to(probs.device)).mean())


def ablation_loss_change(
    model: HookedModel,
    tokens: TokensOrBatch,
    components: Sequence[Any],
    *,
    method: Method = "mean",
    reference_tokens: Optional[Tensor] = None,
    seed: int = 0,
) -> float:
    """Mean next-state loss with `components` ablated together minus the clean loss (nats)."""
    tokens = as_tokens(tokens)
    clean = _mean_loss(next_state_probs(model, tokens), tokens)
    probs = ablated_probs(model, tokens, components, method=method, reference_tokens=reference_tokens, seed=seed)
    return _mean_loss(probs, tokens) - clean


def set_ablation_losses(
    model: HookedModel,
    tokens: TokensOrBatch,
    groups: Sequence[Sequence[Any]],
    *,
    method: Method = "mean",
    reference: Optional[dict[str, Tensor]] = None,
    seed: int = 0,
    cache: Optional[Any] = None,
) -> list[float]:
    """Mean next-state loss (nats) with each group of components ablated together, one run per group.

    A circuit whose role is spread over several heads only shows when the whole set is removed at once
    (ablating one of two redundant heads costs nothing). `reference` (from `reference_activations` on the
    union of the groups) or `cache` save forward passes.
    """
    tokens = as_tokens(tokens)
    if method not in METHODS:
        raise ValueError(f"ablation method must be one of {METHODS}, got {method!r}")
    comp_groups = [as_components(model, g) for g in groups]
    union = sorted({c for g in comp_groups for c in g}, key=lambda c: (c.layer, c.kind, c.head or 0))
    if reference is None:
        reference = reference_activations(model, union, method=method, tokens=tokens, seed=seed, cache=cache)
    if method == "zero":
        reference = {c.hook_name: torch.zeros(()) for c in union}
    probs = intervened_probs(model, tokens, comp_groups, reference)
    return [_mean_loss(p, tokens) for p in probs]


def ablation_table(
    model: HookedModel,
    tokens: TokensOrBatch,
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

    >>> grid = ablation_table(model, tokens).head_grid()  # large at the heads the prediction relies on
    >>> bool(grid[0, 0] > 0.1 and grid[1, 0] > 0.01)  # both heads of the induction circuit
    True
    """
    tokens = as_tokens(tokens)
    comps = as_components(model, model_components(model) if components is None else components)
    if clean_probs is None:
        clean_probs = next_state_probs(model, tokens)
    reference = reference_activations(
        model, comps, method=method, tokens=tokens, reference_tokens=reference_tokens, seed=seed, cache=cache
    )
    losses = set_ablation_losses(model, tokens, [[c] for c in comps], method=method, reference=reference)
    return AblationTable(
        method=method,
        clean_loss=_mean_loss(clean_probs, tokens),
        components=tuple(comps),
        losses=tuple(losses),
        n_layers=int(model.cfg.n_layers),
        n_heads=int(model.cfg.n_heads),
    )
