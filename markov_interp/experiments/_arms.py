"""The arm loop of the experiments that compare training conditions over the same seeds (`interventions`,
`factorial`): every arm trained from one base run, each run's dynamics, the arm's survival and its comparison with
the first arm ("free"), circuit scores, and the tables, figures and results.json entries of one such comparison.

An arm is what changes (interventions, model fields) and what else to measure (`Arm.score_at_release`); the loop
asks the source, not its kind, whether the runs are on the in-context task (`SourceConfig.in_context`: their
models are kept and their circuits scored at the end). No experiment imports another: both import this module.
"""

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

from markov_interp import dynamics, runs
from markov_interp.experiments import Budget, Section, Table, _shared
from markov_interp.models import heads_per_layer
from markov_interp.runs import RunConfig
from markov_interp.training import TrainResult, train_many

__all__ = ["Arm", "CircuitScores", "ArmResult", "ExperimentResult", "run_arms", "arm_result",
           "previous_token_at_release", "circuit_scores_at_end", "circuit_scores_at", "circuit_scores_over_training",
           "discovered_circuits", "dynamics_figures", "experiment_sections", "arm_json", "arm_from_json",
           "experiment_from_json"]


@dataclasses.dataclass(frozen=True)
class Arm:
    """One condition of an experiment: a name, the interventions every seed trains under, changes to the model
    config (e.g. the head start `init_attention`) and, where asked, an update after which the arm's circuit is
    scored too (`score_at_release`: e.g. when a frozen layer is released; the prefix of the run up to it is
    trained again with its models kept, `previous_token_at_release`)."""

    name: str
    interventions: tuple = ()
    model: tuple = ()  # (field, value) pairs replaced in the base run's ModelConfig
    score_at_release: Optional[int] = None  # also score the circuit after this many updates (None: at the end only)



def _with(base: RunConfig, arm: Arm, seed: int, **train: Any) -> RunConfig:
    return dataclasses.replace(base, model=base.model.replace(**dict(arm.model)) if arm.model else base.model,
                               train=dataclasses.replace(base.train, seed=seed, interventions=arm.interventions,
                                                         **train))


def _folder(out: Optional[Path], task: str, arm: Arm, seed: int, suffix: str = "") -> Optional[Path]:
    """runs/TASK/ARM/seedN: keyed by the task, not the experiment, so experiments on one task share its free arm."""
    if out is None:
        return None
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
    """One comparison of arms (an interventions experiment, a factorial cell): its arms (the free arm first) at
    `steps`, with notes on failed runs."""

    name: str
    budget: Budget  # the experiment's (seeds per arm, and what the experiment reads of it)
    steps: int
    arms: tuple  # ArmResult, the free arm first
    seconds: float
    notes: tuple = ()

    @property
    def title(self) -> str:
        """Its name, seeds and steps, as its figures and summary sections are headed."""
        return f"{self.name} ({self.budget.seeds} seeds, {self.steps} steps)"


def _train_arm(base: RunConfig, arm: Arm, budget: Budget, out: Optional[Path], task: str,
               progress: bool, **train: Any) -> list[TrainResult]:
    configs = [_with(base, arm, s, **train) for s in range(budget.seeds)]
    folders = None if out is None else [_folder(out, task, arm, s, "" if not train else "-prefix")
                                        for s in range(budget.seeds)]
    models_out = bool(train) or base.source.in_context  # in-context arms are probed at the end
    return train_many(configs, folders, progress=progress, models_out=models_out)


def run_arms(name: str, base: RunConfig, arms: list[Arm], budget: Budget, out_dir: "str | Path | None" = None, *,
             task: str, progress: bool = False, over_training: bool = False, discovered: int = 0) -> ExperimentResult:
    """Train `arms` (the first is the reference, "free") over `budget.seeds` seeds from `base` and compare each
    with the first: the one arm loop of the interventions and of the factorial. On the in-context task
    (`base.source.in_context`) every arm's circuit is scored at its end (`circuit_scores_at_end`), and an arm with
    `score_at_release` also after that many updates.

    Args:
        name: the experiment's name (figure file names use it).
        base: the run every arm starts from (its seed is replaced).
        arms: the arms, the reference first.
        budget: seeds per arm.
        out_dir: where the run folders go (None: nothing is written).
        task: the run folders' key (out_dir/runs/TASK/ARM/seedN): experiments on one task share a key, so their
            common arms train once.
        progress: a progress bar per arm.
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
        trained = _train_arm(base, arm, budget, out, task, progress)
        curves = [None if r.failed else dynamics.from_metrics(r.metrics) for r in trained]
        at_end = circuit_scores_at_end(trained) if base.source.in_context else None
        at_release = (None if arm.score_at_release is None
                      else previous_token_at_release(base, arm, budget, out, task, progress))
        results.append(arm_result(arm, curves, [r.final.eval_loss for r in trained], results[0] if results else None,
                                  at_end=at_end, at_release=at_release,
                                  over_training=circuit_scores_over_training(trained) if over_training else (),
                                  circuits=discovered_circuits(trained, discovered) if discovered else ()))
    return ExperimentResult(name, budget, base.train.steps, tuple(results), time.perf_counter() - start,
                            _failure_notes(results))


def arm_result(arm: Arm, per_seed: list, final_losses: list, free: Optional[ArmResult], **scores: Any) -> ArmResult:
    """One arm's `ArmResult` from its runs' dynamics (None: a failed run): the arm's `dynamics.condition` and,
    unless it is the reference itself (`free` None), its `dynamics.compare` with the reference arm `free`; the
    one summary of an arm, after training (`run_arms`) and when results.json is read back (`arm_from_json`).

    Args:
        arm: the arm.
        per_seed: each seed's `dynamics.RunDynamics`, None for a failed run.
        final_losses: each seed's final evaluation loss.
        free: the reference arm's result (None: this arm is the reference).
        scores: `ArmResult`'s score fields (at_end, at_release, over_training, circuits).

    Returns:
        The `ArmResult`."""
    known = [r for r in per_seed if r is not None]
    versus = None if free is None else dynamics.compare([r for r in free.runs if r is not None], known)
    return ArmResult(arm, tuple(per_seed), dynamics.condition(known), tuple(final_losses), versus, **scores)


def _failure_notes(arms: list[ArmResult]) -> tuple[str, ...]:
    return tuple(f"{a.arm.name}: {a.failed} runs failed (left out)" for a in arms if a.failed)


def previous_token_at_release(base: RunConfig, arm: Arm, budget: Budget, out: Optional[Path], task: str,
                              progress: bool = False) -> CircuitScores:
    """The circuit scores after `arm.score_at_release` updates (layer 0's previous-token score is the question).

    With a constant learning rate the first `release` steps of a run are a run of `release` steps (same data
    streams), so those short runs are that prefix: trained again here with their models kept, not read from
    checkpoints, and scored by `circuit_scores_at_end`."""
    return circuit_scores_at_end(_train_arm(base, arm, budget, out, task, progress, steps=arm.score_at_release))


def circuit_scores_at_end(trained: list[TrainResult]) -> CircuitScores:
    """Layer 0's previous-token and layer 1's induction and same-token score of each finished run (two-layer
    in-context arms) at its last update: `circuit_scores_at` of the runs' final models."""
    return circuit_scores_at(trained)


def circuit_scores_at(trained: list[TrainResult], step: Optional[int] = None) -> CircuitScores:
    """Layer 0's previous-token and layer 1's induction and same-token score of each finished run (two-layer
    in-context arms) after `step` updates, measured under the interventions active at that update
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
def dynamics_figures(result: ExperimentResult) -> dict[str, Any]:
    """One experiment's median excess curves (bands across seeds) and the survival at every line, by file name
    ("curves-NAME.png", "crossings-NAME.png")."""
    from markov_interp.experiments import _figures_dynamics as figures

    return {f"curves-{result.name}.png": figures.excess_curves_figure(
                {a.arm.name: a.condition.curve for a in result.arms}, title=result.title),
            f"crossings-{result.name}.png": figures.crossing_survival_figure(
                {a.arm.name: a.condition.survival for a in result.arms}, budget=result.steps, title=result.title)}


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
    return [Section(r.title, table=_escape_table(r)),
            Section(text=_CROSSINGS, table=_lines_table(r), after=_score_lines(r),
                    figures=(f"curves-{r.name}.png", f"crossings-{r.name}.png"))]


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


