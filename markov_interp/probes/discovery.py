"""`discover_circuit`: the circuit of a model found by path patching of the edges of its graph.

Every edge (sender -> receiver input, `paths`) is corrupted on its own and its **effect** is the increase of the
mean next-state loss (nats) over the probe batch, with its standard error over the batch's sequences. Two passes
corrupt two kinds of information: the **token pass** (`corruption`: the tokens of another sequence) and the
**positional pass** (the same tokens read at permuted positions: `positions=True`), so a head that computes
positions used downstream shows its edges, which no token corruption can give it ("pos" is a sender beside
"embed"). An edge out of a sender a pass leaves unchanged (the positions in the token pass, the tokens in the
positional one) has no effect in it, exactly, and is not run.

**Methods.** "exact" measures every edge by path patching (about one forward pass of the batch per edge: a single
edge is measured in one pass, `paths.EdgeRunner`); "attribution" estimates every edge from gradients
(`paths.edge_estimates`: edge attribution patching along the way from the clean to the corrupted run, a few forward
and backward passes in all) and keeps edges by the same rule on the estimates, an **estimate-only** mode for a budget: no edge is measured on
its own and no joint test runs; its only patched runs are the kept set's circuit-only and kept-corrupted ones
(faithfulness, completeness), counted in `CircuitGraph.n_runs` and stated in its summary; "attribution+verify" measures
exactly only what the estimates rank first (`verify`: an unreliable edge, whose gradient at the clean run and
along the way disagree by half, ranks by the larger): the edges into the queries or keys of heads whose softmax is
saturated (where gradients vanish) and the 16 highest, then down the ranking 16 at a time while a block still holds
an edge the kept rule keeps; the estimates never keep an edge. "auto" is "exact" up to `EXACT_UP_TO` edges and
"attribution+verify" above (benchmarks/bench_classify.py: up to there exact costs no more). `max_edges` caps the exact
measurements: "exact" refuses a larger graph, "attribution+verify" verifies at most that many edges per pass (the
kept edges, which the joint tests need measured in every pass, come on top).

**The kept edges** (the circuit) follow one stated rule per pass: an edge is kept when its effect is at least a
threshold t **in absolute value** (an edge whose corruption lowers the loss, half of an over-confident readout split
over two heads, carries as much as one whose corruption raises it; ranked by the signed change, such a circuit kept
none of its value edges and its faithfulness was 0.00), starting at t = max(`min_effect`, `min_fraction` x total effect), the total effect being L(all edges
corrupted) - L(clean); edges that cannot carry anything to the logits are dropped until none is left (an edge
into a node that sends nothing further, or out of a node that receives nothing). When the kept edges alone fall
short (faithfulness below `target_faithfulness`), t is lowered to the next edge's effect, never below
`min_effect`, until they do: redundant copies of a role each cost little when corrupted alone, and this is how
they get in. The circuit is the union of the two passes' kept edges. Unlike ACDC (Conmy et al. 2023), which
removes edges one at a time in a fixed order, the rule reads the single-edge effects, so it does not depend on an
order.

**Joint tests** (`joint=True`), on the kept edges of each pass:

- *pairs*: every pair of kept edges (the `MAX_PAIR_EDGES` strongest) is corrupted together; a pair whose joint
  effect is below `CANCEL_FRACTION` of the larger single effect **cancels** (two heads whose outputs cancel each
  cost much alone and nothing together). Cancelling pairs are joined into sets; a set whose joint effect is below
  the pass's threshold is dropped from the circuit (it carries nothing together) and listed with its joint
  effect (`CircuitGraph.cancelling`, drawn apart in the report), unless the circuit without it is less faithful
  than the target and than with it (the joint effect is read on a clean run; the circuit-only run corrupts all
  else): then it stays, and says why;
- *receivers*: all kept edges into each receiver are corrupted together ("necessary jointly", beside each edge's
  own effect, "necessary alone");
- **faithfulness** = (L_all_corrupted - L_circuit_only) / (L_all_corrupted - L_clean), "circuit only" corrupting
  every edge that is not kept (1: the kept edges alone give the clean loss);
- **completeness** = (L_kept_corrupted - L_clean) / (L_all_corrupted - L_clean), corrupting the kept edges
  alone (1: nothing outside the circuit matters once the circuit is corrupted);
- **minimality**: for every kept edge, how much the loss rises when it is corrupted too, on top of the edges
  already corrupted in the circuit-only run (its own contribution inside the circuit).

**The probe batch.** `discover_circuit(model, source, seed=s)` measures on the first `CIRCUIT_SEQUENCES` sequences
of the probe batch that `classify_mechanism(model, source, seed=s)` draws (`PROBE_SEQUENCES` sequences), and
`classify_mechanism` passes its batch here: the two report the same graph, the same faithfulness, by one
definition.

Corruptions (`CORRUPTIONS`): "resample" (each sequence's corrupted version is another sequence of the batch),
"kernel_swap" (same length, drawn from another kernel: `kernel_swap.swap_plan`), "shuffle" (the sequence's own
states in a random order: its state counts kept, its transitions destroyed); the positional pass permutes each
sequence's positions at random.
"""

import dataclasses
import functools
import math
import sys
from collections.abc import Iterable, Sequence
from typing import Any, Optional

import torch
from torch import Tensor

from markov_interp._threads import one_thread_if_tiny
from markov_interp.config import check_int, check_number
from markov_interp.sources import Source
from markov_interp.models import HookedModel
from markov_interp.probes._common import (
    PROBE_SEQUENCES,
    ProbeBatch,
    Tokens,
    check_source_matches,
    json_safe,
    probe_length,
    sample_batch,
)
from markov_interp.probes._display import ProbeResult, dataframe, displayed
from markov_interp.probes.joint import (
    CANCEL_FRACTION,
    MAX_PAIR_EDGES,
    Cancelling,
    JointTest,
    cancelling_sets,
    prune,
    receiver_groups,
    receiver_tests,
    pairs_to_test,
)
from markov_interp.probes.paths import EdgeKey, EdgeRunner, senders
from markov_interp.probes.verify import (
    CANDIDATE_FRACTION,
    IG_STEPS,
    TOP_CANDIDATES,
    Estimates,
    estimate,
    next_block,
    verify_plan,
)

CORRUPTIONS = ("resample", "kernel_swap", "shuffle")
POSITIONS = "positions"  # the positional pass's corruption
METHODS = ("auto", "exact", "attribution", "attribution+verify")
MIN_EFFECT = 2e-3  # nats: an edge whose corruption costs less is never kept
MIN_FRACTION = 0.04  # of the total effect L(all corrupted) - L(clean)
TARGET_FAITHFULNESS = 0.9  # the threshold is lowered edge by edge until the kept edges reach this
CIRCUIT_SEQUENCES = 16  # path patching runs on this many sequences of the probe batch by default
EXACT_UP_TO = 64  # method "auto": exact path patching up to this many edge measurements (bench_classify)
_MAX_LOWERINGS = 16  # at most this many lowered thresholds are tried (each costs one circuit-only run)
_LEVELS_AT_ONCE = 4  # circuit-only runs of this many thresholds are stacked in one call
_SHOWN_EXCESS = 0.005  # faithfulness this far outside [0, 1] rounds into it on display; further, it is explained
_NO_TOTAL = 1e-6  # nats: below this the corruption changes nothing, and faithfulness is undefined
__all__ = ["CANCEL_FRACTION", "CANDIDATE_FRACTION", "CIRCUIT_SEQUENCES", "CORRUPTIONS", "Cancelling", "CircuitGraph",
           "EXACT_UP_TO", "Edge", "IG_STEPS", "JointTest", "MAX_PAIR_EDGES", "METHODS", "MIN_EFFECT", "MIN_FRACTION",
           "POSITIONS", "PassResult", "TARGET_FAITHFULNESS", "discover_circuit", "faithfulness_text", "kept_edges"]


@displayed(line=lambda e: f"{e.name}: effect {e.effect:+.4f} +- {e.se:.4f} nats, gradient {e.attribution:+.4f}")
@dataclasses.dataclass(frozen=True, kw_only=True)
class Edge:
    """One edge with its path-patching effects: corrupting `sender` where `receiver` reads it through `input`
    raises the mean loss by `effect` nats in the token pass (`se`: its standard error over the batch) and by
    `position_effect` in the positional pass (NaN where that pass did not run it); `attribution` is the gradient
    estimate of `effect` (edge attribution patching). `verified` is False for an edge only estimated (methods
    "attribution" and "attribution+verify"): its `effect` is then the estimate and `se` NaN."""

    sender: str
    receiver: str
    input: str
    effect: float
    se: float
    attribution: float = math.nan
    position_effect: float = math.nan
    position_se: float = math.nan
    verified: bool = True

    @property
    def key(self) -> EdgeKey:
        return EdgeKey(self.sender, self.receiver, self.input)

    @property
    def name(self) -> str:
        return self.key.name

    @property
    def strongest(self) -> float:
        """Its effect in the pass where it is larger in absolute value (signed, nats), NaN-safe: -inf where neither
        pass measured it."""
        values = [v for v in (self.effect, self.position_effect) if v == v]
        return max(values, key=abs) if values else -math.inf

    @property
    def strength(self) -> float:
        """The larger absolute value of its two effects: what the kept rule of its passes reads (an edge whose
        corruption *lowers* the loss carries as much as one that raises it)."""
        return abs(self.strongest)

    def to_dict(self) -> dict[str, Any]:
        return json_safe({**dataclasses.asdict(self), "name": self.name})


@displayed(line=lambda p: f"{p.corruption} pass: total effect {p.total_effect:.4f} nats, {len(p.kept)} edges kept, "
                          f"faithfulness {p.faithfulness:.2f}, completeness {p.completeness:.2f}")
@dataclasses.dataclass(frozen=True, kw_only=True)
class PassResult:
    """One corruption pass over the circuit: its losses (nats), the threshold its rule reached and the edges it
    kept on its own, and the circuit (the union of the passes, less cancelling sets) measured under it."""

    corruption: str
    clean_loss: float
    corrupted_loss: float
    circuit_loss: float  # every edge but the circuit's corrupted
    kept_loss: float  # the circuit's edges corrupted, every other edge clean
    faithfulness: float
    completeness: float
    threshold: float
    start_threshold: float  # before any lowering: max(min_effect, min_fraction x total effect)
    kept: tuple[str, ...]  # what this pass's rule kept on its own
    minimality: dict[str, float]

    @property
    def total_effect(self) -> float:
        return self.corrupted_loss - self.clean_loss

    def to_dict(self) -> dict[str, Any]:
        return json_safe(dataclasses.asdict(self))


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False, repr=False)
class CircuitGraph(ProbeResult):
    """The model's graph with every edge's path-patching effect, and the circuit kept from it (module docstring).

    `nodes`: "embed", "pos", the heads ("L0H1"), the MLPs ("L0.mlp"), "logits". `edges`: every edge, in stage
    order. `kept`: the circuit's edges. The losses, faithfulness, completeness, minimality and threshold at the
    top are the token pass's (`corruption`); `position` holds the positional pass's (None when it did not run).
    `joint`: the receiver tests; `cancelling`: the cancelling sets found (dropped ones are not in `kept`).
    `disagreements`: names of the edges the gradient estimate would keep and patching does not, or the reverse.
    """

    nodes: tuple[str, ...]
    edges: tuple[Edge, ...]
    kept: tuple[Edge, ...]
    corruption: str
    clean_loss: float
    corrupted_loss: float
    circuit_loss: float
    faithfulness: float
    minimality: dict[str, float]
    disagreements: tuple[str, ...]
    threshold: float  # the effect an edge needed in the token pass (nats)
    rule: str
    n_layers: int
    n_sequences: int
    seq_len: int
    seed: int
    completeness: float = math.nan
    position: Optional[PassResult] = None
    joint: tuple[JointTest, ...] = ()
    cancelling: tuple[Cancelling, ...] = ()
    method: str = "exact"
    n_verified: int = 0  # edges measured by exact path patching (both passes)
    n_runs: int = 0  # patched runs of the batch the call made (single edges, circuits, joint tests)
    start_threshold: float = math.nan  # the token pass's threshold before any lowering

    @property
    def total_effect(self) -> float:
        """L(all edges corrupted) - L(clean) in the token pass, nats."""
        return self.corrupted_loss - self.clean_loss

    def edge(self, name: str) -> Edge:
        """The edge called `name` ("L0H0->L1H0.k")."""
        for e in self.edges:
            if e.name == name:
                return e
        raise KeyError(f"no edge {name!r} in this graph")

    @property
    def kept_names(self) -> tuple[str, ...]:
        return tuple(e.name for e in self.kept)

    @property
    def position_edges(self) -> tuple[Edge, ...]:
        """Kept edges that only the positional pass kept (position information: drawn apart in the report)."""
        own = set(self.position.kept) if self.position is not None else set()
        return tuple(e for e in self.kept if e.name in own and not abs(e.effect) >= self.threshold)

    def kept_into(self, receiver: str, input: Optional[str] = None) -> tuple[Edge, ...]:
        """The kept edges into `receiver` (through `input` when given)."""
        return tuple(e for e in self.kept if e.receiver == receiver and (input is None or e.input == input))

    def kept_heads(self) -> tuple[str, ...]:
        """Heads on the circuit (a kept edge in or out), in layer order."""
        heads = {n for e in self.kept for n in (e.sender, e.receiver) if "H" in n}
        return tuple(n for n in self.nodes if n in heads)

    def necessary_alone(self, name: str) -> bool:
        """Whether the edge `name` passes the starting threshold of a pass on its own (a kept edge that does not
        got in when the threshold was lowered: a redundant copy, necessary only jointly with the others)."""
        e = self.edge(name)
        return abs(e.effect) >= self.start_threshold or (self.position is not None
                                                         and abs(e.position_effect) >= self.position.start_threshold)

    def summary(self) -> str:
        """The kept edges with their effects, faithfulness and completeness, and what the joint tests found."""
        kept = ", ".join(f"{e.name} {e.strongest:+.3f}" for e in self.kept) or "no edge"
        text = (f"circuit ({self.corruption} corruption, total effect {self.total_effect:.4f} nats): {kept}; "
                f"faithfulness {faithfulness_text(self.faithfulness)}, completeness {self.completeness:.2f}")
        if self.position is not None:
            text += (f"; positional pass: total effect {self.position.total_effect:.4f} nats, faithfulness "
                     f"{self.position.faithfulness:.2f}")
        dropped = [c for c in self.cancelling if c.dropped]
        if self.cancelling:
            text += "; cancelling: " + "; ".join(c.describe() for c in self.cancelling)
        return text + (f" ({len(dropped)} set(s) dropped)" if dropped else "") + self._estimate_note()

    def _estimate_note(self) -> str:
        """What an estimate-only graph measured, stated wherever it is summarised."""
        if self.method != "attribution":
            return ""
        return (f"; estimate only (method='attribution'): every edge effect is a gradient estimate, none measured "
                f"alone, no joint tests; {self.n_runs} patched runs measured the kept set's faithfulness")

    def to_dataframe(self) -> Any:
        """One row per edge (index its name, strongest first): sender, receiver, input, effect and SE in the token
        pass, effect in the positional pass, the gradient estimate, whether it was verified, kept or not, and the
        kept edge's own contribution inside the circuit (minimality).

        Returns:
            A pandas DataFrame.
        """
        kept = set(self.kept_names)
        rows = sorted(self.edges, key=lambda e: -e.strength)
        return dataframe(({"edge": e.name, "sender": e.sender, "receiver": e.receiver, "input": e.input,
                           "effect": e.effect, "se": e.se, "position_effect": e.position_effect,
                           "attribution": e.attribution, "verified": e.verified, "kept": e.name in kept,
                           "minimality": self.minimality.get(e.name, math.nan)} for e in rows), index="edge")

    def _headline(self) -> str:
        return (("estimate only (method='attribution'): " if self.method == "attribution" else "")
                + f"{len(self.kept)} of {len(self.edges)} edges kept, faithfulness "
                + f"{faithfulness_text(self.faithfulness)}: "
                + (", ".join(e.name for e in self.kept) or "none"))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: every edge with its effects, SE and gradient estimate, the kept edges, the losses, the
        positional pass, the joint tests and cancelling sets."""
        return json_safe({
            "nodes": list(self.nodes), "edges": [e.to_dict() for e in self.edges], "kept": list(self.kept_names),
            "corruption": self.corruption, "clean_loss": self.clean_loss, "corrupted_loss": self.corrupted_loss,
            "circuit_loss": self.circuit_loss, "faithfulness": self.faithfulness, "completeness": self.completeness,
            "minimality": self.minimality, "disagreements": list(self.disagreements), "threshold": self.threshold,
            "rule": self.rule, "n_layers": self.n_layers, "n_sequences": self.n_sequences, "seq_len": self.seq_len,
            "seed": self.seed, "position": None if self.position is None else self.position.to_dict(),
            "joint": [j.to_dict() for j in self.joint], "cancelling": [c.to_dict() for c in self.cancelling],
            "method": self.method, "n_verified": self.n_verified, "n_runs": self.n_runs,
            "start_threshold": self.start_threshold,
        })


# --------------------------------------------------------------------------------------------- corruption
def head_of_batch(batch: ProbeBatch, n: int) -> ProbeBatch:
    """The first `n` sequences of `batch` (all of them when it has fewer)."""
    return dataclasses.replace(batch, tokens=batch.tokens[:n], kernels=batch.kernels[:n],
                               initial=None if batch.initial is None else batch.initial[:n])


def circuit_batch(model: HookedModel, source: Source, *, n_sequences: int, seq_len: Optional[int], seed: int
                  ) -> ProbeBatch:
    """The first `n_sequences` of the probe batch `classify_mechanism` draws with the same seed and length
    (`PROBE_SEQUENCES` sequences; more when `n_sequences` asks for more)."""
    length = probe_length(model, seq_len)
    return head_of_batch(sample_batch(source, n_sequences=max(n_sequences, PROBE_SEQUENCES), seq_len=length,
                                      seed=seed), n_sequences)


def corrupted_tokens(batch: ProbeBatch, source: Source, corruption: str, *, seed: int) -> Tokens:
    """The corrupted version of every sequence of `batch` (module docstring), same shape, seeded."""
    from markov_interp.probes.ablation import derangement

    tokens = batch.tokens
    if corruption == "resample":
        return tokens[derangement(tokens.shape[0], seed=seed).to(tokens.device)]
    if corruption == "shuffle":
        return torch.gather(tokens, 1, permuted_positions(tokens, seed=seed).to(tokens.device))
    if corruption == "kernel_swap":
        from markov_interp.probes.kernel_swap import swap_plan

        plan = swap_plan(source, n_sequences=tokens.shape[0], seq_len=tokens.shape[1], seed=seed)
        return plan.batch.tokens.to(tokens.device)
    raise ValueError(f"corruption must be one of {CORRUPTIONS}, got {corruption!r}")


def permuted_positions(tokens: Tokens, *, seed: int) -> Tensor:
    """A seeded random permutation of the positions 0..pos-1 for every sequence, [batch, pos]."""
    gen = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(tokens.shape[1], generator=gen) for _ in range(tokens.shape[0])])


# ---------------------------------------------------------------------------------------------- kept rule
def kept_edges(effects: dict[EdgeKey, float], threshold: float) -> tuple[EdgeKey, ...]:
    """The edges whose effect is at least `threshold` in absolute value (corrupting an edge can lower the loss: half
    of a split, over-confident readout), then pruned to those on a path embed / pos -> ... -> logits."""
    return prune({e for e, v in effects.items() if abs(v) >= threshold}, tuple(effects))


def _mean_se(values: Tensor) -> tuple[float, float]:
    n = values.shape[0]
    return float(values.mean()), float(values.std() / math.sqrt(n)) if n > 1 else math.nan


def _threshold(total: float, min_effect: float, min_fraction: float) -> float:
    return max(min_effect, min_fraction * total)


def faithfulness_text(value: float, *, short: bool = False) -> str:
    """Faithfulness as the one-liners show it: in [0, 1] as it is; above 1 shown as 1.00 with the excess explained
    (the kept edges alone give a lower loss than the clean run: corrupting the edges left out *helps*, they
    pushed the prediction away from the data), below 0 likewise (`short`: the raw value only).

    >>> faithfulness_text(1.06, short=True)
    '1.00 (raw 1.06)'
    """
    if not -_SHOWN_EXCESS <= value <= 1 + _SHOWN_EXCESS:
        if short:
            return f"{min(max(value, 0.0), 1.0):.2f} (raw {value:.2f})"
    else:
        return f"{min(max(value, 0.0), 1.0):.2f}"
    if value > 1:
        return f"1.00 (raw {value:.2f}: the edges left out raise the loss; without them it is below the clean run's)"
    if value < 0:
        return f"0.00 (raw {value:.2f}: the kept edges alone do worse than all of them corrupted)"
    return f"{value:.2f}"


def _faithfulness(total: float, corrupted: float, circuit: float) -> float:
    return (corrupted - circuit) / total if abs(total) > _NO_TOTAL else math.nan


class _Runs:
    """The patched runs of one call, counted, behind a tqdm bar whose total is planned, not grown run by run: the
    plan of the single-edge measurements is announced before the first run, and the runs of the circuit and its
    tests in one announced step once the kept edges are known (`plan`). A stage that asks for more than its plan
    (a walk down the ranking, a further lowering) grows the total only by what it overruns; the bar closes at the
    runs done. `n` counts the runs whether or not the bar is shown (`CircuitGraph.n_runs`)."""

    def __init__(self, enabled: Optional[bool]):
        from tqdm.auto import tqdm

        watched = sys.stderr.isatty() or "ipykernel" in sys.modules
        self.bar = tqdm(total=0, desc="path patching", unit="run", delay=1.0, leave=False,
                        disable=enabled is False or (enabled is None and not watched))
        self.n = 0
        self.total = 0
        self.totals: list[int] = []  # every total the bar showed, in order (what a reader saw announced)

    @property
    def disable(self) -> bool:
        return self.bar.disable

    def plan(self, runs: int, what: str) -> None:
        """Announce `runs` more patched runs for the stage `what`."""
        self._show(self.n + runs, f"path patching ({what})")

    def _show(self, total: int, desc: Optional[str] = None) -> None:
        self.total = total
        self.totals.append(total)
        self.bar.total = total
        if desc is not None:
            self.bar.set_description_str(desc, refresh=False)
        self.bar.refresh()

    def refresh(self) -> None:
        """Called by `EdgeRunner.run_many` after it set `total` to what it needs: the plan grows only when overrun."""
        if self.total != self.bar.total:
            self._show(max(self.total, self.bar.total or 0))

    def update(self, k: int) -> None:
        self.n += k
        self.bar.update(k)

    def __enter__(self) -> "_Runs":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.n != self.total:
            self._show(self.n)  # the plan was a bound: the bar ends at the runs done
        self.bar.close()


def _progress(enabled: Optional[bool]) -> _Runs:
    """The bar over the patched runs (`_Runs`), shown only for calls that last over a second (`delay`); never
    when `enabled` is False, and by default (None) only where someone watches: a terminal or a notebook, not a
    pipe, a log file or a test's captured stderr."""
    return _Runs(enabled)


# --------------------------------------------------------------------------------------------------- a pass
@dataclasses.dataclass
class _Pass:
    """One corruption pass while it is measured: the runner, the edges it can move, their measured rises of the
    loss ([batch] per verified edge), the estimates, what its rule kept."""

    name: str
    runner: EdgeRunner
    active: tuple[EdgeKey, ...]
    rows: dict[EdgeKey, Tensor] = dataclasses.field(default_factory=dict)
    estimates: Optional[Estimates] = None
    circuits: dict[frozenset, Tensor] = dataclasses.field(default_factory=dict)  # kept set -> circuit-only losses
    keys: tuple[EdgeKey, ...] = ()
    threshold: float = math.inf
    start: float = math.inf

    @functools.cached_property
    def moves(self) -> frozenset:
        """The active edges as a set (membership tests over every edge of a large graph)."""
        return frozenset(self.active)

    @property
    def clean(self) -> Tensor:
        return self.runner.clean_losses

    @property
    def total(self) -> float:
        return float(self.runner.corrupted_losses.mean() - self.clean.mean())

    def effects(self) -> dict[EdgeKey, float]:
        """Measured mean effects (nats) of the verified edges."""
        return {e: float(row.mean()) for e, row in self.rows.items()}

    def measure(self, edges: Sequence[EdgeKey], bar: Any) -> None:
        edges = [e for e in edges if e not in self.rows]
        if edges:
            self.rows.update(zip(edges, self.runner.many_losses([[e] for e in edges], progress=bar) - self.clean))

    def choose(self, rule: tuple, bar: Any) -> Tensor:
        """Keep edges by the rule of the module docstring (measured effects; estimates for "attribution");
        returns the circuit-only losses of the edges kept."""
        min_effect, min_fraction, target = rule
        effects = self.effects() if self.rows or self.estimates is None else dict(self.estimates.mean)
        total, corrupted = self.total, float(self.runner.corrupted_losses.mean())
        start = self.start = _threshold(total, min_effect, min_fraction)
        levels = [start, *sorted({abs(v) for v in effects.values() if min_effect <= abs(v) < start}, reverse=True)]
        chosen = [(t, kept_edges(effects, t)) for t in levels[:_MAX_LOWERINGS + 1]]
        for i, (threshold, keys) in enumerate(chosen):
            if frozenset(keys) not in self.circuits:  # this level and the next few in one stacked run
                ahead = [k for k in dict.fromkeys(frozenset(k) for _, k in chosen[i:i + _LEVELS_AT_ONCE])
                         if k not in self.circuits]
                self.circuits.update(zip(ahead, self.runner.many_losses(
                    [_complement(self.runner, k) for k in ahead], progress=bar)))
            circuit = self.circuits[frozenset(keys)]  # each kept set is run once: the walk re-applies the rule
            if not _faithfulness(total, corrupted, float(circuit.mean())) < target:  # reached, or undefined
                break
        self.keys, self.threshold = keys, threshold
        return circuit


def _complement(runner: EdgeRunner, keys: Iterable[EdgeKey]) -> list[EdgeKey]:
    """Every edge of the runner that is not in `keys` and whose sender varies (the others change nothing)."""
    keep = set(keys)
    return [e for e in runner.edges if e not in keep and runner.varies(e.sender)]


def _measure(p: _Pass, method: str, rule: tuple, max_edges: Optional[int], bar: Any) -> None:
    """Fill the pass's single-edge effects by `method` and apply its kept rule."""
    if method == "exact":
        p.measure(p.active, bar)
        p.choose(rule, bar)
        return
    p.estimates = estimate(p.runner, p.active, min_effect=rule[0])
    if method == "attribution":
        p.choose(rule, bar)
        return
    todo = verify_plan(p.estimates)
    while todo:  # the walk down the ranking (`verify`): a block, the kept rule, the next block
        room = len(todo) if max_edges is None else max(0, max_edges - len(p.rows))
        block = todo[:room]  # never measured: the first block on a fresh pass, `next_block` after
        p.measure(block, bar)
        p.choose(rule, bar)
        if not set(block) & set(p.keys) or (max_edges is not None and len(p.rows) >= max_edges):
            return
        todo = next_block(p.estimates, p.rows)


# ------------------------------------------------------------------------------------------------ discover
@torch.no_grad()
def discover_circuit(
    model: HookedModel,
    source: Source,
    *,
    seq_len: Optional[int] = None,
    n_sequences: int = CIRCUIT_SEQUENCES,
    corruption: str = "resample",
    seed: int = 0,
    batch: Optional[ProbeBatch] = None,
    min_effect: float | int = MIN_EFFECT,
    min_fraction: float | int = MIN_FRACTION,
    target_faithfulness: float | int = TARGET_FAITHFULNESS,
    attribution: bool = True,
    positions: bool = True,
    joint: bool = True,
    method: str = "auto",
    max_edges: Optional[int] = None,
    progress: Optional[bool] = None,
) -> CircuitGraph:
    """Find the circuit of `model` on `source` by path patching (module docstring).

    Args:
        model: a hooked model (`models.build` / `models.load`, or any TransformerLens model).
        source: the data source (`BinaryChain`, `MarkovChain`, `RandomMarkov`) the probe batch comes from.
        seq_len: probe length (default `probe_length(model)`: the training length when known).
        n_sequences: sequences path patching runs on (the SEs are over them): the first of the probe batch.
        corruption: the token pass's corruption, "resample", "kernel_swap" or "shuffle".
        seed: seed of the probe batch and of the corruptions (the same batch as `classify_mechanism`'s).
        batch: a `ProbeBatch` to use instead of the seeded one (its first `n_sequences` sequences).
        min_effect, min_fraction, target_faithfulness: the kept-edge rule (module docstring).
        attribution: also compute the gradient estimate of every edge (edge attribution patching).
        positions: run the positional pass too (position information and the heads that compute it).
        joint: test the kept edges jointly (cancelling pairs and sets, receivers).
        method: "exact", "attribution", "attribution+verify" or "auto" (exact up to `EXACT_UP_TO` edges).
        max_edges: at most this many single edges measured by path patching per pass (None: no cap): "exact"
            refuses a larger graph, "attribution+verify" verifies at most that many (plus the kept edges).
        progress: a tqdm bar for calls that last over a second (True; None: only on a terminal or in a notebook),
            or none (False).

    Returns:
        A `CircuitGraph`: every edge's effects and SE, the kept edges, faithfulness, completeness, minimality,
        joint tests and cancelling sets.

    >>> discover_circuit(model, source, n_sequences=16).kept_names[3:]  # a hand-built induction circuit
    ('embed->L1H0.q', 'pos->L1H0.k', 'L0H0->L1H0.k', 'embed->L1H0.v', 'L1H0->logits')
    """
    with one_thread_if_tiny(model):  # tiny models: one CPU thread (markov_interp.set_threads)
        return _discover(model, source, seq_len=seq_len, n_sequences=n_sequences, corruption=corruption, seed=seed,
                         batch=batch, rule=(min_effect, min_fraction, target_faithfulness),
                         flags=(attribution, positions, joint), method=method, max_edges=max_edges, progress=progress)


def _discover(model: HookedModel, source: Source, *, seq_len: Optional[int], n_sequences: int, corruption: str,
              seed: int, batch: Optional[ProbeBatch], rule: tuple, flags: tuple, method: str,
              max_edges: Optional[int], progress: Optional[bool]) -> CircuitGraph:
    """`discover_circuit`'s work (its arguments, the kept rule and the flags as tuples)."""
    (min_effect, min_fraction, target_faithfulness), (attribution, positions, joint) = rule, flags
    check_source_matches(model, source)
    method = _check(corruption=corruption, method=method, max_edges=max_edges, n_sequences=n_sequences,
                    rule=(min_effect, min_fraction, target_faithfulness), flags=(attribution, positions, joint))
    batch = (circuit_batch(model, source, n_sequences=n_sequences, seq_len=seq_len, seed=seed) if batch is None
             else head_of_batch(batch, n_sequences))
    passes = _passes(model, source, batch, corruption=corruption, seed=seed, positions=positions)
    method = _resolve_method(method, sum(len(p.active) for p in passes), max_edges)
    rule = (float(min_effect), float(min_fraction), float(target_faithfulness))
    with _progress(progress) as bar:
        bar.plan(sum(_first_plan(p, method, max_edges) for p in passes), "single edges")
        for p in passes:
            _measure(p, method, rule, max_edges, bar)
        return _graph(passes, rule=rule, seed=seed, method=method, attribution=attribution,
                      joint=joint and method != "attribution", bar=bar)


def _first_plan(p: _Pass, method: str, max_edges: Optional[int]) -> int:
    """The patched runs a pass plans before its first: its single edges (all of them for "exact"; the first block
    for "attribution+verify"; none for "attribution") and the circuit-only runs of the first thresholds."""
    single = {"exact": len(p.active), "attribution": 0,
              "attribution+verify": min(len(p.active), TOP_CANDIDATES, max_edges or len(p.active))}[method]
    return single + _LEVELS_AT_ONCE


def _circuit_plan(passes: list[_Pass], union: Sequence[EdgeKey], *, joint: bool, exact: bool) -> int:
    """The patched runs of the circuit and its tests, once the kept edges `union` are known: the kept edges not
    measured yet, the cancelling pairs, the circuit-only, kept-corrupted and minimality runs of every pass, the
    receiver tests (a cancelling set found, or a lowering, adds to it)."""
    runs = 0
    for p in passes:
        mine = [e for e in union if e in p.moves]
        runs += (sum(e not in p.rows for e in mine) if exact else 0) + 2 + (len(mine) if exact else 0)
        runs += len(pairs_to_test(mine, p.effects())) if joint else 0
    token = passes[0].runner
    return runs + (len(receiver_groups([e for e in union if token.varies(e.sender)])) if joint else 0)


def _passes(model: HookedModel, source: Source, batch: ProbeBatch, *, corruption: str, seed: int,
            positions: bool) -> list[_Pass]:
    """The token pass (`corruption`) and, when asked and the model has a positional sender, the positional pass
    (permuted positions), each with its active edges: those whose sender varies under the corruption."""
    runners = [(corruption, EdgeRunner(model, batch.tokens, corrupted_tokens(batch, source, corruption, seed=seed)))]
    if positions and any(s.kind == "pos" for s in senders(model)):
        runners.append((POSITIONS, EdgeRunner(model, batch.tokens, corrupted_positions=permuted_positions(
            batch.tokens, seed=seed + 1))))
    return [_Pass(name, runner, tuple(e for e in runner.edges if runner.varies(e.sender))) for name, runner in runners]


def _resolve_method(method: str, n_active: int, max_edges: Optional[int]) -> str:
    """The method to run: "auto" becomes "exact" up to `EXACT_UP_TO` active edges, else "attribution+verify";
    "exact" over `max_edges` edges is refused."""
    if method == "auto":
        method = "exact" if n_active <= EXACT_UP_TO else "attribution+verify"
    if method == "exact" and max_edges is not None and n_active > max_edges:
        raise ValueError(f"method='exact' would measure {n_active} edges, more than max_edges={max_edges}; use "
                         "method='attribution+verify' (or a larger max_edges)")
    return method


def _check(*, corruption: str, method: str, max_edges: Any, n_sequences: Any, rule: tuple, flags: tuple) -> str:
    if corruption not in CORRUPTIONS:
        raise ValueError(f"corruption must be one of {CORRUPTIONS}, got {corruption!r}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    for name, value in zip(("min_effect", "min_fraction", "target_faithfulness"), rule):
        check_number(name, value, minimum=0, finite=False)
    check_int("max_edges", max_edges, minimum=1, none_ok=True)
    check_int("n_sequences", n_sequences, minimum=2)
    for name, value in zip(("attribution", "positions", "joint"), flags):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False, got {value!r}")
    return method


def _graph(passes: list[_Pass], *, rule: tuple, seed: int, method: str, attribution: bool, joint: bool,
           bar: Any) -> CircuitGraph:
    """The circuit (the union of the passes' kept edges, less cancelling sets) measured under every pass."""
    token = passes[0]
    runner = token.runner
    union = prune({e for p in passes for e in p.keys}, runner.edges)
    exact = method != "attribution"  # "attribution" estimates only: no edge is measured on its own
    bar.plan(_circuit_plan(passes, union, joint=joint, exact=exact), "circuit and joint tests")
    for p in passes:  # every kept edge is measured exactly, whatever the method but estimates only
        if exact:
            p.measure([e for e in union if e in p.moves], bar)
    union, cancelling = _drop_cancelling(passes, union, rule[2], bar) if joint else (union, [])
    results = [_evaluate(p, union, bar, minimality=exact) for p in passes]
    grads = token.estimates.first if token.estimates is not None else None
    if attribution and grads is None:
        grads = estimate(runner, token.active, steps=1).first
    edges = _edges(passes, grads or {})
    rows = token.effects()
    by_grad = set(kept_edges({e: grads.get(e, 0.0) for e in token.active}, token.threshold)) if grads else set()
    keys = set(token.keys)
    disagree = tuple(e.name for e in token.active if e in rows and (e in by_grad) != (e in keys)) \
        if grads else ()
    tests = receiver_tests(runner, [e for e in union if runner.varies(e.sender)], rows, progress=bar) if joint else ()
    model, main, kept = runner.model, results[0], set(union)
    return CircuitGraph(
        nodes=tuple(s.name for s in senders(model)) + ("logits",), edges=edges,
        kept=tuple(e for e in edges if e.key in kept), corruption=token.name, clean_loss=main.clean_loss,
        corrupted_loss=main.corrupted_loss, circuit_loss=main.circuit_loss, faithfulness=main.faithfulness,
        minimality=main.minimality, disagreements=disagree, threshold=token.threshold,
        rule=_rule_text(rule, token.threshold, token.total), n_layers=int(model.cfg.n_layers),
        n_sequences=int(runner.tokens.shape[0]), seq_len=int(runner.tokens.shape[1]), seed=seed,
        completeness=main.completeness, position=results[1] if len(results) > 1 else None, joint=tuple(tests),
        cancelling=tuple(cancelling), method=method, n_verified=sum(len(p.rows) for p in passes),
        start_threshold=token.start, n_runs=bar.n,
    )


def _drop_cancelling(passes: list[_Pass], union: Sequence[EdgeKey], target: float, bar: Any
                     ) -> tuple[Sequence[EdgeKey], list[Cancelling]]:
    """`union` less the cancelling sets whose joint effect is below their pass's threshold, and every cancelling
    set found (module docstring). A pass's dropped sets stay in the circuit when the circuit without them is less
    faithful in the token pass than `target` and than with them: their joint effect is measured from the clean run,
    but the circuit-only run corrupts everything else, and there such a pair can carry the behaviour (two query
    edges whose corruption together costs nothing on a clean run took a trained model's faithfulness from 1.03 to
    -0.07)."""
    runner, cancelling = passes[0].runner, []
    by_name = {e.name: e for e in runner.edges}
    total, corrupted = passes[0].total, float(runner.corrupted_losses.mean())
    for p in passes:
        found = cancelling_sets(p.runner, [e for e in union if e in p.moves], p.effects(), p.threshold,
                                corruption=p.name, progress=bar)
        dropped = prune(set(union) - {by_name[n] for c in found if c.dropped for n in c.edges}, runner.edges)
        if len(dropped) < len(union):
            without, with_ = (_faithfulness(total, corrupted, float(row.mean())) for row in runner.many_losses(
                [_complement(runner, dropped), _complement(runner, union)], progress=bar))
            if without < min(target, with_):
                note = f"without them the circuit's faithfulness is {without:.2f}, with them {with_:.2f}"
                found = [dataclasses.replace(c, dropped=False, kept_note=note) if c.dropped else c for c in found]
                dropped = union
        cancelling += found
        union = dropped
    return union, cancelling


def _evaluate(p: _Pass, union: Sequence[EdgeKey], bar: Any, *, minimality: bool = True) -> PassResult:
    """The circuit `union` under pass `p`: circuit-only and kept-corrupted losses, minimality (when asked)."""
    runner = p.runner
    mine = [e for e in union if runner.varies(e.sender)]
    base = _complement(runner, union)
    sets = [base, mine] + ([base + [e] for e in mine] if minimality else [])
    losses = runner.many_losses(sets, progress=bar)
    circuit, kept = losses[0], losses[1]
    clean, corrupted = float(p.clean.mean()), float(runner.corrupted_losses.mean())
    total = corrupted - clean
    return PassResult(
        corruption=p.name, clean_loss=clean, corrupted_loss=corrupted, circuit_loss=float(circuit.mean()),
        kept_loss=float(kept.mean()), faithfulness=_faithfulness(total, corrupted, float(circuit.mean())),
        completeness=(float(kept.mean()) - clean) / total if abs(total) > _NO_TOTAL else math.nan,
        threshold=p.threshold, start_threshold=p.start, kept=tuple(e.name for e in p.keys),
        minimality={e.name: float((row - circuit).mean()) for e, row in zip(mine, losses[2:])},
    )


def _edges(passes: list[_Pass], grads: dict[EdgeKey, float]) -> tuple[Edge, ...]:
    """Every edge with its effects in each pass (measured, or the estimate where it was not verified)."""
    token, position = passes[0], (passes[1] if len(passes) > 1 else None)

    def stats(p: Optional[_Pass], e: EdgeKey) -> tuple[float, float, bool]:
        if p is None:
            return math.nan, math.nan, True
        if e in p.rows:
            return (*_mean_se(p.rows[e]), True)
        if e not in p.moves:
            return 0.0, 0.0, True  # its sender is the same in both runs of the pass: no effect, exactly
        return (p.estimates.mean.get(e, math.nan) if p.estimates is not None else math.nan), math.nan, False

    out = []
    for e in token.runner.edges:
        effect, se, ok = stats(token, e)
        pos_effect, pos_se, pos_ok = stats(position, e)
        out.append(Edge(sender=e.sender, receiver=e.receiver, input=e.input, effect=effect, se=se,
                        attribution=grads.get(e, math.nan), position_effect=pos_effect, position_se=pos_se,
                        verified=ok and pos_ok))
    return tuple(out)


def _rule_text(rule: tuple, threshold: float, total: float) -> str:
    min_effect, min_fraction, target = rule
    return (f"kept: |effect| >= {threshold:.4f} nats (from max({min_effect:g}, {min_fraction:g} x total effect "
            f"{total:.4f}), lowered edge by edge while faithfulness < {target:g}), on a path embed/pos -> logits, "
            f"in each pass; cancelling sets dropped")
