"""Interventions during training, as experiments: does a circuit form sooner, later or not at all when part of
the model is clamped or frozen while it learns?

Probing a trained model tells *what* circuit it has; these ask *how it forms* (Singh et al. 2024, "What needs to
go right for an induction head", clamp activations during training; Bietti et al. 2023 freeze parameters).
Each experiment trains every arm over the same seeds (one stack per arm, `training.train_many`) and answers
with escape-time distributions (`dynamics`): the first evaluation after which the model's excess loss over
the true predictor stays below half the plateau's, censored at the budget.

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
returns an `ExperimentResult` (per arm: escape times, summaries, comparisons with the free arm, final losses);
`survival_figure` draws its Kaplan–Meier curves. `python -m markov_interp.experiments --out DIR` runs all
three and writes results.json, summary.md and survival.png (what docs/reproduction/interventions/ holds).
"""

import argparse
import dataclasses
import json
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from markov_interp import dynamics
from markov_interp._io import atomic_path, atomic_write
from markov_interp.data import SourceConfig
from markov_interp.models import preset
from markov_interp.training import RunConfig, TrainConfig

__all__ = ["ExperimentBudget", "QUICK", "FULL", "EXPERIMENTS", "Arm", "ArmResult", "ExperimentResult",
           "experiment_arms", "run_experiment", "previous_token_at_release", "circuit_scores_at_end",
           "survival_figure", "summary_markdown", "to_json", "main"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExperimentBudget:
    """Seeds, steps and sequence lengths of the three experiments (`cuts` says what a small budget leaves out)."""

    name: str
    seeds: int = 16
    # experiments 1 and 2 (constant lr: a shorter run is a prefix of a longer one); free runs escape at steps
    # 160-280 (16 seeds, CPU)
    random_steps: int = 500
    release: int = 150  # experiment 2: layer 1 is frozen for the first `release` updates
    chain_steps: int = 600  # experiment 3 (one-cycle schedule, as the paper)
    chain_seq_len: int = 128
    eval_every: int = 10
    eval_batches: int = 4
    device: str = "cpu"
    cuts: str = ""

    def __post_init__(self) -> None:
        for name in ("seeds", "random_steps", "release", "chain_steps", "chain_seq_len", "eval_every",
                     "eval_batches"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.seeds < 2:
            raise ValueError(f"seeds must be at least 2 (a distribution over seeds), got {self.seeds}")
        if self.release >= self.random_steps:
            raise ValueError(f"release ({self.release}) must come before the end of training "
                             f"(random_steps = {self.random_steps})")


FULL = ExperimentBudget(name="full")
QUICK = ExperimentBudget(name="quick", seeds=4, random_steps=60, release=20, chain_steps=60, chain_seq_len=32,
                         eval_every=10, eval_batches=2,
                         cuts="4 seeds, 60 steps: a smoke test of the code path; its numbers show nothing")
EXPERIMENTS = ("previous-token-clamp", "reader-frozen", "attention-in-one-layer")
_PATTERN0 = "blocks.0.attn.hook_pattern"


@dataclasses.dataclass(frozen=True)
class Arm:
    """One condition of an experiment: a name and the interventions every seed trains under."""

    name: str
    interventions: tuple = ()


def _random_kernel_base(budget: ExperimentBudget, steps: int) -> RunConfig:
    return RunConfig(
        source=SourceConfig(kind="random", vocab=3, alpha=1.0),
        model=preset("attn-only-2layer", n_ctx=32, d_vocab=3),
        train=TrainConfig(steps=steps, seq_len=32, batch_size=64, lr=1e-2, schedule="constant",
                          eval_every=budget.eval_every, eval_batches=budget.eval_batches, log_every=budget.eval_every,
                          n_checkpoints=0, device=budget.device))


def _chain_base(budget: ExperimentBudget) -> RunConfig:
    return RunConfig(
        source=SourceConfig(kind="binary", p=0.5, q=0.8),
        model=preset("paper-1layer", n_ctx=budget.chain_seq_len),
        train=TrainConfig(steps=budget.chain_steps, seq_len=budget.chain_seq_len, batch_size=16,
                          eval_every=budget.eval_every, eval_batches=budget.eval_batches, log_every=budget.eval_every,
                          n_checkpoints=0, device=budget.device))


def experiment_arms(name: str, budget: ExperimentBudget) -> tuple[RunConfig, list[Arm]]:
    """The base run (seed 0, no intervention) and the arms of experiment `name`; the first arm is "free"."""
    free = Arm("free")
    if name == "previous-token-clamp":
        return _random_kernel_base(budget, budget.random_steps), [
            free, Arm("layer 0 clamped to previous-token", ({"clamp": _PATTERN0, "value": "previous_token"},)),
            Arm(f"layer 0 clamped to previous-token until {budget.release}",
                ({"clamp": _PATTERN0, "value": "previous_token", "end": budget.release},))]
    if name == "reader-frozen":
        return _random_kernel_base(budget, budget.random_steps), [
            free, Arm(f"layer 1 frozen until {budget.release}", ({"freeze": "blocks.1.*", "end": budget.release},))]
    if name == "attention-in-one-layer":
        return _chain_base(budget), [
            free, Arm("pattern clamped to uniform", ({"clamp": _PATTERN0, "value": "uniform"},)),
            Arm("attention frozen at init", ({"freeze": "blocks.0.attn.*"},))]
    raise ValueError(f"unknown experiment {name!r}; the experiments are {list(EXPERIMENTS)}")


def _with(base: RunConfig, arm: Arm, seed: int, **train: Any) -> RunConfig:
    return dataclasses.replace(base, train=dataclasses.replace(base.train, seed=seed,
                                                               interventions=arm.interventions, **train))


def _folder(out: Optional[Path], base: RunConfig, arm: Arm, seed: int, suffix: str = "") -> Optional[Path]:
    """runs/TASK/ARM/seedN: keyed by the task, not the experiment, so experiments 1 and 2 share the free arm."""
    if out is None:
        return None
    task = "random-kernels" if base.source.kind == "random" else f"chain-p{base.source.p}-q{base.source.q}"
    slug = "".join(c if c.isalnum() else "-" for c in arm.name).strip("-")
    return out / "runs" / task / f"{slug}{suffix}" / f"seed{seed}"


@dataclasses.dataclass(frozen=True)
class ArmResult:
    """One arm over seeds: escape times (None: a failed run), their summary, final evaluation losses, and its
    comparison with the free arm (None for the free arm itself)."""

    arm: Arm
    escapes: tuple
    summary: dynamics.EscapeSummary
    final_losses: tuple
    against_free: Optional[dynamics.EscapeComparison]
    extra: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class ExperimentResult:
    name: str
    budget: ExperimentBudget
    steps: int
    arms: tuple  # ArmResult, the free arm first
    seconds: float
    notes: tuple = ()


def _train_arm(base: RunConfig, arm: Arm, budget: ExperimentBudget, out: Optional[Path],
               progress: bool, **train: Any) -> list:
    from markov_interp import stacked_training

    runs = [_with(base, arm, s, **train) for s in range(budget.seeds)]
    folders = None if out is None else [_folder(out, base, arm, s, "" if not train else "-prefix")
                                        for s in range(budget.seeds)]
    models_out = bool(train) or base.source.kind == "random"  # the random-kernel arms are probed at the end
    return stacked_training.train_many(runs, folders, progress=progress, models_out=models_out)


def run_experiment(name: str, budget: ExperimentBudget = FULL, out_dir: "str | Path | None" = None, *,
                   progress: bool = False) -> ExperimentResult:
    """Train every arm of experiment `name` over `budget.seeds` seeds (run folders under `out_dir/runs`, so a
    rerun skips what is finished) and compare each arm's escape times with the free arm's."""
    base, arms = experiment_arms(name, budget)
    out = None if out_dir is None else Path(out_dir)
    start = time.perf_counter()
    results, notes = [], []
    free_escapes = None
    for arm in arms:
        trained = _train_arm(base, arm, budget, out, progress)
        escapes = [None if r.failed else dynamics.escape_from_metrics(r.metrics) for r in trained]
        known = [e for e in escapes if e is not None]
        summary = dynamics.summarise(known, budget=base.train.steps)
        versus = None if free_escapes is None else dynamics.compare(free_escapes, known, budget=base.train.steps)
        free_escapes = known if free_escapes is None else free_escapes
        extra = {}
        if base.source.kind == "random":
            extra["at_end"] = circuit_scores_at_end(trained)
        if name == "reader-frozen":
            extra.update(previous_token_at_release(base, arm, budget, out, progress))
        results.append(ArmResult(arm, tuple(escapes), summary, tuple(r.final.eval_loss for r in trained), versus,
                                 extra))
        if any(e is None for e in escapes):
            notes.append(f"{arm.name}: {sum(e is None for e in escapes)} runs failed (left out)")
    return ExperimentResult(name, budget, base.train.steps, tuple(results), time.perf_counter() - start,
                            tuple(notes))


def previous_token_at_release(base: RunConfig, arm: Arm, budget: ExperimentBudget,
                              out: Optional[Path], progress: bool = False) -> dict:
    """Layer 0's previous-token score after `budget.release` updates, per seed, as {"previous_token": [...],
    "mean": m, "interval": (lo, hi)} (a bootstrap interval over seeds). With a constant learning rate the first
    `release` steps of a run are a run of `release` steps (same data streams), so those short runs are that
    prefix: trained again here with their models kept, not read from checkpoints, and scored by
    `circuit_scores_at_end`."""
    trained = _train_arm(base, arm, budget, out, progress, steps=budget.release)
    scores = circuit_scores_at_end(trained)
    return {"previous_token": scores["previous_token"], "mean": scores["previous_token_mean"],
            "interval": scores["previous_token_interval"],
            "chance": scores["chance"].get("previous_token", math.nan), "step": budget.release}


def circuit_scores_at_end(trained: list) -> dict:
    """Layer 0's previous-token and layer 1's induction score of each finished run (two-layer random-kernel
    arms), measured under the interventions active at its last update (`intervene.applied`: a clamped layer is
    probed clamped), with bootstrap intervals of their means and the uniform-attention chance levels."""
    from markov_interp import intervene, probes

    previous, induction, chance = [], [], {}
    for seed, result in enumerate(trained):
        if result.failed or result.model is None:
            continue
        run = result.config
        batch = probes.sample_batch(run.source.build(), n_sequences=64, seq_len=probes.probe_length(result.model),
                                    seed=10_000 + seed)  # the training length: the one probe-length rule
        with intervene.applied(result.model, run.train.interventions, run.train.steps - 1):
            _, cache = result.model.run_with_cache(batch.tokens)
        att = probes.attention_scores(result.model, batch.tokens, cache=cache)
        previous.append(float(att.previous_token[0].max()))
        induction.append(float(att.induction[1].max()))
        chance = {"previous_token": float(att.previous_token_chance), "induction": float(att.induction_chance)}
    return {"previous_token": previous, "previous_token_mean": _mean(previous),
            "previous_token_interval": _mean_interval(previous), "induction": induction,
            "induction_mean": _mean(induction), "induction_interval": _mean_interval(induction), "chance": chance}


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else math.nan


def _mean_interval(values: list[float], confidence: float = 0.95, n_boot: int = 2000) -> tuple[float, float]:
    """Percentile bootstrap interval for the mean of `values` over seeds (fixed resamples; nan below two)."""
    import random

    if len(values) < 2:
        return math.nan, math.nan
    rng = random.Random(0)
    means = sorted(statistics.fmean(rng.choices(values, k=len(values))) for _ in range(n_boot))
    tail = (1 - confidence) / 2
    return means[math.floor(tail * (n_boot - 1))], means[math.ceil((1 - tail) * (n_boot - 1))]


# ------------------------------------------------------------------------------------------------ output
def survival_figure(results: list[ExperimentResult]) -> Any:
    """Kaplan–Meier curves of every arm, one panel per experiment."""
    from markov_interp.report import figures

    panels = {_title(r): {a.arm.name: a.summary.curve for a in r.arms} for r in results}
    return figures.escape_survival_figure(panels, budget={_title(r): r.steps for r in results})


def _title(result: ExperimentResult) -> str:
    return f"{result.name} ({result.budget.seeds} seeds, {result.steps} steps)"


def _step(x: Optional[int], budget: int) -> str:
    return f">{budget}" if x is None else str(x)


def summary_markdown(results: list[ExperimentResult], *, header: str = "") -> str:
    """One table per experiment: per arm escaped k/n, median escape [95% CI], censored fraction [Wilson CI],
    the median difference from the free arm [bootstrap CI] and the log-rank p-value, final loss."""
    lines = [header] if header else []
    for r in results:
        lines += ["", f"## {_title(r)}", "",
                  "| arm | escaped | median escape [95% CI] | censored [95% CI] | vs free: median shift [95% CI] "
                  "| log-rank p | final eval loss (mean) |", "|---|---|---|---|---|---|---|"]
        for a in r.arms:
            s = a.summary
            lo, hi = s.censored_interval
            shift, p = "—", "—"
            if a.against_free is not None:
                c = a.against_free
                fmt = (lambda x: "?" if x is None else f"{x:+d}")
                shift = f"{fmt(c.median_difference)} [{fmt(c.difference_interval[0])}, {fmt(c.difference_interval[1])}]"
                p = f"{c.p_value:.2g}"
            losses = [x for x in a.final_losses if x is not None and math.isfinite(x)]
            lines.append(f"| {a.arm.name} | {s.n - s.n_censored}/{s.n} | {_step(s.median, r.steps)} "
                         f"[{_step(s.median_interval[0], r.steps)}, {_step(s.median_interval[1], r.steps)}] | "
                         f"{s.n_censored}/{s.n} [{lo:.2f}, {hi:.2f}] | {shift} | {p} | "
                         f"{statistics.fmean(losses):.4f} |")
        for a in r.arms:
            e = a.extra
            if "step" in e:
                lines.append(f"\n{a.arm.name}: layer 0's previous-token score after {e['step']} updates: mean "
                             f"{e['mean']:.3f} [{e['interval'][0]:.3f}, {e['interval'][1]:.3f}] over "
                             f"{len(e['previous_token'])} seeds (uniform attention: {e['chance']:.3f})")
            if "at_end" in e:
                end = e["at_end"]
                lines.append(f"\n{a.arm.name}, at step {r.steps} (under its interventions, if any): layer 0 "
                             f"previous-token "
                             f"{end['previous_token_mean']:.3f} [{end['previous_token_interval'][0]:.3f}, "
                             f"{end['previous_token_interval'][1]:.3f}], layer 1 induction {end['induction_mean']:.3f} "
                             f"[{end['induction_interval'][0]:.3f}, {end['induction_interval'][1]:.3f}] (uniform "
                             f"attention: {end['chance'].get('previous_token', math.nan):.3f} and "
                             f"{end['chance'].get('induction', math.nan):.3f})")
        lines += [f"\n{n}" for n in r.notes]
    return "\n".join(lines) + "\n"


def to_json(results: list[ExperimentResult]) -> dict:
    """Every seed's escape step, censoring and final loss, per arm and experiment (what results.json holds)."""
    out = {}
    for r in results:
        out[r.name] = {"steps": r.steps, "seconds": round(r.seconds, 1), "arms": {
            a.arm.name: {"interventions": list(a.arm.interventions),
                         "escape_steps": [e.step if e else None for e in a.escapes],
                         "censored": [e.censored if e else None for e in a.escapes],
                         "final_eval_loss": list(a.final_losses),
                         "median": a.summary.median, "median_interval": list(a.summary.median_interval),
                         "censored_interval": list(a.summary.censored_interval),
                         **({"median_shift": a.against_free.median_difference,
                             "median_shift_interval": list(a.against_free.difference_interval),
                             "logrank_p": a.against_free.p_value} if a.against_free else {}),
                         **a.extra} for a in r.arms}}
    return out


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/interventions", help="run folders, results.json, summary.md, "
                        "survival.png")
    parser.add_argument("--quick", action="store_true", help="tiny budget: a smoke test of the code path")
    parser.add_argument("--experiments", default=",".join(EXPERIMENTS))
    parser.add_argument("--seeds", type=int, default=None)
    parser.add_argument("--device", default=None)
    for field in ("random_steps", "release", "chain_steps"):
        parser.add_argument("--" + field.replace("_", "-"), type=int, default=None,
                            help=f"override the budget's {field}")
    args = parser.parse_args(argv)
    budget = QUICK if args.quick else FULL
    changes = {f: getattr(args, f) for f in ("seeds", "device", "random_steps", "release", "chain_steps")
               if getattr(args, f) is not None}
    if changes:
        budget = dataclasses.replace(budget, **changes)
    out = Path(args.out)
    results = []
    for name in args.experiments.split(","):
        results.append(run_experiment(name, budget, out, progress=sys.stderr.isatty()))
        print(f"{name}: {results[-1].seconds:.0f} s", file=sys.stderr)
    import torch

    header = (f"# Interventions during training ({budget.name})\n\nMade by `python -m markov_interp.experiments "
              f"{' '.join(argv if argv is not None else sys.argv[1:])}` on {platform.machine()}, device "
              f"{budget.device}, torch {torch.__version__}, fp32; {budget.seeds} seeds per arm"
              + (f". Cuts: {budget.cuts}" if budget.cuts else "") + ". Escape step = first evaluation after "
              "which the model's excess loss over the true predictor stays below half the plateau's (the in-context "
              "unigram estimator's for random kernels, the stationary law's for the fixed chain), censored at "
              "the budget; evaluations every " + str(budget.eval_every) + " steps. Intervals are 95%: "
              "Kaplan-Meier median "
              "(log-log band), censored fraction (Wilson), median shift against the free arm (bootstrap over "
              "seeds; ?: beyond the budget), mean scores (bootstrap). Attention scores are measured on 64 fresh "
              "sequences with the arm's clamps applied (`intervene.applied`).")
    markdown = summary_markdown(results, header=header)
    atomic_write(out / "summary.md", markdown)
    atomic_write(out / "results.json", json.dumps(to_json(results), indent=1))
    with atomic_path(out / "survival.png") as tmp:
        survival_figure(results).savefig(tmp, dpi=110, bbox_inches="tight", format="png")
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
