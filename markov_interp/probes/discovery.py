"""`discover_circuit`: the circuit of a model found by exhaustive path patching of every edge of its graph.

Every edge (sender -> receiver input, `paths`) is corrupted on its own and its **effect** is the increase of the
mean next-state loss (nats) over the probe batch, with its standard error over the batch's sequences. These graphs
have tens of edges (a two-layer model with one head per layer has 12), so every edge is measured exactly rather
than approximated; the gradient approximation (edge attribution patching, `paths.edge_attributions`) is computed
beside it and the edges where the two would decide differently are listed (`CircuitGraph.disagreements`).

**The kept edges** (the circuit) follow one stated rule: an edge is kept when its effect is at least a threshold
t, starting at t = max(`min_effect`, `min_fraction` x total effect), the total effect being L(all edges
corrupted) - L(clean); edges that cannot carry anything to the logits are dropped until none is left (an edge
into a node that sends nothing further, or out of a node that receives nothing; the embedding and the logits are
the two ends). When the kept edges alone fall short (faithfulness below `target_faithfulness`), t is lowered to
the next edge's effect, never below `min_effect`, until they do: redundant copies of a role (two heads that each
carry half of it) each cost little when corrupted alone, and this is how they get in. Unlike ACDC (Conmy et al.
2023), which removes edges one at a time in a fixed order and measures each against the edges removed so far,
the rule reads the exhaustive single-edge effects, so it does not depend on an order; whether the kept edges
together carry the model's behaviour is then measured, not assumed:

- **faithfulness** = (L_all_corrupted - L_circuit_only) / (L_all_corrupted - L_clean), where "circuit only"
  corrupts every edge that is not kept (1: the kept edges alone give the clean loss; 0: they give nothing);
- **minimality**: for every kept edge, how much the loss rises when it is corrupted too, on top of the edges
  already corrupted (its own contribution inside the circuit; about 0 for an edge the circuit does not need).

Corruptions (`CORRUPTIONS`): "resample" (each sequence's corrupted version is another sequence of the batch),
"kernel_swap" (same length, drawn from another kernel: `kernel_swap.swap_plan`), "shuffle" (the sequence's own
states in a random order: its state counts kept, its transitions destroyed).
"""

import dataclasses
import math
from typing import Any, Optional

import torch
from torch import Tensor

from markov_interp.data import Source
from markov_interp.models import HookedModel
from markov_interp.probes._common import (
    ProbeBatch,
    Tokens,
    check_source_matches,
    json_safe,
    probe_length,
    sample_batch,
)
from markov_interp.probes._display import ProbeResult, dataframe, displayed
from markov_interp.probes.paths import EdgeKey, EdgeRunner, edge_attributions, senders

CORRUPTIONS = ("resample", "kernel_swap", "shuffle")
MIN_EFFECT = 2e-3  # nats: an edge whose corruption costs less is never kept
MIN_FRACTION = 0.04  # of the total effect L(all corrupted) - L(clean)
TARGET_FAITHFULNESS = 0.9  # the threshold is lowered edge by edge until the kept edges reach this
_MAX_LOWERINGS = 16  # at most this many lowered thresholds are tried (each costs one circuit-only run)
_NO_TOTAL = 1e-6  # nats: below this the corruption changes nothing, and faithfulness is undefined


@displayed(line=lambda e: f"{e.name}: effect {e.effect:+.4f} +- {e.se:.4f} nats, gradient {e.attribution:+.4f}")
@dataclasses.dataclass(frozen=True, kw_only=True)
class Edge:
    """One edge with its path-patching effect: corrupting `sender` where `receiver` reads it through `input`
    raises the mean loss by `effect` nats (`se`: its standard error over the batch); `attribution` is the
    gradient estimate of the same number (edge attribution patching)."""

    sender: str
    receiver: str
    input: str
    effect: float
    se: float
    attribution: float = math.nan

    @property
    def key(self) -> EdgeKey:
        return EdgeKey(self.sender, self.receiver, self.input)

    @property
    def name(self) -> str:
        return self.key.name

    def to_dict(self) -> dict[str, Any]:
        return json_safe({**dataclasses.asdict(self), "name": self.name})


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False, repr=False)
class CircuitGraph(ProbeResult):
    """The model's graph with every edge's path-patching effect, and the circuit kept from it (module docstring).

    `nodes`: "embed", the heads ("L0H1"), the MLPs ("L0.mlp"), "logits". `edges`: every edge, in stage order.
    `kept`: the circuit's edges. Losses in nats on the probe batch: `clean_loss`, `corrupted_loss` (every edge
    corrupted: the corrupted run) and `circuit_loss` (every edge but the kept ones corrupted). `minimality[name]`:
    loss increase when that kept edge is corrupted on top of the others. `disagreements`: names of the edges the
    gradient estimate would keep and exhaustive patching does not, or the reverse.
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
    threshold: float  # the effect an edge needed (nats)
    rule: str
    n_layers: int
    n_sequences: int
    seq_len: int
    seed: int

    @property
    def total_effect(self) -> float:
        """L(all edges corrupted) - L(clean), nats."""
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

    def kept_into(self, receiver: str, input: Optional[str] = None) -> tuple[Edge, ...]:
        """The kept edges into `receiver` (through `input` when given)."""
        return tuple(e for e in self.kept if e.receiver == receiver and (input is None or e.input == input))

    def kept_heads(self) -> tuple[str, ...]:
        """Heads on the circuit (a kept edge in or out), in layer order."""
        heads = {n for e in self.kept for n in (e.sender, e.receiver) if "H" in n}
        return tuple(n for n in self.nodes if n in heads)

    def summary(self) -> str:
        """One sentence: the kept edges with their effects, and faithfulness."""
        kept = ", ".join(f"{e.name} {e.effect:+.3f}" for e in self.kept) or "no edge"
        return (f"circuit ({self.corruption} corruption, total effect {self.total_effect:.4f} nats): {kept}; "
                f"faithfulness {self.faithfulness:.2f}")

    def to_dataframe(self) -> Any:
        """One row per edge (index its name, strongest first): sender, receiver, input, effect and SE (nats), the
        gradient estimate, kept or not, and the kept edge's own contribution inside the circuit (minimality).

        Returns:
            A pandas DataFrame.
        """
        kept = set(self.kept_names)
        rows = sorted(self.edges, key=lambda e: -e.effect)
        return dataframe(({"edge": e.name, "sender": e.sender, "receiver": e.receiver, "input": e.input,
                           "effect": e.effect, "se": e.se, "attribution": e.attribution, "kept": e.name in kept,
                           "minimality": self.minimality.get(e.name, math.nan)} for e in rows), index="edge")

    def _headline(self) -> str:
        return (f"{len(self.kept)} of {len(self.edges)} edges kept, faithfulness {self.faithfulness:.2f}: "
                + (", ".join(e.name for e in self.kept) or "none"))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: every edge with its effect, SE and gradient estimate, the kept edges, the losses."""
        return json_safe({
            "nodes": list(self.nodes), "edges": [e.to_dict() for e in self.edges], "kept": list(self.kept_names),
            "corruption": self.corruption, "clean_loss": self.clean_loss, "corrupted_loss": self.corrupted_loss,
            "circuit_loss": self.circuit_loss, "faithfulness": self.faithfulness, "minimality": self.minimality,
            "disagreements": list(self.disagreements), "threshold": self.threshold, "rule": self.rule,
            "n_layers": self.n_layers, "n_sequences": self.n_sequences, "seq_len": self.seq_len, "seed": self.seed,
        })


# --------------------------------------------------------------------------------------------- corruption
def head_of_batch(batch: ProbeBatch, n: int) -> ProbeBatch:
    """The first `n` sequences of `batch` (all of them when it has fewer)."""
    return dataclasses.replace(batch, tokens=batch.tokens[:n], kernels=batch.kernels[:n],
                               initial=None if batch.initial is None else batch.initial[:n])


def corrupted_tokens(batch: ProbeBatch, source: Source, corruption: str, *, seed: int) -> Tokens:
    """The corrupted version of every sequence of `batch` (module docstring), same shape, seeded."""
    from markov_interp.probes.ablation import derangement

    tokens = batch.tokens
    if corruption == "resample":
        return tokens[derangement(tokens.shape[0], seed=seed).to(tokens.device)]
    if corruption == "shuffle":
        gen = torch.Generator().manual_seed(seed)
        order = torch.stack([torch.randperm(tokens.shape[1], generator=gen) for _ in range(tokens.shape[0])])
        return torch.gather(tokens, 1, order.to(tokens.device))
    if corruption == "kernel_swap":
        from markov_interp.probes.kernel_swap import swap_plan

        plan = swap_plan(source, n_sequences=tokens.shape[0], seq_len=tokens.shape[1], seed=seed)
        return plan.batch.tokens.to(tokens.device)
    raise ValueError(f"corruption must be one of {CORRUPTIONS}, got {corruption!r}")


# ---------------------------------------------------------------------------------------------- kept rule
def kept_edges(effects: dict[EdgeKey, float], threshold: float) -> tuple[EdgeKey, ...]:
    """The edges whose effect is >= `threshold`, then pruned to those on a path embed -> ... -> logits."""
    kept = {e for e, v in effects.items() if v >= threshold}
    while True:
        sends = {e.sender for e in kept}
        gets = {e.receiver for e in kept}
        dead = {e for e in kept if (e.receiver != "logits" and e.receiver not in sends)
                or (e.sender != "embed" and e.sender not in gets)}
        if not dead:
            return tuple(e for e in effects if e in kept)
        kept -= dead


def _mean_se(values: Tensor) -> tuple[float, float]:
    n = values.shape[0]
    return float(values.mean()), float(values.std() / math.sqrt(n)) if n > 1 else math.nan


def _threshold(total: float, min_effect: float, min_fraction: float) -> float:
    return max(min_effect, min_fraction * total)


# ------------------------------------------------------------------------------------------------ discover
@torch.no_grad()
def discover_circuit(
    model: HookedModel,
    source: Source,
    *,
    seq_len: Optional[int] = None,
    n_sequences: int = 32,
    corruption: str = "resample",
    seed: int = 0,
    batch: Optional[ProbeBatch] = None,
    min_effect: float | int = MIN_EFFECT,
    min_fraction: float | int = MIN_FRACTION,
    target_faithfulness: float | int = TARGET_FAITHFULNESS,
    attribution: bool = True,
) -> CircuitGraph:
    """Find the circuit of `model` on `source` by exhaustive path patching (module docstring).

    Args:
        model: a hooked model (`models.build` / `models.load`, or any TransformerLens model).
        source: the data source (`BinaryChain`, `MarkovChain`, `RandomMarkov`) the probe batch comes from.
        seq_len: probe length (default `probe_length(model)`: the training length when known).
        n_sequences: probe sequences (the SEs are over them).
        corruption: "resample", "kernel_swap" or "shuffle".
        seed: seed of the probe batch and of the corruption.
        batch: a `ProbeBatch` to use instead of a fresh one (its first `n_sequences` sequences).
        min_effect, min_fraction, target_faithfulness: the kept-edge rule (module docstring).
        attribution: also compute the gradient estimate of every edge (edge attribution patching).

    Returns:
        A `CircuitGraph`: every edge's effect (nats) and SE, the kept edges, faithfulness and minimality.

    >>> # graph = discover_circuit(model, RandomMarkov(3)); graph.kept_names
    >>> # ('embed->L0H0.v', 'L0H0->L1H0.k', 'embed->L1H0.q', 'embed->L1H0.v', 'L1H0->logits')
    """
    check_source_matches(model, source)
    if corruption not in CORRUPTIONS:
        raise ValueError(f"corruption must be one of {CORRUPTIONS}, got {corruption!r}")
    for name, value in (("min_effect", min_effect), ("min_fraction", min_fraction),
                        ("target_faithfulness", target_faithfulness)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise ValueError(f"{name} must be a number >= 0, got {value!r}")
    if isinstance(n_sequences, bool) or not isinstance(n_sequences, int) or n_sequences < 2:
        raise ValueError(f"n_sequences must be an integer >= 2, got {n_sequences!r}")
    if batch is None:
        batch = sample_batch(source, n_sequences=n_sequences, seq_len=probe_length(model, seq_len), seed=seed)
    else:
        batch = head_of_batch(batch, n_sequences)
    runner = EdgeRunner(model, batch.tokens, corrupted_tokens(batch, source, corruption, seed=seed))
    return _graph(runner, corruption=corruption, seed=seed, rule=(min_effect, min_fraction, target_faithfulness),
                  attribution=attribution)


def _faithfulness(total: float, corrupted: float, circuit: float) -> float:
    return (corrupted - circuit) / total if abs(total) > _NO_TOTAL else math.nan


def _choose(runner: EdgeRunner, effects: dict[EdgeKey, float], total: float, rule: tuple) -> tuple:
    """(kept edges, threshold, circuit-only losses) by the rule of the module docstring."""
    min_effect, min_fraction, target = rule
    corrupted = float(runner.corrupted_losses.mean())
    start = _threshold(total, min_effect, min_fraction)
    levels = [start, *sorted({v for v in effects.values() if min_effect <= v < start}, reverse=True)]
    chosen = [(t, kept_edges(effects, t)) for t in levels[:_MAX_LOWERINGS + 1]]
    circuits = runner.many_losses([[e for e in runner.edges if e not in set(keys)] for _, keys in chosen])
    for (threshold, keys), circuit in zip(chosen, circuits):
        if not _faithfulness(total, corrupted, float(circuit.mean())) < target:  # reached, or undefined
            break
    return keys, threshold, circuit


def _graph(runner: EdgeRunner, *, corruption: str, seed: int, rule: tuple, attribution: bool) -> CircuitGraph:
    clean = runner.clean_losses
    single = runner.many_losses([[e] for e in runner.edges]) - clean  # every edge alone: [edge, batch]
    stats = {e: _mean_se(row) for e, row in zip(runner.edges, single)}
    grads = edge_attributions(runner) if attribution else {}
    edges = tuple(Edge(sender=e.sender, receiver=e.receiver, input=e.input, effect=m, se=s,
                       attribution=grads.get(e, math.nan)) for e, (m, s) in stats.items())
    clean_loss, corrupted_loss = float(clean.mean()), float(runner.corrupted_losses.mean())
    total = corrupted_loss - clean_loss
    keys, threshold, circuit = _choose(runner, {e: m for e, (m, _) in stats.items()}, total, rule)
    dropped = [e for e in runner.edges if e not in set(keys)]
    more = runner.many_losses([dropped + [e] for e in keys]) if keys else []
    minimality = {e.name: float((row - circuit).mean()) for e, row in zip(keys, more)}
    circuit_loss = float(circuit.mean())
    faithful = _faithfulness(total, corrupted_loss, circuit_loss)
    disagree = ()
    if attribution:
        by_grad = set(kept_edges(grads, threshold))
        disagree = tuple(e.name for e in runner.edges if (e in by_grad) != (e in set(keys)))
    model = runner.model
    nodes = tuple(s.name for s in senders(model)) + ("logits",)
    min_effect, min_fraction, target = rule
    rule_text = (f"kept: effect >= {threshold:.4f} nats (from max({min_effect:g}, {min_fraction:g} x total effect "
                 f"{total:.4f}), lowered edge by edge while faithfulness < {target:g}), on a path embed -> logits")
    return CircuitGraph(
        nodes=nodes, edges=edges, kept=tuple(e for e in edges if e.key in set(keys)), corruption=corruption,
        clean_loss=clean_loss, corrupted_loss=corrupted_loss, circuit_loss=circuit_loss, faithfulness=faithful,
        minimality=minimality, disagreements=disagree, threshold=threshold, rule=rule_text,
        n_layers=int(model.cfg.n_layers), n_sequences=int(runner.tokens.shape[0]),
        seq_len=int(runner.tokens.shape[1]), seed=seed,
    )
