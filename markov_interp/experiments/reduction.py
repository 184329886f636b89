"""The exact reduction that stays exact: which freedom moves the separatrix?

`landscape` reduces a one-layer tied model without normalisation (relu MLP, canonical init, zero value matrix)
to three scalars (e, w, b) and predicts, from (e0, w0, b0), whether gradient flow reaches the entropy rate
("bigram") or sticks at the unigram line; on a binary chain with p + q > 1 the boundary in w0 (the
separatrix) sits at w0 = -0.609 for e0 = 0.1, b0 = 0, p = 0.5, q = 0.8. That prediction is exact only while
training stays on the (e, w, b) family, and free training does not: positions, embedding row 0, attention and
the bias's row 0 all get gradients. Here every arm trains the same network from the same canonical inits (a
grid of w0, several seeds: a seed draws the direction u and the data) by SGD on sampled batches:

- "reduced": `train.reduction="canonical"`, the gradient projected onto the family (`models.reduction`): SGD
  on (e, w, b) exactly, so its whole trajectory must follow `landscape.gradient_flow` up to sampling noise;
- one arm per part set free (`release`): "positions", "embedding_row0", "attention", "mlp", "output_bias";
- "free-sgd": nothing constrained (what the issue found escaping at w0 = -0.5);
- "free-adam": nothing constrained, Adam (no weight decay) at `adam_lr`;

and two arms are computed on the reduced loss itself (no network): "flow" (plain GD at the SGD arms' lr:
the theory) and "adam-ewb" (Adam on (e, w, b), `landscape.adam_descent`, at `adam_lr`). Every arm's outcome
is the package's one escape definition (`dynamics`: the 0.5 line of the plateau excess, crossed for
`dynamics.DWELL` evaluations); its separatrix is the w0 interval where the escaped fraction drops through 1/2.
Each run's checkpoints are projected onto (e, w, b) along its init direction u
(`landscape.coordinates_trajectory`) and compared with the flow at the same steps.

Registered as "reduction": `python -m markov_interp.experiments --only reduction [--quick]`.
"""

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

import numpy as np
from tqdm.auto import tqdm

from markov_interp import dynamics, landscape
from markov_interp.experiments import Budget, Experiment, Section, Summary, Table, register
from markov_interp.experiments import _shared
from markov_interp.models import initial_state
from markov_interp.models.reduction import RELEASABLE, exact_model_options
from markov_interp.sweep import SweepSpec

__all__ = ["ReductionBudget", "QUICK", "STANDARD", "FULL", "NETWORK_ARMS", "THEORY_ARMS", "arm_spec",
           "separatrix_interval", "predicted_boundary", "ArmResult", "ReductionResult", "run", "read", "EXPERIMENT"]

NETWORK_ARMS = ("reduced", *RELEASABLE, "free-sgd", "free-adam")
THEORY_ARMS = ("flow", "adam-ewb")
_MEASURE_KEY = "reduction-v1"


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReductionBudget(Budget):
    """The chain (p, q), the canonical inits (e0, every w0; b0 = 0), the SGD recipe (lr, batch of `batch_size`
    sequences of `seq_len`), Adam's lr, and which network `arms` train (the theory arms always run)."""

    seeds: int = 8
    steps: int = 400
    p: float = 0.5
    q: float = 0.8
    e0: float = 0.1
    w0: tuple[float, ...] = (-0.9, -0.85, -0.8, -0.75, -0.7, -0.65, -0.6, -0.55, -0.5, -0.45, -0.4, -0.35)
    lr: float = 0.5
    adam_lr: float = 2e-3
    seq_len: int = 64
    batch_size: int = 16
    eval_every: int = 10
    eval_batches: int = 4
    n_checkpoints: int = 16  # log-spaced: the paths compared with the flow
    arms: tuple[str, ...] = NETWORK_ARMS
    workers: int = 1
    device: str = "cpu"

    def check(self) -> None:
        landscape.reference_losses(self.p, self.q)  # p, q in (0, 1)
        if not self.p + self.q > 1:
            raise ValueError(f"the separatrix exists for p + q > 1, got p + q = {self.p + self.q:g}")
        if not self.e0 > 0 or not all(w < 0 for w in self.w0) or list(self.w0) != sorted(set(self.w0)):
            raise ValueError(f"need e0 > 0 and increasing, distinct w0 < 0; got e0={self.e0}, w0={list(self.w0)}")
        unknown = [a for a in self.arms if a not in NETWORK_ARMS]
        if unknown or len(set(self.arms)) != len(self.arms):
            raise ValueError(f"arms: expected distinct names from {list(NETWORK_ARMS)}, got {list(self.arms)}")
        for name in ("lr", "adam_lr"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")


FULL = ReductionBudget(name="full")
# CPU-sized: the positive control (the reduced arm below the separatrix escapes, 8/8 per w0) learns at it
STANDARD = FULL.replace(name="standard", cuts="none: the full budget (the reduced arm escapes below the "
                                               "separatrix in every seed)")
QUICK = ReductionBudget(name="quick", seeds=2, steps=200, w0=(-0.8, -0.65, -0.55, -0.45),
                        arms=("reduced", "positions", "free-sgd"), eval_batches=2, n_checkpoints=4,
                        cuts="2 seeds, 4 values of w0, 200 steps, arms reduced / positions / free-sgd only: a smoke "
                             "test (no separatrix from 2 seeds)")


def arm_spec(budget: ReductionBudget, arm: str) -> SweepSpec:
    """The sweep of one network arm: the exact model at every w0 x seed, trained by the arm's recipe."""
    model = exact_model_options(n_ctx=budget.seq_len, e0=budget.e0)
    train: dict[str, Any] = {
        "steps": budget.steps, "seq_len": budget.seq_len, "batch_size": budget.batch_size, "lr": budget.lr,
        "optimizer": "sgd", "weight_decay": 0.0, "schedule": "constant", "eval_every": budget.eval_every,
        "eval_batches": budget.eval_batches, "log_every": budget.eval_every,
        "n_checkpoints": budget.n_checkpoints, "device": budget.device}
    if arm == "free-adam":
        train.update(optimizer="adamw", lr=budget.adam_lr)
    elif arm != "free-sgd":
        train.update(reduction="canonical", release=[] if arm == "reduced" else [arm])
    return SweepSpec(name=f"reduction-{arm}",
                     base={"source": {"kind": "binary", "p": budget.p, "q": budget.q}, "model": model, "train": train},
                     grid={"model.canonical_w": list(budget.w0)}, seeds=tuple(range(budget.seeds)), probe=False)


def separatrix_interval(w0: Sequence[float], escaped: Sequence[float]) -> Optional[tuple[float, float]]:
    """Where the escaped fraction first drops from >= 1/2 to < 1/2 going up in w0: (last w0 at >= 1/2, first
    below), or None when it never does (every w0 escapes, none does, or the first already fails)."""
    for i in range(1, len(w0)):
        if escaped[i - 1] >= 0.5 > escaped[i]:
            return w0[i - 1], w0[i]
    return None


# ------------------------------------------------------------------------------------------ measurement
def _measure(folder: Path, cfg: Any, budget: ReductionBudget) -> dict:
    """One run's escape, its (e, w, b) at every checkpoint (along its init direction) and the flow's there."""
    from markov_interp import runs

    states = [initial_state(cfg.model, cfg.train.seed)]
    steps = [0]
    for step, _ in runs.list_checkpoints(folder):
        states.append(runs.read_checkpoint(folder, step)[0])
        steps.append(step)
    traj = landscape.coordinates_trajectory(states, p=budget.p, q=budget.q)
    flow = landscape.gradient_flow(budget.e0, cfg.model.canonical_w, 0.0, p=budget.p, q=budget.q,
                                   steps=max(steps), lr=budget.lr)
    gap = np.abs(traj.points - flow.points[steps])
    run = dynamics.from_metrics(runs.load_metrics(folder))
    return {"escape": None if run is None else dynamics.crossings_to_json({0.5: run.escape}, dwell=run.dwell),
            "steps": steps, "points": traj.points.round(6).tolist(), "flow_gap": gap.max(0).round(6).tolist()}


@dataclasses.dataclass(frozen=True)
class ArmResult:
    """One arm over the w0 grid: per w0 the escaped k/n (0.5 line) and, for network arms, the largest distance
    |(e, w, b) - flow| over checkpoints (median over seeds, per coordinate) and every seed's numbers."""

    arm: str
    escaped: tuple[int, ...]  # per w0
    n: tuple[int, ...]
    flow_gap: Optional[tuple[tuple[float, float, float], ...]]  # per w0: median over seeds of the max |d(e, w, b)|
    runs: tuple[dict, ...]  # per run: w0, seed and `_measure`'s numbers (network arms)

    def fractions(self) -> list[float]:
        return [k / n if n else math.nan for k, n in zip(self.escaped, self.n)]


def _network_arm(arm: str, rows: list, work: Path, budget: ReductionBudget, progress: bool) -> ArmResult:
    """Measure one arm's finished runs (cached per run) and tally them per w0."""
    per_w: dict[float, list[dict]] = {w: [] for w in budget.w0}
    for row in tqdm(rows, disable=not progress, desc=arm, unit="run"):
        if row.status != "ok":
            continue
        cfg = row.config
        value = _shared.cached_measure(work, row.cell_id, _MEASURE_KEY, lambda: _measure(work / row.run_dir, cfg,
                                                                                       budget))
        per_w[cfg.model.canonical_w].append({"w0": cfg.model.canonical_w, "seed": cfg.train.seed, **value})
    return _tally(arm, [r for w in budget.w0 for r in per_w[w]], budget)


def _tally(arm: str, runs: list[dict], budget: ReductionBudget) -> ArmResult:
    """A network arm's runs (w0, seed and `_measure`'s numbers each) tallied per w0: escaped k/n and the median
    distance from the flow; after training and when results.json is read back (`read`)."""
    escaped, n, gaps = [], [], []
    for w in budget.w0:
        mine = [r for r in runs if r["w0"] == w]
        found = [dynamics.crossings_from_json(r["escape"])[0][dynamics.ESCAPE_FRACTION] for r in mine if r["escape"]]
        escaped.append(sum(f.escaped for f in found))
        n.append(len(found))
        g = np.array([r["flow_gap"] for r in mine]) if mine else np.full((1, 3), np.nan)
        gaps.append(tuple(float(x) for x in np.median(g, 0)))
    return ArmResult(arm, tuple(escaped), tuple(n), tuple(gaps), tuple(runs))


def _theory_arm(arm: str, budget: ReductionBudget) -> ArmResult:
    """The reduced loss itself, no network: plain GD at the SGD lr ("flow") or Adam ("adam-ewb"), every w0 at
    once; escape by the same `dynamics` rule on the exact loss at the networks' evaluation steps."""
    if arm == "flow":
        trajs = [landscape.gradient_flow(budget.e0, w, 0.0, p=budget.p, q=budget.q, steps=budget.steps,
                                         lr=budget.lr).loss for w in budget.w0]
        losses = np.stack(trajs, -1)
    else:
        losses = landscape.adam_descent(budget.e0, np.array(budget.w0), 0.0, p=budget.p, q=budget.q,
                                        steps=budget.steps, lr=budget.adam_lr).loss
    refs = landscape.reference_losses(budget.p, budget.q)
    rate, plateau = refs["entropy_rate"], refs["unigram_loss"]
    steps = tuple(range(budget.eval_every, budget.steps + 1, budget.eval_every))
    escaped = []
    for j in range(len(budget.w0)):
        curve = dynamics.ExcessCurve(steps, tuple(float(losses[s, j] - rate) for s in steps),
                                     (plateau - rate,) * len(steps))
        escaped.append(int(dynamics.crossing(curve, 0.5).escaped))
    return ArmResult(arm, tuple(escaped), (1,) * len(budget.w0), None, ())


# ------------------------------------------------------------------------------------------------ result
def predicted_boundary(budget: ReductionBudget, *, tol: float = 1e-4) -> float:
    """The flow's separatrix in w0 at (e0, b0 = 0) by bisection on `landscape.predict_outcome` (bigram below)."""
    lo, hi = -2.0, -1e-3
    outcome = lambda w: landscape.predict_outcome(budget.e0, w, 0.0, p=budget.p, q=budget.q)  # noqa: E731
    if outcome(lo) != "bigram" or outcome(hi) != "unigram":
        raise ValueError(f"no separatrix in w0 in [{lo}, {hi}] at e0={budget.e0}, p={budget.p}, q={budget.q}")
    while hi - lo > tol:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if outcome(mid) == "bigram" else (lo, mid)
    return (lo + hi) / 2


def _interval_text(interval: Optional[tuple[float, float]]) -> str:
    return "none in the grid" if interval is None else f"({interval[0]:g}, {interval[1]:g})"


@dataclasses.dataclass(frozen=True)
class ReductionResult(Summary):
    """Every arm over the w0 grid, theory arms first, and the flow's exact separatrix."""

    budget: ReductionBudget
    arms: tuple[ArmResult, ...]
    boundary: float  # the flow's separatrix in w0 (bisection)
    n_failed: int

    @property
    def failed(self) -> int:
        return self.n_failed

    def arm(self, name: str) -> ArmResult:
        return next(a for a in self.arms if a.arm == name)

    def separatrices(self) -> dict[str, Optional[tuple[float, float]]]:
        return {a.arm: separatrix_interval(self.budget.w0, a.fractions()) for a in self.arms}

    def moved(self) -> list[str]:
        """The arms whose separatrix interval is not the flow's."""
        found = self.separatrices()
        return [a.arm for a in self.arms if found[a.arm] != found["flow"]]

    def outcome_table(self) -> Table:
        seps = self.separatrices()
        return Table(("arm", *(f"w0={w:g}" for w in self.budget.w0), "separatrix"),
                     [(a.arm, *(f"{k}/{n}" for k, n in zip(a.escaped, a.n)), _interval_text(seps[a.arm]))
                      for a in self.arms])

    def gap_table(self) -> Table:
        """Per network arm: each run's largest |run - flow| over its checkpoints, then the max and the median of
        that over all the arm's runs (every w0 and seed), per coordinate, and the number of runs."""
        rows = []
        for a in self.arms:
            if a.flow_gap is None or not a.runs:
                continue
            gaps = np.array([r["flow_gap"] for r in a.runs], dtype=float)
            rows.append((a.arm, str(len(gaps)), *(f"{x:.3g}" for x in np.nanmax(gaps, 0)),
                         *(f"{x:.3g}" for x in np.nanmedian(gaps, 0))))
        return Table(("arm", "runs", "max Δe", "max Δw", "max Δb", "median Δe", "median Δw", "median Δb"), rows)

    def sections(self) -> list[Section]:
        b = self.budget
        intro = Section(text=(
            f"Binary chain p = {b.p:g}, q = {b.q:g}; the exact model (one layer, tied, no normalisation, relu MLP, "
            f"zero value matrix) from the canonical init e0 = {b.e0:g}, b0 = 0 at each w0; {b.seeds} seeds per arm "
            f"and w0 (a seed draws u and the data); SGD at lr {b.lr:g} (constant), Adam at {b.adam_lr:g} "
            f"(betas 0.9 / 0.95, no weight decay); {b.steps} steps, batches of {b.batch_size} x {b.seq_len}, "
            f"evaluations every {b.eval_every} steps. The flow's separatrix at this init (bisection on "
            f"`landscape.predict_outcome`): w0 = {self.boundary:.4f}."))
        moved = self.moved()
        outcome = Section("Escapes and separatrices", (
            f"Escaped = crossed the 0.5 line of the plateau excess within the budget (`dynamics`, dwell "
            f"{dynamics.DWELL}), k/n seeds (theory arms: one deterministic run). Separatrix = where the escaped "
            "fraction drops through 1/2 going up in w0."), self.outcome_table(),
            after=("Arms whose separatrix differs from the flow's: " + (", ".join(moved) if moved else "none") + "."),
            figures=("separatrix.png",))
        gaps = Section("Distance from the flow", (
            "Each run's checkpoints projected on (e, w, b) along its init direction u "
            "(`landscape.coordinates_trajectory`), against plain GD on the reduced loss at the same lr and steps: "
            "Δ = the largest |run - flow| over checkpoints per run, then the max and the median of that over the "
            "arm's runs (every w0 and seed). For "
            "released arms the projection is a summary (the weights leave the family). The figure draws seed 0's "
            "path at every w0."), self.gap_table(),
            figures=("paths.png",))
        return [intro, outcome, gaps]

    def figures(self) -> dict[str, Any]:
        from markov_interp.experiments._figures_reduction import paths_on_landscape_figure, separatrix_figure

        b = self.budget
        fig = separatrix_figure(b.w0, {a.arm: a.fractions() for a in self.arms}, boundary=self.boundary,
                                title=f"p={b.p:g}, q={b.q:g}, e0={b.e0:g}, {b.steps} steps")
        paths = {a.arm: [np.array(r["points"]) for r in a.runs if r["seed"] == 0] for a in self.arms if a.runs}
        flows = [landscape.gradient_flow(b.e0, w, 0.0, p=b.p, q=b.q, steps=b.steps, lr=b.lr) for w in b.w0]
        return {"separatrix.png": fig, "paths.png": paths_on_landscape_figure(paths, flows, p=b.p, q=b.q)}

    def tables(self) -> dict[str, Table]:
        return {"outcomes.csv": self.outcome_table(), "flow_gap.csv": self.gap_table()}

    def to_json(self) -> dict:
        return {"boundary": self.boundary, "separatrices": {k: v for k, v in self.separatrices().items()},
                "arms": {a.arm: {"escaped": a.escaped, "n": a.n, "flow_gap": a.flow_gap, "runs": a.runs}
                         for a in self.arms}}


def read(budget: ReductionBudget, result: dict) -> ReductionResult:
    """results.json's "result" read back (`experiments.load`): the network arms tallied from their recorded runs
    (each run's escape as measured); the theory arms and the flow's separatrix as recorded (deterministic
    functions of the budget, seconds to recompute: `_theory_arm`, `predicted_boundary`)."""
    theory = [ArmResult(name, tuple(result["arms"][name]["escaped"]), tuple(result["arms"][name]["n"]), None, ())
              for name in THEORY_ARMS]
    network = [_tally(name, list(result["arms"][name]["runs"]), budget) for name in budget.arms]
    return ReductionResult(budget, tuple(theory + network), float(result["boundary"]), 0)


def run(budget: ReductionBudget, out: Path, *, progress: bool = False) -> ReductionResult:
    """Train every network arm into out/runs (restartable), measure every run, compute the theory arms.

    Args:
        budget: the grid, recipe and arms.
        out: the experiment's folder.
        progress: progress bars.

    Returns:
        The typed result (`ReductionResult`).
    """
    work = Path(out) / "runs"
    specs = [arm_spec(budget, arm) for arm in budget.arms]
    result = _shared.train_grid(specs, work, workers=budget.workers, group=len(budget.w0) * budget.seeds,
                                progress=progress)
    arms = [_theory_arm(name, budget) for name in THEORY_ARMS]
    for spec in specs:
        rows = [r for r in result.rows if r.sweep == spec.name]
        arms.append(_network_arm(spec.name.removeprefix("reduction-"), rows, work, budget, progress))
    return ReductionResult(budget, tuple(arms), predicted_boundary(budget), result.n_failed)


EXPERIMENT = register(Experiment(name="reduction", title="The exact reduction that stays exact: which freedom moves "
                                 "the separatrix", budgets={"quick": QUICK, "standard": STANDARD,
                                                                       "full": FULL}, run=run, read=read,
                                 precision="fp32"))
