"""The paper's headline findings, reproduced as escape-time distributions: seven sweeps, one results table, a
summary with intervals and figures.

Makkuva et al. ("Attention with Markov", arXiv 2402.04161) and the follow-up ("Local to Global", arXiv
2406.03072) claim, for transformers trained on first-order Markov chains:

1. one layer, **tied** embeddings, binary chain (p, q): for p + q > 1 training gets stuck at the unigram loss
   H(pi) (a bad local minimum of the landscape), for p + q < 1 it reaches the entropy rate;
2. the same **untied**: no bad local minimum, every cell reaches the entropy rate;
3. **depth** at p = 0.5, q = 0.8: one layer stays on the unigram plateau, two and four layers leave it;
4. the **random-kernel** (in-context) task: two layers form a previous-token + induction-head circuit, one
   layer cannot;
5. **initialisation and precision** decide the plateau: a canonical init with w0 < -1/sqrt(2) starts in the
   global basin, small inits with p + q > 1 in the unigram one, and fp16 autocast without loss scaling
   (what the reference code ran) keeps runs stuck that fp32 lets escape.

Registered as the experiment "paper"; `markov-interp reproduce [--quick]` is the command users type (it runs
`experiments.run` on this experiment with its sweep folder, backend and workers). `run(budget, out, work=...)`
runs these as `sweep` specs (restartable: a rerun only trains what is missing): a coarse (p, q) grid tied and
untied, a line p = 0.5 across p + q = 1 with 16 seeds per cell, depth and precision at p = 0.5, q = 0.8 with 16
seeds per condition, the random-kernel task, and the exact-reduction experiment (canonical init without
normalisation, where `landscape.predict_outcome` holds exactly). `experiments.run` then writes `results.csv`
(every cell), `summary.csv` / `summary.md` (per condition: censored k/n with a Wilson interval, Kaplan-Meier median
escape step with its interval, losses, the landscape's prediction, mechanism counts) and the figures
`phase_pq.png`, `boundary.png`, `depth.png`, `mechanisms.png` and `survival.png` (Kaplan-Meier curves of the
escape step) into `out`. The theory column is `landscape.predict_outcome` for the canonical reduced model: "unigram" or "bigram" (= reaches the entropy
rate); for the standard (small Gaussian) init it is evaluated at a small init e0 = w0 = 0.05, where the
prediction does not depend on the sign of w0.
"""

import dataclasses
import json
import math
import os
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from markov_interp import dynamics, sweep
from markov_interp._io import atomic_write
from markov_interp.experiments import Budget, Experiment, Section, Summary, Table, describe_device, register
from markov_interp.models.reduction import exact_model_options
from markov_interp.runs import RunConfig
from markov_interp.sources import BinaryChainConfig
from markov_interp.sweep import Row, SweepResult, SweepSpec

__all__ = ["ReproductionBudget", "QUICK", "FULL", "ConditionSummary", "Reproduction", "experiment_specs", "run",
           "summarise", "section_table", "summary_table", "SECTION_COLUMNS", "THEORY_SMALL_INIT", "GROUP", "EXPERIMENT"]

THEORY_SMALL_INIT = 0.05  # (e0, w0) at which the landscape's prediction stands for the standard init
_PQ = 0.5, 0.8  # the paper's depth / precision chain


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReproductionBudget(Budget):
    """How much compute the reproduction spends; `cuts` says what differs from the paper's setup.

    The key conditions (p = 0.5, q = 0.8, tied: fp32, fp16 without and with loss scaling, every depth) get
    `seeds` seeds at `steps`; the line p = `line_p` across p + q = 1 (tied and untied) `line_seeds`; a coarse
    (p, q) grid `grid_seeds`; the exact-reduction experiment (canonical init, no normalisation) `exact_seeds`
    per initial w0. Fields are checked by `experiments.Budget` (and the probabilities here)."""

    seq_len: int  # training sequence length (the paper: 1024 for the (p, q) grid, 512 for depth)
    depth_layers: tuple[int, ...]
    line_p: float = 0.5  # the line across p + q = 1: p fixed, q in line_q (tied and untied)
    line_q: tuple[float, ...]
    line_seeds: int
    grid_values: tuple[float, ...]  # values of p and of q (cells with p + q = 1 are left out: the solutions coincide)
    grid_seeds: int
    grid_steps: int
    exact_e: float = 0.1  # the exact experiment's canonical e0 (b0 = 0, no normalisation, relu MLP)
    exact_w: tuple[float, ...]  # its canonical w0, on both sides of the predicted basin boundary
    exact_seeds: int
    random_seeds: int
    random_steps: int
    random_lr: float  # the random-kernel task's learning rate, constant (the paper's 2e-3 forms the circuit slowly)
    random_vocab: int = 3  # states of the random-kernel task
    random_seq_len: int = 32  # short sequences, big batches: the circuit forms in a few hundred steps on a CPU
    random_batch: int = 64
    eval_batches: int = 8

    def check(self) -> None:
        for name, values in (("line_p", (self.line_p,)), ("line_q", self.line_q), ("grid_values", self.grid_values)):
            if not all(0 < v < 1 for v in values):
                raise ValueError(f"budget {self.name!r}: {name} must lie in (0, 1), got {values}")
        for name in ("exact_e", "random_lr"):
            if getattr(self, name) <= 0:
                raise ValueError(f"budget {self.name!r}: {name} must be > 0, got {getattr(self, name)}")
        if self.random_vocab < 2:
            raise ValueError(f"budget {self.name!r}: random_vocab must be at least 2, got {self.random_vocab}")


QUICK = ReproductionBudget(
    name="quick",
    seq_len=128,
    steps=400,
    seeds=16,
    depth_layers=(1, 2, 4),
    line_q=(0.2, 0.4, 0.6, 0.8),
    line_seeds=16,
    grid_values=(0.1, 0.5, 0.9),
    grid_seeds=4,
    grid_steps=400,
    exact_w=(0.1, -0.5, -0.8, -1.0),
    exact_seeds=8,
    random_seeds=3,
    random_steps=600,
    random_lr=1e-2,
    cuts="sequences of 128 states instead of 512-1024; 400 optimiser steps everywhere (the full budget: 2000; "
    "escape times beyond 400 steps are censored, not observed); 16 seeds for the key conditions (p = 0.5, "
    "q = 0.8: fp32, fp16, fp16 with loss scaling, depths 1, 2, 4) and for the line p = 0.5, q = 0.2 ... 0.8 "
    "(tied and untied); depth 8 is missing (the full budget has it); a 3 x 3 (p, q) grid (0.1, 0.5, 0.9) with "
    "4 seeds per cell; the exact-reduction experiment with 4 initial w0 and 8 seeds each; the random-kernel "
    "task with 3 seeds on 3 states, sequences of 32, batch 64, 600 steps at a constant lr 1e-2; evaluation on "
    "8 fresh batches of 16",
)

FULL = ReproductionBudget(
    name="full",
    seq_len=512,
    steps=2000,
    seeds=16,
    depth_layers=(1, 2, 4, 8),
    line_q=(0.1, 0.2, 0.3, 0.4, 0.6, 0.7, 0.8, 0.9),
    line_seeds=16,
    grid_values=(0.1, 0.3, 0.5, 0.7, 0.9),
    grid_seeds=4,
    grid_steps=1000,
    exact_w=(0.1, -0.5, -0.6, -0.65, -0.8, -1.0),
    exact_seeds=16,
    random_seeds=8,
    random_steps=2000,
    random_lr=1e-2,
    random_seq_len=64,
    cuts="sequences of 512 states instead of 1024; 2000 steps for the key conditions, the line p = 0.5 and the "
    "exact-reduction experiment, 1000 for the 5 x 5 (p, q) grid with 4 seeds per cell; the random-kernel task "
    "with 8 seeds on 3 states, sequences of 64, batch 64, constant lr 1e-2",
)

# stacked training (`sweep.run(group=...)`): 16 seeds of a condition train as one stacked model
GROUP = {"cpu": 16, "cuda": 64}


def _train_base(budget: ReproductionBudget, steps: int) -> dict:
    # paired evaluations at a cadence of 1/20 of the budget plus 8 log-spaced early ones: escape times to 5%
    return {"steps": steps, "seq_len": budget.seq_len, "eval_every": max(steps // 20, 1), "eval_log_points": 8,
            "eval_batches": budget.eval_batches, "n_checkpoints": 0, "log_every": 10, "device": budget.device}


def experiment_specs(budget: ReproductionBudget) -> list[SweepSpec]:
    """The sweeps of the reproduction at `budget` (names: pq-tied, pq-untied (the coarse grid), pq-line, depth,
    random, precision, exact)."""
    values = list(budget.grid_values)
    iid = [{"source.p": p, "source.q": q} for p in values for q in values if abs(p + q - 1) < 1e-9]
    model = {"preset": "paper-1layer", "n_ctx": budget.seq_len}
    binary = {"kind": "binary", "p": _PQ[0], "q": _PQ[1]}
    grid_train = _train_base(budget, budget.grid_steps)
    key_train = _train_base(budget, budget.steps)
    grid = {"source.p": values, "source.q": values}
    line = {"source.p": [budget.line_p], "source.q": list(budget.line_q), "model.tie_weights": [True, False]}
    return [
        SweepSpec(name="pq-tied", base={"source": {"kind": "binary", "p": 0.5, "q": 0.5}, "model": model,
                                        "train": grid_train}, grid=grid, exclude=iid, seeds=_seeds(budget.grid_seeds)),
        SweepSpec(name="pq-untied", base={"source": {"kind": "binary", "p": 0.5, "q": 0.5},
                                          "model": {**model, "tie_weights": False}, "train": grid_train},
                  grid=grid, exclude=iid, seeds=_seeds(budget.grid_seeds)),
        # escape times are what the line, precision and exact experiments measure: no probes there (the fp32
        # cell at p = 0.5, q = 0.8 is the depth experiment's one-layer cell, probed there)
        SweepSpec(name="pq-line", base={"source": binary, "model": model, "train": key_train}, grid=line,
                  exclude=[{"source.q": 1 - budget.line_p}], seeds=_seeds(budget.line_seeds), probe=False),
        SweepSpec(name="depth", base={"source": binary, "model": model, "train": key_train},
                  grid={"model.n_layers": list(budget.depth_layers)}, seeds=_seeds(budget.seeds)),
        SweepSpec(name="random", base={"source": {"kind": "random", "vocab": budget.random_vocab, "alpha": 1.0},
                                       "model": {"preset": "attn-only-2layer", "n_ctx": budget.random_seq_len},
                                       "train": {**_train_base(budget, budget.random_steps),
                                                 "seq_len": budget.random_seq_len,
                                                 "batch_size": budget.random_batch,
                                                 "lr": budget.random_lr, "schedule": "constant"}},
                  grid={"model.n_layers": [1, 2]}, seeds=_seeds(budget.random_seeds)),
        SweepSpec(name="precision", base={"source": binary, "model": model, "train": key_train},
                  grid={"train.precision": ["fp32", "fp16"], "train.loss_scaling": [False, True]},
                  exclude=[{"train.precision": "fp32", "train.loss_scaling": True}], seeds=_seeds(budget.seeds),
                  probe=False),
        SweepSpec(name="exact", base={"source": binary, "train": key_train,
                                      "model": exact_model_options(n_ctx=budget.seq_len, e0=budget.exact_e)},
                  grid={"model.canonical_w": list(budget.exact_w)}, seeds=_seeds(budget.exact_seeds), probe=False),
    ]


def _seeds(n: int) -> list[int]:
    return list(range(n))


# ----------------------------------------------------------------------------------------------- theory
def _theory(row: Row) -> Optional[str]:
    """The canonical model's predicted outcome for a one-layer binary-chain cell, or None where the theory is
    silent (deeper models, random kernels)."""
    from markov_interp import landscape

    source, model = row.config.source, row.config.model
    if not isinstance(source, BinaryChainConfig) or model.n_layers != 1:
        return None
    p, q, tied = source.p, source.q, model.tie_weights
    if model.init == "canonical":
        return landscape.predict_outcome(model.canonical_e, model.canonical_w, model.canonical_b, p=p, q=q, tied=tied)
    return landscape.predict_outcome(THEORY_SMALL_INIT, THEORY_SMALL_INIT, None, p=p, q=q, tied=tied)


def _theory_exact(row: Row) -> Optional[bool]:
    """Whether the canonical (e, w, b) reduction behind `_theory` holds for this cell throughout training, not only
    at its start: the run trains on the family (`train.reduction="canonical"`, nothing released) by plain SGD (no
    momentum), whose steps are gradient descent on (e, w, b) itself. `RunConfig` accepts that reduction only for
    the model on which it is exact (`models.reduction.check_reduction`), so the model needs no second check here.
    Free training leaves the family (positions, embedding row 0, attention and the bias's row 0 all move), so
    there the prediction holds at the start only; with LayerNorm (the paper's model) or a Gaussian init it is a
    heuristic (see `landscape.projection`)."""
    if _theory(row) is None:
        return None
    train = row.config.train
    return train.reduction == "canonical" and not train.release and train.optimizer == "sgd" and train.momentum == 0


# ---------------------------------------------------------------------------------------------- summary
def _mean(values: list) -> Optional[float]:
    values = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return sum(values) / len(values) if values else None


def _group(rows: list[Row], sweep_name: str, key: Callable[[RunConfig], tuple]) -> dict[tuple, list[Row]]:
    """The rows of one sweep grouped by `key(config)` (a tuple of setting values), in sorted order."""
    groups: dict = defaultdict(list)
    for row in rows:
        if row.sweep == sweep_name:
            groups[key(row.config)].append(row)
    return dict(sorted(groups.items(), key=lambda kv: tuple(str(x) for x in kv[0])))


def _mechanism_label(probe: Optional[sweep.ProbeColumns]) -> str:
    """The classified mechanism (`classify_mechanism`'s labels; "?" when the cell was not probed). A model
    that follows an in-context k-gram law without a confirmed circuit is already "other" there."""
    return probe.mechanism if probe is not None and probe.mechanism else "?"


def _probe_mean(results: list[sweep.CellResult], name: str) -> Optional[float]:
    return _mean([getattr(r.probe, name) for r in results if r.probe is not None])


@dataclasses.dataclass(frozen=True, kw_only=True)
class ConditionSummary:
    """One setting of one of the reproduction's sweeps, over its seeds (a row of summary.csv).

    Escape times with interval and right censoring (paired evaluation; `dynamics`): `n_censored` of `n_runs`
    runs without a confirmed escape at the budget, with its Wilson interval; the Kaplan-Meier `median_escape`
    (the step by which half the seeds had escaped; None: not reached) and its interval (after, by] (None: fewer
    than `dynamics.MIN_RUNS` seeds; by None: not reached). Losses in nats."""

    experiment: str  # the sweep: pq-tied, pq-untied, pq-line, depth, random, precision, exact
    p: Optional[float] = None  # the setting (None where the sweep does not vary or fix it)
    q: Optional[float] = None
    tied: Optional[bool] = None
    n_layers: Optional[int] = None
    init: Optional[str] = None
    precision: Optional[str] = None
    seeds: int
    failed: int
    diverged: int  # non-finite loss: neither stuck nor escaped
    budget: int  # training steps
    n_runs: int  # runs with a known escape (finished with a paired evaluation)
    n_censored: int
    median_escape: Optional[int]
    median_escape_ci: Optional[tuple[int, Optional[int]]]
    censored_ci: Optional[tuple[float, float]]
    escape_curve: Optional[dynamics.Survival]  # for the survival figure (not a table column)
    stuck_fraction: Optional[float]
    above_unigram: int
    final_loss: Optional[float]
    entropy_rate: Optional[float]
    unigram_loss: Optional[float]
    bayes_loss: Optional[float]
    escape_step: Optional[float]  # mean over seeds of the escape's `by` step (or censoring step)
    theory: Optional[str]  # `landscape.predict_outcome`: "unigram" or "bigram"; None where the theory is silent
    theory_exact: Optional[bool]
    theory_agreement: Optional[str]  # "k/n" seeds whose outcome is the predicted one
    p_hat: Optional[float]
    mechanisms: tuple[tuple[str, int], ...]  # (label, seeds), sorted by label
    previous_token_excess: Optional[float]
    induction_excess: Optional[float]
    circuit_confirmed: int

    @property
    def censored(self) -> Optional[str]:
        """"k/n" runs censored (None without runs)."""
        return f"{self.n_censored}/{self.n_runs}" if self.n_runs else None

    def value(self, column: str) -> Any:
        """The value of a summary column (a field or `censored`)."""
        return getattr(self, column)

    def to_json(self) -> dict:
        """Every field but the survival curve, JSON-ready."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "escape_curve"}


def _escape(row: Row) -> Optional[dynamics.StepInterval]:
    """A finished cell's escape; a table written before crossings were kept is read on the run's evaluation
    grid (`dynamics.recorded_escape`)."""
    from markov_interp.training import evaluation_steps

    return row.result.crossing(evaluations=evaluation_steps(row.config.train))


def _escapes(ok: list[Row], theory: Optional[str]) -> dict[str, Any]:
    """The escape fields of a condition from its finished cells."""
    escapes = [e for e in (_escape(r) for r in ok) if e is not None]
    spread = dynamics.survival(escapes) if escapes else None
    median = spread.median() if spread else None
    return {
        "n_runs": spread.n if spread else 0, "n_censored": spread.n_censored if spread else 0,
        "median_escape": median.by if median else None,
        "median_escape_ci": ((median.interval.after, median.interval.by) if median and median.interval else None),
        "censored_ci": dynamics.wilson_interval(spread.n_censored, spread.n) if spread else None,
        "escape_curve": spread,
        # the seeds whose observed outcome is the predicted one: "unigram" = censored at the budget (still on the
        # plateau), "bigram" = escaped (the models' training is Adam on a schedule, not the theory's flow)
        "theory_agreement": (f"{sum((e.censored) == (theory == 'unigram') for e in escapes)}/{len(escapes)}"
                             if theory and escapes else None),
    }


def _condition(experiment: str, setting: dict, cells: list[Row]) -> ConditionSummary:
    """One condition's summary from its cells."""
    ok = [r.result for r in cells if r.status == "ok"]
    stuck = [r.stuck_at_unigram for r in ok if r.stuck_at_unigram is not None]
    mechanisms = Counter(_mechanism_label(r.probe) for r in ok)
    references = ok[0] if ok else None
    theory = _theory(cells[0])
    return ConditionSummary(
        experiment=experiment, **setting, seeds=len(cells),
        failed=sum(r.status not in ("ok", "diverged") for r in cells),
        diverged=sum(r.status == "diverged" for r in cells),
        budget=cells[0].config.train.steps,
        stuck_fraction=(sum(stuck) / len(stuck)) if stuck else None,
        above_unigram=sum(r.outcome == "above" for r in ok),
        final_loss=_mean([r.final_eval_loss for r in ok]),
        entropy_rate=references.entropy_rate if references else None,
        unigram_loss=references.unigram_loss if references else None,
        bayes_loss=_mean([r.bayes_loss for r in ok]),
        escape_step=_mean([r.escape_step for r in ok]),
        theory=theory, theory_exact=_theory_exact(cells[0]),
        p_hat=_probe_mean(ok, "p_hat"),
        mechanisms=tuple(sorted(mechanisms.items())),
        previous_token_excess=_probe_mean(ok, "previous_token_excess"),
        induction_excess=_probe_mean(ok, "induction_excess"),
        circuit_confirmed=sum(bool(r.probe and r.probe.circuit_confirmed) for r in ok),
        **_escapes([r for r in cells if r.status == "ok"], theory),
    )


def summarise(rows: list[Row]) -> list[ConditionSummary]:
    """One summary per setting of each experiment (over seeds): escape times with censoring (censored k/n with
    its Wilson interval, Kaplan-Meier median escape with its interval, at the budget), mean final loss beside
    the references, the landscape's prediction (exact or heuristic) and its agreement with the seeds, the mean
    learned P(1|0) ("p_hat"), mechanism counts and mean head scores.

    Args:
        rows: the reproduction's sweep rows (`sweep.run` or `sweep.read_table`).

    Returns:
        The conditions, experiment by experiment (`ConditionSummary`)."""
    out = []
    for name in ("pq-tied", "pq-untied"):
        for (p, q), cells in _group(rows, name, lambda c: (c.source.p, c.source.q)).items():
            out.append(_condition(name, {"p": p, "q": q, "tied": name == "pq-tied"}, cells))
    for (untied, q), cells in _group(rows, "pq-line", lambda c: (not c.model.tie_weights, c.source.q)).items():
        out.append(_condition("pq-line", {"p": cells[0].config.source.p, "q": q, "tied": not untied}, cells))
    for (layers,), cells in _group(rows, "depth", lambda c: (c.model.n_layers,)).items():
        out.append(_condition("depth", {"p": _PQ[0], "q": _PQ[1], "n_layers": layers}, cells))
    for (layers,), cells in _group(rows, "random", lambda c: (c.model.n_layers,)).items():
        out.append(_condition("random", {"n_layers": layers}, cells))
    precisions = _group(rows, "precision", lambda c: (c.train.precision, c.train.loss_scaling))
    for (precision, scaling), cells in sorted(precisions.items(), key=lambda kv: (kv[0][0] != "fp32", kv[0])):
        label = precision + (" + loss scaling" if scaling else "")
        out.append(_condition("precision", {"p": _PQ[0], "q": _PQ[1], "init": "standard N(0, 0.02)",
                                            "precision": label}, cells))
    for (w,), cells in sorted(_group(rows, "exact", lambda c: (c.model.canonical_w,)).items(), reverse=True):
        e = cells[0].config.model.canonical_e
        out.append(_condition("exact", {"p": _PQ[0], "q": _PQ[1], "init": f"canonical e0={e} w0={w}"}, cells))
    out.sort(key=lambda r: _EXPERIMENTS.index(r.experiment))  # stable: each experiment's rows keep their order
    return out


_EXPERIMENTS = ("pq-tied", "pq-untied", "pq-line", "depth", "random", "precision", "exact")


_SUMMARY_COLUMNS = ("experiment", "p", "q", "tied", "n_layers", "init", "precision", "seeds", "failed",
                    "diverged", "budget", "censored", "censored_ci", "median_escape", "median_escape_ci",
                    "stuck_fraction", "above_unigram", "final_loss", "entropy_rate", "unigram_loss", "bayes_loss",
                    "escape_step", "theory", "theory_exact", "theory_agreement", "p_hat", "mechanisms",
                    "previous_token_excess", "induction_excess", "circuit_confirmed")


def _fmt(value: Any, digits: int = 4) -> str:
    """A value as a markdown cell."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    if isinstance(value, tuple) and value and isinstance(value[0], tuple):  # mechanism counts
        return ", ".join(f"{k} {n}" for k, n in value)
    if isinstance(value, tuple):  # an interval; None: beyond the budget
        return "[" + ", ".join(">budget" if v is None else _fmt(v, digits) for v in value) + "]"
    return str(value)


def _csv_text(value: Any) -> str:
    """A value as a summary.csv cell: None empty, intervals as JSON (null: beyond the budget), mechanism counts
    as "label n, ..."."""
    if value is None:
        return ""
    if isinstance(value, tuple) and value and isinstance(value[0], tuple):
        return ", ".join(f"{k} {n}" for k, n in value)
    if isinstance(value, tuple):
        return json.dumps(list(value))
    return str(value)


_KEY_COLUMNS = ("seeds", "budget", "censored", "censored_ci", "median_escape", "median_escape_ci")
_DIGITS = {"stuck_fraction": 2, "p": 2, "q": 2, "escape_step": 0, "p_hat": 3, "censored_ci": 2}


def _markdown_cells(r: ConditionSummary, columns: tuple[str, ...]) -> tuple[str, ...]:
    cells = [_fmt(r.value(c), _DIGITS.get(c, 4)) for c in columns]
    median = r.escape_curve.median() if r.escape_curve is not None else None
    if "median_escape" in columns and median is not None:  # the grid interval it is ("> 400": not reached)
        cells[columns.index("median_escape")] = str(median.estimate)
    if "median_escape_ci" in columns and r.median_escape_ci:  # (after, by]: a grid interval
        after, by = r.median_escape_ci
        cells[columns.index("median_escape_ci")] = f"({after}, {'not reached)' if by is None else f'{by}]'}"
    elif "median_escape_ci" in columns and median is not None:
        cells[columns.index("median_escape_ci")] = f"none ({r.n_runs} seeds)"  # fewer than dynamics.MIN_RUNS
    return tuple(cells)


def _table(summary: list[ConditionSummary], experiment: str, columns: tuple[str, ...]) -> Table:
    """One experiment's conditions as a markdown table."""
    return Table(columns, [_markdown_cells(r, columns) for r in summary if r.experiment == experiment])


_GRID_COLUMNS = ("p", "q", *_KEY_COLUMNS, "final_loss", "entropy_rate", "unigram_loss", "theory", "theory_exact",
                 "p_hat", "mechanisms")
SECTION_COLUMNS: dict[str, tuple[str, ...]] = {  # the table of each sweep in summary.md
    "pq-line": ("q", "tied", *_KEY_COLUMNS, "final_loss", "entropy_rate", "unigram_loss", "theory", "theory_exact"),
    "pq-tied": _GRID_COLUMNS,
    "pq-untied": _GRID_COLUMNS,
    "depth": ("n_layers", *_KEY_COLUMNS, "final_loss", "entropy_rate", "unigram_loss", "mechanisms",
              "previous_token_excess", "induction_excess"),
    "random": ("n_layers", *_KEY_COLUMNS, "final_loss", "bayes_loss", "unigram_loss", "mechanisms",
               "previous_token_excess", "induction_excess", "circuit_confirmed"),
    "precision": ("precision", *_KEY_COLUMNS, "final_loss", "theory", "theory_exact"),
    "exact": ("init", *_KEY_COLUMNS, "final_loss", "entropy_rate", "unigram_loss", "theory", "theory_exact",
              "theory_agreement"),
}


def summary_table(conditions: "list[ConditionSummary] | tuple[ConditionSummary, ...]") -> Table:
    """summary.csv: one row per condition, every column of `ConditionSummary` (intervals as JSON lists)."""
    return Table(_SUMMARY_COLUMNS, [tuple(_csv_text(r.value(c)) for c in _SUMMARY_COLUMNS) for r in conditions])


def section_table(summary: list[ConditionSummary], experiment: str) -> Table:
    """The table summary.md shows for one of the sweeps (`SECTION_COLUMNS`), e.g. `section_table(summarise(
    sweep.read_table("docs/reproduction/results.csv")), "pq-line")` re-summarises committed rows."""
    if experiment not in SECTION_COLUMNS:
        raise ValueError(f"unknown reproduction sweep {experiment!r}; the sweeps are {list(SECTION_COLUMNS)}")
    return _table(summary, experiment, SECTION_COLUMNS[experiment])


# ---------------------------------------------------------------------------------------------- figures
def _depth_curves(rows: list[Row], work_dir: Path) -> tuple[dict, dict]:
    """The depth experiment's training curves ({n_layers: [(steps, losses) per finished seed]}) and the
    chain's reference losses, read from the run folders, for `_figures_paper.reproduction_depth_figure`."""
    from markov_interp.runs import load_metrics

    curves, refs = defaultdict(list), {}
    for r in rows:
        if r.sweep != "depth" or r.status != "ok":
            continue
        metrics = [m for m in load_metrics(work_dir / r.run_dir) if "train_loss" in m]
        curves[r.config.model.n_layers].append(([m["step"] for m in metrics], [m["train_loss"] for m in metrics]))
        refs = {"entropy_rate": r.result.entropy_rate, "unigram_loss": r.result.unigram_loss}
    return dict(curves), refs


def _mechanism_counts(summary: list[ConditionSummary], name: str) -> list[tuple[str, dict]]:
    """(n_layers, {mechanism: seeds}) per setting of one experiment."""
    return [(str(r.n_layers), dict(r.mechanisms)) for r in summary if r.experiment == name]


def _survival_panels(summary: list[ConditionSummary], budget: ReproductionBudget) -> dict[str, dict]:
    """The survival figure's panels: {title: {condition label: escape curve}}."""
    def curves(name: str, label: Callable[[ConditionSummary], Optional[str]]) -> dict:
        return {label(r): r.escape_curve for r in summary
                if r.experiment == name and r.escape_curve and label(r) is not None}

    at = f"p = {_PQ[0]}, q = {_PQ[1]}"
    return {
        f"tied, p = {budget.line_p}, q across 1 - p": curves("pq-line", lambda r: f"q = {r.q}" if r.tied else None),
        f"precision at {at} (device: {_precision_device()})": curves("precision", lambda r: r.precision),
        f"depth at {at}": curves("depth", lambda r: f"{r.n_layers} layer(s)"),
        f"exact reduction at {at}": curves("exact", lambda r: f"{r.init.split(' ', 1)[1]} ({r.theory})"),
    }


def _figures(summary: list[ConditionSummary], rows: list[Row], work: Path, budget: ReproductionBudget) -> dict:
    """The reproduction's figures (drawn by `experiments._figures_paper`), by file name."""
    from markov_interp.experiments import _figures_paper as figures
    from markov_interp.experiments._figures_dynamics import escape_survival_figure

    def experiment(name: str) -> list[ConditionSummary]:
        return [r for r in summary if r.experiment == name]

    curves_depth, refs = _depth_curves(rows, work)
    phase = {"one layer, tied": experiment("pq-tied"), "one layer, untied": experiment("pq-untied")}
    mechanisms = {f"binary chain p={_PQ[0]}, q={_PQ[1]}": _mechanism_counts(summary, "depth"),
                  "random kernels (in-context task)": _mechanism_counts(summary, "random")}
    return {
        "phase_pq.png": figures.reproduction_phase_figure(phase, budget.grid_values),
        "boundary.png": figures.reproduction_boundary_figure(experiment("pq-line"), p=budget.line_p),
        "depth.png": figures.reproduction_depth_figure(curves_depth, refs, p=_PQ[0], q=_PQ[1]),
        "mechanisms.png": figures.reproduction_mechanism_figure(mechanisms),
        "survival.png": escape_survival_figure(_survival_panels(summary, budget), budget=budget.steps),
    }


def _precision_device() -> str:
    """Where this process's runs train with device "auto" (the precision runs' setting): "cuda (NAME)" or "cpu"."""
    return describe_device("auto")


# -------------------------------------------------------------------------------------------- reproduce
@dataclasses.dataclass(frozen=True)
class Reproduction(Summary):
    """The reproduction at one budget: its conditions, the sweep result they summarise and the sweep folder
    (what summary.md, summary.csv, results.json and the figures hold)."""

    budget: ReproductionBudget
    conditions: tuple[ConditionSummary, ...]
    sweep: SweepResult
    work: Path

    @property
    def failed(self) -> int:
        return self.sweep.n_failed

    def sections(self) -> list[Section]:
        return _sections(list(self.conditions), self.budget, self.sweep, self.work)

    def figures(self) -> dict[str, Any]:
        return _figures(list(self.conditions), self.sweep.rows, self.work, self.budget)

    def tables(self) -> dict[str, Table]:
        return {"summary.csv": summary_table(self.conditions)}

    def to_json(self) -> dict:
        return {"cells": len(self.sweep.rows), "failed": self.sweep.n_failed, "diverged": self.sweep.n_diverged,
                "executed": self.sweep.n_run, "reused": self.sweep.n_skipped, "work": str(self.work),
                "conditions": [r.to_json() for r in self.conditions]}


def run(budget: ReproductionBudget, out: Path, *, progress: bool = False, work: "str | os.PathLike | None" = None,
        backend: str = "local", workers: Optional[int] = None, group: Optional[int] = None) -> Reproduction:
    """Run the seven sweeps (`experiment_specs`) and copy their results table into `out`; `experiments.run` then
    writes the summary (summary.md, summary.csv, results.json and phase_pq.png, boundary.png, depth.png,
    mechanisms.png, survival.png), with the provenance, the budget's cuts and the precision runs' device at the top.

    Args:
        budget: `QUICK`, `FULL` or a budget of its own (e.g. `QUICK.replace(...)`).
        out: the folder for tables and figures.
        progress: a progress bar.
        work: the sweep folder of the training runs (default out/sweep; `markov-interp reproduce`:
            runs/reproduce[-quick]); a rerun skips finished cells.
        backend, workers: `sweep.run`'s.
        group: seeds trained as one stacked model (default `GROUP`: 16 on a CPU, 64 on a GPU; `sweep.run`).

    Returns:
        The typed `Reproduction`; out/results.csv holds every cell (config, losses, references, stuck flag,
        mechanism, probe scores)."""
    work = Path(work) if work is not None else Path(out) / "sweep"
    if group is None:
        group = GROUP["cuda" if describe_device(budget.device).startswith("cuda") else "cpu"]
    result = sweep.run(experiment_specs(budget), work, backend=backend, workers=workers, progress=progress,
                       group=group)
    Path(out).mkdir(parents=True, exist_ok=True)  # after the sweep's checks (devices, sizes): a refusal writes nothing
    atomic_write(Path(out) / "results.csv", (work / "results.csv").read_text())
    return Reproduction(budget, tuple(summarise(result.rows)), result, work)


_PRECISION = "fp32, and fp16 autocast with and without loss scaling in the precision sweep"


def _training_span(work: Path, rows: list[Row]) -> tuple[Optional[float], float]:
    """(wall-clock minutes from the first cell's start to the last cell's end of training, summed minutes of
    the cells' trainings), read from the run folders (config.json written at the start, model.safetensors at
    the end): the time the training took, also when this call reused or only re-probed the cells."""
    starts, ends = [], []
    for row in rows:
        config = work / row.run_dir / "config.json"
        weights = work / row.run_dir / "model.safetensors"
        if config.exists() and weights.exists():
            starts.append(config.stat().st_mtime)
            ends.append(weights.stat().st_mtime)
    if not starts:
        return None, 0.0
    return (max(ends) - min(starts)) / 60, sum(e - s for s, e in zip(starts, ends)) / 60


_GPU_NOTE = ("The CPU's fp16 autocast does not reproduce the GPU effect; the CUDA measurements are in "
             "docs/reproduction/gpu/ (NVIDIA H200, torch 2.11.0+cu130, 16 seeds per condition, 2000 steps, paired "
             "evaluation every 20 steps): there fp16 autocast without loss scaling delays the escape against fp32 "
             "and fp16 with loss scaling, and leaves at most one seed in 16 censored at 2000 steps "
             "(docs/findings.md).")


def _precision_note() -> str:
    """Where the precision runs ran, and on a CPU where the CUDA measurements are."""
    device = _precision_device()
    text = f"The precision runs ran on {device} (the reproduction's runs use device \"auto\")."
    return text if device.startswith("cuda") else text + " " + _GPU_NOTE


_LEGEND = (
    "Escape times are the headline. Every evaluation is paired (the model's loss beside the true predictor's "
    "and the plateau predictor's on the same tokens); a run escapes at the first evaluation that starts "
    f"{dynamics.DWELL} in a row with its excess below half the plateau's (`dynamics`; the escape lies between "
    "the previous evaluation and it), and is **censored** when that is not seen within the budget (\"stuck\" "
    "means censored, nothing more: a longer budget may see it escape). Per condition: seeds, budget (steps), "
    "censored = k/n censored with its 95% Wilson interval (censored_ci), median_escape = the grid interval "
    "(after, by] between two evaluations in which half the seeds had escaped (Kaplan-Meier on the evaluation "
    "grid; \"> 400\": not reached by the budget) with its 95% interval (median_escape_ci; "
    f"none from fewer than {dynamics.MIN_RUNS} seeds). \"theory\" = "
    "`landscape.predict_outcome` for the canonical "
    f"one-layer model (a Gaussian init evaluated at e0 = w0 = {THEORY_SMALL_INIT}); it is exact only where "
    "theory_exact says yes (the canonical model without normalisation trained on the (e, w, b) family by plain "
    "SGD: the experiment `reduction`); section 7's free training starts exact and leaves the family, and for the "
    "paper's LayerNorm models it is a heuristic (theory_exact = no in both). \"p_hat\" = the learned P(1|0) "
    "(`probes.kernel_readout`); mechanisms = `probes.classify_mechanism` counts over seeds (\"?\": not "
    "probed; \"other\": no candidate law fits, or an in-context k-gram law without a confirmed circuit); "
    "losses in nats (final_loss: mean final evaluation loss)."
)


def _run_note(result: SweepResult, work: Path) -> str:
    """How many cells, how long their training took and what this call reused."""
    span, _ = _training_span(work, result.rows)  # summed minutes overcount stacks (members share a process)
    return (
        f"{len(result.rows)} cells ({result.n_failed} failed)"
        + (f", trained within {span:.1f} minutes of wall-clock time (from the first run's start to the last "
           "run's end; probing comes on top)" if span is not None else "")
        + f". This call executed {result.n_run} cells (a finished training run is loaded, not retrained; probes "
        f"re-run when their code changed) and reused {result.n_skipped} results from {work}. Seeds of a "
        "condition train as one stacked model (`sweep.run(group=...)`)."
    )


def _sections(summary: list[ConditionSummary], budget: ReproductionBudget, result: SweepResult,
              work: Path) -> list[Section]:
    """summary.md after its header: what this call did, the precision note, the legend, then the seven sweeps."""
    return [
        Section(text=_run_note(result, work)), Section(text=_precision_note()), Section(text=_LEGEND),
        Section(f"1. The p + q = 1 boundary: p = {budget.line_p}, q across {1 - budget.line_p:g}, one layer",
                table=section_table(summary, "pq-line"), figures=("boundary.png",)),
        Section("2. A coarse (p, q) grid, tied", table=section_table(summary, "pq-tied")),
        Section("3. The same grid, untied", table=section_table(summary, "pq-untied"), figures=("phase_pq.png",)),
        Section(f"4. Depth at p = {_PQ[0]}, q = {_PQ[1]} (tied)", figures=("depth.png",),
                table=section_table(summary, "depth")),
        *_later_sections(summary, budget),
    ]


def _later_sections(summary: list[ConditionSummary], budget: ReproductionBudget) -> list[Section]:
    """Sections 5-7: random kernels, precision, the exact reduction."""
    return [
        Section(f"5. Random kernels (in-context task, {budget.random_vocab} states, Dirichlet(1) rows): one vs two "
                "attention-only layers",
                text="The plateau here is the in-context unigram estimator (unigram_loss column); bayes_loss is the "
                "in-context Bayes predictor's loss.", figures=("mechanisms.png",),
                table=section_table(summary, "random")),
        Section(f"6. Precision at p = {_PQ[0]}, q = {_PQ[1]} (one layer, tied, standard init; device: "
                f"{_precision_device()})",
                table=section_table(summary, "precision")),
        Section(f"7. The exact reduction: canonical init, no normalisation, at p = {_PQ[0]}, q = {_PQ[1]} (tied)",
                text="The one model on which `landscape.predict_outcome` is exact at the start: the paper's one-layer "
                f"shape without LayerNorm, relu MLP, canonical init with e0 = {budget.exact_e}, b0 = 0, zero value "
                "matrix. The reduced (e, w, b) start is the same for every seed; a seed draws the direction u (a random "
                "sign vector), the attention's query/key/output weights and the data. theory_agreement = seeds whose "
                "outcome is the predicted one (\"unigram\": censored at the budget; \"bigram\": escaped). The theory "
                "is gradient flow; training here is AdamW on a one-cycle schedule with every weight free, which leaves "
                "the (e, w, b) family, so the prediction is exact at the start only (theory_exact = no). The "
                "experiment `reduction` (`markov-interp reproduce --extras`) trains the same model on the family by "
                "plain SGD, where it is exact throughout, and releases one freedom at a time.",
                table=section_table(summary, "exact"),
                figures=("survival.png",)),
    ]


EXPERIMENT = register(Experiment(name="paper", title="Reproduction", budgets={"quick": QUICK, "full": FULL}, run=run,
                                 precision=_PRECISION))
