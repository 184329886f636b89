"""The order x depth x heads phase diagram: which in-context law do transformers of a given depth and head count
reach on order-k Markov data with a fresh kernel per sequence?

The papers this answers, each with a claim about depth, heads and order:

- Rajaraman et al. (NeurIPS 2024, "Transformers on Markov data: constant depth suffices"): trained long enough, a
  fixed-depth transformer with one head per layer reaches low loss on order-k sources as k grows; three layers
  with one head and LayerNorm can represent the in-context order-k law for any k; attention-only models need
  Omega(log k) layers or Omega(k) heads (a conditional lower bound; O(log k) layers suffice).
- Ekbote et al. (arXiv 2508.07208): two layers with one head each can represent the order-k in-context law.
- Nichani et al. (2024): for a k-parent causal structure the first layer learns one head per parent (here: one
  previous-token head per lag 1..k), read by an induction head in the second.
- Edelman et al. (2024, ICL-MC): learning passes through uniform -> in-context unigram -> bigram stages.

Grid: order k in `budget.orders`, depth x heads per layer in `budget.shapes` (one count for every layer, plus
extra heads in layer 0 only, e.g. (2, 1): "heads" apart from "depth"), two families: attention-only without
normalisation (the theory's setting) and attention with pre-LayerNorm (the package's attention-only preset, as
the papers train), every cell over `budget.seeds` seeds, all orders and seeds of one shape trained as one stack
(`training.train_many` through `sweep.run`).

Per run (measured on a probe batch of its order's source at the training length, one batch per order shared by
every model):

- **gain fractions** g_j = (L(in-context law of order j - 1) - L(model)) / (L(order j - 1) - L(order j)) for
  j = 0..k, "order -1" the uniform law: the share of each step up the ladder of in-context add-alpha laws the
  model has climbed (`gain_fractions`, the definition of the circuits branch's `probes.graded_gains`).
- **order reached**: the highest j with g_j >= `REACH` (1/2: closer in loss to the order-j law than to the
  order-(j-1) law); -1 when not even the unigram step is half climbed.
- **escape**: `dynamics` on the paired evaluations (the excess over the order-k law relative to the in-context
  unigram plateau's), crossings of 0.9 / 0.75 / 0.5 / 0.25.
- **circuit**: heads below the last layer whose previous-token score at lag l is `HEAD_EXCESS` above chance
  (lag heads, l = 1..k), and the highest order j <= k of an induction score `HEAD_EXCESS` above its baseline in
  a layer >= 1 (`probes.attention_scores`); "full circuit" = a lag head for every l <= k and an order-k
  induction head.

Per cell: the fraction of seeds reaching each order with Wilson intervals, the gains' means with bootstrap
intervals, the escape survival (median crossing with its interval) and median excess curve, the circuit counts.
`python -m markov_interp.experiments phases [--quick]` writes results.json, cells.csv, summary.md (with the
table set beside each paper's claim) and the figures.
"""

import argparse
import dataclasses
import json
import math
import platform
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Optional

import torch

from markov_interp import dynamics, theory
from markov_interp.experiments import _shared
from markov_interp.models import preset
from markov_interp.sweep import SweepSpec

__all__ = ["PhaseBudget", "QUICK", "FULL", "TINY", "REACH", "HEAD_EXCESS", "FAMILIES", "shape_label",
           "phase_specs", "gain_fractions", "order_reached", "circuit_summary", "measure_model", "cell_summaries",
           "claims", "run_phases", "summary_markdown", "main"]

REACH = 0.5  # a seed reaches the order-j law when g_j >= REACH (closer to it in loss than to the order-(j-1) law)
HEAD_EXCESS = 0.2  # a lag / induction head: its score this far above chance on the 0-1 scale (circuits' threshold)
FAMILIES = {"attention-only": None, "layernorm": "LN"}  # family name -> ModelConfig.normalization
_PROBE_SEED = 7_000  # the probe batch of order k: sample_batch(seed=_PROBE_SEED + k)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PhaseBudget:
    """Seeds, grid and recipe of the phase diagram (`cuts` says what a smaller budget leaves out)."""

    name: str
    seeds: int = 16
    orders: tuple = (1, 2, 3)
    # heads per layer, one tuple per shape (its length is the depth)
    shapes: tuple = ((1,), (3,), (1, 1), (2, 1), (3, 1), (2, 2), (3, 3), (1, 1, 1), (2, 1, 1), (3, 1, 1),
                     (2, 2, 2), (3, 3, 3), (1, 1, 1, 1), (2, 2, 2, 2), (3, 3, 3, 3), (2, 1, 1, 1))
    families: tuple = ("attention-only", "layernorm")
    vocab: int = 2
    alpha: float = 1.0
    steps: int = 3000
    seq_len: int = 64
    batch_size: int = 32
    lr: float = 1e-2
    d_model: int = 16
    d_head: int = 8
    eval_every: int = 50
    eval_batches: int = 4
    probe_sequences: int = 128
    device: str = "cpu"
    group: Optional[int] = None  # runs per stack (default: every order and seed of a shape)
    cuts: str = ""

    def __post_init__(self) -> None:
        for name in ("seeds", "steps", "seq_len", "batch_size", "d_model", "d_head", "eval_every", "eval_batches",
                     "probe_sequences", "vocab"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.seeds < 2:
            raise ValueError(f"seeds must be at least 2 (a distribution over seeds), got {self.seeds}")
        if not self.orders or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in self.orders):
            raise ValueError(f"orders must be integers >= 1, got {self.orders!r}")
        for heads in self.shapes:
            if not isinstance(heads, tuple) or not heads or any(not isinstance(h, int) or h < 1 for h in heads):
                raise ValueError(f"each shape must be a tuple of head counts >= 1 (one per layer), got {heads!r}")
        unknown = [f for f in self.families if f not in FAMILIES]
        if unknown or not self.families:
            raise ValueError(f"families must be some of {list(FAMILIES)}, got {self.families!r}")
        if self.seq_len <= max(self.orders) + 1:
            raise ValueError(f"seq_len ({self.seq_len}) must exceed the highest order + 1")

    @property
    def stack_size(self) -> int:
        return self.group or len(self.orders) * self.seeds


FULL = PhaseBudget(name="full", seeds=64, device="cuda", cuts="")
QUICK = PhaseBudget(
    name="quick", seeds=16, orders=(1, 2), shapes=((1,), (3,), (1, 1), (2, 1), (2, 2), (1, 1, 1)), steps=1000,
    eval_every=50,
    cuts="orders 1-2 (no order 3), six shapes (depth 1 with 1 or 3 heads; depth 2 with (1, 1), (2, 1), (2, 2); "
         "depth 3 with one head per layer), 1000 steps, 16 seeds: order-2 laws are not reached in 1000 steps by "
         "any shape here, so the order-2 cells measure how far each shape climbs, not whether it gets there")
TINY = PhaseBudget(name="tiny", seeds=2, orders=(1, 2), shapes=((1,), (2, 1)), steps=6, seq_len=16,
                   batch_size=4, eval_every=3, eval_batches=1, probe_sequences=8, families=("layernorm",),
                   cuts="a smoke test of the code path; its numbers show nothing")
BUDGETS = {"quick": QUICK, "full": FULL, "tiny": TINY}


def shape_label(heads: tuple) -> str:
    """"L2 (2,1)": depth and heads per layer; one count for all layers reads "L2 x1"."""
    if len(set(heads)) == 1:
        return f"L{len(heads)} x{heads[0]}"
    return f"L{len(heads)} ({','.join(map(str, heads))})"


def _spec(budget: PhaseBudget, family: str, depth: int) -> Optional[SweepSpec]:
    shapes = [list(h) for h in budget.shapes if len(h) == depth]
    if not shapes:
        return None
    model = {"preset": "attn-only-2layer", "n_layers": depth, "d_model": budget.d_model, "d_head": budget.d_head,
             "n_ctx": budget.seq_len, "normalization": FAMILIES[family]}
    train = {"steps": budget.steps, "seq_len": budget.seq_len, "batch_size": budget.batch_size, "lr": budget.lr,
             "schedule": "constant", "eval_every": budget.eval_every, "eval_batches": budget.eval_batches,
             "log_every": budget.eval_every, "n_checkpoints": 0, "device": budget.device}
    return SweepSpec(name=f"phases-{family}-L{depth}",
                     base={"source": {"kind": "random", "vocab": budget.vocab, "alpha": budget.alpha},
                           "model": model, "train": train},
                     grid={"source.order": list(budget.orders), "model.n_heads": shapes},
                     seeds=tuple(range(budget.seeds)), probe=False)


def phase_specs(budget: PhaseBudget) -> list[SweepSpec]:
    """One sweep spec per family and depth, its grid the orders x that depth's shapes, `budget.seeds` seeds."""
    depths = sorted({len(h) for h in budget.shapes})
    specs = [_spec(budget, family, depth) for family in budget.families for depth in depths]
    return [s for s in specs if s is not None]


# --------------------------------------------------------------------------------------------- measures
def gain_fractions(probs: torch.Tensor, tokens: torch.Tensor, vocab: int, *, beta: float,
                   top: int) -> dict[int, float]:
    """g_j for j = 0..top: the share of the step from the in-context add-beta law of order j - 1 to that of
    order j (order -1: the uniform law) that `probs` climbs, as a ratio of mean losses over the batch.

    Args:
        probs: the model's next-state laws [batch pos vocab].
        tokens: the states [batch pos].
        vocab: number of states.
        beta: add-beta smoothing of the in-context laws (the source's alpha: then the order-k law is the
            posterior predictive).
        top: highest order.

    Returns:
        {j: g_j}: 1 at the order-j law, 0 at the order-(j-1) law.

    >>> t = torch.tensor([[0, 1, 1, 0, 1, 1, 0, 1, 1, 0]])
    >>> law = theory.add_beta_predictions(t, 2, order=1, beta=1.0)
    >>> {j: round(g, 6) for j, g in gain_fractions(law, t, 2, beta=1.0, top=1).items()}
    {0: 1.1, 1: 1.0}
    """
    tokens = tokens.cpu()
    loss = lambda p: float(theory.target_log_loss(p.detach().cpu().double(), tokens).mean())  # noqa: E731
    laws = {-1: loss(torch.full((*tokens.shape, vocab), 1.0 / vocab, dtype=torch.float64))}
    for j in range(top + 1):
        laws[j] = loss(theory.add_beta_predictions(tokens, vocab, order=j, beta=beta))
    model = loss(probs)
    return {j: (laws[j - 1] - model) / (laws[j - 1] - laws[j]) if laws[j - 1] != laws[j] else math.nan
            for j in range(top + 1)}


def order_reached(gains: dict[int, float], *, reach: float = REACH) -> int:
    """The highest order j such that every step up to it is climbed at least `reach` (g_0, ..., g_j >= reach);
    -1 when g_0 is not. On order-k data the in-context laws improve up to order k, so g_j >= reach already
    implies g_i > 1 for i < j; requiring every rung keeps a model from "reaching" a step whose higher law is
    the worse one (short sequences), where g_j is a ratio of two negative numbers.

    >>> order_reached({0: 1.3, 1: 0.8, 2: 0.1})
    1
    >>> order_reached({0: 0.2, 1: 4.0})  # worse than the unigram law: not at the bigram law
    -1
    """
    top = -1
    for j in sorted(gains):
        g = gains[j]
        if g is None or not math.isfinite(g) or g < reach:
            break
        top = j
    return top


def circuit_summary(scores: Any, heads: tuple[int, ...], order: int, *,
                    threshold: float = HEAD_EXCESS) -> dict:
    """The lag heads and the induction order an `AttentionScores` shows (module docstring).

    Args:
        scores: `probes.attention_scores(model, tokens, max_order=order)`.
        heads: the model's real heads per layer (`models.heads_per_layer`): padded heads are never counted.
        order: the source's order k (lags 1..k, induction orders 1..k).
        threshold: excess over chance (0-1 scale) that makes a head.

    Returns:
        {"lags": {l: ["L0H1", ...]}, "induction": {j: [...]}, "induction_order": j (0: none), "full": bool}.
    """
    n_layers = len(heads)

    def found(grid: torch.Tensor, layers: range) -> list[str]:
        return [f"L{layer}H{h}" for layer in layers for h in range(heads[layer])
                if math.isfinite(float(grid[layer, h])) and float(grid[layer, h]) >= threshold]

    lags = {lag: found(scores.lag_excess(lag), range(n_layers - 1)) for lag in range(1, order + 1)}
    induction = {j: found(scores.induction_excess(j), range(1, n_layers)) for j in range(1, order + 1)}
    top = max((j for j, h in induction.items() if h), default=0)
    full = n_layers >= 2 and top == order and all(lags.values())
    return {"lags": {str(k): v for k, v in lags.items()}, "induction": {str(k): v for k, v in induction.items()},
            "induction_order": top, "full": bool(full)}


@torch.no_grad()
def measure_model(model: Any, batch: Any, *, order: int, alpha: float) -> dict:
    """Gain fractions, order reached and circuit of one trained model on its order's probe batch.

    Args:
        model: a trained hooked model.
        batch: `probes.sample_batch` of the model's source at its training length.
        order: the source's order.
        alpha: the source's Dirichlet concentration (the in-context laws' smoothing).

    Returns:
        {"gains": {j: g_j}, "reached": j, "model_loss": nats, "circuit": `circuit_summary`}.
    """
    from markov_interp import probes
    from markov_interp.models import heads_per_layer

    probs = probes.next_state_probs(model, batch.tokens)
    gains = gain_fractions(probs, batch.tokens, batch.vocab, beta=alpha, top=order)
    scores = probes.attention_scores(model, batch.tokens, max_order=order)
    circuit = circuit_summary(scores, tuple(heads_per_layer(model)), order)
    loss = float(theory.target_log_loss(probs.cpu().double(), batch.tokens.cpu()).mean())
    return {"gains": {str(j): g for j, g in gains.items()}, "reached": order_reached(gains), "model_loss": loss,
            "circuit": circuit}


# ------------------------------------------------------------------------------------------------- runs
@dataclasses.dataclass(frozen=True)
class RunRecord:
    """One trained run of the grid: where it sits, its status, measures and dynamics (None unless it finished)."""

    family: str
    heads: tuple
    order: int
    seed: int
    status: str
    measure: Optional[dict]
    dynamics: Optional[dynamics.RunDynamics]


def _family(normalization: Optional[str]) -> str:
    return next(name for name, norm in FAMILIES.items() if norm == normalization)


def _probe_batches(budget: PhaseBudget) -> dict[int, Any]:
    from markov_interp import probes
    from markov_interp.data import RandomMarkov

    return {k: probes.sample_batch(RandomMarkov(budget.vocab, order=k, alpha=budget.alpha),
                                   n_sequences=budget.probe_sequences, seq_len=budget.seq_len, seed=_PROBE_SEED + k)
            for k in budget.orders}


def _measure_key(budget: PhaseBudget) -> str:
    return (f"phases-1:{budget.probe_sequences}x{budget.seq_len}:seed{_PROBE_SEED}:reach{REACH}:"
            f"head{HEAD_EXCESS}")


def measure_rows(rows: list, work: Path, budget: PhaseBudget, *, progress: bool = False) -> list[RunRecord]:
    """Each sweep row as a `RunRecord`: the finished runs loaded from their folders and measured (cached in
    work/measures), their dynamics read from their metrics."""
    from tqdm.auto import tqdm

    from markov_interp.training import runfolder

    batches = _probe_batches(budget)
    records = []
    for row in tqdm(rows, disable=not progress, desc="measure", unit="run"):
        cfg = row.config
        where = dict(family=_family(cfg.model.normalization), heads=tuple(cfg.model.heads_per_layer),
                     order=cfg.source.order, seed=cfg.train.seed, status=row.status)
        if row.status != "ok":
            records.append(RunRecord(**where, measure=None, dynamics=None))
            continue
        folder = work / row.run_dir

        def measure() -> dict:
            model = runfolder.load_model(folder, device="cpu")
            return measure_model(model, batches[cfg.source.order], order=cfg.source.order, alpha=cfg.source.alpha)

        value = _shared.cached_measure(work, row.cell_id, _measure_key(budget), measure)
        records.append(RunRecord(**where, measure=value, dynamics=dynamics.from_metrics(runfolder.load_metrics(folder))))
    return records


def _escape_json(runs: list) -> dict:
    """The escape (the 0.5 crossing) over a cell's runs: median crossing and interval, censored fraction."""
    if not runs:
        return {"median": None, "describe": "no runs", "censored": _shared.proportion(0, 0)}
    cond = dynamics.condition(runs)
    median = cond.escape.median()
    return {"median": median.by, "after": median.estimate.after, "describe": median.describe(),
            "interval": None if median.interval is None else [median.interval.after, median.interval.by],
            "censored": _shared.proportion(cond.escape.n_censored, cond.escape.n)}


def _circuit_json(measures: list[dict], order: int) -> dict:
    n = len(measures)
    circuits = [m["circuit"] for m in measures]
    signature = Counter(f"lags {'+'.join(l for l, h in c['lags'].items() if h) or 'none'}, induction order "
                        f"{c['induction_order']}" for c in circuits)
    return {"full": _shared.proportion(sum(c["full"] for c in circuits), n),
            "lag_heads": {str(lag): _shared.proportion(sum(bool(c["lags"][str(lag)]) for c in circuits), n)
                          for lag in range(1, order + 1)},
            "induction_order": dict(sorted(Counter(c["induction_order"] for c in circuits).items())),
            "signatures": dict(signature.most_common())}


def _cell_json(key: tuple, records: list[RunRecord]) -> dict:
    family, heads, order = key
    done = [r for r in records if r.measure is not None]
    measures = [r.measure for r in done]
    reached = [m["reached"] for m in measures]
    n = len(done)
    cell = {"family": family, "heads": list(heads), "label": shape_label(heads), "order": order,
            "n": n, "not_ok": dict(Counter(r.status for r in records if r.status != "ok")),
            "reached": {str(j): _shared.proportion(sum(x >= j for x in reached), n) for j in range(-1, order + 1)},
            "order_reached": dict(sorted(Counter(reached).items())),
            "median_order": int(statistics.median_low(reached)) if reached else None,
            "gains": {}, "escape": _escape_json([r.dynamics for r in done if r.dynamics is not None]),
            "circuit": _circuit_json(measures, order) if measures else None}
    for j in range(order + 1):
        values = [m["gains"][str(j)] for m in measures]
        cell["gains"][str(j)] = {"mean": _shared.mean(values), "interval": list(_shared.mean_interval(values)),
                                 "median": statistics.median(values) if values else None}
    return cell


def cell_summaries(records: list[RunRecord]) -> list[dict]:
    """One summary per (family, shape, order) cell, in grid order: the fraction of seeds reaching each order
    (`reached[j]`: g_j >= REACH, Wilson 95% interval; j = -1 counts every finished seed), the median order
    reached, the gain fractions' means (bootstrap 95% interval) and medians, the escape (median crossing of 0.5
    with its 95% interval, censored fraction) and the circuit counts."""
    cells: dict[tuple, list[RunRecord]] = {}
    for r in records:
        cells.setdefault((r.family, r.heads, r.order), []).append(r)
    return [_cell_json(key, rs) for key, rs in cells.items()]


# ------------------------------------------------------------------------------------------------ claims
def _find(cells: list[dict], family: str, heads: tuple, order: int) -> Optional[dict]:
    return next((c for c in cells if c["family"] == family and tuple(c["heads"]) == heads and c["order"] == order),
                None)


def _majority(p: dict) -> str:
    """Whether most seeds do it: 'yes' (Wilson interval above 1/2), 'no' (below), 'mixed'."""
    if not p or p["n"] == 0:
        return "not run"
    lo, hi = p["interval"]
    return "yes" if lo > 0.5 else "no" if hi < 0.5 else "mixed"


def _fmt_p(p: Optional[dict]) -> str:
    if not p or not p["n"]:
        return "not run"
    lo, hi = p["interval"]
    return f"{p['k']}/{p['n']} [{lo:.2f}, {hi:.2f}]"


def _compare(a: Optional[dict], b: Optional[dict]) -> str:
    """'ahead' when proportion a's Wilson interval lies above b's, 'behind' when below, else 'not resolved'."""
    if not a or not b or not a["n"] or not b["n"]:
        return "not run"
    if a["interval"][0] > b["interval"][1]:
        return "ahead"
    return "behind" if a["interval"][1] < b["interval"][0] else "not resolved"


# (paper, claim, kind, cells): a cell is (family, heads(k), orders). Kinds: "learn" (the paper trained it: does
# most of the grid's seeds reach the order-k law?), "represent" (a construction; training need not find it),
# "learn-not" (the paper says it does not), "versus" (the first cell against the second at each order).
_CLAIMS = (
    ("Rajaraman et al. 2024", "trained long enough, a fixed depth with one head per layer reaches the order-k law "
     "as k grows", "learn", [("layernorm", lambda k: (1, 1), (2, 3)), ("layernorm", lambda k: (1, 1, 1), (2, 3))]),
    ("Rajaraman et al. 2024", "three layers with one head each and LayerNorm represent the order-k law for any k",
     "represent", [("layernorm", lambda k: (1, 1, 1), (1, 2, 3))]),
    ("Rajaraman et al. 2024", "LayerNorm is what lets constant depth suffice: attention-only models need more "
     "layers or heads as k grows (LayerNorm cell against the attention-only cell of the same shape)", "versus",
     [("layernorm", lambda k: (1, 1), (1, 2, 3)), ("attention-only", lambda k: (1, 1), (1, 2, 3))]),
    ("Ekbote et al. 2025", "two layers with one head each represent the order-k law", "represent",
     [("layernorm", lambda k: (1, 1), (1, 2, 3)), ("attention-only", lambda k: (1, 1), (1, 2, 3))]),
    ("Nichani et al. 2024", "one layer-0 head per parent (lag) feeding an induction head: k heads in layer 0 "
     "against one", "versus", [("layernorm", lambda k: (k, 1), (2, 3)), ("layernorm", lambda k: (1, 1), (2, 3))]),
    ("Edelman et al. 2024", "one layer cannot form an induction head: depth 1 does not reach the bigram law",
     "learn-not", [("layernorm", lambda k: (1,), (1,)), ("layernorm", lambda k: (3,), (1,))]),
    ("Edelman et al. 2024", "two layers learn the in-context bigram law with an induction head", "learn",
     [("layernorm", lambda k: (1, 1), (1,)), ("attention-only", lambda k: (1, 1), (1,))]),
)
_LEARN = {"yes": "reproduced", "no": "not reproduced at this budget", "mixed": "mixed", "not run": "not run"}


def _claim_row(paper: str, claim: str, cell: Optional[dict], family: str, heads: tuple, k: int,
               verdict: str) -> dict:
    circuit = cell["circuit"] if cell else None
    return {"paper": paper, "claim": claim, "family": family, "shape": shape_label(heads), "order": k,
            "reached": cell["reached"][str(k)] if cell else None,
            "full_circuit": circuit["full"] if circuit else None, "verdict": verdict}


def claims(cells: list[dict]) -> list[dict]:
    """One row per cited claim and cell bearing on it: the fraction of seeds reaching the order-k law (Wilson
    95%), the fraction with a full circuit, and the verdict at this budget: "reproduced", "not reproduced at
    this budget", "mixed" (the interval straddles 1/2), for comparisons "ahead" / "behind" / "not resolved"
    (Wilson intervals apart or overlapping), "not run" where the budget has no such cell."""
    rows = []
    for paper, claim, kind, spec in _CLAIMS:
        orders = sorted({k for _, _, ks in spec for k in ks})
        for k in orders:
            found = [(family, heads(k), _find(cells, family, heads(k), k)) for family, heads, ks in spec if k in ks]
            for i, (family, heads, cell) in enumerate(found):
                reached = cell["reached"][str(k)] if cell else None
                majority = _majority(reached)
                if kind == "versus":
                    other = found[1 - i][2] if len(found) == 2 else None
                    verdict = (f"{_compare(reached, other['reached'][str(k)] if other else None)} of "
                               f"{found[1 - i][0]} {shape_label(found[1 - i][1])}") if i == 0 else "(comparison)"
                elif kind == "learn-not":
                    verdict = {"no": "reproduced", "yes": "not reproduced", "mixed": "mixed"}.get(majority, majority)
                else:
                    verdict = _LEARN[majority]
                    if kind == "represent" and majority == "no":
                        verdict += " (a construction: training need not find it)"
                rows.append(_claim_row(paper, claim, cell, family, heads, k, verdict))
    return rows


# ------------------------------------------------------------------------------------------------ output
_ORDER_NAMES = {-1: "none", 0: "unigram", 1: "bigram", 2: "trigram", 3: "4-gram", 4: "5-gram"}


def _cells_table(cells: list[dict]) -> list[str]:
    lines = ["| family | shape | order k | seeds | reach order 0 | reach order 1 | reach order k | median order "
             "reached | g_k mean [95% CI] | escape: median crossing of 0.5 | censored | full circuit | most common "
             "circuit |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in cells:
        k = c["order"]
        g = c["gains"][str(k)]
        circuit = c["circuit"] or {}
        common = next(iter(circuit.get("signatures", {}).items()), ("—", 0))
        median = c["median_order"]
        lines.append(
            f"| {c['family']} | {c['label']} | {k} | {c['n']} | {_fmt_p(c['reached']['0'])} | "
            f"{_fmt_p(c['reached']['1'])} | {_fmt_p(c['reached'][str(k)])} | "
            f"{'—' if median is None else f'{median} ({_ORDER_NAMES[median]})'} | "
            f"{g['mean']:.2f} [{g['interval'][0]:.2f}, {g['interval'][1]:.2f}] | {c['escape']['describe']} | "
            f"{_fmt_p(c['escape']['censored'])} | {_fmt_p(circuit.get('full'))} | {common[0]} ({common[1]}) |")
    return lines


def _claims_table(rows: list[dict]) -> list[str]:
    lines = ["| paper | claim | cell | order k | seeds reaching order k [95% CI] | full circuit | at this budget |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['paper']} | {r['claim']} | {r['family']} {r['shape']} | {r['order']} | "
                     f"{_fmt_p(r['reached'])} | {_fmt_p(r['full_circuit'])} | {r['verdict']} |")
    return lines


def summary_markdown(cells: list[dict], claim_rows: list[dict], budget: PhaseBudget, *, header: str = "") -> str:
    """The claims table, then every cell (fractions of seeds reaching each order, gains, escape, circuits)."""
    lines = [header] if header else []
    lines += ["", "## Beside each paper's claim", "", *_claims_table(claim_rows), "",
              "## Every cell", "", f"Reach order j: the seeds whose gain fraction g_j >= {REACH} (Wilson 95% "
              "interval); g_k: the share of the step from the order-(k-1) to the order-k in-context law the seeds "
              "climb (mean, bootstrap 95% interval); escape: `dynamics` on the paired evaluations (median crossing "
              "of half the in-context unigram plateau's excess over the order-k law, Kaplan-Meier 95% interval); "
              f"full circuit: a lag head (previous-token excess >= {HEAD_EXCESS}) below the last layer for every "
              f"lag 1..k and an order-k induction head (excess >= {HEAD_EXCESS}) above layer 0.", "",
              *_cells_table(cells)]
    return "\n".join(lines) + "\n"


def _cells_csv(cells: list[dict]) -> str:
    import csv
    import io

    columns = ["family", "shape", "order", "n", "median_order"] + [f"reached_{j}" for j in range(-1, 5)] + \
        [f"reached_{j}_lo" for j in range(-1, 5)] + [f"reached_{j}_hi" for j in range(-1, 5)] + \
        [f"g{j}_mean" for j in range(5)] + ["escape_median", "escape_describe", "censored", "full_circuit"]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for c in cells:
        row = {"family": c["family"], "shape": c["label"], "order": c["order"], "n": c["n"],
               "median_order": c["median_order"], "escape_median": c["escape"]["median"],
               "escape_describe": c["escape"]["describe"], "censored": c["escape"]["censored"]["fraction"],
               "full_circuit": (c["circuit"] or {}).get("full", {}).get("fraction")}
        for j, p in c["reached"].items():
            row[f"reached_{j}"] = p["fraction"]
            row[f"reached_{j}_lo"], row[f"reached_{j}_hi"] = p["interval"] or (None, None)
        for j, g in c["gains"].items():
            row[f"g{j}_mean"] = round(g["mean"], 4) if math.isfinite(g["mean"]) else None
        writer.writerow(row)
    return buffer.getvalue()


def curve_panels(records: list[RunRecord]) -> dict[str, dict[str, dynamics.MedianCurve]]:
    """{"family, order k": {shape: median excess curve}} over each cell's finished runs."""
    groups: dict[tuple, list] = {}
    for r in records:
        if r.dynamics is not None:
            groups.setdefault((r.family, r.order, r.heads), []).append(r.dynamics.curve)
    panels: dict[str, dict] = {}
    for (family, order, heads), curves in groups.items():
        panels.setdefault(f"{family}, order {order}", {})[shape_label(heads)] = dynamics.median_curve(curves)
    return panels


@dataclasses.dataclass(frozen=True)
class PhaseResult:
    """The phase diagram at one budget: per-run records, per-cell summaries, the claims, the time it took."""

    budget: PhaseBudget
    records: tuple
    cells: list
    claims: list
    seconds: float
    failed: int

    def to_json(self) -> dict:
        runs = [{"family": r.family, "heads": list(r.heads), "order": r.order, "seed": r.seed, "status": r.status,
                 **(r.measure or {}), "crossings": r.dynamics.to_json() if r.dynamics else None}
                for r in self.records]
        return {"budget": dataclasses.asdict(self.budget), "seconds": round(self.seconds, 1), "cells": self.cells,
                "claims": self.claims, "runs": runs}


def run_phases(budget: PhaseBudget = QUICK, work: "str | Path" = "runs/phases", *, workers: Optional[int] = None,
               progress: bool = False) -> PhaseResult:
    """Train the grid of `budget` into `work` (restartable: finished runs and measures are reused), measure every
    run and summarise every cell.

    Args:
        budget: the grid and recipe.
        work: the sweep folder (runs, records, measures).
        workers: training processes (default: all cores; one torch thread each).
        progress: tqdm bars.

    Returns:
        A `PhaseResult`.
    """
    work = Path(work)
    start = time.perf_counter()
    result = _shared.train_grid(phase_specs(budget), work, workers=workers, group=budget.stack_size,
                                progress=progress)
    records = measure_rows(result.rows, work, budget, progress=progress)
    cells = cell_summaries(records)
    return PhaseResult(budget=budget, records=tuple(records), cells=cells, claims=claims(cells),
                       seconds=time.perf_counter() - start, failed=result.n_failed)


def _header(budget: PhaseBudget, command: str, seconds: float) -> str:
    return (f"# Order x depth x heads phase diagram ({budget.name} budget)\n\nMade by `{command}` in {seconds / 60:.1f} "
            f"min on {platform.machine()} ({budget.device}), torch {torch.__version__}, fp32. Source: "
            f"RandomMarkov(vocab {budget.vocab}, order k, alpha {budget.alpha:g}): a fresh Dirichlet kernel per "
            f"sequence. Models: d_model {budget.d_model}, d_head {budget.d_head}, untied, no MLP; families "
            f"{', '.join(budget.families)}. Training: {budget.steps} steps, batch {budget.batch_size} x "
            f"{budget.seq_len} states, AdamW lr {budget.lr:g} constant, {budget.seeds} seeds per cell, every order "
            f"and seed of a shape one stack. Probes: {budget.probe_sequences} sequences of {budget.seq_len} states "
            f"per order (the training length)." + (f"\n\nCuts: {budget.cuts}." if budget.cuts else ""))


def write_results(result: PhaseResult, out: "str | Path", *, command: str) -> list[Path]:
    """results.json, cells.csv, summary.md, phase_diagram.png and escape_curves.png into `out`."""
    from markov_interp.report import figures

    header = _header(result.budget, command, result.seconds)
    texts = {"summary.md": summary_markdown(result.cells, result.claims, result.budget, header=header),
             "results.json": json.dumps(result.to_json(), indent=1, default=str),
             "cells.csv": _cells_csv(result.cells)}
    figs = {"phase_diagram.png": figures.phase_diagram_figure(result.cells, title=f"{result.budget.name} budget: "
                                                               f"{result.budget.steps} steps"),
            "escape_curves.png": figures.excess_curves_panels_figure(
                curve_panels(list(result.records)), columns=len(result.budget.orders),
                title="median excess over the order-k law relative to the in-context unigram plateau's")}
    return _shared.write_outputs(Path(out), texts, figs)


def main(argv: Optional[list[str]] = None) -> int:
    """`python -m markov_interp.experiments phases [--budget quick|full|tiny] [--out DIR] [--work DIR]`."""
    parser = argparse.ArgumentParser(prog="python -m markov_interp.experiments phases", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", choices=sorted(BUDGETS), default="quick")
    parser.add_argument("--quick", action="store_const", const="quick", dest="budget", help="= --budget quick")
    parser.add_argument("--out", default=None, help="results and figures (default WORK/report)")
    parser.add_argument("--work", default=None, help="sweep folder (default runs/phases-BUDGET)")
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--seeds", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--device", default=None)
    args = parser.parse_args(argv)
    budget = BUDGETS[args.budget]
    changes = {k: getattr(args, k) for k in ("seeds", "steps", "device") if getattr(args, k) is not None}
    budget = dataclasses.replace(budget, **changes) if changes else budget
    work = Path(args.work or f"runs/phases-{budget.name}")
    result = run_phases(budget, work, workers=args.workers, progress=sys.stderr.isatty())
    command = "python -m markov_interp.experiments phases " + " ".join(argv if argv is not None else sys.argv[1:])
    write_results(result, args.out or work / "report", command=command.strip())
    print(summary_markdown(result.cells, result.claims, budget))
    return 1 if result.failed else 0
