"""Joint causal tests of a circuit's kept edges: pairs that cancel, receivers' edges together, dead-edge pruning.

Single-edge effects miss two kinds of structure. Two heads whose outputs cancel each cost much when corrupted
alone, yet corrupting both costs nothing: they are not part of what the model computes. And a role split over
redundant copies costs little edge by edge, yet everything at once. `discovery.discover_circuit` runs these tests
on the kept edges of each pass:

- `cancelling_sets`: every pair of kept edges into the same receiver (among the `MAX_PAIR_EDGES` strongest; not
  the two sides of one head's query-key match, `_one_match`) is corrupted together; a pair whose joint effect is
  within `CANCEL_FRACTION` of the larger of its two single effects of 0 cancels (a joint effect far below 0 is no
  cancelling: an over-confident model can gain from losing a whole role, as a hand-built circuit with its role
  split over two heads does at unembedding scale 8). Two paths whose contributions cancel
  meet at some receiver, so testing the pairs that share one finds them (pairs of every two kept edges cost
  quadratically more and found nothing more on the hand-built circuits). Cancelling pairs that share an edge form
  one set; the set is corrupted together, and when that costs (in absolute value) less than the pass's threshold it
  is dropped from
  the circuit (`Cancelling.dropped`), and with it what only fed it (dead-edge pruning): it carries nothing
  jointly;
- `receiver_tests`: the kept edges into each receiver corrupted together ("necessary jointly"), beside the sum of
  their single effects ("necessary alone").

Effects are rises of the mean next-state loss (nats) over the runner's batch with their standard errors.
"""

import dataclasses
import itertools
import math
from collections.abc import Iterable, Sequence
from typing import Any

from markov_interp._display import displayed
from markov_interp.probes._common import json_safe
from markov_interp.probes.paths import EdgeKey, EdgeRunner

__all__ = ["Cancelling", "JointTest"]

CANCEL_FRACTION = 0.25  # a pair cancels when corrupting both costs less than this share of the larger alone
MAX_PAIR_EDGES = 24  # pairs are tested among at most this many kept edges (the strongest): 276 pairs


@displayed(line=lambda j: f"{j.receiver}: {len(j.edges)} kept edges together {j.effect:+.4f} +- {j.se:.4f} nats, "
                          f"alone {sum(j.alone):+.4f} summed")
@dataclasses.dataclass(frozen=True, kw_only=True)
class JointTest:
    """The kept edges into `receiver`, corrupted together: `effect` nats (SE `se`), against each edge's own
    effect (`alone`, same order as `edges`)."""

    receiver: str
    edges: tuple[str, ...]
    effect: float
    se: float
    alone: tuple[float, ...]

    def to_dict(self) -> dict[str, Any]:
        return json_safe(dataclasses.asdict(self))


@displayed(line=lambda c: c.describe())
@dataclasses.dataclass(frozen=True, kw_only=True)
class Cancelling:
    """A set of kept edges whose pairs cancel: each costs `alone` nats corrupted on its own, all together `effect`
    (SE `se`) under the pass `corruption`; `dropped` when that is below the pass's threshold (then the edges are
    not in the circuit), unless the circuit without them is less faithful (`discovery`: then `kept_note` says
    by how much, and the set stays)."""

    edges: tuple[str, ...]
    effect: float
    se: float
    alone: tuple[float, ...]
    corruption: str
    dropped: bool
    kept_note: str = ""  # why a set below the threshold stays in the circuit (`discovery`: dropping it cost faithfulness)

    def describe(self) -> str:
        """"L0H0->logits +0.612, L0H1->logits +0.598 alone; +0.000 together (dropped)"."""
        alone = ", ".join(f"{n} {v:+.3f}" for n, v in zip(self.edges, self.alone))
        return f"{alone} alone; {self.effect:+.3f} together" + (" (dropped)" if self.dropped else "") + (
            f" (kept: {self.kept_note})" if self.kept_note else "")

    def to_dict(self) -> dict[str, Any]:
        return json_safe({**dataclasses.asdict(self), "description": self.describe()})


def prune(kept: Iterable[EdgeKey], order: Sequence[EdgeKey]) -> tuple[EdgeKey, ...]:
    """`kept` without the edges that reach nothing (into a node that sends nothing on, or out of a node that
    receives nothing; "embed", "pos" and "logits" are the ends), repeated until none is left; in `order`."""
    kept = set(kept)
    while True:
        sends = {e.sender for e in kept}
        gets = {e.receiver for e in kept}
        dead = {e for e in kept if (e.receiver != "logits" and e.receiver not in sends)
                or (e.sender not in ("embed", "pos") and e.sender not in gets)}
        if not dead:
            return tuple(e for e in order if e in kept)
        kept -= dead


def _mean_se(rows: Any) -> tuple[float, float]:
    n = rows.shape[0]
    return float(rows.mean()), float(rows.std() / math.sqrt(n)) if n > 1 else math.nan


def _groups(pairs: Iterable[tuple[EdgeKey, EdgeKey]]) -> list[list[EdgeKey]]:
    """Connected sets of edges linked by the pairs (union-find), each in first-seen order."""
    parent: dict[EdgeKey, EdgeKey] = {}

    def root(e: EdgeKey) -> EdgeKey:
        while parent.setdefault(e, e) != e:
            e = parent[e]
        return e

    for a, b in pairs:
        parent[root(a)] = root(b)
    sets: dict[EdgeKey, list[EdgeKey]] = {}
    for e in parent:
        sets.setdefault(root(e), []).append(e)
    return list(sets.values())


def _one_match(a: EdgeKey, b: EdgeKey) -> bool:
    """Whether two edges feed the two sides of one attention match (a head's queries and keys): corrupting both
    alike can leave the match as it was (a head that attends to itself by position, under permuted positions), which
    says nothing about whether either carries information, so such pairs are not tested for cancelling."""
    return a.receiver == b.receiver and {a.input, b.input} == {"q", "k"}


def pairs_to_test(kept: Sequence[EdgeKey], effects: dict[EdgeKey, float]) -> list[tuple[EdgeKey, EdgeKey]]:
    """The pairs of kept edges the cancelling test corrupts together: edges into one receiver, among the
    `MAX_PAIR_EDGES` strongest (`effects`; a missing one counts as 0), never the two sides of one match."""
    strong = sorted(kept, key=lambda e: -abs(effects.get(e, 0.0)))[:MAX_PAIR_EDGES]
    return [(a, b) for a, b in itertools.combinations(strong, 2) if a.receiver == b.receiver and not _one_match(a, b)]


def receiver_groups(kept: Sequence[EdgeKey]) -> list[tuple[str, list[EdgeKey]]]:
    """(receiver, its kept edges) for every receiver with at least two kept edges: the receiver tests' sets."""
    by_receiver: dict[str, list[EdgeKey]] = {}
    for e in kept:
        by_receiver.setdefault(e.receiver, []).append(e)
    return [(r, es) for r, es in by_receiver.items() if len(es) > 1]


def cancelling_sets(runner: EdgeRunner, kept: Sequence[EdgeKey], effects: dict[EdgeKey, float], threshold: float, *,
                    corruption: str, progress: Any = None) -> list[Cancelling]:
    """The cancelling sets among the kept edges `kept` (module docstring).

    Args:
        runner: the pass's `EdgeRunner`.
        kept: the kept edges of this pass (each measured: `effects` holds its single effect).
        effects: single-edge effects (nats).
        threshold: the pass's kept threshold: a set whose joint effect is below it is dropped.
        corruption: the pass's name, for the record.
        progress: a tqdm bar to advance.

    Returns:
        One `Cancelling` per set of cancelling pairs.
    """
    pairs = pairs_to_test(kept, effects)
    if not pairs:
        return []
    joint = (runner.many_losses([list(p) for p in pairs], progress=progress) - runner.clean_losses).mean(1)
    cancel = [(a, b) for (a, b), j in zip(pairs, joint.tolist())
              if abs(j) < CANCEL_FRACTION * max(abs(effects[a]), abs(effects[b]))]
    sets = _groups(cancel)
    if not sets:
        return []
    rows = runner.many_losses(sets, progress=progress) - runner.clean_losses
    out = []
    for edges, row in zip(sets, rows):
        effect, se = _mean_se(row)
        out.append(Cancelling(edges=tuple(e.name for e in edges), effect=effect, se=se,
                              alone=tuple(effects[e] for e in edges), corruption=corruption,
                              dropped=abs(effect) < threshold))
    return out


def receiver_tests(runner: EdgeRunner, kept: Sequence[EdgeKey], effects: dict[EdgeKey, float], *,
                   progress: Any = None) -> list[JointTest]:
    """Every receiver's kept edges (of those the runner's corruption moves) corrupted together.

    Args:
        runner: the pass's `EdgeRunner`.
        kept: the circuit's edges.
        effects: single-edge effects (nats) of the pass (NaN where an edge was not measured).
        progress: a tqdm bar to advance.

    Returns:
        One `JointTest` per receiver with at least two kept edges.
    """
    groups = receiver_groups(kept)
    if not groups:
        return []
    rows = runner.many_losses([es for _, es in groups], progress=progress) - runner.clean_losses
    out = []
    for (receiver, es), row in zip(groups, rows):
        effect, se = _mean_se(row)
        out.append(JointTest(receiver=receiver, edges=tuple(e.name for e in es), effect=effect, se=se,
                             alone=tuple(effects.get(e, math.nan) for e in es)))
    return out
