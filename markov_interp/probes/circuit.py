"""The induction circuit read off a discovered graph: previous-token heads feeding induction heads' keys.

An order-k induction circuit (Olsson et al.; Edelman et al. for Markov data) copies the states x_{j-1}, ..,
x_{j-k} into each position j (previous-token heads, at lags 1..k, in any layers and spread over any number of
heads) and lets a later head's **keys** read them, so that its query, the current state, attends to the keys
whose preceding states match (K-composition). `read_circuit` finds it in the causal graph of
`discovery.discover_circuit`, not in attention scores alone:

- a **K-edge** is a kept edge from a head into another head's key input ("L0H0->L1H0.k");
- its sender is a **previous-token head** when its attention to the last few positions (lags 1..k + 1 summed,
  so that a role spread over lags counts once) is at least `head_excess` above uniform causal attention
  (`attention.AttentionScores`: 0 at chance, 1 for a head that attends only there);
- its receiver is an **induction head** (every kept edge lies on a path to the logits, so it matters downstream).

The circuit is found when at least one previous-token -> induction K-edge is kept; its effect is the K-edges'
path-patching effects. Roles are sets (every previous-token head with a kept K-edge, every induction head that
receives one); redundant heads each carry part of a role and each edge shows it.
"""

import dataclasses
from typing import Any, Optional

import torch

from markov_interp.probes._common import json_safe
from markov_interp.probes._display import ProbeResult, dataframe, displayed
from markov_interp.probes.attention import AttentionScores
from markov_interp.probes.discovery import CircuitGraph, Edge
from markov_interp.probes.interventions import Component

__all__ = ["CIRCUIT_KINDS", "Circuit", "CircuitVerdict", "Role", "circuit_verdict", "lag_channels", "read_circuit",
           "spread_previous_token_excess"]


@displayed
@dataclasses.dataclass(frozen=True, kw_only=True)
class Role:
    """One role of the circuit: its heads, their scores, and the kept K-edges' effect through them."""

    kind: str  # "previous_token" or "induction"
    index: int  # the circuit's order k
    heads: tuple[Component, ...]
    scores: tuple[float, ...]  # previous-token excess over lags 1..k+1, or order-k induction excess, per head
    effect: Optional[float]  # summed path-patching effect (nats) of the kept K-edges out of / into these heads
    confirmed: bool  # a kept previous-token -> induction K-edge passes through the role

    @property
    def name(self) -> str:
        return "previous-token" if self.kind == "previous_token" else f"induction order {self.index}"

    def _headline(self) -> str:
        heads = ", ".join(f"{h.name} {x:.2f}" for h, x in zip(self.heads, self.scores)) or "no head"
        effect = "" if self.effect is None else f"; kept K-edges {self.effect:+.4f} nats"
        return f"{self.name}: {heads}{effect}{' (confirmed)' if self.confirmed else ''}"

    def to_dict(self) -> dict[str, Any]:
        return json_safe({"kind": self.kind, "index": self.index, "name": self.name,
                          "heads": [h.name for h in self.heads], "scores": list(self.scores),
                          "effect": self.effect, "confirmed": self.confirmed})


@dataclasses.dataclass(frozen=True, kw_only=True, repr=False)
class Circuit(ProbeResult):
    """The induction circuit of order `order` read off `graph` (module docstring)."""

    order: int
    k_edges: tuple[Edge, ...]  # kept previous-token -> induction K-edges
    other_k_edges: tuple[Edge, ...]  # kept K-edges from heads that are not previous-token heads
    roles: tuple[Role, ...]  # previous-token, induction
    lag_profile: dict[str, tuple[float, ...]]  # each previous-token head's excess at lags 1..k+1
    n_layers: int
    found: bool

    def role(self, kind: str, index: Optional[int] = None) -> Optional[Role]:
        for r in self.roles:
            if r.kind == kind and (index is None or r.index == index):
                return r
        return None

    @property
    def confirmed(self) -> bool:
        return self.found

    def top_head(self, kind: str) -> Optional[tuple[int, int]]:
        """(layer, head) of the role's head with the largest K-edge effect (None for an empty role)."""
        if not self.k_edges:
            return None
        best = max(self.k_edges, key=lambda e: e.effect)
        comp = Component.parse(best.sender if kind == "previous_token" else best.receiver)
        return comp.layer, comp.head

    @property
    def effect(self) -> float:
        """Summed effect (nats) of the kept previous-token -> induction K-edges."""
        return float(sum(e.effect for e in self.k_edges))

    def missing(self) -> str:
        """Why no circuit was found, in words."""
        if self.n_layers < 2:
            return "a single-layer model has no induction circuit (it needs a previous-token head below it)"
        if self.other_k_edges:
            return ("no kept K-edge comes from a previous-token head (kept K-edges: "
                    + ", ".join(f"{e.name} {e.effect:+.3f}" for e in self.other_k_edges) + ")")
        return "no kept edge feeds a head's keys (no K-composition among the kept edges)"

    def summary(self) -> str:
        if not self.found:
            return f"no induction circuit: {self.missing()}"
        edges = ", ".join(f"{e.name} {e.effect:+.3f} nats" for e in self.k_edges)
        prev = self.role("previous_token")
        lags = "; ".join(f"{h.name} lag excess " + "/".join(f"{x:.2f}" for x in self.lag_profile[h.name])
                         for h in prev.heads)
        return f"previous-token -> induction K-edges kept: {edges} ({lags})"

    def to_dataframe(self) -> Any:
        """One row per role (index its name): its heads, their scores, the kept K-edges' effect through them.

        Returns:
            A pandas DataFrame.
        """
        return dataframe(({"role": r.name, "heads": ", ".join(h.name for h in r.heads),
                           "scores": ", ".join(f"{x:.2f}" for x in r.scores), "effect": r.effect,
                           "confirmed": r.confirmed} for r in self.roles), index="role")

    def _headline(self) -> str:
        return self.summary()

    def to_dict(self) -> dict[str, Any]:
        return json_safe({
            "order": self.order, "found": self.found, "k_edges": [e.to_dict() for e in self.k_edges],
            "other_k_edges": [e.to_dict() for e in self.other_k_edges], "roles": [r.to_dict() for r in self.roles],
            "lag_profile": {k: list(v) for k, v in self.lag_profile.items()}, "n_layers": self.n_layers,
            "effect": self.effect,
        })


def spread_previous_token_excess(scores: AttentionScores, max_lag: int) -> torch.Tensor:
    """Per head, (mass on lags 1..max_lag - its uniform-attention chance) / (1 - chance): a previous-token role
    spread over several lags counts once. [layer, head]."""
    lags = min(max_lag, scores.max_lag)
    mass = scores.previous_token_lags[:lags].sum(0)
    chance = sum(scores.previous_token_lag_chance[:lags])
    return (mass - chance) / max(1.0 - chance, 1e-6)


def read_circuit(graph: CircuitGraph, scores: AttentionScores, *, order: int, head_excess: float) -> Circuit:
    """The order-`order` induction circuit in `graph` (module docstring).

    Args:
        graph: a `discover_circuit` result.
        scores: the attention scores of the same model (previous-token lags up to `order` + 1).
        order: the order k of the in-context law the circuit is read for.
        head_excess: the spread previous-token excess a K-edge's sender needs.

    Returns:
        A `Circuit`: the kept previous-token -> induction K-edges, the roles, found or not.
    """
    spread = spread_previous_token_excess(scores, order + 1)
    k_edges, others = [], []
    for e in graph.kept:
        if e.input != "k" or "H" not in e.sender:
            continue
        sender = Component.parse(e.sender)
        (k_edges if float(spread[sender.layer, sender.head]) >= head_excess else others).append(e)
    prev = tuple(dict.fromkeys(Component.parse(e.sender) for e in k_edges))
    ind = tuple(dict.fromkeys(Component.parse(e.receiver) for e in k_edges))
    ind_grid = scores.induction_excess(min(order, scores.max_order)) if order >= 1 else None
    lags = min(order + 1, scores.max_lag)
    profile = {h.name: tuple(float(scores.lag_excess(lag)[h.layer, h.head]) for lag in range(1, lags + 1))
               for h in prev}
    roles = (
        Role(kind="previous_token", index=order, heads=prev,
             scores=tuple(float(spread[h.layer, h.head]) for h in prev),
             effect=sum(e.effect for e in k_edges) if k_edges else None, confirmed=bool(k_edges)),
        Role(kind="induction", index=order, heads=ind,
             scores=tuple(float(ind_grid[h.layer, h.head]) if ind_grid is not None else float("nan") for h in ind),
             effect=sum(e.effect for e in k_edges) if k_edges else None, confirmed=bool(k_edges)),
    )
    return Circuit(order=order, k_edges=tuple(k_edges), other_k_edges=tuple(others), roles=roles,
                   lag_profile=profile, n_layers=graph.n_layers, found=bool(k_edges))


# ---------------------------------------------------------------------------------------- the circuit axis
CIRCUIT_KINDS = ("induction", "kernel", "state_counting", "none")
LAG_SHARE = 0.5  # a head carries every lag whose excess is at least this share of its largest
RANK_TOL = 1 / 3  # lag channels: singular values of the heads' lag profiles above this share of the largest


def lag_channels(profiles: dict[str, tuple[float, ...]]) -> tuple[int, dict[str, tuple[int, ...]]]:
    """(the number of independent lag channels, each head's lags) of previous-token heads' lag profiles
    ({head: excess at lags 1..L}).

    The channels are the numerical rank of the [head, lag] matrix of excesses (negative ones read as 0), with
    singular values below `RANK_TOL` of the largest dropped: two heads at lags 1 and 2 are two channels (an order-2
    circuit), one head spread over lags 1 and 2, or two copies of a lag-1 head, one.

    >>> lag_channels({"L0H0": (0.95, 0.0), "L0H1": (0.02, 0.9)})
    (2, {'L0H0': (1,), 'L0H1': (2,)})
    >>> lag_channels({"L0H0": (0.5, 0.45)})
    (1, {'L0H0': (1, 2)})
    """
    if not profiles:
        return 0, {}
    grid = torch.tensor([list(p) for p in profiles.values()], dtype=torch.float64).clamp_min(0)
    values = torch.linalg.svdvals(grid)
    rank = int((values > RANK_TOL * values[0]).sum()) if float(values[0]) > 0 else 0
    lags = {name: tuple(i + 1 for i, x in enumerate(row) if x > 0 and x >= LAG_SHARE * max(row))
            for name, row in zip(profiles, grid.tolist())}
    return rank, lags


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False, repr=False)
class CircuitVerdict(ProbeResult):
    """The circuit axis of `classify_mechanism`: what structure the causal evidence shows, read off the graph.

    `kind`: "induction" (a kept previous-token -> induction K-edge: `reading`), "kernel" (the kernel swap finds
    the prediction in the weights), "state_counting" (kept edges carry the context through heads, with no
    previous-token -> induction K-edge: counts of states), "none" (no kept edge carries the context).
    `order`: for induction, the number of independent lag channels its previous-token heads carry into the keys
    (`lag_channels`: the order read from the lags, not from the law); for kernel, the source's order. `lags`:
    every lag the previous-token heads carry; `head_lags` per head. Every attribute of the `graph` it was read
    from reads through (`kept_names`, `faithfulness`, `edges`, `to_dataframe()`, ...), so code written when
    `MechanismReport.circuit` was the graph keeps working.
    """

    kind: str
    order: Optional[int]
    lags: tuple[int, ...]
    head_lags: dict[str, tuple[int, ...]]
    reading: Circuit
    graph: CircuitGraph
    in_context_fraction: float

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("graph", "reading"):
            raise AttributeError(name)
        return getattr(self.graph, name)

    @property
    def mixed_heads(self) -> tuple[str, ...]:
        """Previous-token heads that spread over more than one lag."""
        return tuple(h for h, lags in self.head_lags.items() if len(lags) > 1)

    def describe(self) -> str:
        """One clause: "induction circuit of order 2: L0H0 (lag 1), L0H1 (lag 2) -> keys of L1H0"."""
        if self.kind == "induction":
            heads = ", ".join(f"{h} (lag{'s' if len(l) > 1 else ''} {', '.join(map(str, l)) or '-'})"
                              for h, l in self.head_lags.items())
            into = ", ".join(h.name for h in self.reading.role("induction").heads)
            return f"induction circuit of order {self.order}: {heads} -> keys of {into}"
        if self.kind == "kernel":
            return (f"kernel in the weights (kernel swap: in-context fraction {self.in_context_fraction:.2f}); "
                    f"{len(self.graph.kept)} kept edges")
        if self.kind == "state_counting":
            heads = ", ".join(self.graph.kept_heads())
            return f"state counting: heads {heads} carry the context, no previous-token -> induction K-edge"
        return "no circuit carries the context (no kept edge from a head)"

    def summary(self) -> str:
        cancel = [c.describe() for c in self.graph.cancelling]
        lines = [self.describe(), self.graph.summary(), self.reading.summary()]
        return "\n".join(lines + ([f"cancelling: {'; '.join(cancel)}"] if cancel else []))

    def to_dataframe(self) -> Any:
        """The graph's edge table (`CircuitGraph.to_dataframe`)."""
        return self.graph.to_dataframe()

    def to_dict(self) -> dict[str, Any]:
        """The graph's dict (every edge, the kept ones, the losses) with the reading: kind, order, lags."""
        return json_safe({**self.graph.to_dict(), "kind": self.kind, "order": self.order, "lags": list(self.lags),
                          "head_lags": {h: list(v) for h, v in self.head_lags.items()},
                          "mixed_heads": list(self.mixed_heads), "in_context_fraction": self.in_context_fraction,
                          "description": self.describe()})


def circuit_verdict(graph: CircuitGraph, reading: Circuit, *, in_weights: bool, in_context_fraction: float,
                    source_order: int) -> CircuitVerdict:
    """The circuit axis (`CircuitVerdict`) of a graph and its induction reading.

    Args:
        graph: a `discover_circuit` result.
        reading: `read_circuit` of it.
        in_weights: the kernel swap found the prediction in the weights.
        in_context_fraction: that swap's in-context fraction.
        source_order: the source's order (the kernel's order).

    Returns:
        A `CircuitVerdict`.
    """
    order, head_lags = lag_channels(reading.lag_profile)
    if reading.found:
        kind = "induction"
    elif not graph.kept:
        kind, order = "none", None
    elif in_weights:
        kind, order = "kernel", source_order
    elif any("H" in e.sender for e in graph.kept):
        kind, order = "state_counting", None
    else:
        kind, order = "none", None
    lags = tuple(sorted({lag for v in head_lags.values() for lag in v})) if kind == "induction" else ()
    return CircuitVerdict(kind=kind, order=order if kind != "induction" else max(order, 1), lags=lags,
                          head_lags=head_lags if kind == "induction" else {}, reading=reading, graph=graph,
                          in_context_fraction=in_context_fraction)
