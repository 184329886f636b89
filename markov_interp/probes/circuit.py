"""The induction circuit read off a discovered graph: previous-token heads feeding induction heads' keys.

An order-k induction circuit (Olsson et al.; Edelman et al. for Markov data) copies the states x_{j-1}, ..,
x_{j-k} into each position j (previous-token heads, at lags 1..k, in any layers and spread over any number of
heads) and lets a later head's **keys** read them, so that its query, the current state, attends to the keys
whose preceding states match (K-composition). `read_circuit` finds it in the causal graph of
`discovery.discover_circuit`, not in attention scores alone:

- a **K-edge** is a kept edge from a head (or an MLP) into another head's key input ("L0H0->L1H0.k");
- **roles by content** (`edge_content`: what each kept edge carries, read by interchange interventions): its
  sender has the **previous-token** role when the K-edge carries a lagged state x_{j-l} (directly, or *relayed*: the
  sender copies a lagged state it receives from another head through its values), and its receiver is an
  **induction head** when its query carries the current state (a kept query edge carrying it: the token embedding,
  or a head whose edge carries "state") and its keys as a whole carry a lagged state (`keys_match_lag`: a head
  whose keys read a K-edge's lagged state only beside the key's own state keys positions by their own state). Attention scores are supporting evidence only (`Role.scores`: the spread
  previous-token excess of the senders; a head that parks attention on position 0 can be a previous-token head
  with little excess, and a pattern that looks previous-token can carry something else). An edge kept only by the
  positional pass carries the position.
- **without the content** (`content=None`: a model whose residual stream is not the sum of its senders' writes),
  the sender is a previous-token head when its attention to lags 1..k + 1 summed is at least `head_excess` above
  uniform causal attention (`attention.AttentionScores`: 0 at chance, 1 for a head that attends only there).

The circuit is found when at least one previous-token -> induction K-edge is kept; its effect is the K-edges'
path-patching effects. Roles are sets (every previous-token head with a kept K-edge, every induction head that
receives one); redundant heads each carry part of a role and each edge shows it.

**Switch counting** (read by content, `switch_counting`; two states only): a head whose query carries the current
state, whose keys carry each key's *own* state (not a lagged one alone: it attends to the positions holding the
current state, or to the other states'), and into which a kept edge carries switch statistics (the switch into a
key, the step into it (x_{j-1}, x_j), the number of switches, the transition counts; into the keys also the window
of recent states, which holds the switches into the key) or, through its values, the state before each key. On two
states the transitions into a state equal those out of it up to one (n_ab = n_ba +- 1), so such a head computes the
in-context bigram law with no induction head (tests/handbuilt.py `switch_counting_circuit`; keyed by the step, the
state and the switch into each key from one mixed head, `step_keyed_circuit`).
"""

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, Optional

import torch

from markov_interp.probes._common import json_safe
from markov_interp.probes._display import ProbeResult, dataframe, displayed
from markov_interp.probes.attention import AttentionScores
from markov_interp.probes.discovery import CircuitGraph, Edge
from markov_interp.probes.interchange import BY_CONSTRUCTION, EdgeContent, is_lagged
from markov_interp.probes.interventions import Component
from markov_interp.probes.paths import EdgeKey

SWITCH_VARIABLES = ("switch", "step", "switches", "transitions")  # switch statistics (`interchange.variable_names`)
# what a key edge carries that holds the key's own state: the state itself, or with the states before it (the step
# into the key, the window), which also holds the switches into the key
OWN_STATE = ("state", "step", "window")

__all__ = ["CIRCUIT_KINDS", "Circuit", "CircuitVerdict", "Role", "circuit_verdict", "lag_channels", "read_circuit",
           "spread_previous_token_excess", "edge_carried", "switch_counting", "keys_match_lag", "FAITHFUL"]


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
    """The roles read off `graph` (module docstring): the induction circuit of order `order` (its kept
    previous-token -> induction K-edges, the roles, each previous-token head's lag profile, the heads that relay a
    lagged state, `found`), the switch-counting heads and the edges carrying switch statistics into them, and, read
    by content, what each kept edge carries (`carried`; `content` is the `EdgeContent` it came from)."""

    order: int
    k_edges: tuple[Edge, ...]  # kept previous-token -> induction K-edges
    other_k_edges: tuple[Edge, ...]  # kept K-edges from heads that are not previous-token heads
    roles: tuple[Role, ...]  # previous-token, induction
    lag_profile: dict[str, tuple[float, ...]]  # each previous-token head's excess (relays: explained) at lags 1..k+1
    n_layers: int
    found: bool
    content: Optional[EdgeContent] = None  # what the kept edges carry (None: roles from attention scores)
    relays: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)  # relay -> heads it relays
    switch_edges: tuple[Edge, ...] = ()  # kept edges carrying switch statistics into switch-counting heads
    switch_heads: tuple[Component, ...] = ()  # heads that count switches (`switch_counting`)
    carried: dict[str, Optional[str]] = dataclasses.field(default_factory=dict)  # kept edge -> what it carries
    unresolved: tuple[str, ...] = ()  # edges whose content the reading hinges on, within their interval of the cut

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
        """Why no circuit was found, in words (with the content: what the kept K-edges carry, and what was tried)."""
        if self.n_layers < 2:
            return "a single-layer model has no induction circuit (it needs a previous-token head below it)"
        keys = [name for name in self.carried if name.endswith(".k")]
        if self.content is not None and keys:
            said = "; ".join(self.describe_edge(name) for name in keys)
            keyed = sorted({EdgeKey.parse(n).receiver for n in keys if self.carried[n] in OWN_STATE})
            values = [n for n in self.carried if n.endswith(".v") and EdgeKey.parse(n).receiver in keyed]
            switch = (f"; no switch-counting head: {', '.join(keyed)} key positions by their own state, but no kept "
                      f"edge into them carries switch statistics ({'; '.join(self.describe_edge(n) for n in values)})"
                      if keyed else "")
            whole = "; ".join(f"{r.describe()}, its best lag {max(_lag_fractions(r), default=math.nan):.2f}"
                              for r in self.content.keys)
            return (f"no kept K-edge carries a lagged state into a head whose query carries the current state and "
                    f"whose keys match on it (kept K-edges: {said}{'; keys ' + whole if whole else ''}){switch}; "
                    f"tried: {', '.join(self.content.variables)}")
        if self.other_k_edges:
            return ("no kept K-edge comes from a previous-token head (kept K-edges: "
                    + ", ".join(f"{e.name} {e.effect:+.3f}" for e in self.other_k_edges) + ")")
        return "no kept edge feeds a head's keys (no K-composition among the kept edges)"

    def describe_edge(self, name: str) -> str:
        """What kept edge `name` carries, in words, with the closest variable when none reaches the cut."""
        if self.carried.get(name):
            return f"{name} carries {self.carried[name]}"
        row = self.content[name] if self.content is not None and name in self.content else None
        if row is None or row.best is None:
            return f"{name} carries no tested variable"
        lo, hi = row.interval[row.best]
        closest = f"{row.best} {row.explained[row.best]:.2f} [{lo:.2f}, {hi:.2f}]"
        return f"{name} carries no tested variable (closest {closest})"

    def summary(self) -> str:
        if not self.found:
            return f"no induction circuit: {self.missing()}"
        edges = ", ".join(f"{e.name} {e.effect:+.3f} nats" + (f" ({self.carried[e.name]})" if e.name in self.carried
                                                               else "") for e in self.k_edges)
        prev = self.role("previous_token")

        def what(h: Component) -> str:
            if h.name in self.relays or h.kind != "head":
                return "lags explained"
            return "lag excess beyond the sink" if self.content is not None else "lag excess"

        lags = "; ".join(f"{h.name} {what(h)} " + "/".join(f"{x:.2f}" for x in self.lag_profile[h.name])
                         + (f" (relaying {', '.join(self.relays[h.name])})" if h.name in self.relays else "")
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
            "effect": self.effect, "by_content": self.content is not None, "relays": self.relays,
            "switch_edges": [e.name for e in self.switch_edges], "switch_heads": [h.name for h in self.switch_heads],
            "carried": self.carried,
        })


def _lag_fractions(row: Any) -> list[float]:
    return [x for v, x in row.explained.items() if is_lagged(v) and math.isfinite(x)]


def spread_previous_token_excess(scores: AttentionScores, max_lag: int) -> torch.Tensor:
    """Per head, (mass on lags 1..max_lag - its uniform-attention chance) / (1 - chance): a previous-token role
    spread over several lags counts once. [layer, head]."""
    lags = min(max_lag, scores.max_lag)
    mass = scores.previous_token_lags[:lags].sum(0)
    chance = sum(scores.previous_token_lag_chance[:lags])
    return (mass - chance) / max(1.0 - chance, 1e-6)


def edge_carried(graph: CircuitGraph, content: EdgeContent) -> dict[str, Optional[str]]:
    """What each kept edge of `graph` carries: "position" for an edge only the positional pass kept, the state or the
    position for an edge out of an embedding (by construction), else what `content` reads (None: nothing tested)."""
    position = {e.name for e in graph.position_edges}
    return {e.name: "position" if e.name in position else BY_CONSTRUCTION.get(e.sender) or content.carries(e.name)
            for e in graph.kept}


def _query_carries_state(graph: CircuitGraph, carried: dict[str, Optional[str]], receiver: str) -> bool:
    return any(carried.get(e.name) == "state" for e in graph.kept_into(receiver, "q"))


def keys_match_lag(content: Optional[EdgeContent], receiver: str, *, unmeasured: bool = True) -> bool:
    """Whether head `receiver`'s keys as a whole carry a lagged state (`EdgeContent.keys`: some lagged variable
    explains at least the cut of what patching its whole key vector does), as an induction head's must;
    `unmeasured` where its keys were not measured (then the K-edges' content decides alone).

    On more than two states the step into a key (x_{j-1}, x_j) and the window count too: they hold the lagged
    state, and the only other reading of step-keyed keys, switch counting, does not exist there (a binary chain's
    shortcut). An induction head whose keys also hold the key's own state (its embedding reaches them beside the
    previous-token head's write) carries the step, not the lag alone; on two states that is ambiguous, on three it
    is not."""
    row = None if content is None else content.keys_of(receiver)
    if row is None:
        return unmeasured
    beyond_binary = content.vocab is not None and content.vocab > 2
    return any((is_lagged(v) or (beyond_binary and v in ("step", "window"))) and x >= content.cut
               for v, x in row.explained.items())


def _into_induction(graph: CircuitGraph, content: EdgeContent, carried: dict[str, Optional[str]], e: Edge) -> bool:
    """Whether kept K-edge `e` is a previous-token -> induction edge: it carries a lagged state (or the step or
    window, which hold one, into keys that match on the lag as a whole: a head that attends to itself and the
    position before), into a head whose query carries the current state and whose keys match on the lag."""
    what = carried[e.name]
    if not _query_carries_state(graph, carried, e.receiver):
        return False
    if is_lagged(what):
        return keys_match_lag(content, e.receiver)
    return what in ("step", "window") and keys_match_lag(content, e.receiver, unmeasured=False)


def _by_content(graph: CircuitGraph, content: EdgeContent, scores: AttentionScores, order: int
                ) -> tuple[list, list, dict, dict, dict]:
    """(K-edges carrying a lagged state into heads whose query carries the current state, the other kept K-edges
    out of heads and MLPs, each previous-token sender's lag profile at lags 1..order + 1, the relays, what each kept
    edge carries). The lags of a head that makes the lag itself are where its attention goes beyond the sink
    (`AttentionScores.lag_excess_beyond_sink`: one head spread over lags 1 and 2 carries one mixed channel, which
    holding one lag at a time cannot show); those of a relay, which attends to itself, are what its strongest
    K-edge carries (the explained fraction of each lag)."""
    carried = edge_carried(graph, content)
    k_edges, others = [], []
    for e in graph.kept:
        if e.input == "k" and e.sender not in BY_CONSTRUCTION:
            (k_edges if _into_induction(graph, content, carried, e) else others).append(e)
    profile, relays = {}, {}
    for sender in dict.fromkeys(e.sender for e in k_edges):
        inputs = graph.kept_into(sender, "mlp" if sender.endswith(".mlp") else "v")
        upstream = tuple(e.sender for e in inputs if e.sender not in BY_CONSTRUCTION and is_lagged(carried[e.name]))
        if upstream:
            relays[sender] = upstream
        comp = Component.parse(sender)
        if upstream or comp.kind != "head":
            top = max((e for e in k_edges if e.sender == sender), key=lambda e: e.strength)
            values = [content[top.name].explained.get(f"lag{lag}", 0.0) for lag in range(1, order + 2)]
        else:
            values = [float(scores.lag_excess_beyond_sink(lag)[comp.layer, comp.head])
                      for lag in range(1, min(order + 1, scores.max_lag) + 1)]
        profile[sender] = tuple(v if v > 0 else 0.0 for v in values)  # NaN and below chance read as 0
    return k_edges, others, profile, relays, carried


def _by_attention(graph: CircuitGraph, scores: AttentionScores, order: int, head_excess: float
                  ) -> tuple[list, list, dict]:
    """(K-edges out of heads whose spread previous-token excess reaches `head_excess`, the other K-edges out of
    heads, each previous-token head's excess at lags 1..order + 1): the reading without edge content."""
    spread = spread_previous_token_excess(scores, order + 1)
    k_edges, others = [], []
    for e in graph.kept:
        if e.input != "k" or "H" not in e.sender:
            continue
        sender = Component.parse(e.sender)
        (k_edges if float(spread[sender.layer, sender.head]) >= head_excess else others).append(e)
    lags = min(order + 1, scores.max_lag)
    profile = {h: tuple(float(scores.lag_excess(lag)[c.layer, c.head]) for lag in range(1, lags + 1))
               for h, c in ((h, Component.parse(h)) for h in dict.fromkeys(e.sender for e in k_edges))}
    return k_edges, others, profile


def switch_counting(graph: CircuitGraph, carried: dict[str, Optional[str]], content: Optional[EdgeContent] = None
                    ) -> tuple[tuple[Component, ...], tuple[Edge, ...]]:
    """(the switch-counting heads, the kept edges carrying switch statistics into them) (module docstring): on two
    states (`vocab`; None: not known, read as two), heads whose query carries the current state, whose keys carry
    the keys' own state (`OWN_STATE`: alone, or with the states before it) and no lagged state alone, and into whose
    keys or values a kept edge from a head or MLP carries switch statistics (or the window: a key's state with the
    states before it holds the switches into it), or, into the values, a lagged state; not a head whose keys as a
    whole match on a lagged state (`keys_match_lag`, where `content` measured them: an induction head)."""
    heads, edges = [], []
    if content is not None and content.vocab not in (None, 2):
        return (), ()
    for receiver in dict.fromkeys(e.receiver for e in graph.kept if e.input in ("q", "k", "v")):
        into = graph.kept_into(receiver)
        keys = [carried.get(e.name) for e in into if e.input == "k"]
        lagged_keys = any(e.input == "k" and e.sender not in BY_CONSTRUCTION and is_lagged(carried.get(e.name))
                          for e in into)
        if lagged_keys or not set(keys) & set(OWN_STATE) or not _query_carries_state(graph, carried, receiver) \
                or keys_match_lag(content, receiver, unmeasured=False):
            continue
        stats = [e for e in into if e.input in ("k", "v") and e.sender not in BY_CONSTRUCTION and (
            carried.get(e.name) in SWITCH_VARIABLES + ("window",) or (e.input == "v" and is_lagged(
                carried.get(e.name))))]
        if stats:
            heads.append(Component.parse(receiver))
            edges += stats
    return tuple(heads), tuple(edges)


def read_circuit(graph: CircuitGraph, scores: AttentionScores, *, order: int, head_excess: float,
                 content: Optional[EdgeContent] = None) -> Circuit:
    """The order-`order` induction circuit in `graph`, and its switch-counting heads (module docstring).

    Args:
        graph: a `discover_circuit` result.
        scores: the attention scores of the same model (previous-token lags up to `order` + 1): the roles'
            supporting evidence, and the reading itself when `content` is None.
        order: the order k of the in-context law the circuit is read for.
        head_excess: the spread previous-token excess a K-edge's sender needs when the roles are read from
            attention (`content` None).
        content: what the kept edges carry (`edge_content` of `graph.kept`): the roles by content.

    Returns:
        A `Circuit`: the kept previous-token -> induction K-edges, the roles, found or not.
    """
    relays, carried, switch, unresolved = {}, {}, ((), ()), ()
    if content is None:
        k_edges, others, profile = _by_attention(graph, scores, order, head_excess)
    else:
        k_edges, others, profile, relays, carried = _by_content(graph, content, scores, order)
        switch = switch_counting(graph, carried, content)
        unresolved = _unresolved(content, k_edges or switch[1], carried)
    spread = spread_previous_token_excess(scores, order + 1)
    prev = tuple(dict.fromkeys(Component.parse(e.sender) for e in k_edges))
    ind = tuple(dict.fromkeys(Component.parse(e.receiver) for e in k_edges))
    ind_grid = scores.induction_excess(min(order, scores.max_order)) if order >= 1 else None
    effect = sum(e.effect for e in k_edges) if k_edges else None
    roles = (
        Role(kind="previous_token", index=order, heads=prev, scores=tuple(
            float(spread[h.layer, h.head]) if h.kind == "head" else math.nan for h in prev),
             effect=effect, confirmed=bool(k_edges)),
        Role(kind="induction", index=order, heads=ind,
             scores=tuple(float(ind_grid[h.layer, h.head]) if ind_grid is not None else math.nan for h in ind),
             effect=effect, confirmed=bool(k_edges)),
    )
    return Circuit(order=order, k_edges=tuple(k_edges), other_k_edges=tuple(others), roles=roles,
                   lag_profile=profile, n_layers=graph.n_layers, found=bool(k_edges), content=content,
                   relays=relays, switch_heads=switch[0], switch_edges=switch[1], carried=carried,
                   unresolved=unresolved)


def _unresolved(content: EdgeContent, deciding: Sequence[Edge], carried: dict[str, Optional[str]]) -> tuple[str, ...]:
    """The edges whose content the reading hinges on and whose bootstrap interval reaches across the cut: every
    edge that names the circuit (`deciding`) when none of them clears the cut with its interval; without such
    edges, every measured kept edge into a head that carries no tested variable while its closest one's interval
    reaches the cut."""
    cut = content.cut
    if deciding:
        low = {e.name: content[e.name].interval[carried[e.name]][0] for e in deciding if e.name in content}
        return tuple(low) if low and all(not x >= cut for x in low.values()) else ()
    return tuple(e.edge for e in content.edges if e.measured and e.carries is None and e.best is not None
                 and e.edge in carried and e.interval[e.best][1] >= cut)


# ---------------------------------------------------------------------------------------- the circuit axis
CIRCUIT_KINDS = ("induction", "switch_counting", "kernel", "state_counting", "none")
FAITHFUL = 0.5  # below this faithfulness the kept edges do not carry the model's behaviour: no circuit is named
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

    `kind`: "induction" (a kept previous-token -> induction K-edge: `reading`), "switch_counting" (no such K-edge,
    and a head keys positions by their own state and reads switch statistics: `reading.switch_heads`), "kernel"
    (the kernel swap finds the prediction in the weights), "state_counting" (kept edges carry the context through
    heads, with neither: counts of states), "none" (no kept edge carries the context). `faithful`: the kept
    circuit's faithfulness is at least `FAITHFUL` (or undefined): below it the kept edges do not carry the model's
    behaviour, and `classify_mechanism` names no circuit.
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
    note: str = ""  # kind "none": why, when the verdict, not the graph, rules the circuit out (a uniform model)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("graph", "reading"):
            raise AttributeError(name)
        return getattr(self.graph, name)

    @property
    def faithful(self) -> bool:
        """The kept circuit's faithfulness is at least `FAITHFUL` (an undefined one, no total effect, counts)."""
        return not self.graph.faithfulness < FAITHFUL

    @property
    def mixed_heads(self) -> tuple[str, ...]:
        """Previous-token heads that spread over more than one lag."""
        return tuple(h for h, lags in self.head_lags.items() if len(lags) > 1)

    def describe(self) -> str:
        """One clause: "induction circuit of order 2: L0H0 (lag 1), L0H1 (lag 2) -> keys of L1H0"."""
        if self.kind == "induction":
            relays = self.reading.relays
            heads = ", ".join(f"{h} (lag{'s' if len(l) > 1 else ''} {', '.join(map(str, l)) or '-'}"
                              + (f", relaying {', '.join(relays[h])})" if h in relays else ")")
                              for h, l in self.head_lags.items())
            into = ", ".join(h.name for h in self.reading.role("induction").heads)
            return f"induction circuit of order {self.order}: {heads} -> keys of {into}"
        if self.kind == "kernel":
            return (f"kernel in the weights (kernel swap: in-context fraction {self.in_context_fraction:.2f}); "
                    f"{len(self.graph.kept)} kept edges")
        if self.kind == "switch_counting":
            heads = ", ".join(h.name for h in self.reading.switch_heads)
            what = ", ".join(f"{e.name} ({self.reading.carried.get(e.name)})" for e in self.reading.switch_edges)
            return f"switch counting: {heads} keys positions by their own state and reads switch statistics: {what}"
        if self.kind == "state_counting":
            heads = ", ".join(self.graph.kept_heads())
            return f"state counting: heads {heads} carry the context, no previous-token -> induction K-edge"
        return f"no circuit: {self.note}" if self.note else "no circuit carries the context (no kept edge from a head)"

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
                          "faithful": self.faithful, "description": self.describe()})


def no_circuit(verdict: CircuitVerdict, why: str) -> CircuitVerdict:
    """`verdict` read as "no circuit" for the reason `why` (the graph stays, for its numbers): a model whose
    prediction ignores its input (the uniform law) runs no circuit, whatever edges the rule kept from a tiny total
    effect."""
    return dataclasses.replace(verdict, kind="none", order=None, lags=(), head_lags={}, note=why)


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
    elif reading.switch_heads and not in_weights:
        kind, order = "switch_counting", 1
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
