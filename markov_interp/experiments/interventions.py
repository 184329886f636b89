"""Interventions during training, as experiments: does a circuit form sooner, later or not at all when part of
the model is clamped or frozen while it learns?

Probing a trained model tells *what* circuit it has; these ask *how it forms* (Singh et al. 2024, "What needs to
go right for an induction head", clamp activations during training; Bietti et al. 2023 freeze parameters).
Each experiment trains every arm over the same seeds (one stack per arm, `training.train_many`) and answers
with the distributions of `dynamics`: each run's excess curve (its excess loss over the true predictor as a
fraction of the plateau's) and its crossings of 0.9 / 0.75 / 0.5 / 0.25 (interval-censored between evaluations,
right-censored at the budget), summarised per arm and compared with the free arm at every line.

1. **previous-token clamp** — random kernels (a fresh Dirichlet kernel per sequence), two attention-only
   layers: layer 0's pattern clamped to a perfect previous-token head (`previous_token`) for the whole run, or
   until `release` and then trained, against free. How much sooner does the loss leave the in-context unigram
   plateau when the first half of the induction circuit is given?
2. **reader frozen** — the same task, layer 1 frozen until `release` and then trained: does layer 0 become a
   previous-token head without a reader? Its previous-token score at `release` (frozen reader against free),
   and the escape times after release.
3. **attention in one layer** — one layer, tied, p = 0.5, q = 0.8 (the paper's stuck chain): attention clamped
   to the uniform causal pattern, or its weights frozen at init, against free. Does the unigram plateau
   depend on attention at all?

`run_experiment(name, budget, out_dir)` trains one experiment (restartable through its run folders) and
returns an `ExperimentResult` (per arm: each run's dynamics, the arm's `dynamics.ConditionDynamics`, the
comparison with the free arm, final losses; the arm loop is `experiments._arms`, shared with the factorial);
`survival_figure` draws the escape survival. Registered as the experiment "interventions" (`run`
runs the parts its budget names into one `InterventionsResult`): `python -m markov_interp.experiments --only
interventions --out DIR` writes DIR/interventions/results.json (with every run's curve), summary.md and the
figures (what docs/reproduction/interventions/ holds).
"""

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

from markov_interp import dynamics
from markov_interp.sources import SourceConfig
from markov_interp.experiments import Budget, Experiment, Section, Summary, register
from markov_interp.experiments._arms import (Arm, ExperimentResult, arm_json, dynamics_figures,
                                             experiment_from_json, experiment_sections, run_arms)
from markov_interp.models import preset
from markov_interp.models.hooks import act_name
from markov_interp.runs import RunConfig, TrainConfig

__all__ = ["InterventionsBudget", "QUICK", "STANDARD", "FULL", "EXPERIMENTS", "InterventionsResult", "experiment_arms",
           "run_experiment", "run", "survival_figure", "summary_markdown", "read", "EXPERIMENT"]

EXPERIMENTS = ("previous-token-clamp", "reader-frozen", "attention-in-one-layer")


@dataclasses.dataclass(frozen=True, kw_only=True)
class InterventionsBudget(Budget):
    """Seeds, steps and sequence lengths of the three experiments (`cuts` says what a small budget leaves out).

    `steps` is the random-kernel experiments' (1 and 2; constant lr: a shorter run is a prefix of a longer one;
    free runs escape at steps 160-280 over 16 seeds on a CPU), `chain_steps` the one-layer chain's (3, one-cycle
    schedule as the paper); `parts` the experiments to run."""

    seeds: int = 16
    steps: int = 500
    release: int = 150  # experiment 2: layer 1 is frozen for the first `release` updates
    chain_steps: int = 600
    chain_seq_len: int = 128
    eval_every: int = 10
    eval_batches: int = 4
    device: str = "cpu"
    parts: tuple[str, ...] = EXPERIMENTS

    def check(self) -> None:
        if self.release >= self.steps:
            raise ValueError(f"release ({self.release}) must come before the end of training (steps = {self.steps})")
        unknown = [p for p in self.parts if p not in EXPERIMENTS]
        if unknown:
            raise ValueError(f"parts: unknown experiments {unknown}; the experiments are {list(EXPERIMENTS)}")


FULL = InterventionsBudget(name="full")
# the full budget is CPU-sized: at it the positive control learns (free two-layer runs leave the plateau in 16/16
# seeds, docs/reproduction/interventions/), so "standard" is the full budget under its own name
STANDARD = FULL.replace(name="standard", cuts="none: the full budget (free runs escape in every seed)")
QUICK = InterventionsBudget(name="quick", seeds=4, steps=60, release=20, chain_steps=60, chain_seq_len=32,
                            eval_every=10, eval_batches=2,
                            cuts="4 seeds, 60 steps: a smoke test of the code path; its numbers show nothing")
_PATTERN0 = act_name("pattern", 0)
_CHAIN_PQ = (0.5, 0.8)  # experiment 3's chain: the paper's stuck one


def _random_kernel_base(budget: InterventionsBudget, steps: int) -> RunConfig:
    return RunConfig(
        source=SourceConfig(kind="random", vocab=3, alpha=1.0),
        model=preset("attn-only-2layer", n_ctx=32, d_vocab=3),
        train=TrainConfig(steps=steps, seq_len=32, batch_size=64, lr=1e-2, schedule="constant",
                          eval_every=budget.eval_every, eval_batches=budget.eval_batches, log_every=budget.eval_every,
                          n_checkpoints=0, device=budget.device))


def _chain_base(budget: InterventionsBudget) -> RunConfig:
    return RunConfig(
        source=SourceConfig(kind="binary", p=_CHAIN_PQ[0], q=_CHAIN_PQ[1]),
        model=preset("paper-1layer", n_ctx=budget.chain_seq_len),
        train=TrainConfig(steps=budget.chain_steps, seq_len=budget.chain_seq_len, batch_size=16,
                          eval_every=budget.eval_every, eval_batches=budget.eval_batches, log_every=budget.eval_every,
                          n_checkpoints=0, device=budget.device))


# the run folders' key of each base (runs/TASK/ARM/seedN): experiments 1 and 2 share the random-kernel task's free arm
_RANDOM_KERNELS, _CHAIN = "random-kernels", f"chain-p{_CHAIN_PQ[0]}-q{_CHAIN_PQ[1]}"


def experiment_arms(name: str, budget: InterventionsBudget) -> tuple[RunConfig, list[Arm]]:
    """The base run (seed 0, no intervention) and the arms of experiment `name`; the first arm is "free".

    Args:
        name: one of `EXPERIMENTS`.
        budget: steps, release, sequence lengths.

    Returns:
        (the base run, the arms); `_arms.run_arms` trains them."""
    return _EXPERIMENT_ARMS[_known(name)](budget)[1:]


def _known(name: str) -> str:
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; the experiments are {list(EXPERIMENTS)}")
    return name


def _previous_token_clamp(budget: InterventionsBudget) -> tuple[str, RunConfig, list[Arm]]:
    return _RANDOM_KERNELS, _random_kernel_base(budget, budget.steps), [
        Arm("free"), Arm("layer 0 clamped to previous-token", ({"clamp": _PATTERN0, "value": "previous_token"},)),
        Arm(f"layer 0 clamped to previous-token until {budget.release}",
            ({"clamp": _PATTERN0, "value": "previous_token", "end": budget.release},))]


def _reader_frozen(budget: InterventionsBudget) -> tuple[str, RunConfig, list[Arm]]:
    """Layer 1 frozen; every arm scored at the release too (does layer 0 learn without a reader by then?)."""
    release = budget.release
    return _RANDOM_KERNELS, _random_kernel_base(budget, budget.steps), [
        Arm("free", score_at_release=release),
        Arm(f"layer 1 frozen until {release}", ({"freeze": "blocks.1.*", "end": release},), score_at_release=release),
        # the control: layer 0 read at the end, when free runs have formed their previous-token head
        Arm("layer 1 frozen throughout", ({"freeze": "blocks.1.*"},), score_at_release=release)]


def _attention_in_one_layer(budget: InterventionsBudget) -> tuple[str, RunConfig, list[Arm]]:
    return _CHAIN, _chain_base(budget), [
        Arm("free"), Arm("pattern clamped to uniform", ({"clamp": _PATTERN0, "value": "uniform"},)),
        Arm("attention frozen at init", ({"freeze": "blocks.0.attn.*"},)),
        # the control: which half of attention lengthens the plateau, the pattern (Q/K) or the values (V/O)
        Arm("Q/K frozen at init", ({"freeze": "blocks.0.attn.[qk].weight"},)),
        Arm("V/O frozen at init", ({"freeze": "blocks.0.attn.[vo].weight"},))]


_EXPERIMENT_ARMS = {"previous-token-clamp": _previous_token_clamp, "reader-frozen": _reader_frozen,
                    "attention-in-one-layer": _attention_in_one_layer}


def run_experiment(name: str, budget: InterventionsBudget = FULL, out_dir: "str | Path | None" = None, *,
                   progress: bool = False) -> ExperimentResult:
    """Train every arm of experiment `name` over `budget.seeds` seeds (run folders under `out_dir/runs`, so a
    rerun skips what is finished) and compare each arm's escape times with the free arm's.

    Args:
        name: one of `EXPERIMENTS`.
        budget: seeds, steps, device.
        out_dir: where the run folders go (None: nothing is written).
        progress: a progress bar per arm.

    Returns:
        The arms' dynamics and comparisons (`ExperimentResult`)."""
    task, base, arms = _EXPERIMENT_ARMS[_known(name)](budget)
    return run_arms(name, base, arms, budget, out_dir, task=task, progress=progress)


# ------------------------------------------------------------------------------------------------ output
def survival_figure(results: list[ExperimentResult]) -> Any:
    """The survival of the escape of every arm, one panel per experiment."""
    from markov_interp.experiments import _figures_dynamics as figures

    panels = {r.title: {a.arm.name: a.summary for a in r.arms} for r in results}
    return figures.escape_survival_figure(panels, budget={r.title: r.steps for r in results})


def summary_markdown(results: list[ExperimentResult]) -> str:
    """The sections of `results` as markdown (what summary.md holds after its header)."""
    return "\n\n".join(s.markdown() for r in results for s in experiment_sections(r)) + "\n"


_PREAMBLE = (
    "A run crosses a line f (a fraction of the plateau's excess over the true predictor: the in-context unigram "
    "estimator's for random kernels, the stationary law's for the fixed chain) at the first evaluation that starts "
    f"{dynamics.DWELL} in a row below f, known to lie in (previous evaluation, evaluation]; escape = the crossing of "
    "0.5, censored when not seen within the budget (`dynamics`). Intervals are 95%: median crossings (Kaplan-Meier "
    "on the evaluation grid, log-log band; none from fewer than 5 seeds), censored fraction (Wilson), shifts, "
    "ratios and areas against the free arm (bootstrap over seeds; ?: beyond the budget), mean scores (bootstrap). "
    "Attention scores are measured on 64 fresh sequences with the arm's clamps applied (`clamps.applied`).")


@dataclasses.dataclass(frozen=True)
class InterventionsResult(Summary):
    """The experiments run at one budget (`run`): what summary.md, results.json and the figures hold."""

    budget: InterventionsBudget
    parts: tuple[ExperimentResult, ...]

    @property
    def failed(self) -> int:
        return sum(a.failed for r in self.parts for a in r.arms)

    def sections(self) -> list[Section]:
        intro = Section(text=f"{self.budget.seeds} seeds per arm; evaluations every {self.budget.eval_every} steps. "
                        + _PREAMBLE, figures=("survival.png",))
        return [intro] + [s for r in self.parts for s in experiment_sections(r)]

    def figures(self) -> dict[str, Any]:
        drawn = {"survival.png": survival_figure(list(self.parts))}
        for r in self.parts:
            drawn.update(dynamics_figures(r))
        return drawn

    def to_json(self) -> dict:
        """Every seed's escape, crossings, excess curve and final loss, per arm and experiment, with the arms'
        comparisons with free."""
        return {r.name: {"steps": r.steps, "seconds": round(r.seconds, 1),
                         "arms": {a.arm.name: arm_json(a) for a in r.arms}} for r in self.parts}


def read(budget: InterventionsBudget, result: Mapping) -> InterventionsResult:
    """results.json's "result" read back as the typed result, every statistic recomputed (`experiments.load`)."""
    return InterventionsResult(budget, tuple(experiment_from_json(name, data, budget)
                                             for name, data in result.items()))


def run(budget: InterventionsBudget, out: Path, *, progress: bool = False) -> InterventionsResult:
    """Run the experiments `budget.parts` into `out` (run folders under out/runs; a rerun loads them).

    Args:
        budget: seeds, steps, device and which experiments.
        out: the experiment's folder.
        progress: progress bars.

    Returns:
        The typed result (`InterventionsResult`)."""
    return InterventionsResult(budget, tuple(run_experiment(name, budget, out, progress=progress)
                                             for name in budget.parts))


EXPERIMENT = register(Experiment(name="interventions", title="Interventions during training",
                                 budgets={"quick": QUICK, "standard": STANDARD, "full": FULL}, run=run,
                                 read=read, precision="fp32"))
