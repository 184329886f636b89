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
comparison with the free arm, final losses); `survival_figure` draws the escape survival, `dynamics_figures` the
median excess curves and the survival at every line. Registered as the experiment "interventions" (`run`
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
from markov_interp.experiments import Budget, Experiment, Section, Summary, Table, _shared, register
from markov_interp.models import heads_per_layer, preset
from markov_interp.models.hooks import act_name
from markov_interp import runs
from markov_interp.runs import RunConfig, TrainConfig
from markov_interp.training import TrainResult, train_many

__all__ = ["InterventionsBudget", "QUICK", "STANDARD", "FULL", "EXPERIMENTS", "Arm", "CircuitScores", "ArmResult",
           "ExperimentResult", "InterventionsResult", "experiment_arms", "run_experiment", "run",
           "previous_token_at_release", "circuit_scores_at_end", "circuit_scores_at",
           "circuit_scores_over_training", "discovered_circuits", "survival_figure", "dynamics_figures",
           "experiment_sections", "summary_markdown", "run_arms", "arm_result", "arm_json", "arm_from_json",
           "experiment_from_json", "read", "EXPERIMENT"]

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


@dataclasses.dataclass(frozen=True)
class Arm:
    """One condition of an experiment: a name, the interventions every seed trains under and changes to the
    model config (e.g. the head start `init_attention`)."""

    name: str
    interventions: tuple = ()
    model: tuple = ()  # (field, value) pairs replaced in the base run's ModelConfig


def _random_kernel_base(budget: InterventionsBudget, steps: int) -> RunConfig:
    return RunConfig(
        source=SourceConfig(kind="random", vocab=3, alpha=1.0),
        model=preset("attn-only-2layer", n_ctx=32, d_vocab=3),
        train=TrainConfig(steps=steps, seq_len=32, batch_size=64, lr=1e-2, schedule="constant",
                          eval_every=budget.eval_every, eval_batches=budget.eval_batches, log_every=budget.eval_every,
                          n_checkpoints=0, device=budget.device))


def _chain_base(budget: InterventionsBudget) -> RunConfig:
    return RunConfig(
        source=SourceConfig(kind="binary", p=0.5, q=0.8),
        model=preset("paper-1layer", n_ctx=budget.chain_seq_len),
        train=TrainConfig(steps=budget.chain_steps, seq_len=budget.chain_seq_len, batch_size=16,
                          eval_every=budget.eval_every, eval_batches=budget.eval_batches, log_every=budget.eval_every,
                          n_checkpoints=0, device=budget.device))


def experiment_arms(name: str, budget: InterventionsBudget) -> tuple[RunConfig, list[Arm]]:
    """The base run (seed 0, no intervention) and the arms of experiment `name`; the first arm is "free"."""
    free = Arm("free")
    if name == "previous-token-clamp":
        return _random_kernel_base(budget, budget.steps), [
            free, Arm("layer 0 clamped to previous-token", ({"clamp": _PATTERN0, "value": "previous_token"},)),
            Arm(f"layer 0 clamped to previous-token until {budget.release}",
                ({"clamp": _PATTERN0, "value": "previous_token", "end": budget.release},))]
    if name == "reader-frozen":
        return _random_kernel_base(budget, budget.steps), [
            free, Arm(f"layer 1 frozen until {budget.release}", ({"freeze": "blocks.1.*", "end": budget.release},)),
            # issue 22's control: layer 0 read at the end, when free runs have formed their previous-token head
            Arm("layer 1 frozen throughout", ({"freeze": "blocks.1.*"},))]
    if name == "attention-in-one-layer":
        return _chain_base(budget), [
            free, Arm("pattern clamped to uniform", ({"clamp": _PATTERN0, "value": "uniform"},)),
            Arm("attention frozen at init", ({"freeze": "blocks.0.attn.*"},)),
            # issue 22's control: which half of attention lengthens the plateau, the pattern (Q/K) or the values (V/O)
            Arm("Q/K frozen at init", ({"freeze": "blocks.0.attn.[qk].weight"},)),
            Arm("V/O frozen at init", ({"freeze": "blocks.0.attn.[vo].weight"},))]
    raise ValueError(f"unknown experiment {name!r}; the experiments are {list(EXPERIMENTS)}")


def _with(base: RunConfig, arm: Arm, seed: int, **train: Any) -> RunConfig:
    return dataclasses.replace(base, model=base.model.replace(**dict(arm.model)) if arm.model else base.model,
                               train=dataclasses.replace(base.train, seed=seed, interventions=arm.interventions,
                                                         **train))


def _folder(out: Optional[Path], base: RunConfig, arm: Arm, seed: int, suffix: str = "",
            task: Optional[str] = None) -> Optional[Path]:
    """runs/TASK/ARM/seedN: keyed by the task, not the experiment, so experiments 1 and 2 share the free arm
    (`task` names it where the source kind alone does not, e.g. the factorial's cells)."""
    if out is None:
        return None
    if task is None:
        task = "random-kernels" if base.source.kind == "random" else f"chain-p{base.source.p}-q{base.source.q}"
    slug = "".join(c if c.isalnum() else "-" for c in arm.name).strip("-")
    return out / "runs" / task / f"{slug}{suffix}" / f"seed{seed}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class CircuitScores:
    """Layer 0's previous-token and layer 1's induction and same-token score of each finished run of an arm (the
    best head the layer has), with bootstrap intervals of their means over seeds and the uniform-attention
    chance levels."""

    step: int  # the update after which the runs were scored
    previous_token: tuple[float, ...]
    previous_token_mean: float
    previous_token_interval: tuple[float, float]
    induction: tuple[float, ...]
    induction_mean: float
    induction_interval: tuple[float, float]
    previous_token_chance: float
    induction_chance: float
    same_token: tuple[float, ...] = ()  # layer 1's same-token score (attention on keys with x_j = x_i)
    same_token_mean: float = math.nan
    same_token_interval: tuple[float, float] = (math.nan, math.nan)
    same_token_chance: float = math.nan


@dataclasses.dataclass(frozen=True)
class ArmResult:
    """One arm over seeds: each run's `dynamics.RunDynamics` (None: a failed run), the arm's
    `dynamics.ConditionDynamics`, final evaluation losses, and its comparison with the free arm (None for the
    free arm itself); on the random-kernel task the circuit scores at the end and, for experiment 2, after
    `release` updates; where asked (the factorial), the scores at every checkpoint step (`over_training`) and
    the circuits discovered at the end in a few seeds (`circuits`: (seed, `probes.CircuitGraph`) pairs)."""

    arm: Arm
    runs: tuple
    condition: dynamics.ConditionDynamics
    final_losses: tuple
    against_free: Optional[dynamics.Comparison]
    at_end: Optional[CircuitScores] = None
    at_release: Optional[CircuitScores] = None
    over_training: tuple = ()  # CircuitScores, one per checkpoint step
    circuits: tuple = ()  # (seed, probes.CircuitGraph)

    @property
    def escapes(self) -> tuple:
        """Each run's escape (`dynamics.StepInterval`; None: a failed run)."""
        return tuple(None if r is None else r.escape for r in self.runs)

    @property
    def summary(self) -> dynamics.Survival:
        """The survival of the escape over the arm's runs."""
        return self.condition.escape

    @property
    def failed(self) -> int:
        return sum(r is None for r in self.runs)


@dataclasses.dataclass(frozen=True)
class ExperimentResult:
    """One of the three experiments: its arms (the free arm first) at `steps`, with notes on failed runs."""

    name: str
    budget: Budget  # an `InterventionsBudget`, or the factorial's
    steps: int
    arms: tuple  # ArmResult, the free arm first
    seconds: float
    notes: tuple = ()


def _train_arm(base: RunConfig, arm: Arm, budget: Budget, out: Optional[Path],
               progress: bool, task: Optional[str] = None, **train: Any) -> list[TrainResult]:
    runs = [_with(base, arm, s, **train) for s in range(budget.seeds)]
    folders = None if out is None else [_folder(out, base, arm, s, "" if not train else "-prefix", task)
                                        for s in range(budget.seeds)]
    models_out = bool(train) or base.source.kind == "random"  # the random-kernel arms are probed at the end
    return train_many(runs, folders, progress=progress, models_out=models_out)


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
    base, arms = experiment_arms(name, budget)
    return run_arms(name, base, arms, budget, out_dir, progress=progress)


def run_arms(name: str, base: RunConfig, arms: list[Arm], budget: Budget, out_dir: "str | Path | None" = None, *,
             progress: bool = False, task: Optional[str] = None, over_training: bool = False,
             discovered: int = 0) -> ExperimentResult:
    """Train `arms` (the first is the reference, "free") over `budget.seeds` seeds from `base` and compare each
    with the first: the one arm loop of `run_experiment` and of the factorial (`experiments.factorial`).

    Args:
        name: the experiment's name (figure file names use it).
        base: the run every arm starts from (its seed is replaced).
        arms: the arms, the reference first.
        budget: seeds (and `release` for "reader-frozen").
        out_dir: where the run folders go (None: nothing is written).
        progress: a progress bar per arm.
        task: the run folders' key (runs/TASK/ARM/seedN; default from the source).
        over_training: also score every checkpoint step `base.train.n_checkpoints` saves
            (`circuit_scores_over_training`; needs `out_dir`).
        discovered: also discover the circuit of this many seeds per arm at the end (`discovered_circuits`).

    Returns:
        The arms' dynamics and comparisons (`ExperimentResult`)."""
    import time

    if over_training and (out_dir is None or base.train.n_checkpoints == 0):
        raise ValueError("over_training scores read the runs' checkpoints: it needs an out_dir and "
                         f"base.train.n_checkpoints > 0 (got out_dir={out_dir!r}, "
                         f"n_checkpoints={base.train.n_checkpoints})")

    out = None if out_dir is None else Path(out_dir)
    start = time.perf_counter()
    results: list[ArmResult] = []
    for arm in arms:
        trained = _train_arm(base, arm, budget, out, progress, task)
        runs = [None if r.failed else dynamics.from_metrics(r.metrics) for r in trained]
        at_end = circuit_scores_at_end(trained) if base.source.kind == "random" else None
        at_release = previous_token_at_release(base, arm, budget, out, progress) if name == "reader-frozen" else None
        results.append(arm_result(arm, runs, [r.final.eval_loss for r in trained], results[0] if results else None,
                                  at_end=at_end, at_release=at_release,
                                  over_training=circuit_scores_over_training(trained) if over_training else (),
                                  circuits=discovered_circuits(trained, discovered) if discovered else ()))
    return ExperimentResult(name, budget, base.train.steps, tuple(results), time.perf_counter() - start,
                            _failure_notes(results))


def arm_result(arm: Arm, runs: list, final_losses: list, free: Optional[ArmResult], **scores: Any) -> ArmResult:
    """One arm's `ArmResult` from its runs' dynamics (None: a failed run): the arm's `dynamics.condition` and,
    unless it is the reference itself (`free` None), its `dynamics.compare` with the reference arm `free`; the
    one summary of an arm, after training (`run_arms`) and when results.json is read back (`arm_from_json`).

    Args:
        arm: the arm.
        runs: each seed's `dynamics.RunDynamics`, None for a failed run.
        final_losses: each seed's final evaluation loss.
        free: the reference arm's result (None: this arm is the reference).
        scores: `ArmResult`'s score fields (at_end, at_release, over_training, circuits).

    Returns:
        The `ArmResult`."""
    known = [r for r in runs if r is not None]
    versus = None if free is None else dynamics.compare([r for r in free.runs if r is not None], known)
    return ArmResult(arm, tuple(runs), dynamics.condition(known), tuple(final_losses), versus, **scores)


def _failure_notes(arms: list[ArmResult]) -> tuple[str, ...]:
    return tuple(f"{a.arm.name}: {a.failed} runs failed (left out)" for a in arms if a.failed)


def previous_token_at_release(base: RunConfig, arm: Arm, budget: InterventionsBudget,
                              out: Optional[Path], progress: bool = False) -> CircuitScores:
    """The circuit scores after `budget.release` updates (layer 0's previous-token score is the question).

    With a constant learning rate the first `release` steps of a run are a run of `release` steps (same data
    streams), so those short runs are that prefix: trained again here with their models kept, not read from
    checkpoints, and scored by `circuit_scores_at_end`."""
    return circuit_scores_at_end(_train_arm(base, arm, budget, out, progress, steps=budget.release))


def circuit_scores_at_end(trained: list[TrainResult]) -> CircuitScores:
    """Layer 0's previous-token and layer 1's induction and same-token score of each finished run (two-layer
    random-kernel arms) at its last update: `circuit_scores_at` of the runs' final models."""
    return circuit_scores_at(trained)


def circuit_scores_at(trained: list[TrainResult], step: Optional[int] = None) -> CircuitScores:
    """Layer 0's previous-token and layer 1's induction and same-token score of each finished run (two-layer
    random-kernel arms) after `step` updates, measured under the interventions active at that update
    (`clamps.applied`: a clamped layer is probed clamped), with bootstrap intervals of their means and the
    uniform-attention chance levels. Every step probes run k on the same 64 sequences (seed 10_000 + k).

    Args:
        trained: the arm's runs, seed order (failed runs are left out).
        step: the update to score at (None: the end, each run's own final model; else each run's checkpoint of
            that step, read from its run folder).

    Returns:
        The scores (`CircuitScores`, `step` the update scored)."""
    from markov_interp import clamps, probes

    previous, induction, same, chance = [], [], [], (math.nan, math.nan, math.nan)
    end = trained[0].config.train.steps if trained else 0
    for seed, result in enumerate(trained):
        if result.failed or result.model is None:
            continue
        run, model = result.config, result.model if step is None else _checkpoint_model(result, step)
        batch = probes.sample_batch(run.source.build(), n_sequences=64, seq_len=probes.probe_length(model),
                                    seed=10_000 + seed)  # the training length: the one probe-length rule
        with clamps.applied(model, run.train.interventions, (end if step is None else step) - 1):
            att = probes.attention_scores(model, batch)  # the probe moves the CPU batch to the model's device
        heads = heads_per_layer(model)  # the [layer, head] grids hold NaN for absent heads
        previous.append(float(att.previous_token[0, : heads[0]].max()))
        induction.append(float(att.induction[1, : heads[1]].max()))
        same.append(float(att.same_token[1, : heads[1]].max()))
        chance = (float(att.previous_token_chance), float(att.induction_chance), float(att.same_token_chance))
    return CircuitScores(step=end if step is None else step, previous_token=tuple(previous),
                         previous_token_mean=_shared.mean(previous),
                         previous_token_interval=_shared.mean_interval(previous),
                         induction=tuple(induction), induction_mean=_shared.mean(induction),
                         induction_interval=_shared.mean_interval(induction), previous_token_chance=chance[0],
                         induction_chance=chance[1], same_token=tuple(same), same_token_mean=_shared.mean(same),
                         same_token_interval=_shared.mean_interval(same), same_token_chance=chance[2])


def _checkpoint_model(result: TrainResult, step: int) -> Any:
    """The run's model as of its checkpoint of `step`, on the final model's device, probed at the training
    length (as `TrainResult` sets it)."""
    if result.out_dir is None:
        raise ValueError(f"scores at step {step} read checkpoints, but seed {result.config.train.seed}'s run has no "
                         "run folder (train with an out_dir)")
    path, _ = runs.checkpoint_paths(result.out_dir, step)
    if not path.exists():
        raise ValueError(f"{result.out_dir} has no checkpoint of step {step}; it has "
                         f"{[s for s, _ in runs.list_checkpoints(result.out_dir)]}")
    return runs.load_model(path, device=next(result.model.parameters()).device, expect=result.config.model)


def circuit_scores_over_training(trained: list[TrainResult]) -> tuple[CircuitScores, ...]:
    """`circuit_scores_at` every checkpoint step the runs share (`TrainConfig.n_checkpoints`, log-spaced, the
    last step included), in step order; () when the runs keep no checkpoints.

    Args:
        trained: the arm's runs, seed order, trained into run folders.

    Returns:
        One `CircuitScores` per checkpoint step."""
    finished = [r for r in trained if not r.failed and r.model is not None and r.out_dir is not None]
    if not finished:
        return ()
    steps = set.intersection(*({s for s, _ in runs.list_checkpoints(r.out_dir)} for r in finished))
    return tuple(circuit_scores_at(trained, step) for step in sorted(steps))


def discovered_circuits(trained: list[TrainResult], n: int) -> tuple:
    """`probes.discover_circuit` (resample corruption, 32 fresh sequences, seed 10_000 + k) of the first `n`
    finished runs at their last update, under the interventions active then (a clamped layer stays clamped,
    so edges into its queries and keys carry nothing).

    Args:
        trained: the arm's runs, seed order.
        n: how many runs to read (the discovery costs seconds a model).

    Returns:
        (seed, `probes.CircuitGraph`) pairs."""
    from markov_interp import clamps, probes

    found = []
    for seed, result in enumerate(trained):
        if len(found) == n:
            break
        if result.failed or result.model is None:
            continue
        run = result.config
        with clamps.applied(result.model, run.train.interventions, run.train.steps - 1):
            graph = probes.discover_circuit(result.model, run.source.build(), n_sequences=32, seed=10_000 + seed)
        found.append((seed, graph))
    return tuple(found)


# ------------------------------------------------------------------------------------------------ output
def survival_figure(results: list[ExperimentResult]) -> Any:
    """The survival of the escape of every arm, one panel per experiment."""
    from markov_interp.experiments import _figures_dynamics as figures

    panels = {_title(r): {a.arm.name: a.summary for a in r.arms} for r in results}
    return figures.escape_survival_figure(panels, budget={_title(r): r.steps for r in results})


def dynamics_figures(result: ExperimentResult) -> dict[str, Any]:
    """One experiment's median excess curves (bands across seeds) and the survival at every line, by file name
    ("curves-NAME.png", "crossings-NAME.png")."""
    from markov_interp.experiments import _figures_dynamics as figures

    return {f"curves-{result.name}.png": figures.excess_curves_figure(
                {a.arm.name: a.condition.curve for a in result.arms}, title=_title(result)),
            f"crossings-{result.name}.png": figures.crossing_survival_figure(
                {a.arm.name: a.condition.survival for a in result.arms}, budget=result.steps, title=_title(result))}


def _title(result: ExperimentResult) -> str:
    return f"{result.name} ({result.budget.seeds} seeds, {result.steps} steps)"


def _escape_table(r: ExperimentResult) -> Table:
    """Per arm: escaped k/n, the median escape [interval], censored [Wilson], the shift from free, log-rank."""
    rows = []
    for a in r.arms:
        s = a.summary
        lo, hi = dynamics.wilson_interval(s.n_censored, s.n)
        shift, p = "—", "—"
        if a.against_free is not None:
            c = a.against_free.escape
            shift, p = c.difference_text(), "—" if c.p_value is None else f"{c.p_value:.2g}"
        losses = [x for x in a.final_losses if x is not None and math.isfinite(x)]
        rows.append((a.arm.name, f"{s.n - s.n_censored}/{s.n}", s.median().describe(),
                     f"{s.n_censored}/{s.n} [{lo:.2f}, {hi:.2f}]", shift, p, f"{_shared.mean(losses):.4f}"))
    return Table(("arm", "escaped", "median escape [95% CI]", "censored [95% CI]",
                  "vs free: median shift [95% CI]", "log-rank p", "final eval loss (mean)"), rows)


def _lines_table(r: ExperimentResult) -> Table:
    """Per arm and line: the median crossing, and for an intervention its ratio to free [bootstrap CI]; the
    area between the median excess curves (intervention - free)."""
    fractions = list(r.arms[0].condition.survival)
    rows = []
    for a in r.arms:
        cells = []
        for f in fractions:
            text = str(a.condition.survival[f].median().estimate)
            c = a.against_free.fractions.get(f) if a.against_free else None
            if c is not None:
                text += f"; x free: {c.ratio_text()}"
            cells.append(text)
        area = "—"
        if a.against_free is not None and a.against_free.area is not None:
            ar = a.against_free.area
            area = f"{ar.text()} (steps {ar.span[0]}-{ar.span[1]})"
        rows.append((a.arm.name, *cells, area))
    return Table(("arm", *(f"{f:g} left" for f in fractions), "area vs free [95% CI]"), rows)


def _scores_line(arm: str, scores: CircuitScores, what: str) -> str:
    lo, hi = scores.previous_token_interval
    text = (f"{arm}, {what}: layer 0 previous-token {scores.previous_token_mean:.3f} [{lo:.3f}, {hi:.3f}]")
    if what.startswith("at step"):
        ilo, ihi = scores.induction_interval
        text += f", layer 1 induction {scores.induction_mean:.3f} [{ilo:.3f}, {ihi:.3f}]"
    return (text + f" over {len(scores.previous_token)} seeds (uniform attention: {scores.previous_token_chance:.3f}"
            + (f" and {scores.induction_chance:.3f})" if what.startswith("at step") else ")"))


def _score_lines(r: ExperimentResult) -> str:
    lines = []
    for a in r.arms:
        if a.at_release is not None:
            lines.append(_scores_line(a.arm.name, a.at_release, f"after {a.at_release.step} updates"))
        if a.at_end is not None:
            lines.append(_scores_line(a.arm.name, a.at_end, f"at step {r.steps} (under its interventions, if any)"))
    return "\n\n".join(lines + list(r.notes))


_CROSSINGS = ("Crossings of every line (fraction of the plateau excess left): the median crossing's grid interval; for "
              "an intervention its ratio to free with a bootstrap interval; area = the integral of (median excess "
              "curve - free's) over steps.")


def experiment_sections(r: ExperimentResult) -> list[Section]:
    """Two tables per experiment: per arm escaped k/n, the median escape [95% CI], censored fraction [Wilson
    CI], the median shift from the free arm [bootstrap CI], log-rank p and final loss; then the median crossing
    of every line with its ratio to free [bootstrap CI] and the area between the median excess curves, and the
    circuit scores."""
    return [Section(_title(r), table=_escape_table(r)),
            Section(text=_CROSSINGS, table=_lines_table(r), after=_score_lines(r),
                    figures=(f"curves-{r.name}.png", f"crossings-{r.name}.png"))]


def summary_markdown(results: list[ExperimentResult]) -> str:
    """The sections of `results` as markdown (what summary.md holds after its header)."""
    return "\n\n".join(s.markdown() for r in results for s in experiment_sections(r)) + "\n"


def _comparison_json(c: dynamics.Comparison) -> dict:
    """The comparison with the free arm: per line the medians' shift and ratio with intervals, log-rank p."""
    out = {"median_shift": c.escape.difference, "median_shift_interval": c.escape.difference_interval,
           "logrank_p": c.escape.p_value, "lines": {
               repr(f): {"difference": x.difference, "difference_interval": x.difference_interval, "ratio": x.ratio,
                         "ratio_interval": x.ratio_interval, "logrank_p": x.p_value} for f, x in c.fractions.items()}}
    if c.area is not None:
        out["area"] = {"span": list(c.area.span), "area": c.area.area, "interval": c.area.interval}
    return out


def arm_json(a: ArmResult) -> dict:
    """One arm's results.json entry: every seed's escape, crossings, excess curve and final loss, its comparison
    with the free arm and its circuit scores."""
    median = a.summary.median()
    return {"interventions": list(a.arm.interventions), **({"model": dict(a.arm.model)} if a.arm.model else {}),
            "escape_steps": [e.step if e else None for e in a.escapes],
            "censored": [e.censored if e else None for e in a.escapes],
            "final_eval_loss": list(a.final_losses),
            "median": median.by,
            "median_interval": None if median.interval is None else [median.interval.after, median.interval.by],
            "censored_interval": list(dynamics.wilson_interval(a.summary.n_censored, a.summary.n)),
            # every run's crossings of every line and its excess curve (paired losses at each evaluation)
            "crossings": [None if r is None else r.to_json() for r in a.runs],
            "curves": [None if r is None else {"steps": list(r.curve.steps), "excess": list(r.curve.excess),
                                               "plateau_excess": list(r.curve.plateau_excess)} for r in a.runs],
            **(_comparison_json(a.against_free) if a.against_free else {}),
            "at_end": None if a.at_end is None else dataclasses.asdict(a.at_end),
            "at_release": None if a.at_release is None else dataclasses.asdict(a.at_release),
            **({"over_training": [dataclasses.asdict(x) for x in a.over_training]} if a.over_training else {}),
            **({"circuits": [{"run_seed": seed, **graph.to_dict()} for seed, graph in a.circuits]}
               if a.circuits else {})}


def _scores_from_json(data: Optional[Mapping]) -> Optional[CircuitScores]:
    if data is None:
        return None
    return CircuitScores(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


def _run_from_json(curve: Optional[Mapping]) -> Optional[dynamics.RunDynamics]:
    """A run's excess curve from results.json, its crossings recomputed by the current rule (None: failed)."""
    if curve is None:
        return None
    return dynamics.run_dynamics(dynamics.ExcessCurve(tuple(int(s) for s in curve["steps"]),
                                                      tuple(curve["excess"]), tuple(curve["plateau_excess"])))


def arm_from_json(name: str, data: Mapping, free: Optional[ArmResult]) -> ArmResult:
    """One arm of results.json (`arm_json`) read back: every seed's excess curve, its crossings and the arm's
    statistics and comparison with `free` recomputed by the current `dynamics`; the circuit scores as recorded.
    Discovered circuits are not read back (results.json keeps them as dicts: read those directly).

    Args:
        name: the arm's name (its key in results.json).
        data: its entry.
        free: the reference arm, read back first (None: this is it).

    Returns:
        The `ArmResult`. ValueError for an entry written before results.json kept every seed's curve."""
    if "curves" not in data:
        raise ValueError(f"arm {name!r}: results.json holds no excess curves (written before they were kept); "
                         "read its escape steps with `dynamics.recorded_escape`")
    arm = Arm(name, tuple(data["interventions"]), tuple(data.get("model", {}).items()))
    return arm_result(arm, [_run_from_json(c) for c in data["curves"]], data["final_eval_loss"], free,
                      at_end=_scores_from_json(data.get("at_end")),
                      at_release=_scores_from_json(data.get("at_release")),
                      over_training=tuple(_scores_from_json(x) for x in data.get("over_training", ())))


def experiment_from_json(name: str, data: Mapping, budget: Budget) -> ExperimentResult:
    """One experiment (or factorial cell) of results.json read back (`arm_from_json` for each arm, the first
    the reference), at `budget` (the file's, `experiments.load`)."""
    arms: list[ArmResult] = []
    for arm_name, entry in data["arms"].items():
        arms.append(arm_from_json(arm_name, entry, arms[0] if arms else None))
    return ExperimentResult(name, budget, int(data["steps"]), tuple(arms), float(data["seconds"]),
                            _failure_notes(arms))


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
