"""Task diversity: with a finite pool of N kernels instead of a fresh one per sequence, when do transformers stop
retrieving the pool from their weights and start estimating the kernel in context?

Raventós et al. (2023) found, for in-context linear regression, a task-diversity threshold: below it models
behave like the Bayes predictor of the pretraining tasks (retrieval), above it like the predictor of the whole
prior (inference, generalising to unseen tasks). Park et al. (2024, "Competition dynamics shape algorithmic phases
of in-context learning") map the same question on finite mixtures of Markov chains into four algorithms: unigram or
bigram statistics of the context, used to retrieve a chain of the pool or to infer one. Here:

- sources `RandomMarkov(vocab, alpha=1, pool_size=N)` (pool seed 0) for N in `budget.pool_sizes`
  and the fresh-kernel source (N = ∞), the same pool for every seed; the paper's two-layer attention-only model
  and `budget.depths`' others; `budget.seeds` seeds per cell, every N and seed of a depth one stack;
- per model, on a probe batch of its own pool (in pool) and one of fresh kernels (out of pool, the same for all):
  its loss against the pool's Bayes predictor (the source's `predictive`, `sources.pool_bayes_predictions`:
  retrieval) and the in-context Bayes predictor (add-alpha, inference); the **kernel-swap fraction**
  (`probes.swap_kernels`, raw: not clipped) on fresh kernels outside the pool f = (L(pool Bayes) - L(model)) / (L(pool Bayes) - L(in-context Bayes)): 0 for
  a model that retrieves, 1 for one that infers;
- **Park et al.'s four algorithms** on the in-pool batch: unigram retrieval (`theory.pool_unigram_predictions`),
  bigram retrieval (the pool's Bayes predictor), unigram inference (in-context add-alpha state counts), bigram
  inference (in-context add-alpha transition counts); KL(algorithm || model) for each and the closest one, the
  model's phase;
- **the transition N\\***: where the mean kernel-swap fraction over seeds first reaches 1/2 and stays there for
  every larger N where the fraction is defined (`swap_transition`: a pool size whose denominator is below the
  floor `swap_floor` has no fraction for N\\*), interpolated in log2 N, with a bootstrap interval over seeds
  (`transition_point`, `transition_interval`); and the N where half the seeds are closest to an inference
  algorithm.

`python -m markov_interp.experiments --only diversity [--quick]` (or `markov-interp experiment diversity`) writes
results.json, cells.csv, summary.md and the figure.
"""

import dataclasses
import math
import statistics
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import numpy as np
import torch

from markov_interp import theory
from markov_interp._plan import Need, planned, size
from markov_interp.config import check_probability
from markov_interp.sources import add_beta_predictions
from markov_interp.experiments import Budget, Experiment, Section, Table, _shared, register
from markov_interp.sweep import SweepSpec

if TYPE_CHECKING:  # for annotations only: probes and models load TransformerLens, which `--help` need not
    from markov_interp.sources import RandomMarkov
    from markov_interp.models import HookedModel
    from markov_interp.probes import ProbeBatch

__all__ = ["DiversityBudget", "QUICK", "STANDARD", "FULL", "GPU", "TINY", "EXPERIMENT", "ALGORITHMS", "INFERENCE",
           "diversity_specs", "algorithm_laws", "measure_model", "transition_point", "transition_interval",
           "Transition", "UNDEFINED", "swap_denominator", "swap_floor", "swap_transition", "cell_summaries",
           "transitions", "claims", "claims_table", "cells_table", "references_table", "transitions_table",
           "cells_csv", "DiversityResult", "run", "read"]

# Park et al.'s four algorithms (retrieval / inference x unigram / bigram statistics of the context)
ALGORITHMS = ("unigram retrieval", "bigram retrieval", "unigram inference", "bigram inference")
INFERENCE = ("unigram inference", "bigram inference")
_PROBE_SEED = 8_000  # in-pool batch of pool size N: seed _PROBE_SEED + log2 N; out of pool: _PROBE_SEED - 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class DiversityBudget(Budget):
    """Seeds, pool sizes, depths and recipe of the task-diversity sweep (`cuts` says what a smaller budget leaves
    out)."""

    pool_sizes: tuple[int, ...] = tuple(2 ** i for i in range(11))  # and the fresh-kernel source (N = ∞)
    depths: tuple[int, ...] = (2, 1, 3)
    vocab: int = 3
    alpha: float = 1.0
    seq_len: int = 64
    batch_size: int = 32
    lr: float = 1e-2
    d_model: int = 16
    eval_every: int = 50
    eval_batches: int = 4
    probe_sequences: int = 128
    group: Optional[int] = None  # runs per stack (default: every pool size and seed of a depth)
    workers: Optional[int] = None  # training processes (default: every core)

    def check(self) -> None:
        if self.vocab < 2:
            raise ValueError(f"budget {self.name!r}: vocab must be at least 2, got {self.vocab}")
        sizes = list(self.pool_sizes)
        if sizes != sorted(set(sizes)):
            raise ValueError(f"budget {self.name!r}: pool_sizes must be increasing, got {self.pool_sizes!r}")

    @property
    def sizes(self) -> tuple:
        """The pool sizes with the fresh-kernel source last (None = ∞)."""
        return (*self.pool_sizes, None)

    @property
    def stack_size(self) -> int:
        return self.group or len(self.sizes) * self.seeds


FULL = DiversityBudget(name="full", seeds=64, steps=3000)
QUICK = DiversityBudget(
    name="quick", seeds=4, steps=300, pool_sizes=(1, 8, 64), depths=(2,), eval_batches=2, probe_sequences=64,
    workers=1,
    cuts="pool sizes 1, 8, 64 and fresh kernels (full: every power of two to 1024), depth 2 only (full: 2, 1 and 3), 4 "
         "seeds, 300 steps (full: 3000), 64 probe sequences, one training process (a shared 2-core machine): it shows "
         "retrieval against inference at both ends of the pool sizes after 300 steps; its N* is that of 300 steps, "
         "which moves with the training length (Raventos et al.), not the full budget's")
GPU = DiversityBudget(
    name="gpu", seeds=16, steps=2000, depths=(2, 1), workers=2, device="cuda",
    cuts="sized for one lent GPU call of about 10 minutes (not yet measured): depths 2 and 1 (no depth 3), 16 seeds "
         "per cell in stacks of 192 (12 pool sizes x 16 seeds), 2000 steps")
STANDARD = DiversityBudget(
    name="standard", seeds=8, steps=3000, pool_sizes=(1, 2, 4, 8, 16, 32, 64, 256, 1024), depths=(2, 1),
    probe_sequences=512, workers=1,
    cuts="the smallest budget at which the positive control learns (two layers on fresh kernels, N = ∞, reach the "
         "in-context bigram law): pool sizes 1-64, 256 and 1024 and fresh kernels, depths 2 and 1 (no 3), 8 seeds "
         "per cell (full: 64), 3000 steps, 512 probe sequences, one training process (a 2-core CPU)")
TINY = DiversityBudget(name="tiny", seeds=2, pool_sizes=(1, 4), depths=(1,), steps=6, seq_len=16, batch_size=4,
                       eval_every=3, eval_batches=1, probe_sequences=8,
                       cuts="a smoke test of the code path; its numbers show nothing")


def diversity_specs(budget: DiversityBudget) -> list[SweepSpec]:
    """One sweep spec per depth: its grid the pool sizes and the fresh source, `budget.seeds` seeds."""
    specs = []
    for depth in budget.depths:
        model = {"preset": "attn-only-2layer", "n_layers": depth, "d_model": budget.d_model, "n_ctx": budget.seq_len}
        train = {"steps": budget.steps, "seq_len": budget.seq_len, "batch_size": budget.batch_size, "lr": budget.lr,
                 "schedule": "constant", "eval_every": budget.eval_every, "eval_batches": budget.eval_batches,
                 "log_every": budget.eval_every, "n_checkpoints": 0, "device": budget.device}
        source = {"kind": "random", "vocab": budget.vocab, "alpha": budget.alpha}
        specs.append(SweepSpec(name=f"diversity-L{depth}", base={"source": source, "model": model, "train": train},
                               grid={"source.pool_size": list(budget.sizes)}, seeds=tuple(range(budget.seeds)),
                               probe=False))
    return specs


# --------------------------------------------------------------------------------------------- measures
def algorithm_laws(source: "RandomMarkov", tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """Park et al.'s four algorithms' next-state laws on `tokens` ([batch pos vocab] each) for a pool `source`
    (`RandomMarkov(pool_size=N)`); for the fresh-kernel source (no pool) only the two inference laws.

    Args:
        source: the training source.
        tokens: [batch pos] states.

    Returns:
        {"unigram retrieval": ..., "bigram retrieval": ..., "unigram inference": ..., "bigram inference": ...}.
    """
    laws = {}
    if source.pool is not None:
        laws["unigram retrieval"] = theory.pool_unigram_predictions(source.pool, tokens)
        laws["bigram retrieval"] = source.predictive(tokens)
    laws["unigram inference"] = add_beta_predictions(tokens, source.vocab, order=0, beta=source.alpha)
    laws["bigram inference"] = add_beta_predictions(tokens, source.vocab, order=source.order, beta=source.alpha)
    return laws


def _loss(probs: torch.Tensor, tokens: torch.Tensor) -> float:
    return float(theory.target_log_loss(probs.cpu().double(), tokens.cpu()).mean())


def _kl(law: torch.Tensor, probs: torch.Tensor) -> float:
    """Mean over the predictions of the targets of KL(law || model), nats."""
    law, probs = law[:, :-1].cpu().double(), probs[:, :-1].cpu().double()
    return float(theory.kl_divergence(law, probs).mean())


@torch.no_grad()
def measure_model(model: "HookedModel", inside: "ProbeBatch", outside: "ProbeBatch", source: "RandomMarkov") -> dict:
    """One trained model on its pool's probe batch (`inside`) and on the fresh-kernel batch (`outside`).

    Args:
        model: the trained hooked model.
        inside: `probes.sample_batch` of its training source.
        outside: `probes.sample_batch` of `source.out_of_pool()` (for the fresh source, another batch of it).
        source: the training source.

    Returns:
        {"in": {"model", "pool_bayes", "in_context_bayes": losses}, "out": {...}, "swap_fraction": f, the raw
        in-context fraction of `probes.swap_kernels` on fresh kernels outside the pool (None for the fresh source),
        "swap_se", "kl": {algorithm: KL(algorithm || model) on the in-pool batch}, "phase": the closest
        algorithm}.
    """
    from markov_interp import probes

    fresh = source.out_of_pool() if source.pool is not None else source
    result = {}
    for name, batch in (("in", inside), ("out", outside)):
        tokens = batch.tokens
        losses = {"model": _loss(probes.next_state_probs(model, tokens), tokens),
                  "in_context_bayes": _loss(fresh.predictive(tokens), tokens)}
        if source.pool is not None:
            losses["pool_bayes"] = _loss(source.predictive(tokens), tokens)
        result[name] = losses
    swap = None if source.pool is None else probes.swap_kernels(
        model, source, seq_len=outside.tokens.shape[1], n_sequences=outside.tokens.shape[0], seed=_PROBE_SEED - 1)
    # the raw fraction (not clipped to [0, 1]): its mean over seeds is unbiased
    result["swap_fraction"] = None if swap is None else swap.raw_fraction
    result["swap_se"] = None if swap is None else swap.se
    probs = probes.next_state_probs(model, inside.tokens)
    result["kl"] = {name: _kl(law, probs) for name, law in algorithm_laws(source, inside.tokens).items()}
    result["phase"] = min(result["kl"], key=result["kl"].get)
    return result


# ------------------------------------------------------------------------------------------- transition
UNDEFINED = "undefined"  # Transition.relation when the measure is defined at no pool size


@dataclasses.dataclass(frozen=True)
class Transition:
    """Where a per-seed measure's mean over seeds crosses `level` as the pool grows (N*).

    `estimate`: N* (interpolated in log2 N between the last size below the level and the first of the sizes at or
    above it for good), or the smallest size when the mean is at or above the level throughout ("<="), or the
    largest when it never gets there for good (">"), or nan when the measure is defined at no size (`UNDEFINED`,
    see `swap_transition`). `interval`: the bootstrap interval over seeds (percentile; `math.inf` = not reached by
    the largest size)."""

    estimate: float
    relation: str  # "=", "<=", ">" or UNDEFINED
    interval: Optional[tuple[float, float]]
    level: float
    n_boot: int

    def describe(self) -> str:
        """E.g. "N* = 22 [11, 45]", "N* > 1024 [300, not reached]", "N* undefined"."""
        if self.relation == UNDEFINED:
            return "N* undefined"
        head = f"N* {self.relation} {self.estimate:.3g}"
        if self.interval is None:
            return head + " (no interval)"
        lo, hi = (f"{v:.3g}" if math.isfinite(v) else "not reached" for v in self.interval)
        return head + f" [{lo}, {hi}]"


def _crossings(x: np.ndarray, means: np.ndarray, level: float) -> np.ndarray:
    """Per row of `means` [rows, sizes]: the crossing in log2 N (x), x[0] when at or above `level` throughout,
    +inf when the last mean is below it."""
    above = means >= level
    stay = np.flip(np.logical_and.accumulate(np.flip(above, 1), 1), 1)  # at or above from here on
    first = np.where(stay.any(1), stay.argmax(1), len(x))
    out = np.full(len(means), np.inf)
    out[first == 0] = x[0]
    inner = (first > 0) & (first < len(x))
    rows, i = np.nonzero(inner)[0], first[inner]
    lo_m, hi_m = means[rows, i - 1], means[rows, i]
    out[rows] = x[i - 1] + (level - lo_m) / (hi_m - lo_m) * (x[i] - x[i - 1])
    return out


def transition_point(sizes: list[int], values: list[list[float]], *, level: float = 0.5) -> tuple[float, str]:
    """(N*, relation) of the mean of `values[i]` (one value per seed at pool size `sizes[i]`) crossing `level`
    (see `Transition`).

    >>> transition_point([1, 4, 16], [[0.0], [0.0], [1.0]])  # halfway between log2 N = 2 and 4
    (8.0, '=')
    """
    x = np.log2(np.asarray(sizes, dtype=float))
    means = np.array([[statistics.fmean(v) for v in values]])
    crossing = float(_crossings(x, means, level)[0])
    if math.isinf(crossing):
        return float(sizes[-1]), ">"
    return float(2 ** crossing), "<=" if crossing == x[0] else "="


def _boot_needs(a: Any) -> list[Need]:
    """The resampled means: n_boot x the sizes x the longest list of values (float64, and their indices)."""
    sizes = a.get("sizes")
    rows = len(sizes) if hasattr(sizes, "__len__") else 1
    return [Need.of("the bootstrap resamples", size(a, "n_boot") * max(rows, 1) * 16, [("n_boot", size(a, "n_boot"))])]


@planned(_boot_needs)
def transition_interval(sizes: list[int], values: list[list[float]], *, level: float = 0.5, n_boot: int = 2000,
                        seed: int = 0, confidence: float = 0.95) -> Transition:
    """`transition_point` with a percentile bootstrap interval: the seeds of every pool size resampled with
    replacement (`numpy.random.default_rng(seed)`), the crossing of each resample's means.

    Args:
        sizes: increasing pool sizes.
        values: per size, one value per seed (e.g. the kernel-swap fraction).
        level: the line (1/2: halfway from retrieval to inference).
        n_boot: resamples.
        seed: of the resampling generator.
        confidence: of the interval.

    Returns:
        A `Transition`; no interval when a size has fewer than two values.
    """
    estimate, relation = transition_point(sizes, values, level=level)
    if min(len(v) for v in values) < 2:
        return Transition(estimate, relation, None, level, n_boot)
    rng = np.random.default_rng(seed)
    means = np.stack([np.asarray(v, float)[rng.integers(0, len(v), (n_boot, len(v)))].mean(1) for v in values], 1)
    crossings = _crossings(np.log2(np.asarray(sizes, dtype=float)), means, level)
    tail = (1 - confidence) / 2
    lo, hi = np.quantile(crossings, [tail, 1 - tail], method="inverted_cdf")
    return Transition(estimate, relation, (float(2 ** lo), float(2 ** hi)), level, n_boot)


# -------------------------------------------------------------------------------- the swap fraction's guard
def swap_denominator(measure: dict) -> float:
    """The kernel-swap fraction's denominator in one run's measures (`measure_model`): L(pool Bayes) - L(in-context
    Bayes) on the fresh-kernel batch, nats. `probes.swap_kernels` is fed that very batch (the same source, seed and
    shape), so the run's `swap_fraction` is (L(pool Bayes) - L(model)) / this, from its "out" losses.

    >>> round(swap_denominator({"out": {"model": 0.9, "pool_bayes": 0.9080, "in_context_bayes": 0.8949}}), 6)
    0.0131
    """
    return measure["out"]["pool_bayes"] - measure["out"]["in_context_bayes"]


def swap_floor(control_excess: Optional[float], *, level: float = 0.5) -> float:
    """The denominator at or below which the kernel-swap fraction cannot say whether a model infers: e / (1 - level),
    e the excess loss of the positive control (the same depth trained on fresh kernels, N = ∞) over in-context
    Bayes on the same fresh-kernel batch, mean over its seeds (0 when e < 0 or there is no control).

    Why this floor. A model that infers as well as the control has L(model) = L(in-context Bayes) + e, so its
    fraction is f = 1 - e / D for a denominator D: it reaches `level` only where D > e / (1 - level). Where D is
    smaller, f below `level` says nothing of retrieval against inference: it is the models' own excess over Bayes
    divided by a vanishing gap. Measured at the standard budget, depth 2: e = 0.011 nats; at N = 1024, D = 0.003
    nats and f = -2.67 while those models sit as close to in-context Bayes as the control does (0.011 nats). Not an
    SE rule: the fraction's SE over probe sequences there was 0.67-1.09 per seed, and the seed bootstrap gave
    [-3.10, -2.31], so -2.67 is far from 1/2 by both: the failure is a bias of the ratio, not noise, and neither SE
    sees it. A fixed number of nats would be this rule with e read off one budget; this one follows each budget's
    and depth's control.

    Args:
        control_excess: e, nats (None: no control run finished; the floor is then 0, which leaves out only
            non-positive denominators).
        level: the fraction's line (1/2 for N*), in (0, 1).

    Returns:
        The floor, nats.

    >>> swap_floor(0.011)  # the standard budget's depth-2 control
    0.022
    """
    check_probability("level", level, strict=True)
    return 0.0 if control_excess is None else max(control_excess, 0.0) / (1.0 - level)


@planned(_boot_needs)
def swap_transition(sizes: list[int], measures: list[list[dict]], control: list[dict], *, level: float = 0.5,
                    n_boot: int = 2000, seed: int = 0) -> tuple[Transition, str]:
    """N* of the kernel-swap fraction over the pool sizes where it is defined, and the text naming those where not.

    A pool size whose denominator (`swap_denominator`, mean over its seeds) is at or below `swap_floor` has no
    fraction for N*: it neither reaches nor falls below `level`. N* is where the mean fraction reaches `level` and
    stays there at every larger defined size, interpolated in log2 N between neighbouring defined sizes; the raw
    fractions of every size stay in the cell table. Every seed is probed on the same fresh batch, so the seeds'
    denominators are one number; the mean keeps one rule per cell if they were not. The guard is set once from the
    means; the bootstrap resamples the seeds of the defined sizes.

    Args:
        sizes: increasing pool sizes.
        measures: per size, its finished seeds' measures (`measure_model`).
        control: the same depth's N = ∞ measures (empty: no floor but 0).
        level, n_boot, seed: as `transition_interval`.

    Returns:
        (the `Transition`, relation `UNDEFINED` without a defined size; the note for its text: "" when every size
        is defined, else e.g. "; undefined at N = 256, 1024: denominator 0.014, 0.0031 nats <= floor 0.022 (2 x
        the N = ∞ models' excess over in-context Bayes, 0.011)").
    """
    excess = statistics.fmean(m["out"]["model"] - m["out"]["in_context_bayes"] for m in control) if control else None
    floor = swap_floor(excess, level=level)
    gaps = [statistics.fmean(swap_denominator(m) for m in ms) for ms in measures]
    keep = [i for i, gap in enumerate(gaps) if gap > floor]
    if keep:
        t = transition_interval([sizes[i] for i in keep], [[m["swap_fraction"] for m in measures[i]] for i in keep],
                                level=level, n_boot=n_boot, seed=seed)
    else:
        t = Transition(math.nan, UNDEFINED, None, level, n_boot)
    out = [i for i in range(len(sizes)) if i not in keep]
    if not out:
        return t, "" if control else " (no N = ∞ run: only a non-positive denominator would leave a size out)"
    why = (f"floor {floor:.2g} ({1 / (1 - level):g} x the N = ∞ models' excess over in-context Bayes, {excess:.2g})"
           if control else "0 (no N = ∞ run for a floor)")
    named = ", ".join(str(sizes[i]) for i in out)
    where = f"every N ({named})" if not keep else f"N = {named}"
    return t, f"; undefined at {where}: denominator {', '.join(f'{gaps[i]:.2g}' for i in out)} nats <= {why}"


# ------------------------------------------------------------------------------------------------- runs
@dataclasses.dataclass(frozen=True)
class DiversityRecord:
    """One trained run: its depth, pool size (None = fresh kernels), seed, status and measures."""

    depth: int
    pool_size: Optional[int]
    seed: int
    status: str
    measure: Optional[dict]


def _batches(budget: DiversityBudget) -> tuple[dict, Any]:
    """The in-pool probe batch of every pool size (None: the fresh source) and the out-of-pool batch."""
    from markov_interp import probes
    from markov_interp.sources import RandomMarkov

    def batch(source: RandomMarkov, seed: int) -> probes.ProbeBatch:
        return probes.sample_batch(source, n_sequences=budget.probe_sequences, seq_len=budget.seq_len, seed=seed)

    fresh = RandomMarkov(budget.vocab, alpha=budget.alpha)
    inside = {n: batch(RandomMarkov(budget.vocab, alpha=budget.alpha, pool_size=n), _PROBE_SEED + int(math.log2(n)))
              for n in budget.pool_sizes}
    inside[None] = batch(fresh, _PROBE_SEED + 100)
    return inside, batch(fresh, _PROBE_SEED - 1)


def measure_rows(rows: list, work: Path, budget: DiversityBudget, *, progress: bool = False) -> list[DiversityRecord]:
    """Each sweep row as a `DiversityRecord`, finished runs loaded from their folders and measured (cached in
    work/measures)."""
    from tqdm.auto import tqdm

    from markov_interp import runs

    inside, outside = _batches(budget)
    key = f"diversity-1:{budget.probe_sequences}x{budget.seq_len}:seed{_PROBE_SEED}"
    records = []
    for row in tqdm(rows, disable=not progress, desc="measure", unit="run"):
        cfg = row.config
        where = dict(depth=cfg.model.n_layers, pool_size=cfg.source.pool_size, seed=cfg.train.seed, status=row.status)
        if row.status != "ok":
            records.append(DiversityRecord(**where, measure=None))
            continue
        folder = work / row.run_dir

        def measure() -> dict:
            model = runs.load_model(folder, device="cpu")
            return measure_model(model, inside[cfg.source.pool_size], outside, cfg.source.build())

        records.append(DiversityRecord(**where, measure=_shared.cached_measure(work, row.cell_id, key, measure)))
    return records


def _cell_json(depth: int, size: Optional[int], records: list[DiversityRecord]) -> dict:
    measures = [r.measure for r in records if r.measure is not None]
    n = len(measures)

    def stat(values: list[float]) -> dict:
        return {"mean": _shared.mean(values), "interval": list(_shared.mean_interval(values))}

    cell = {"depth": depth, "pool_size": size, "n": n,
            "not_ok": dict(Counter(r.status for r in records if r.status != "ok")),
            "phases": {a: _shared.proportion(sum(m["phase"] == a for m in measures), n) for a in ALGORITHMS},
            "inference": _shared.proportion(sum(m["phase"] in INFERENCE for m in measures), n),
            "kl": {a: stat([m["kl"][a] for m in measures if a in m["kl"]]) for a in ALGORITHMS}}
    for side in ("in", "out"):
        cell[side] = {"model": stat([m[side]["model"] for m in measures])}
        for ref in ("in_context_bayes", "pool_bayes"):
            if measures and ref in measures[0][side]:
                cell[side][f"excess_{ref}"] = stat([m[side]["model"] - m[side][ref] for m in measures])
                cell[side][ref] = measures[0][side][ref]  # one probe batch per pool size: the same for every seed
    if size is not None:
        cell["swap_fraction"] = stat([m["swap_fraction"] for m in measures])
    return cell


def cell_summaries(records: list[DiversityRecord]) -> list[dict]:
    """One summary per (depth, pool size): losses in and out of the pool with the model's excess over the pool's
    Bayes and the in-context Bayes predictors (means, bootstrap 95% intervals), the kernel-swap fraction, the
    KL to each of Park et al.'s algorithms and the fraction of seeds closest to each (Wilson 95%)."""
    cells: dict[tuple, list] = {}
    for r in records:
        cells.setdefault((r.depth, r.pool_size), []).append(r)
    return [_cell_json(depth, size, rs) for (depth, size), rs in cells.items()]


def transitions(records: list[DiversityRecord], budget: DiversityBudget) -> dict:
    """Per depth: N* of the kernel-swap fraction (mean over seeds crossing 1/2 where the fraction is defined,
    `swap_transition`; its "describe" names the sizes where it is not) and of the fraction of seeds closest to an
    inference algorithm (crossing 1/2), each with its bootstrap 95% interval."""
    out = {}
    for depth in budget.depths:
        done = {n: [r.measure for r in records if r.depth == depth and r.pool_size == n and r.measure is not None]
                for n in budget.sizes}
        sizes = [n for n in budget.pool_sizes if done[n]]
        if not sizes:
            continue
        swap, note = swap_transition(sizes, [done[n] for n in sizes], done[None])
        phase = transition_interval(sizes, [[float(m["phase"] in INFERENCE) for m in done[n]] for n in sizes])
        out[str(depth)] = {"swap_fraction": dataclasses.asdict(swap) | {"describe": swap.describe() + note},
                           "inference_phase": dataclasses.asdict(phase) | {"describe": phase.describe()}}
    return out


# ------------------------------------------------------------------------------------------------ claims
def _majority(p: Optional[dict]) -> Optional[bool]:
    """True when most seeds do it (Wilson interval above 1/2), False when few (below), None otherwise."""
    if not p or not p["n"]:
        return None
    lo, hi = p["interval"]
    return True if lo > 0.5 else False if hi < 0.5 else None


def _word(ok: Optional[bool], fails: str = "fails at this budget") -> str:
    return "holds" if ok else "not resolved (mixed)" if ok is None else fails


def claims(cells: list[dict], trans: dict) -> list[tuple[str, str, str, str]]:
    """(paper, claim, evidence, verdict) per cited claim and depth this budget runs: "holds", "fails at this
    budget", "not resolved" (a Wilson interval straddles 1/2) or "not tested at this budget"."""
    rows = []
    for depth in sorted({c["depth"] for c in cells}):
        mine = {c["pool_size"]: c for c in cells if c["depth"] == depth}
        pools = sorted(n for n in mine if n is not None)
        fresh = mine.get(None)
        small, large = (mine[pools[0]], mine[pools[-1]]) if pools else (None, None)
        if fresh is not None:
            bigram = fresh["phases"]["bigram inference"]
            rows.append(("(positive control)", f"L{depth}, fresh kernels (N = ∞): closest to in-context bigram "
                         "inference", f"{_p(bigram)} seeds", _word(_majority(bigram))))
        t = trans.get(str(depth), {}).get("swap_fraction")
        if t is not None:
            verdict = {">": "fails at this budget (not reached)", UNDEFINED: "not tested at this budget (the "
                       "fraction is undefined at every N)"}.get(t["relation"], "holds")
            rows.append(("Raventós et al. 2023", f"L{depth}: a task-diversity threshold N* exists: below it the model "
                         "retrieves the pool, above it it infers the task in context (kernel-swap fraction crosses "
                         "1/2)", t["describe"], verdict))
        if small is not None and large is not None:
            retrieval = _majority(small["inference"])
            inference = _majority(large["inference"])
            ok = None if retrieval is None or inference is None else (retrieval is False and inference is True)
            rows.append(("Park et al. 2024", f"L{depth}: algorithmic phases: retrieval closest at small N "
                         f"({pools[0]}), inference at large N ({pools[-1]})",
                         f"inference closest: {_p(small['inference'])} at N = {pools[0]}, "
                         f"{_p(large['inference'])} at N = {pools[-1]}", _word(ok, "fails")))
    if not rows:
        rows.append(("Raventós et al. 2023 / Park et al. 2024", "the transition and its phases", "—",
                     "not tested at this budget"))
    return rows


def _p(p: dict) -> str:
    return "—" if not p["n"] else f"{p['k']}/{p['n']} [{p['interval'][0]:.2f}, {p['interval'][1]:.2f}]"


def claims_table(rows: list[tuple[str, str, str, str]]) -> Table:
    """The claims (`claims`) as a table."""
    return Table(("paper", "claim", "evidence [95% CI]", "at this budget"), rows)


# ------------------------------------------------------------------------------------------------ output
def _fmt(stat: Optional[dict], digits: int = 3) -> str:
    if not stat or stat["mean"] is None or not math.isfinite(stat["mean"]):
        return "—"
    lo, hi = stat["interval"]
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return f"{stat['mean']:+.{digits}f}"
    return f"{stat['mean']:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]"


def _fmt_p(p: dict) -> str:
    if not p["n"]:
        return "—"
    return f"{p['k']}/{p['n']} [{p['interval'][0]:.2f}, {p['interval'][1]:.2f}]"


def cells_table(cells: list[dict]) -> Table:
    """Every (depth, N) cell: the model's excess over the references, the kernel-swap fraction and the closest of
    Park et al.'s algorithms."""
    rows = []
    for c in cells:
        counts = ", ".join(f"{a} {p['k']}" for a, p in c["phases"].items() if p["k"])
        rows.append((f"L{c['depth']}", _shared.log2_label(c["pool_size"]), str(c["n"]),
                     _fmt(c["in"].get("excess_pool_bayes")), _fmt(c["in"]["excess_in_context_bayes"]),
                     _fmt(c["out"]["excess_in_context_bayes"]), _fmt(c.get("swap_fraction"), 2), counts or "—",
                     _fmt_p(c["inference"])))
    return Table(("depth", "N", "seeds", "in pool: model - pool Bayes", "in pool: model - in-context Bayes",
                  "fresh: model - in-context Bayes", "kernel-swap fraction", "closest algorithm (seeds)",
                  "seeds closest to an inference algorithm"), rows)


def references_table(cells: list[dict]) -> Table:
    """The references on the probe batches (the same for every seed and depth)."""
    rows, seen = [], set()
    for c in cells:
        if c["pool_size"] in seen:
            continue
        seen.add(c["pool_size"])
        cols = [c["in"].get("pool_bayes"), c["in"].get("in_context_bayes"), c["out"].get("pool_bayes"),
                c["out"].get("in_context_bayes")]
        rows.append((_shared.log2_label(c["pool_size"]), *("—" if v is None else f"{v:.4f}" for v in cols)))
    return Table(("N", "in pool: pool Bayes", "in pool: in-context Bayes", "fresh: pool Bayes",
                  "fresh: in-context Bayes"), rows)


def transitions_table(trans: dict) -> Table:
    """N* per depth: of the kernel-swap fraction and of the fraction of seeds closest to an inference algorithm."""
    return Table(("depth", "kernel-swap fraction crosses 1/2", "half the seeds closest to an inference algorithm"),
                 [(f"L{depth}", t["swap_fraction"]["describe"], t["inference_phase"]["describe"])
                  for depth, t in trans.items()])


def cells_csv(cells: list[dict]) -> Table:
    """cells.csv: one row per (depth, N), numbers only."""
    def number(value: Any) -> str:
        return "" if value is None or not math.isfinite(value) else f"{value:.4g}"

    rows = []
    for c in cells:
        swap = c.get("swap_fraction") or {"mean": None, "interval": [None, None]}
        rows.append((str(c["depth"]), "inf" if c["pool_size"] is None else str(c["pool_size"]), str(c["n"]),
                     number(c["in"].get("excess_pool_bayes", {}).get("mean")),
                     number(c["in"]["excess_in_context_bayes"]["mean"]),
                     number(c["out"]["excess_in_context_bayes"]["mean"]), number(swap["mean"]),
                     number(swap["interval"][0]), number(swap["interval"][1]), number(c["inference"]["fraction"]),
                     *(number(c["phases"][a]["fraction"]) for a in ALGORITHMS)))
    return Table(("depth", "pool_size", "n", "in_excess_pool_bayes", "in_excess_in_context_bayes",
                  "out_excess_in_context_bayes", "swap_fraction", "swap_lo", "swap_hi", "inference_fraction",
                  *(f"phase_{a.replace(' ', '_')}" for a in ALGORITHMS)), rows)


def setup_text(budget: DiversityBudget) -> str:
    """The sources, models, training and probes of `budget`, in words."""
    return (f"Sources: RandomMarkov(vocab {budget.vocab}, order 1, alpha {budget.alpha:g}, pool_size N, pool seed "
            f"0) for N in {', '.join(map(str, budget.pool_sizes))}, and fresh kernels (N = ∞); the same pool for "
            f"every seed and depth. Models: the attention-only preset (pre-LayerNorm, no MLP, untied, one head, "
            f"d_model {budget.d_model}) at depths {', '.join(map(str, budget.depths))}. Training: {budget.steps} "
            f"steps, batch {budget.batch_size} x {budget.seq_len} states, AdamW lr {budget.lr:g} constant, "
            f"{budget.seeds} seeds per cell (seeds 0..{budget.seeds - 1}), every N and seed of a depth one stack. "
            f"Probes: {budget.probe_sequences} sequences of {budget.seq_len} states from each pool and from fresh "
            "kernels.")


_TRANSITION_TEXT = ("N*: where the mean over seeds first reaches 1/2 and stays there for every larger N (interpolated "
                    "in log2 N); 95% percentile bootstrap over seeds (2000 resamples); \"not reached\": the crossing "
                    "lies beyond the largest N in more than 2.5% of the resamples. The kernel-swap fraction counts "
                    "only where it is defined: at a pool size whose denominator L(pool Bayes) - L(in-context Bayes) "
                    "on fresh kernels is at most twice the N = ∞ models' excess over in-context Bayes on the same "
                    "batch, even a model inferring as well as those would read below 1/2, so that size neither "
                    "reaches nor falls below it (`diversity.swap_floor`); its raw fraction stays in the cell table.")
_CELLS_TEXT = ("Losses in nats per prediction on the probe batches, model minus reference, mean over seeds with a "
               "bootstrap 95% interval; kernel-swap fraction f = (L(pool Bayes) - L(model)) / (L(pool Bayes) - "
               "L(in-context Bayes)) on fresh kernels (`probes.swap_kernels`, raw); closest algorithm: the smallest "
               "mean KL(algorithm || model) on the in-pool batch (Wilson 95% intervals).")


_CLAIMS_TEXT = ("Each claim read from this grid: a fraction of seeds with its Wilson 95% interval (a majority when the "
                "interval lies above 1/2) or N* with its bootstrap interval. Raventós et al. studied in-context "
                "linear regression; Park et al. in-context Markov chains with finite pools, where the transition "
                "moves with the training length, so a verdict holds at this budget's steps only.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DiversityResult(_shared.GridResult):
    """The sweep at one budget: per-run records, per-cell summaries, N* per depth."""

    transitions: dict

    def sections(self) -> list[Section]:
        return [Section("Setup", setup_text(self.budget)),
                Section("Beside each paper's claim", _CLAIMS_TEXT, claims_table(claims(self.cells, self.transitions))),
                Section("The transition N*", "", transitions_table(self.transitions), _TRANSITION_TEXT),
                Section("Every cell", _CELLS_TEXT, cells_table(self.cells), figures=("diversity.png",)),
                Section("Reference losses on the probe batches", "", references_table(self.cells))]

    def figures(self) -> dict[str, Any]:
        from markov_interp.experiments._figures_diversity import diversity_figure

        return {"diversity.png": diversity_figure(
            self.cells, self.transitions,
            title=f"{self.budget.name} budget: {self.budget.steps} steps, {self.budget.seeds} seeds per cell")}

    def tables(self) -> dict[str, Table]:
        return {"cells.csv": cells_csv(self.cells)}

    def to_json(self) -> dict:
        runs = [{"depth": r.depth, "pool_size": r.pool_size, "seed": r.seed, "status": r.status, **(r.measure or {})}
                for r in self.records]
        return {"cells": self.cells, "transitions": self.transitions, "runs": runs}


_RUN_KEYS = ("depth", "pool_size", "seed", "status")


def read(budget: DiversityBudget, result: dict) -> DiversityResult:
    """results.json's "result" read back (`experiments.load`): the runs' measures as records, every cell summary
    and N* recomputed by the current code."""
    records = [DiversityRecord(depth=int(r["depth"]), pool_size=r["pool_size"], seed=int(r["seed"]),
                               status=r["status"],
                               measure={k: v for k, v in r.items() if k not in _RUN_KEYS} if r["status"] == "ok"
                               else None) for r in result["runs"]]
    return DiversityResult(budget=budget, records=tuple(records), cells=cell_summaries(records),
                           transitions=transitions(records, budget),
                           n_failed=sum(r.status not in ("ok", "diverged") for r in records))


def run(budget: DiversityBudget, out: Path, *, progress: bool = False) -> DiversityResult:
    """Train the sweep of `budget` into out/runs (restartable), measure every run, summarise every cell and
    estimate N* per depth.

    Args:
        budget: pool sizes, depths and recipe.
        out: the experiment's folder (the sweep in out/runs, measures cached in out/runs/measures).
        progress: tqdm bars.

    Returns:
        A `DiversityResult`.
    """
    work = Path(out) / "runs"
    result = _shared.train_grid(diversity_specs(budget), work, workers=budget.workers, group=budget.stack_size,
                                progress=progress)
    records = measure_rows(result.rows, work, budget, progress=progress)
    return DiversityResult(budget=budget, records=tuple(records), cells=cell_summaries(records),
                           transitions=transitions(records, budget), n_failed=result.n_failed)


EXPERIMENT = register(Experiment(name="diversity", title="Task diversity: finite kernel pools",
                                 budgets={"quick": QUICK, "standard": STANDARD, "full": FULL, "gpu": GPU,
                                          "tiny": TINY}, run=run, read=read, precision="fp32"))
