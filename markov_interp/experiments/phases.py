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
  model has climbed (`probes.graded_gains`).
- **order reached**: the highest j with g_j >= `REACH` (1/2: closer in loss to the order-j law than to the
  order-(j-1) law); -1 when not even the unigram step is half climbed.
- **escape**: `dynamics` on the paired evaluations (the excess over the order-k law relative to the in-context
  unigram plateau's), crossings of 0.9 / 0.75 / 0.5 / 0.25.
- **circuit**: heads below the last layer whose previous-token score at lag l is `HEAD_EXCESS` above chance
  (lag heads, l = 1..k), and the highest order j <= k of an induction score `HEAD_EXCESS` above its baseline in
  a layer >= 1 (`probes.attention_scores`); "full circuit" = a lag head for every l <= k and an order-k
  induction head (attention evidence, every seed);
- **classifier**: `probes.classify_mechanism` (the causal verdict: law check, graded gains, kernel swap, path
  patching) on the first `budget.classified` seeds of every cell: its label ("induction" needs a previous-token ->
  induction K-edge among the kept edges) and the head pair.

Per cell: the fraction of seeds reaching each order with Wilson intervals, the gains' means with bootstrap
intervals, the escape survival (median crossing with its interval) and median excess curve, the circuit counts.
`python -m markov_interp.experiments --only phases [--quick]` (or `markov-interp experiment phases`) writes
results.json, cells.csv, summary.md (with the table set beside each paper's claim) and the figures.
"""

import dataclasses
import json
import math
import re
import statistics
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import torch

from markov_interp import dynamics
from markov_interp.experiments import Budget, Experiment, Section, Table, _formation, _shared, _weights, register
from markov_interp.experiments._phases_claims import NOT_TESTED, _fmt_p, claims, claims_table, shape_label
from markov_interp.probes.classify import Thresholds
from markov_interp.sweep import SweepSpec

if TYPE_CHECKING:  # for annotations only: probes and models load TransformerLens, which `--help` need not
    from markov_interp.sources import Source
    from markov_interp.models import HookedModel
    from markov_interp.probes import ProbeBatch

__all__ = ["PhaseBudget", "QUICK", "STANDARD", "STANDARD3", "CONVERGED", "FULL", "GPU", "TINY", "REACH", "HEAD_EXCESS", "FAMILIES",
           "EXPERIMENT", "shape_label", "phase_specs", "formation_specs", "formation_rows", "order_reached",
           "circuit_summary", "measure_model", "cell_summaries", "claims", "NOT_TESTED", "cells_table",
           "claims_table", "cells_csv", "PhaseResult", "run", "read", "remeasure", "weights_name", "alphabets",
           "run_label", "run_key", "label_changes", "deep_at_law", "unnamed_at_law"]

REACH = 0.5  # a seed reaches the order-j law when g_j >= REACH (closer to it in loss than to the order-(j-1) law)
HEAD_EXCESS = Thresholds().head_excess  # a lag / induction head: its score this far above chance (the classifier's cut)
FAMILIES = {"attention-only": None, "layernorm": "LN"}  # family name -> ModelConfig.normalization
_PROBE_SEED = 7_000  # the probe batch of order k: sample_batch(seed=_PROBE_SEED + k)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PhaseBudget(Budget):
    """Seeds, grid and recipe of the phase diagram (`cuts` says what a smaller budget leaves out)."""

    orders: tuple[int, ...] = (1, 2, 3)
    # heads per layer, one tuple per shape (its length is the depth)
    shapes: tuple[tuple[int, ...], ...] = (
        (1,), (3,), (1, 1), (2, 1), (3, 1), (2, 2), (3, 3), (1, 1, 1), (2, 1, 1), (3, 1, 1), (2, 2, 2), (3, 3, 3),
        (1, 1, 1, 1), (2, 2, 2, 2), (3, 3, 3, 3), (2, 1, 1, 1))
    families: tuple[str, ...] = ("attention-only", "layernorm")
    vocab: int = 2
    alpha: float = 1.0
    seq_len: int = 64
    batch_size: int = 32
    lr: float = 1e-2
    d_model: int = 16
    d_head: int = 8
    eval_every: int = 50
    eval_batches: int = 4
    probe_sequences: int = 128
    classified: int = 4  # seeds per cell named by `probes.classify_mechanism` (path patching: the costly probe)
    group: Optional[int] = None  # runs per stack (default: every order and seed of a shape)
    workers: Optional[int] = None  # training processes (default: every core)
    formation_seeds: int = 0  # seeds per cell trained again with checkpoints: the circuit at every checkpoint
    formation_checkpoints: int = 24  # log-spaced checkpoints of those runs (the last step included)

    ZERO_OK = ("classified", "formation_seeds")

    def check(self) -> None:
        if self.vocab < 2:
            raise ValueError(f"budget {self.name!r}: vocab must be at least 2, got {self.vocab}")
        unknown = [f for f in self.families if f not in FAMILIES]
        if unknown:
            raise ValueError(f"budget {self.name!r}: families must be some of {list(FAMILIES)}, got {unknown!r}")
        if self.seq_len <= max(self.orders) + 1:
            raise ValueError(f"budget {self.name!r}: seq_len ({self.seq_len}) must exceed the highest order + 1")

    @property
    def stack_size(self) -> int:
        return self.group or len(self.orders) * self.seeds


FULL = PhaseBudget(name="full", seeds=64, steps=3000, classified=16)
QUICK = PhaseBudget(
    name="quick", seeds=4, steps=300, orders=(1, 2), shapes=((1,), (1, 1)), families=("layernorm",), eval_batches=2,
    probe_sequences=64, classified=1, workers=1,
    cuts="orders 1-2 (no order 3), the LayerNorm family only, two shapes (one layer; two layers with one head each), "
         "4 seeds, 300 steps (full: 3000), the classifier on 1 seed per cell, 64 probe sequences, one training "
         "process (a shared 2-core machine): it shows where one and two layers are after 300 steps and checks the "
         "measures against theory (a single layer is never an induction circuit); it cannot say whether a shape "
         "reaches the bigram or trigram law when trained long enough, nor compare head counts")
GPU = PhaseBudget(
    name="gpu", seeds=16, steps=2000, shapes=((1,), (3,), (1, 1), (2, 1), (3, 1), (2, 2), (1, 1, 1), (2, 1, 1)),
    classified=2, workers=4, device="cuda",
    cuts="sized for one lent GPU call of about 10 minutes (not yet measured): eight shapes to depth 3 (no depth 4, no "
         "(3, 3), (2, 2, 2) or (3, 3, 3)), 16 seeds per cell in stacks of 48 (three orders x 16 seeds), 2000 steps, "
         "the classifier on 2 seeds per cell")
STANDARD = PhaseBudget(
    name="standard", seeds=8, steps=3000, orders=(1, 2),
    shapes=((1,), (2,), (1, 1), (2, 1), (2, 2), (1, 1, 1), (2, 1, 1), (2, 2, 2)), families=("layernorm",),
    probe_sequences=512, classified=8, workers=1, formation_seeds=1,
    cuts="the smallest budget at which the positive control learns (two layers x two heads on order 2 reach the "
         "trigram law): orders 1 and 2 (order 3 does not fit a 2-core CPU's day), depth 1-3 with heads {1, 2} and "
         "an extra layer-0 head, the LayerNorm family only, 8 seeds per cell (full: 64), 3000 steps, every seed "
         "classified on 512 probe sequences, one training process (a 2-core CPU); seed 0 of every cell trained again "
         "with 24 checkpoints for its circuit over training")
STANDARD3 = PhaseBudget(
    name="standard3", seeds=8, steps=3000, orders=(1, 2), vocab=3, shapes=((1,), (1, 1), (2, 1), (2, 2), (1, 1, 1)),
    families=("layernorm",), probe_sequences=512, classified=8, workers=1,
    cuts="the standard recipe on three states, where no switch-counting shortcut exists (a binary chain's "
         "transition counts follow from its switch counts): orders 1 and 2, five shapes to depth 3 (one layer; two "
         "layers with one head, two heads in layer 0, two heads each; three layers with one head), the LayerNorm "
         "family only, 8 seeds per cell, 3000 steps, every seed classified on 512 probe sequences, no formation runs")
CONVERGED = PhaseBudget(
    name="converged", seeds=8, steps=10_000, orders=(1, 2), shapes=((1, 1), (2, 2), (1, 1, 1)), families=("layernorm",),
    probe_sequences=512, classified=8, workers=1,
    cuts="the standard recipe trained 10,000 steps (standard: 3000) on the shapes whose seeds sit between laws at "
         "3000 steps (two layers with one and two heads, three layers with one head), orders 1 and 2, 8 seeds, no "
         "formation runs; one depth per sweep, so a rerun resumes at the first unfinished depth")
TINY = PhaseBudget(name="tiny", seeds=2, orders=(1, 2), shapes=((1,), (2, 1)), steps=6, seq_len=16,
                   batch_size=4, eval_every=3, eval_batches=1, probe_sequences=8, families=("layernorm",),
                   classified=1, formation_seeds=1, formation_checkpoints=3, cuts="a smoke test of the code path; its numbers show nothing")


def _spec(budget: PhaseBudget, family: str, depth: int, *, formation: bool = False) -> Optional[SweepSpec]:
    """The sweep of one family and depth; `formation`: its first `formation_seeds` seeds again, with checkpoints
    (the same runs otherwise: same seeds, same data, same weights at every step)."""
    shapes = [list(h) for h in budget.shapes if len(h) == depth]
    if not shapes:
        return None
    model = {"preset": "attn-only-2layer", "n_layers": depth, "d_model": budget.d_model, "d_head": budget.d_head,
             "n_ctx": budget.seq_len, "normalization": FAMILIES[family]}
    train = {"steps": budget.steps, "seq_len": budget.seq_len, "batch_size": budget.batch_size, "lr": budget.lr,
             "schedule": "constant", "eval_every": budget.eval_every, "eval_batches": budget.eval_batches,
             "log_every": budget.eval_every, "n_checkpoints": budget.formation_checkpoints if formation else 0,
             "device": budget.device}
    return SweepSpec(name=f"phases-{family}-L{depth}" + ("-formation" if formation else ""),
                     base={"source": {"kind": "random", "vocab": budget.vocab, "alpha": budget.alpha},
                           "model": model, "train": train},
                     grid={"source.order": list(budget.orders), "model.n_heads": shapes},
                     seeds=tuple(range(budget.formation_seeds if formation else budget.seeds)), probe=False)


def phase_specs(budget: PhaseBudget) -> list[SweepSpec]:
    """One sweep spec per family and depth, its grid the orders x that depth's shapes, `budget.seeds` seeds."""
    depths = sorted({len(h) for h in budget.shapes})
    specs = [_spec(budget, family, depth) for family in budget.families for depth in depths]
    return [s for s in specs if s is not None]


def formation_specs(budget: PhaseBudget) -> list[SweepSpec]:
    """The runs whose circuit is followed over training: `budget.formation_seeds` seeds of every cell, trained
    again with `formation_checkpoints` log-spaced checkpoints ([] when formation_seeds is 0)."""
    if budget.formation_seeds == 0:
        return []
    depths = sorted({len(h) for h in budget.shapes})
    specs = [_spec(budget, family, depth, formation=True) for family in budget.families for depth in depths]
    return [s for s in specs if s is not None]


# --------------------------------------------------------------------------------------------- measures
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


def _classified(report: Any) -> dict:
    """What the phase diagram keeps of a `probes.MechanismReport`: the label and its circuit."""
    pair = lambda h: None if h is None else f"L{h[0]}H{h[1]}"  # noqa: E731
    return {"mechanism": report.mechanism, "order": report.order, "confident": report.confident,
            "circuit_confirmed": report.circuit_confirmed, "previous_token_head": pair(report.previous_token_head),
            "induction_head": pair(report.induction_head), "in_context_fraction": report.in_context_fraction,
            "reason": report.reasons[0] if report.reasons else ""}


@torch.no_grad()
def measure_model(model: "HookedModel", batch: "ProbeBatch", source: "Source", *, classify: bool = False) -> dict:
    """Gain fractions, order reached, attention-score heads and (optionally) the causal classification of one
    trained model on its order's probe batch.

    Args:
        model: a trained hooked model.
        batch: `probes.sample_batch` of the model's source at its training length.
        source: that source (its alpha smooths the in-context laws: the order-k law is then the posterior
            predictive).
        classify: also run `probes.classify_mechanism` (path patching and kernel swap on 32 of the sequences).

    Returns:
        {"gains": {j: g_j}, "reached": j, "model_loss": nats, "circuit": `circuit_summary`, "classified":
        the classifier's label and circuit (None unless `classify`)}.
    """
    from markov_interp import probes
    from markov_interp.models import heads_per_layer

    order = source.order
    probs = probes.next_state_probs(model, batch.tokens)
    gains = probes.graded_gains(probs, batch, beta=source.alpha, max_order=order)
    scores = probes.attention_scores(model, batch.tokens, max_order=order)
    circuit = circuit_summary(scores, tuple(heads_per_layer(model)), order)
    classified = None
    if classify:
        small = probes.sample_batch(source, n_sequences=min(32, batch.tokens.shape[0]), seq_len=batch.tokens.shape[1],
                                    seed=_PROBE_SEED + 100 + order)
        classified = _classified(probes.classify_mechanism(model, source, batch=small, circuit_sequences=8, seed=0))
    return {"gains": {str(j): g for j, g in gains.items()}, "reached": order_reached(dict(gains)),
            "model_loss": gains.model_loss, "circuit": circuit, "classified": classified}


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
    dynamics: Optional[dynamics.RunDynamics]  # None also when read back from results.json (it keeps no curves)
    crossings: Optional[dict] = None  # read back: the crossings as results.json keeps them (`crossings_to_json`)
    vocab: int = 2  # the chain's states (the alphabet axis)

    @property
    def escape(self) -> Optional[dynamics.StepInterval]:
        """The run's escape (the crossing of 0.5), None unless finished."""
        if self.dynamics is not None:
            return self.dynamics.escape
        return None if self.crossings is None else dynamics.crossings_from_json(self.crossings)[0].get(
            dynamics.ESCAPE_FRACTION)


def _family(normalization: Optional[str]) -> str:
    return next(name for name, norm in FAMILIES.items() if norm == normalization)


def _probe_batches(budget: PhaseBudget) -> dict[int, Any]:
    from markov_interp import probes
    from markov_interp.sources import RandomMarkov

    return {k: probes.sample_batch(RandomMarkov(budget.vocab, order=k, alpha=budget.alpha),
                                   n_sequences=budget.probe_sequences, seq_len=budget.seq_len, seed=_PROBE_SEED + k)
            for k in budget.orders}


def _measure_key(budget: PhaseBudget) -> str:
    # the version names the measure's code: 4 = the classifier's roles by edge content, 5 = with what the receivers'
    # keys carry as a whole and cancelling sets kept where dropping them cost faithfulness, so labels cached by an
    # older classifier are measured again rather than reused
    return (f"phases-6:{budget.probe_sequences}x{budget.seq_len}:seed{_PROBE_SEED}:reach{REACH}:"
            f"head{HEAD_EXCESS}")


def measure_rows(rows: list, work: Path, budget: PhaseBudget, *, progress: bool = False) -> list[RunRecord]:
    """Each sweep row as a `RunRecord`: the finished runs loaded from their folders and measured (cached in
    work/measures), their dynamics read from their metrics."""
    from tqdm.auto import tqdm

    from markov_interp import runs

    batches = _probe_batches(budget)
    records = []
    for row in tqdm(rows, disable=not progress, desc="measure", unit="run"):
        cfg = row.config
        where = dict(family=_family(cfg.model.normalization), heads=tuple(cfg.model.heads_per_layer),
                     order=cfg.source.order, seed=cfg.train.seed, status=row.status, vocab=cfg.source.vocab)
        if row.status != "ok":
            records.append(RunRecord(**where, measure=None, dynamics=None))
            continue
        folder = work / row.run_dir
        value = _measure_folder(folder, batches, budget, work, row.cell_id)
        curves = dynamics.from_metrics(runs.load_metrics(folder))
        records.append(RunRecord(**where, measure=value, dynamics=curves))
    return records


def _measure_folder(folder: Path, batches: dict, budget: PhaseBudget, work: Path, cell_id: str) -> dict:
    """`measure_model` of the final weights in `folder` (a run folder, or a folder of kept weights: its
    config.json and model.safetensors) on its order's probe batch, cached in work/measures under `cell_id`."""
    from markov_interp import runs

    cfg = runs.read_config(folder)
    classify = cfg.train.seed < budget.classified

    def measure() -> dict:
        model = runs.load_model(folder, device="cpu")
        return measure_model(model, batches[cfg.source.order], cfg.source.build(), classify=classify)

    return _shared.cached_measure(work, cell_id, _measure_key(budget) + f":classify{classify}", measure)


def _escape_json(escapes: list[dynamics.StepInterval]) -> dict:
    """The escape (the 0.5 crossing) over a cell's runs: median crossing and interval, censored fraction."""
    if not escapes:
        return {"median": None, "describe": "no runs", "censored": _shared.proportion(0, 0)}
    spread = dynamics.survival(escapes)
    median = spread.median()
    return {"median": median.by, "after": median.estimate.after, "describe": median.describe(),
            "interval": None if median.interval is None else [median.interval.after, median.interval.by],
            "censored": _shared.proportion(spread.n_censored, spread.n)}


def _circuit_json(measures: list[dict], order: int) -> dict:
    n = len(measures)
    circuits = [m["circuit"] for m in measures]
    signature = Counter(f"lags {'+'.join(l for l, h in c['lags'].items() if h) or 'none'}, induction order "
                        f"{c['induction_order']}" for c in circuits)
    return {"full": _shared.proportion(sum(c["full"] for c in circuits), n),
            "lag_heads": {str(lag): _shared.proportion(sum(bool(c["lags"][str(lag)]) for c in circuits), n)
                          for lag in range(1, order + 1)},
            "induction_order": dict(sorted(Counter(c["induction_order"] for c in circuits).items())),
            "signatures": dict(signature.most_common()), "classified": _classified_json(measures, order)}


def _classified_json(measures: list[dict], order: int) -> dict:
    """The classifier's labels over the classified seeds of a cell of source order `order`: counts of "mechanism
    (order k)", the fraction labelled induction of that order (Wilson 95%: an order-1 circuit on an order-2 source
    is not the circuit a claim about the order-2 law names) and the most common previous-token -> induction pair."""
    done = [m["classified"] for m in measures if m.get("classified")]
    labels = Counter(c["mechanism"] + (f" {c['order']}" if c["order"] is not None else "") for c in done)
    pairs = Counter(f"{c['previous_token_head']} -> {c['induction_head']}" for c in done if c["circuit_confirmed"])
    return {"n": len(done), "labels": dict(labels.most_common()),
            "induction": _shared.proportion(sum(c["mechanism"] == "induction" and c["order"] == order for c in done),
                                            len(done)),
            "pairs": dict(pairs.most_common())}


def _cell_json(key: tuple, records: list[RunRecord]) -> dict:
    family, vocab, heads, order = key
    done = [r for r in records if r.measure is not None]
    measures = [r.measure for r in done]
    reached = [m["reached"] for m in measures]
    n = len(done)
    cell = {"family": family, "vocab": vocab, "heads": list(heads), "label": shape_label(heads), "order": order,
            "n": n, "not_ok": dict(Counter(r.status for r in records if r.status != "ok")),
            "reached": {str(j): _shared.proportion(sum(x >= j for x in reached), n) for j in range(-1, order + 1)},
            "order_reached": dict(sorted(Counter(reached).items())),
            "median_order": int(statistics.median_low(reached)) if reached else None,
            "gains": {}, "escape": _escape_json([r.escape for r in done if r.escape is not None]),
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
        cells.setdefault((r.family, r.vocab, r.heads, r.order), []).append(r)
    return [_cell_json(key, rs) for key, rs in cells.items()]


# ------------------------------------------------------------------------------------------------ output
_ORDER_NAMES = {-1: "none", 0: "unigram", 1: "bigram", 2: "trigram", 3: "4-gram", 4: "5-gram"}


def _fmt_labels(classified: Optional[dict]) -> str:
    if not classified or not classified["n"]:
        return "not classified"
    return ", ".join(f"{label} {n}" for label, n in classified["labels"].items()) + f" (of {classified['n']})"


def cells_table(cells: list[dict]) -> Table:
    """Every cell: seeds reaching orders 0, 1 and k (Wilson 95%), the median order reached, g_k (bootstrap 95%),
    the escape, the full attention circuit and the classifier's labels."""
    columns = ("family", "states", "shape", "order k", "seeds", "reach order 0", "reach order 1", "reach order k",
               "median order reached", "g_k mean [95% CI]", "escape: median crossing of 0.5", "censored",
               "full circuit (attention)", "classifier (seeds)")
    rows = []
    for c in cells:
        k = c["order"]
        g = c["gains"][str(k)]
        circuit = c["circuit"] or {}
        median = c["median_order"]
        rows.append((c["family"], str(c.get("vocab", 2)), c["label"], str(k), str(c["n"]), _fmt_p(c["reached"]["0"]),
                     _fmt_p(c["reached"]["1"]), _fmt_p(c["reached"][str(k)]),
                     "—" if median is None else f"{median} ({_ORDER_NAMES[median]})",
                     f"{g['mean']:.2f} [{g['interval'][0]:.2f}, {g['interval'][1]:.2f}]", c["escape"]["describe"],
                     _fmt_p(c["escape"]["censored"]), _fmt_p(circuit.get("full")),
                     _fmt_labels(circuit.get("classified"))))
    return Table(columns, rows)


def _number(value: Any) -> str:
    return "" if value is None or (isinstance(value, float) and not math.isfinite(value)) else f"{value:.4g}"


def cells_csv(cells: list[dict]) -> Table:
    """cells.csv: one row per cell, numbers only (fractions, interval ends, gain means)."""
    orders = range(-1, max((c["order"] for c in cells), default=1) + 1)
    columns = ["family", "vocab", "shape", "order", "n", "median_order"] + [f"reached_{j}{e}" for j in orders
                                                                  for e in ("", "_lo", "_hi")]
    columns += [f"g{j}_mean" for j in orders if j >= 0] + ["escape_median", "censored", "full_circuit",
                                                           "classified", "classified_induction"]
    rows = []
    for c in cells:
        row = {"family": c["family"], "vocab": str(c.get("vocab", 2)), "shape": c["label"], "order": str(c["order"]), "n": str(c["n"]),
               "median_order": _number(c["median_order"]), "escape_median": _number(c["escape"]["median"]),
               "censored": _number(c["escape"]["censored"]["fraction"])}
        circuit = c["circuit"] or {}
        row["full_circuit"] = _number((circuit.get("full") or {}).get("fraction"))
        classified = circuit.get("classified") or {"n": 0, "induction": {}}
        row["classified"], row["classified_induction"] = str(classified["n"]), _number(
            classified["induction"].get("fraction"))
        for j, p in c["reached"].items():
            lo, hi = p["interval"] or (None, None)
            row[f"reached_{j}"], row[f"reached_{j}_lo"], row[f"reached_{j}_hi"] = map(_number, (p["fraction"], lo, hi))
        for j, g in c["gains"].items():
            row[f"g{j}_mean"] = _number(g["mean"])
        rows.append([row.get(col, "") for col in columns])
    return Table(columns, rows)


def run_label(classified: Optional[dict]) -> str:
    """A run's label as the cells count it: "induction 1", "switch_counting 1", "other"; "—" unclassified."""
    if not classified:
        return "—"
    return classified["mechanism"] + (f" {classified['order']}" if classified["order"] is not None else "")


def _why(reason: str) -> str:
    """The classifier's reason without its label and particulars, so that seeds with the same reason group: the
    text after "LABEL: " without its parentheses and faithfulness value, up to the first ";" or ":" (the heads and
    numbers that follow differ from seed to seed).

    >>> _why("other: it follows the in-context bigram (order 1) the kept circuit (switch counting: L1H0 (x)) has "
    ...      "faithfulness -0.07, below 0.5: the kept edges ...")
    'it follows the in-context bigram the kept circuit has faithfulness below 0.5'
    """
    text = reason.split(": ", 1)[1] if ": " in reason else reason
    while re.search(r"\([^()]*\)", text):
        text = re.sub(r"\s*\([^()]*\)", "", text)
    text = re.sub(r"faithfulness -?[\d.]+, ", "faithfulness ", text)
    return re.split(r"[;:]", text)[0].strip()


def run_key(run: dict) -> tuple:
    """A results.json run's place in the grid: (family, states, heads, order, seed)."""
    return run["family"], run.get("vocab", 2), tuple(run["heads"]), run["order"], run["seed"]


def label_changes(before: list[dict], after: list[dict]) -> Table:
    """How the classified runs' labels moved between two measurements of the same runs (results.json "runs"
    rows, e.g. before and after `remeasure`): one row per (before, after, the new reason), with its count.

    Args:
        before: the runs as first labelled.
        after: the same runs labelled again.

    Returns:
        A table of label changes, most common first; runs whose label held are one row per label ("unchanged").
    """
    old = {run_key(r): r for r in before}
    counts: Counter = Counter()
    for run in after:
        if not run.get("classified"):
            continue
        was, now = run_label((old.get(run_key(run)) or {}).get("classified")), run_label(run["classified"])
        counts[(was, now, _why(run["classified"]["reason"]) if was != now else "unchanged")] += 1
    return Table(("before", "after", "seeds", "why (the new verdict's reason)"),
                 [(was, now, str(n), why) for (was, now, why), n in counts.most_common()])


def deep_at_law(runs: list[dict]) -> list[dict]:
    """The classified results.json runs with two or more layers that reach their order's law (g_k >= 0.75, as the
    phase diagram's issue counts them)."""
    return [r for r in runs if r.get("classified") and len(r["heads"]) >= 2
            and (r.get("gains") or {}).get(str(r["order"]), -1) >= 0.75]


def unnamed_at_law(after: list[dict]) -> Table:
    """The seeds of `deep_at_law` still labelled `other`, by cell and reason."""
    counts: Counter = Counter()
    for run in deep_at_law(after):
        c = run["classified"]
        if c["mechanism"] == "other":
            counts[(f"{shape_label(tuple(run['heads']))} order {run['order']}", _why(c["reason"]))] += 1
    return Table(("cell", "seeds", "why"), [(cell, str(n), why) for (cell, why), n in sorted(counts.items())])


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


def setup_text(budget: PhaseBudget) -> str:
    """The source, models, training and probes of `budget`, in words."""
    return (f"Source: RandomMarkov(vocab {budget.vocab}, order k, alpha {budget.alpha:g}): a fresh Dirichlet kernel "
            f"per sequence. Models: d_model {budget.d_model}, d_head {budget.d_head}, untied, no MLP; families "
            f"{', '.join(budget.families)} (attention-only: no normalisation; layernorm: pre-LayerNorm). Training: "
            f"{budget.steps} steps, batch {budget.batch_size} x {budget.seq_len} states, AdamW lr {budget.lr:g} "
            f"constant, {budget.seeds} seeds per cell (seeds 0..{budget.seeds - 1}), every order and seed of a "
            f"shape one stack. Probes: {budget.probe_sequences} sequences of {budget.seq_len} states per order (the "
            f"training length), the same batch for every model of that order; `probes.classify_mechanism` on 32 "
            f"sequences (path patching on 8) for seeds 0..{budget.classified - 1} of every cell.")


_CELLS_TEXT = (f"Reach order j: the seeds whose gain fraction g_j >= {REACH} for every rung up to j (Wilson 95% "
               "interval); g_k: the share of the step from the order-(k-1) to the order-k in-context law the seeds "
               "climb (mean, bootstrap 95% interval); escape: `dynamics` on the paired evaluations (median crossing "
               "of half the in-context unigram plateau's excess over the order-k law, Kaplan-Meier 95% interval); "
               f"full circuit (attention): a lag head (previous-token excess >= {HEAD_EXCESS}) below the last layer "
               f"for every lag 1..k and an order-k induction head (excess >= {HEAD_EXCESS}) above layer 0; "
               "classifier: `probes.classify_mechanism`'s labels (causal: the law check, graded gains, kernel swap "
               "and path patching).")


_FORMATION_TEXT = ("Seed 0 of every cell trained again with {n} log-spaced checkpoints (the same run: same seed, same "
                   "data) and its circuit found at every checkpoint by path patching on one batch of {seqs} sequences "
                   "(`probes.circuit_formation`). A K-edge (a head into another head's keys: the induction "
                   "composition) enters at the first checkpoint from which it stays kept; set against the run's own "
                   "crossings of the excess-loss lines (a crossing is a grid interval between evaluations).")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PhaseResult(_shared.GridResult):
    """The phase diagram at one budget: per-run records, per-cell summaries, the claims."""

    claims: list
    formation: tuple = ()  # `_formation.FormationRecord`s: seed 0 of every cell, its circuit at every checkpoint

    def _formation_labels(self) -> dict:
        return {id(r): f"{r.where['family']} {shape_label(tuple(r.where['heads']))} order {r.where['order']}"
                for r in self.formation}

    def _formation_shown(self) -> dict[str, _formation.FormationRecord]:
        """The figures' runs: two layers with one head on order 1 (the textbook circuit) and two heads on
        order 2, where run."""
        wanted = {"circuit_formation.png": ((1, 1), 1), "circuit_formation_order2.png": ((2, 2), 2)}
        return {name: r for name, (heads, order) in wanted.items() for r in self.formation
                if tuple(r.where["heads"]) == heads and r.where["order"] == order and r.where["seed"] == 0}

    def _curves(self) -> dict[str, dict[str, dynamics.MedianCurve]]:
        return curve_panels(list(self.records))

    def sections(self) -> list[Section]:
        out = [Section("Setup", setup_text(self.budget), id="setup"),
               Section("Beside each paper's claim", "", claims_table(self.claims), id="claims"),
               Section("Every cell", _CELLS_TEXT, cells_table(self.cells),
                       figures=("phase_diagram.png", *(["escape_curves.png"] if self._curves() else [])), id="cells")]
        if self.formation:
            out.append(Section("Circuits over training", _FORMATION_TEXT.format(
                n=self.budget.formation_checkpoints, seqs=_formation.FORMATION_SEQUENCES),
                _formation.formation_table(list(self.formation), self._formation_labels()),
                figures=tuple(self._formation_shown()), id="formation"))
        return out

    def figures(self) -> dict[str, Any]:
        from markov_interp.experiments._figures_dynamics import excess_curves_panels_figure
        from markov_interp.experiments._figures_phases import phase_diagram_figure

        drawn = {"phase_diagram.png": phase_diagram_figure(
                     self.cells, title=f"{self.budget.name} budget: {self.budget.steps} steps")}
        if self._curves():  # read back from results.json there are no curves to draw
            drawn["escape_curves.png"] = excess_curves_panels_figure(
                self._curves(), columns=len(self.budget.orders),
                title="median excess over the order-k law relative to the in-context unigram plateau's")
        labels = self._formation_labels()
        for name, record in self._formation_shown().items():
            drawn[name] = _formation.formation_figure(record, f"{labels[id(record)]}, seed 0: the circuit over "
                                                              "training")
        return drawn

    def tables(self) -> dict[str, Table]:
        return {"cells.csv": cells_csv(self.cells)}

    def to_json(self) -> dict:
        runs = [{"family": r.family, "vocab": r.vocab, "heads": list(r.heads), "order": r.order, "seed": r.seed,
                 "status": r.status,
                 **(r.measure or {}), "crossings": _crossings_json(r)} for r in self.records]
        return {"cells": self.cells, "claims": self.claims, "runs": runs,
                "formation": [r.to_json() for r in self.formation]}


def _crossings_json(r: RunRecord) -> Optional[dict]:
    return r.dynamics.to_json() if r.dynamics is not None else r.crossings


_RUN_KEYS = ("family", "vocab", "heads", "order", "seed", "status", "crossings")


def _record_from_json(run: dict, vocab: int) -> RunRecord:
    """One run of results.json as a `RunRecord`: its measures, the order reached recomputed from its gains by the
    current `REACH`, its crossings (no curve: results.json keeps none); `vocab` for a file that does not name its
    runs' alphabet (its budget's)."""
    measure = {k: v for k, v in run.items() if k not in _RUN_KEYS} if run["status"] == "ok" else None
    if measure is not None:
        measure["reached"] = order_reached({int(j): g for j, g in measure["gains"].items()})
    return RunRecord(family=run["family"], heads=tuple(run["heads"]), order=int(run["order"]), seed=int(run["seed"]),
                     status=run["status"], measure=measure, dynamics=None, crossings=run.get("crossings"),
                     vocab=int(run.get("vocab", vocab)))


def read(budget: PhaseBudget, result: dict) -> PhaseResult:
    """results.json's "result" read back (`experiments.load`): the runs' measures and crossings as records, every
    cell summary and claim recomputed by the current code (no figure of the excess curves: the file keeps none)."""
    records = [_record_from_json(run, budget.vocab) for run in result["runs"]]
    cells = cell_summaries(records)
    return PhaseResult(budget=budget, records=tuple(records), cells=cells, claims=claims(cells),
                       n_failed=sum(r.status not in ("ok", "diverged") for r in records),
                       formation=tuple(_formation.FormationRecord.from_json(f) for f in result.get("formation", ())))


def alphabets(results: list[PhaseResult]) -> tuple[list[dict], list[dict]]:
    """The phase diagrams of several alphabets (one `PhaseResult` per number of states, e.g. the standard and
    standard3 budgets) as one: (cells, claims) over the union of their runs, each cell and claim row at its own
    number of states, so a claim about induction heads is read where binary chains' switch-counting shortcut does
    not exist."""
    cells = cell_summaries([r for result in results for r in result.records])
    return cells, claims(cells)


def run(budget: PhaseBudget, out: Path, *, progress: bool = False) -> PhaseResult:
    """Train the grid of `budget` into out/runs (restartable: finished runs and measures are reused), measure
    every run and summarise every cell.

    Args:
        budget: the grid and recipe.
        out: the experiment's folder (the sweep in out/runs, measures cached in out/runs/measures).
        progress: tqdm bars.

    Returns:
        A `PhaseResult`.
    """
    work = Path(out) / "runs"
    result = _shared.train_grid(phase_specs(budget), work, workers=budget.workers, group=budget.stack_size,
                                progress=progress)
    records = measure_rows(result.rows, work, budget, progress=progress)
    for row, record in zip(result.rows, records):  # the final weights beside results.json: `remeasure` reads them
        if record.measure is not None:
            _weights.keep(work / row.run_dir, Path(out), weights_name(record))
    cells = cell_summaries(records)
    formation = formation_rows(budget, work, progress=progress)
    return PhaseResult(budget=budget, records=tuple(records), cells=cells, claims=claims(cells),
                       n_failed=result.n_failed, formation=tuple(formation))


def weights_name(record: RunRecord) -> str:
    """The folder of a run's kept weights under out/weights: family, states, heads per layer, order and seed.

    >>> weights_name(RunRecord("layernorm", (2, 1), 1, 3, "ok", None, None, vocab=2))
    'layernorm-v2-h2-1-k1-s3'
    """
    return f"{record.family}-v{record.vocab}-h{'-'.join(map(str, record.heads))}-k{record.order}-s{record.seed}"


def remeasure(budget: PhaseBudget, out: Path, *, progress: bool = False) -> PhaseResult:
    """Measure and classify again, with no training, every finished run of the results.json in `out` from the
    weights kept beside it (out/weights, `weights_name`), by the current probes and classifier; the crossings
    (training curves) and the formation runs' circuits are the file's (their curves and checkpoints are not kept).

    Args:
        budget: the file's budget (`experiments.load(out).budget`).
        out: the experiment's folder: results.json and weights/ (measures cached in out/runs/measures).
        progress: a tqdm bar.

    Returns:
        A `PhaseResult` of the same runs.
    """
    from tqdm.auto import tqdm

    from markov_interp.experiments import RESULTS_FILE

    out = Path(out)
    old = json.loads((out / RESULTS_FILE).read_text())["result"]
    batches, records = _probe_batches(budget), []
    for run_json in tqdm(old["runs"], disable=not progress, desc="remeasure", unit="run"):
        record = _record_from_json(run_json, budget.vocab)
        if record.measure is not None:
            name = weights_name(record)
            measure = _measure_folder(_weights.kept(out, name), batches, budget, out / "runs", name)
            record = dataclasses.replace(record, measure=measure)
        records.append(record)
    cells = cell_summaries(records)
    return PhaseResult(budget=budget, records=tuple(records), cells=cells, claims=claims(cells),
                       n_failed=sum(r.status not in ("ok", "diverged") for r in records),
                       formation=tuple(_formation.FormationRecord.from_json(f) for f in old.get("formation", ())))


def formation_rows(budget: PhaseBudget, work: Path, *, progress: bool = False) -> list[_formation.FormationRecord]:
    """Train the formation runs (`formation_specs`) into `work` and read each one's circuit at every checkpoint."""
    from tqdm.auto import tqdm

    from markov_interp import runs

    specs = formation_specs(budget)
    if not specs:
        return []
    trained = _shared.train_grid(specs, work, workers=budget.workers,
                                 group=len(budget.orders) * budget.formation_seeds, progress=progress)
    found = []
    for row in tqdm([r for r in trained.rows if r.status == "ok"], disable=not progress, desc="formation",
                    unit="run"):
        cfg, folder = row.config, work / row.run_dir
        where = dict(family=_family(cfg.model.normalization), heads=list(cfg.model.heads_per_layer),
                     order=cfg.source.order, seed=cfg.train.seed)
        found.append(_formation.FormationRecord(
            where=where, formation=_formation.measure_formation(folder, work, row.cell_id, seed=_PROBE_SEED),
            dynamics=dynamics.from_metrics(runs.load_metrics(folder))))
    return found


EXPERIMENT = register(Experiment(name="phases", title="Order x depth x heads phase diagram",
                                 budgets={"quick": QUICK, "standard": STANDARD, "standard3": STANDARD3,
                                          "converged": CONVERGED,
                                          "full": FULL, "gpu": GPU, "tiny": TINY}, run=run, read=read, remeasure=remeasure,
                                 precision="fp32"))
