"""Training: the one loop. `train_many(runs)` trains compatible runs as one stack; `train(run)` is a stack of one.

Each step draws a fresh batch per run (`batches.DataStreams`: what the run draws alone, on its random stream:
"counter-1" for new runs, "torch-1" for folders trained before counter streams), runs the stacked
forward (`models.stack.stacked_forward`) with the clamps active at that step, one backward of the summed member
losses (members share no parameter, so each member's gradient is its own) and one elementwise optimiser step
(`models.optim.StackedOptimizer`: AdamW or SGD, per-member learning rate and weight decay). A member's numbers
never depend on the other members, so **the same run gives the same weights whatever the entry point**:
`train`, `train_many` with any companions, `markov-interp train` (with or without `--seeds`), sweeps and
`reproduce` (tested bit for bit on the CPU).

Runs share a stack when they share their shapes (architecture, vocab, n_ctx, seq_len, batch size, steps,
optimiser kind and hyper-parameters other than lr / weight decay, schedule, precision, evaluation and
checkpoint plan, interventions, device, random stream: `stack_key`); they may differ in seed, source parameters
of one kind and vocab, initialisation options, learning rate and weight decay.

**Run folders** (`markov_interp.runs`): each run writes config.json, metrics.jsonl, checkpoints/ and, when it
finishes, model.safetensors. While it trains it also keeps a resume point (resume/: a checkpoint's files, at most
one at rest, removed when the run ends) every `train.resume_every` steps (default: every 5 minutes; 0: none),
whatever `n_checkpoints` is. Re-running resumes from the newest checkpoint or resume point every member folder holds
and ends bit-identical to an uninterrupted run; a finished run is loaded, not retrained; a folder holding another
config is refused. Checkpoints hold the member's weights and, in the format of a torch optimiser's `state_dict()`,
its optimiser state (plus loss scaler, the data streams' place, pending losses and clamp means), which is also the
format of folders written before the one engine, so those resume too.

**Divergence.** A run whose training loss, gradient, evaluation loss or weights are not finite stops there: its
weights and optimiser state are frozen at their last finite values while the others go on, a metrics row
`{"step": s, "diverged": true, "reason": ...}` and status.json record it, no final weights are written (its
last finite checkpoint is kept), and `TrainResult.failed` says why; `train` raises `TrainingDiverged`, again at
once on any later call for that folder.

**Interventions** (`TrainConfig.interventions`, `markov_interp.clamps`): the update t -> t + 1 runs with the
freezes and clamps active at t, the evaluation at step t with the clamps active at t (running means are not
updated by evaluations). Running means are checkpointed per member; a resume is bit-identical.

**Loss scaling** (fp16): every member has its own GradScaler arithmetic (scale, growth tracker, skipped overflow
steps and so its own AdamW step count), checkpointed as a torch GradScaler's state dict.

**Compiled steps** (`TrainConfig.compile`): the step's loss, its backward, the evaluation's forward and the
optimiser update run compiled (`models.stack.compiled_losses`, `models.optim`), compiled once per shapes in a
process; on "counter-1" with kernel sources the training batch is drawn inside the compiled graph (its input is
the step tensor); equal to eager up to float rounding; steps with an active clamp run eagerly (docs/training.md).

**Captured steps** (`TrainConfig.capture="graph"`): after the first step of a process, each step is
`training.step.WholeStep` (sampling to update in one function of device tensors), one CUDA graph on CUDA; where it
cannot be, `TrainResult.engine` says why (docs/training.md#captured-steps).

**Host work**: nothing in a step reads a device value (on the CPU the update checks that every member is alive,
to skip restoring them); every member's batch comes from one sampling pass ("counter-1": the same operations
whatever the number of members; "torch-1": one draw per member from its own generator); losses accumulate on the
device and are read per log row; an evaluation computes theory's references once per distinct source for all its
members.
"""

import contextlib
import dataclasses
import json
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

import torch
from tqdm.auto import tqdm

from markov_interp._plan import Need, planned, size
from markov_interp._threads import one_thread_if_tiny
from markov_interp.clamps import ClampState, check_interventions, clamp_hooks, frozen_names
from markov_interp import theory
from markov_interp.sources import Source
from markov_interp.models import INIT_FIELDS, HookedModel, WeightsMetadata, shape_config, state_dict_for_save
from markov_interp.models.optim import StackedOptimizer
from markov_interp.models.reduction import CanonicalConstraint
from markov_interp.models.stack import Stack, build_stack, compiled_losses, stacked_losses
from markov_interp.theory import ReferenceLosses
from markov_interp import runs as run_folder  # (`runs` is a list of run configs here)
from markov_interp.training import plan, resume
from markov_interp.training.step import WholeStep, capture_problem, whole_step_problem
from markov_interp.training.batches import DataStreams, data_streams
from markov_interp.runs.config import PRECISIONS, RunConfig, TrainConfig, resolve_device
from markov_interp.training.results import FinalLosses, TrainResult
from markov_interp.runs import TrainingDiverged
from markov_interp.training.schedule import StepPlan, lr_at

__all__ = [
    "train",
    "train_many",
    "check_compatible",
    "stack_key",
    "evaluate",
    "evaluate_paired",
    "paired_row",
    "autocast",
    "PAIRED_KEYS",
    "MEMBER_TRAIN_FIELDS",
    "FAILED_KEY",
]

# TrainConfig fields in which the members of a stack may differ (everything else must match).
MEMBER_TRAIN_FIELDS = ("seed", "lr", "weight_decay")
FAILED_KEY = "diverged"  # the metrics row key of a run that diverged
PAIRED_KEYS = ("eval_loss", "eval_true_loss", "eval_plateau_loss")
# torch.amp.GradScaler's defaults (what loss_scaling=True uses)
_SCALER = {"scale": 65536.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000}
_NON_FINITE = "non-finite training loss or gradient"
_LR_CHUNK = 4096  # learning rates moved to the device this many steps at a time (never a table of every step)


# ------------------------------------------------------------------------------------------ compatibility
def check_compatible(runs: Sequence[RunConfig]) -> None:
    """Refuse runs that cannot share one stack, with a ValueError naming the first differing field."""
    if not runs:
        raise ValueError("train_many needs at least one run")
    for i, run in enumerate(runs):
        if not isinstance(run, RunConfig):
            raise ValueError(f"runs[{i}] must be a RunConfig, got {type(run).__name__}")
    first = runs[0]
    for i, run in enumerate(runs[1:], start=1):
        diffs = _differences(first, run)
        if diffs:
            field, a, b = diffs[0]
            raise ValueError(
                f"runs[{i}] cannot share a stack with runs[0]: {field} differs ({b!r} vs {a!r}); members may "
                f"differ only in train.{'/'.join(MEMBER_TRAIN_FIELDS)}, the source's parameters (same kind and "
                f"vocab) and the model's init options ({', '.join(INIT_FIELDS)})"
            )


def stack_key(run: RunConfig) -> str:
    """What must agree for runs to share a stack, as text."""
    train = {k: v for k, v in run.train.to_dict().items() if k not in MEMBER_TRAIN_FIELDS}
    return json.dumps({"source": [run.source.kind, run.source.vocab_size],
                       "model": shape_config(run.model).to_dict(), "train": train}, sort_keys=True)


def _differences(a: RunConfig, b: RunConfig) -> list[tuple[str, Any, Any]]:
    out = []
    if a.source.kind != b.source.kind:
        out.append(("source.kind", a.source.kind, b.source.kind))
    elif a.source.vocab_size != b.source.vocab_size:
        out.append(("source vocab", a.source.vocab_size, b.source.vocab_size))
    ma, mb = shape_config(a.model).to_dict(), shape_config(b.model).to_dict()
    out += [(f"model.{k}", ma[k], mb[k]) for k in ma if ma[k] != mb[k]]
    ta, tb = dataclasses.asdict(a.train), dataclasses.asdict(b.train)  # every field, also those to_dict omits
    out += [(f"train.{k}", ta[k], tb[k]) for k in ta if k not in MEMBER_TRAIN_FIELDS and ta[k] != tb[k]]
    return out


# ------------------------------------------------------------------------------------------------ entry
def train(run: RunConfig, out_dir: "str | os.PathLike | None" = None, *, progress: bool = True) -> TrainResult:
    """Train `run.model` on fresh batches of `run.source` with `run.train`'s recipe: `train_many([run])`.

    Each step draws `batch_size` sequences of `seq_len + 1` states; the loss is the mean next-state
    cross-entropy over all positions (nats). Evaluation uses fresh batches from a separate stream and is logged
    beside `theory.reference_losses`: the entropy rate (the bigram / k-gram optimum the paper's models should
    reach) and the unigram loss (the stationary-law plateau of the tied one-layer model), or for random kernels
    the in-context Bayes loss. With `out_dir`, writes / resumes a run folder (see the module docstring and
    `markov_interp.runs`); without, trains in memory. No output besides the tqdm bar.

    Args:
        run: the run.
        out_dir: its run folder, or None.
        progress: show a tqdm bar.

    Returns:
        The `TrainResult` (the hooked model, metrics rows, `final` losses). A run that diverges raises
        `TrainingDiverged` (with its step and last finite checkpoint), again at once on a later call.
    """
    if not isinstance(run, RunConfig):
        raise ValueError(f"run must be a RunConfig, got {type(run).__name__}")
    (result,) = train_many([run], None if out_dir is None else [out_dir], progress=progress)
    if result.failed is not None:
        raise _diverged(result)
    return result


def _diverged(result: TrainResult) -> TrainingDiverged:
    """The `TrainingDiverged` of a result whose run diverged."""
    out, step = result.out_dir, result.final.step
    status = run_folder.divergence(out) if out is not None else None
    checkpoint = status.get("last_finite_checkpoint") if status else None
    reason = status.get("reason") if status else result.failed
    kept = f"; last finite checkpoint: step {checkpoint}" if checkpoint is not None else ""
    where = f"{out}: " if out is not None else ""
    return TrainingDiverged(f"{where}training diverged at step {step} ({reason}){kept}; lower the learning rate or "
                            "clip gradients, and train into a new folder", step=step, run_dir=out,
                            checkpoint=checkpoint)


def train_many(runs: Sequence[RunConfig], out_dirs: Optional[Sequence["str | os.PathLike"]] = None, *,
               progress: bool = True, models_out: bool = True) -> list[TrainResult]:
    """Train compatible `runs` as one stack; one `TrainResult` per run, in order (see the module docstring).

    Args:
        runs: the runs (`check_compatible`: incompatible runs raise ValueError naming the field).
        out_dirs: one distinct run folder per run, or None (in memory).
        progress: show a tqdm bar.
        models_out: build the hooked models of the results; False leaves `TrainResult.model` None and nothing
            imports transformer_lens (seconds of start-up), which is how `markov-interp train` runs.

    Returns:
        One result per run; a run that diverged has `failed` set (and NaN final losses) instead of raising.
    """
    runs = list(runs)
    check_compatible(runs)
    outs: list[Optional[Path]] = [None] * len(runs)
    if out_dirs is not None:
        outs = [run_folder.folder_path(d, "out_dirs entry") for d in out_dirs]  # "" is not the current folder
        if len(outs) != len(runs):
            raise ValueError(f"got {len(runs)} runs but {len(outs)} out_dirs")
        resolved = [o.resolve() for o in outs]
        if len(set(resolved)) != len(resolved):
            raise ValueError(f"out_dirs must be distinct folders, got {[str(o) for o in outs]}")
    device = resolve_device(runs[0].train.device)
    plan.check_plan(runs, outs, device)  # before any folder is created or config.json written
    with contextlib.ExitStack() as locks:  # every run folder locked for the whole training
        for out in outs:
            if out is not None:
                locks.enter_context(run_folder.lock(run_folder.check_writable_dir(out, "run folder")))
                run_folder.remove_stale_tmp(out)
        return _train_locked(runs, outs, device, progress, models_out)


def _train_locked(runs: list[RunConfig], outs: list[Optional[Path]], device: torch.device, progress: bool,
                  models_out: bool) -> list[TrainResult]:
    results: list[Optional[TrainResult]] = [None] * len(runs)
    todo = []
    for i, (run, out) in enumerate(zip(runs, outs)):
        if out is not None:
            run_folder.prepare(out, run)
            status = run_folder.divergence(out)
            # final weights beside incomplete metrics (a damaged folder), or damaged final weights, resume from a
            # checkpoint: see _Group._resume
            finished = (out / run_folder.WEIGHTS_FILE).exists() and resume.metrics_complete(
                run.train, run_folder.load_metrics(out)) and _final_weights_problem(out, run) is None
            if status is not None or finished:
                run_folder.remove_resume_points(out)  # left by a kill after the final weights were written
                results[i] = _finished(out, run, device, models_out, status)
                continue
        todo.append(i)
    if todo:
        group = _Group.create([runs[i] for i in todo], [outs[i] for i in todo], device)
        with one_thread_if_tiny(group.stack):  # a tiny stack trains on one CPU thread (markov_interp.set_threads)
            trained = group.train(progress, models_out)
        for i, result in zip(todo, trained):
            results[i] = result
    return results  # type: ignore[return-value]


def _final_weights_problem(out: Path, run: RunConfig) -> Optional[str]:
    """Why a folder's model.safetensors is unusable (truncated, another model, non-finite, another step), or None:
    the finished check opens the weights instead of trusting that the file exists."""
    return run_folder.weights_problem(out / run_folder.WEIGHTS_FILE, run.model, step=run.train.steps)


def _references(run: RunConfig, source: Optional[Source] = None) -> dict[str, float]:
    """theory's reference losses of `run` (whose source, built, is `source`) as a metrics row, rounded (the last
    bits of theory's linear algebra vary between calls; rows must compare exactly)."""
    source = run.source.build() if source is None else source
    return theory.reference_losses(source, run.train.seq_len + 1).as_row(digits=12)


def _final(rows: list[dict]) -> FinalLosses:
    last = [r for r in rows if "eval_loss" in r]
    assert last, "training always evaluates at its last step"
    return FinalLosses(step=last[-1]["step"], eval_loss=last[-1]["eval_loss"], train_loss=last[-1]["train_loss"],
                       references=ReferenceLosses.from_row(last[-1]))


def _failed_final(step: int, references: Mapping[str, float]) -> FinalLosses:
    return FinalLosses(step=step, eval_loss=math.nan, train_loss=math.nan,
                       references=ReferenceLosses.from_row(references))


def _finished(out: Path, run: RunConfig, device: torch.device, models_out: bool,
              status: Optional[dict]) -> TrainResult:
    """The result of a finished or diverged run folder (its model loaded when `models_out` and it has one)."""
    rows = run_folder.load_metrics(out)
    has_weights = (out / run_folder.WEIGHTS_FILE).exists()
    model = run_folder.load_model(out, device=device, expect=run.model) if models_out and has_weights else None
    if status is None:  # finished: the caller checked that its metrics are complete
        return TrainResult(model=model, metrics=rows, final=_final(rows), config=run, out_dir=out,
                           already_done=True)
    reason = status.get("reason", "non-finite loss")
    return TrainResult(model=model, metrics=rows, final=_failed_final(status["step"], _references(run)), config=run,
                       out_dir=out, already_done=True, failed=f"diverged at step {status['step']}: {reason}")


# ----------------------------------------------------------------------------------------------- evaluation
def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """The autocast context of `precision` ("fp32": none) on `device`."""
    dtype = PRECISIONS[precision]
    return torch.autocast(device_type=device.type, dtype=dtype, enabled=dtype is not None)


def paired_row(totals: Sequence[float], n_batches: int) -> dict[str, float]:
    """The evaluation columns of a metrics row from summed (model, true, plateau) batch losses."""
    return {key: total / n_batches for key, total in zip(PAIRED_KEYS, totals)}


@torch.no_grad()
def _paired_eval(losses: Callable[[torch.Tensor], torch.Tensor], sources: Sequence[Source],
                 sample: Callable[[], torch.Tensor], n_batches: int) -> list[dict[str, float]]:
    """Each member's evaluation columns over `n_batches` batches of `sample()`: its loss (`losses(tokens)`, the
    [member] losses) beside the true and plateau predictors' losses on the same tokens (`_paired_references`),
    summed on the device and read once."""
    totals = None
    for _ in range(n_batches):
        tokens = sample()
        batch = torch.cat([losses(tokens).double()[:, None], _paired_references(sources, tokens)], dim=1)
        totals = batch if totals is None else totals + batch
    return [paired_row(row, n_batches) for row in totals.tolist()]


def _paired_references(sources: Sequence[Source], tokens: torch.Tensor) -> torch.Tensor:
    """[member, 2]: each member's (true, plateau) mean log-loss on its tokens, `theory.paired_losses`, for the
    members of one source object at once (one `theory` call per distinct source: a stack of seeds is one call)."""
    out = torch.empty(len(sources), 2, dtype=torch.float64, device=tokens.device)
    groups: dict[int, list[int]] = {}
    for k, source in enumerate(sources):
        groups.setdefault(id(source), []).append(k)
    for members in groups.values():
        source, flat = sources[members[0]], tokens[members].flatten(0, 1)  # [(member batch), pos]
        for column, law in enumerate((source.predictive(flat), theory.plateau_predictions(source, flat))):
            per_target = theory.target_log_loss(law, flat)  # as theory.paired_losses
            out[members, column] = per_target.view(len(members), -1).mean(dim=1).to(out)
    return out


def _evaluation_needs(a: Any) -> list[Need]:
    """One evaluation batch: the model's forward over batch_size x (seq_len + 1) and the sampled sequences."""
    from markov_interp.models.memory import hooked_needs

    batch, length = size(a, "batch_size"), size(a, "seq_len") + 1
    fields = [("batch_size", batch), ("seq_len", size(a, "seq_len"))]
    model = a.get("model")
    return (hooked_needs(model, batch=batch, seq_len=length, fields=fields) if isinstance(model, HookedModel)
            else []) + [Need.of("the evaluation sequences", batch * length * 8, fields)]


@planned(_evaluation_needs)
def evaluate_paired(model: HookedModel, source: Source, *, seq_len: int, batch_size: int, n_batches: int,
                    generator: torch.Generator, precision: str = "fp32",
                    interventions: Optional[Mapping[str, Callable]] = None) -> dict[str, float]:
    """The evaluation a run logs, for a hooked model: its mean next-state cross-entropy ("eval_loss", nats) on
    `n_batches` fresh batches of `seq_len` inputs beside the losses of the source's `predictive` ("eval_true_loss")
    and of the plateau predictor ("eval_plateau_loss", `theory.plateau_predictions`) on the *same* tokens.

    The model's paired excess is eval_loss - eval_true_loss, the plateau's eval_plateau_loss - eval_true_loss
    (`dynamics.escape_time`). The model runs through the fused forward (a stack of one holding its weights).

    Args:
        model: a hooked model built by `models` (with `markov_config`).
        source: the data source; batches come from `generator`.
        seq_len, batch_size, n_batches: the evaluation batches.
        generator: the evaluation stream (its device is where the model runs).
        precision: "fp32", "fp16" or "bf16" (autocast).
        interventions: {hook name: fn} clamps for the forward, receiving activations without a member axis
            (`clamps.clamp_hooks(..., update=False)`: evaluations never move running means).

    Returns:
        {"eval_loss", "eval_true_loss", "eval_plateau_loss"}.
    """
    stack = Stack.from_states([model.markov_config], [state_dict_for_save(model)], device=generator.device)
    hooks = {name: (lambda fn: lambda x: fn(x[0]).unsqueeze(0))(fn) for name, fn in (interventions or {}).items()}
    (row,) = _paired_eval(
        lambda tokens: stacked_losses(stack, tokens, dtype=PRECISIONS[precision], interventions=hooks), [source],
        lambda: source.sample(batch_size, seq_len + 1, generator=generator)[None], n_batches)
    return row


@planned(_evaluation_needs)
def evaluate(model: HookedModel, source: Source, *, seq_len: int, batch_size: int, n_batches: int,
             generator: torch.Generator, precision: str = "fp32",
             interventions: Optional[Mapping[str, Callable]] = None) -> float:
    """Mean next-state cross-entropy (nats) of `model` on `n_batches` fresh batches of `seq_len` inputs
    (every position a target): comparable with `theory.reference_losses(source, seq_len + 1)`
    (`evaluate_paired`'s "eval_loss")."""
    return evaluate_paired(model, source, seq_len=seq_len, batch_size=batch_size, n_batches=n_batches,
                           generator=generator, precision=precision, interventions=interventions)["eval_loss"]


def _on_step(step: int) -> None:
    """Called after every completed step (after its checkpoint or resume point); tests replace it to simulate a
    kill."""


_clock = time.monotonic  # the wall time of resume points (`resume.resume_point_due`); tests replace it


# ------------------------------------------------------------------------------------------------ group
@dataclasses.dataclass
class _Group:
    """The state of one training stack: the models, their optimiser, each run's streams and rows."""

    runs: list[RunConfig]
    outs: list[Optional[Path]]
    device: torch.device
    sources: list[Source]
    references: list[dict[str, float]]  # per member: theory's reference losses as a (rounded) metrics row
    stack: Stack
    optimizer: StackedOptimizer
    data: DataStreams  # the training and evaluation batches, [member, batch, seq_len + 1] (`batches`)
    rows: list[list[dict]] = dataclasses.field(default_factory=list)  # per member: metrics rows
    pending: list[torch.Tensor] = dataclasses.field(default_factory=list)  # per step: [member] losses since a row
    failed: list[Optional[int]] = dataclasses.field(default_factory=list)  # per member: step it diverged, or None
    start: int = 0
    resumed_from: Optional[int] = None
    saved: tuple[int, float] = (0, 0.0)  # the last save (start, checkpoint or resume point): (step, _clock())
    scale: Optional[torch.Tensor] = None  # fp16 loss scaling: [member] scales, one GradScaler per member
    growth_tracker: Optional[torch.Tensor] = None
    clamps: ClampState = dataclasses.field(default_factory=ClampState)  # [member, ...] means
    constraint: Optional[CanonicalConstraint] = None  # train.reduction: gradients projected onto (e, w, b)
    compiled: Optional[Callable[[torch.Tensor], torch.Tensor]] = None  # train.compile: the compiled losses
    compiled_step: Optional[Callable[[torch.Tensor], torch.Tensor]] = None  # ... drawing the batch in the graph
    whole: Optional[WholeStep] = None  # train.capture: the whole step in one function (one CUDA graph on CUDA)
    engine: str = "uncaptured"  # how the steps ran, one line (TrainResult.engine)
    logs: list[Optional[run_folder.MetricsLog]] = dataclasses.field(default_factory=list)  # per member: metrics.jsonl

    @classmethod
    def create(cls, runs: list[RunConfig], outs: list[Optional[Path]], device: torch.device) -> "_Group":
        tc = runs[0].train
        check_interventions(tc.interventions, runs[0].model)  # tensor files too, before any step
        built: dict[str, Source] = {}  # one source object and one reference computation per distinct source
        cache: dict[str, dict] = {}
        for run in runs:
            key = run.source.to_json()
            if key not in built:
                built[key] = run.source.build()
                cache[key] = _references(run, built[key])
        sources = [built[r.source.to_json()] for r in runs]
        stack = build_stack([r.model for r in runs], [r.train.seed for r in runs], device=device)
        optimizer = StackedOptimizer(stack, kind=tc.optimizer, betas=tc.betas, momentum=tc.momentum,
                                     compile=tc.compile)
        data = data_streams(tc.stream, sources, [r.train.seed for r in runs], tc.batch_size, tc.seq_len + 1, device)
        group = cls(runs=runs, outs=outs, device=device, sources=sources,
                    references=[cache[r.source.to_json()] for r in runs], stack=stack, optimizer=optimizer,
                    data=data, rows=[[] for _ in runs], failed=[None] * len(runs))
        if tc.compile != "off":
            group.compiled = compiled_losses(stack, dtype=PRECISIONS[tc.precision], mode=tc.compile)
            if data.capturable is not None:  # counter-1 kernel sources: sampling, forward and loss in one graph
                group.compiled_step = compiled_losses(stack, dtype=PRECISIONS[tc.precision], mode=tc.compile,
                                                      sample=data.capturable)
        if tc.capture != "off":  # the whole step where it can run (captured where it can be), else why not
            problem = whole_step_problem(tc, data)
            group.engine = f"not captured: {problem}"
            if problem is None:
                group.whole = WholeStep(stack, optimizer, data, tc, capture_problem(tc, device, data))
        if tc.reduction is not None:
            group.constraint = CanonicalConstraint([r.model for r in runs], [r.train.seed for r in runs],
                                                   tc.release, device=device)
        if tc.loss_scaling:  # GradScaler's defaults: init scale 2**16, growth 2, backoff 0.5, interval 2000
            optimizer.count_members()
            group.scale = torch.full((len(runs),), _SCALER["scale"], device=device)
            group.growth_tracker = torch.zeros(len(runs), dtype=torch.int32, device=device)
        group._resume()
        return group

    @property
    def tc(self) -> TrainConfig:
        return self.runs[0].train

    # -- training loop
    def train(self, progress: bool, build_models: bool = True) -> list[TrainResult]:
        tc = self.tc
        wd = torch.tensor([r.train.weight_decay for r in self.runs], dtype=torch.float64, device=self.device)
        alive = torch.tensor([f is None for f in self.failed], device=self.device)
        failed_at = torch.tensor([-1 if f is None else f for f in self.failed], device=self.device)
        steps = StepPlan.of(tc)  # membership by arithmetic: nothing of size O(steps)
        bar = tqdm(total=tc.steps, initial=self.start, disable=not progress, desc=f"train x{len(self.runs)}",
                   unit="step", dynamic_ncols=True)
        self.logs = [None if out is None else run_folder.MetricsLog(out) for out in self.outs]
        self.saved = (self.start, _clock())
        try:
            for step in range(self.start + 1, tc.steps + 1):
                if (step - self.start - 1) % _LR_CHUNK == 0:  # the schedule on the device a chunk at a time
                    lr_table, lr_from = self._lr_chunk(step - 1), step - 1
                losses, ok = self._step(lr_table[step - 1 - lr_from], wd, alive, step - 1)
                failed_at = torch.where(alive & ~ok, step, failed_at)
                alive = alive & ok
                self.pending.append(losses)
                bar.update(1)
                is_eval, is_log, is_ckpt = steps.evaluates(step), step % tc.log_every == 0, steps.checkpoints(step)
                if is_log or is_eval or is_ckpt:
                    self._note_failures(failed_at, step, weights=is_ckpt or step == tc.steps)
                if is_log or is_eval:
                    self._log(step, is_eval)
                if is_log or is_eval or is_ckpt:
                    alive = alive & torch.tensor([f is None for f in self.failed], device=self.device)
                    if not any(f is None for f in self.failed):
                        break  # every run diverged: nothing left to train
                self._save(step, is_ckpt, is_log or is_eval)
                _on_step(step)
            for log in self.logs:
                if log is not None:
                    log.sync()
        finally:
            bar.close()
            for log in self.logs:
                if log is not None:
                    log.close()
        return self._finish(build_models)

    def _lr_chunk(self, first: int) -> torch.Tensor:
        """[step, member] learning rates of updates first .. first + _LR_CHUNK - 1 (on the device)."""
        last = min(first + _LR_CHUNK, self.tc.steps)
        return torch.tensor([[lr_at(r.train, s) for r in self.runs] for s in range(first, last)],
                            dtype=torch.float64, device=self.device)

    def _hooks(self, t: int, update: bool) -> dict[str, Callable]:
        """The clamps active at time t as stacked-forward hooks (members share their interventions)."""
        tc = self.tc
        if not tc.interventions:
            return {}
        return clamp_hooks(tc.interventions, t, state=self.clamps, update=update, member_axis=True)

    def _step(self, lr: torch.Tensor, wd: torch.Tensor, alive: torch.Tensor,
              t: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Update t -> t + 1 of every member (with the interventions active at t); returns the [member] losses
        and which members stayed finite. A frozen parameter gets no gradient (so no update, no share in
        clipping); a parameter a clamp cuts off from the loss gets a zero gradient (it still decays)."""
        tc = self.tc
        if self.whole is not None and t > self.start:  # the process's first step creates the optimiser's state
            return self.whole(t, lr, wd, alive)
        hooks = self._hooks(t, update=True)
        if self.compiled_step is not None and not hooks:
            losses = self.compiled_step(self.data.step(t))
        else:
            losses = self._losses(self.data.train(t), hooks)
        self.optimizer.zero_grad()
        frozen = frozenset(frozen_names(tc.interventions, self.runs[0].model, t)) if tc.interventions \
            else frozenset()
        if self.constraint is not None:
            frozen = frozen | self.constraint.fixed_names(self.stack.params)
        if self.scale is None:
            losses.sum().backward()
            ok = torch.isfinite(losses)
        else:
            (losses * self.scale).sum().backward()
        for name, param in self.stack.params.items():
            if name in frozen:
                param.grad = None
            elif param.grad is None:
                param.grad = torch.zeros_like(param)
        if self.scale is None:
            ok = ok & self.optimizer.member_finite()
            update = alive & ok
        else:
            update, ok = self._unscale(losses, alive)
        if self.constraint is not None:
            self.constraint.project_(self.stack.params)
        if tc.grad_clip is not None:
            self.optimizer.clip_grad_norm(tc.grad_clip)
        self.optimizer.step(lr, wd, update, frozen)
        return losses.detach(), ok

    def _unscale(self, losses: torch.Tensor, alive: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """fp16 loss scaling per member, torch's GradScaler step by step: unscale the gradients of
        backward(scale * loss) with the fp64 reciprocal, skip a member's step when its gradient overflowed
        (halving its scale), double the scale after 2000 clean steps. A member fails only when its loss itself
        is not finite. Returns (members to update, members still finite)."""
        inv_scale = self.scale.double().reciprocal().float()
        for param in self.stack.parameters():
            if param.grad is not None:
                param.grad.mul_(inv_scale.view(-1, *([1] * (param.ndim - 1))))
        found_inf = ~self.optimizer.member_finite()
        tracker = torch.where(found_inf, 0, self.growth_tracker + 1)
        grow = tracker == _SCALER["growth_interval"]
        grown = self.scale * _SCALER["growth_factor"]
        scale = torch.where(grow & torch.isfinite(grown), grown, self.scale)
        self.scale = torch.where(found_inf, self.scale * _SCALER["backoff_factor"], scale)
        self.growth_tracker = torch.where(grow, 0, tracker).to(torch.int32)
        return alive & ~found_inf & torch.isfinite(losses), torch.isfinite(losses)

    # -- divergence
    def _note_failures(self, failed_at: torch.Tensor, step: int, *, weights: bool) -> None:
        """Record the members that diverged since the last check (with `weights`, also members whose weights
        are not finite at `step`)."""
        for k, at in enumerate(failed_at.tolist()):
            if at >= 0 and self.failed[k] is None:
                self._fail(k, at, _NON_FINITE)
        if weights:  # a checkpoint is only ever finite
            for k, ok in enumerate(self._finite_members()):
                if not ok and self.failed[k] is None:
                    self._fail(k, step, "non-finite weights")

    def _finite_members(self) -> list[bool]:
        """Per member: whether all its weights are finite."""
        finite = torch.stack([torch.isfinite(p).flatten(1).all(dim=1) for p in self.stack.parameters()])
        return finite.all(dim=0).tolist()

    def _fail(self, k: int, step: int, reason: str) -> None:
        """Member k diverged at `step`: a metrics row, status.json (with its last finite checkpoint)."""
        self.failed[k] = step
        self.rows[k].append({"step": step, FAILED_KEY: True, "reason": reason})
        out = self.outs[k]
        if out is not None:  # probe / report / sweeps read status.json: "diverged", not a mechanism
            self.logs[k].append(self.rows[k][-1])
            self.logs[k].sync()
            kept = [c for c, _ in run_folder.list_checkpoints(out) if c < step]
            run_folder.mark_diverged(out, step=step, reason=reason, checkpoint=kept[-1] if kept else None)
            run_folder.remove_resume_points(out)  # a diverged run is loaded, never resumed

    # -- metrics and files
    def _log(self, step: int, is_eval: bool) -> None:
        # per member a contiguous row of its pending losses, each reduced on its own
        means = torch.stack(self.pending).float().T.contiguous().mean(dim=1).tolist()
        self.pending = []
        evals = self._evaluate(step) if is_eval else None
        for k, run in enumerate(self.runs):
            if self.failed[k] is not None:
                continue
            row = {"step": step, "lr": lr_at(run.train, step - 1), "train_loss": means[k]}
            if evals is not None:
                if not math.isfinite(evals[k]["eval_loss"]):
                    self._fail(k, step, f"non-finite evaluation loss {evals[k]['eval_loss']}")
                    continue
                row.update(evals[k])
                row.update(self.references[k])
            self.rows[k].append(row)
            if self.logs[k] is not None:
                self.logs[k].append(row)

    def _evaluate(self, step: int) -> list[dict[str, float]]:
        """Each member's evaluation columns on its own fresh batches, with the clamps active at `step` (running
        means not updated)."""
        hooks = self._hooks(step, update=False)
        return _paired_eval(lambda tokens: self._losses(tokens, hooks), self.sources, self.data.evaluation,
                            self.tc.eval_batches)

    def _losses(self, tokens: torch.Tensor, hooks: Mapping[str, Callable]) -> torch.Tensor:
        """[member] losses of `tokens` (`stacked_losses`; compiled when the run asks and no clamp is active: a
        clamp's hooks are Python functions with running state, which run eagerly)."""
        if self.compiled is not None and not hooks:
            return self.compiled(tokens)
        return stacked_losses(self.stack, tokens, dtype=PRECISIONS[self.tc.precision], interventions=hooks)

    def _save(self, step: int, is_ckpt: bool, is_row: bool) -> None:
        """The checkpoint of `step` at its steps; else a resume point when one is due (`resume.resume_point_due`),
        only at a metrics row (its rows are written and its failures recorded first) and never at the last step
        (the final weights follow), when every running member's weights are finite (else at a later row: only a
        checkpoint records a failure from the weights, so the metrics never depend on the cadence)."""
        if is_ckpt:
            self._checkpoint(step)
        elif is_row and step < self.tc.steps and self.outs[0] is not None and resume.resume_point_due(
                self.tc, step - self.saved[0], _clock() - self.saved[1]):
            finite = self._finite_members()
            if all(finite[k] for k in range(len(self.runs)) if self.failed[k] is None):
                self._checkpoint(step, resume_point=True)

    def _checkpoint(self, step: int, *, resume_point: bool = False) -> None:
        """Each running member's checkpoint (diverged members keep their last finite one), or its resume point;
        then every member's older resume points go: only once all are written, so a kill in between leaves a step
        every member holds (a checkpoint makes them all older)."""
        running = [k for k, out in enumerate(self.outs) if out is not None and self.failed[k] is None]
        for k in running:
            self.logs[k].sync()  # the rows up to this checkpoint are on disk before it is
            run_folder.save_checkpoint(self.outs[k], step, self.runs[k].model, self.stack.member_state(k),
                                      self._training_state(k, step), train_seq_len=self.runs[k].train.seq_len,
                                      resume_point=resume_point)
        for k in running:
            run_folder.remove_resume_points(self.outs[k], keep=step if resume_point else None)
        self.saved = (step, _clock())

    def _training_state(self, k: int, step: int) -> dict:
        """Member k's training state at `step` as a checkpoint's .pt file holds it."""
        tc = self.runs[k].train
        return {
            "step": step,
            "optimizer": self.optimizer.member_state_dict(k, lr=lr_at(tc, step - 1), weight_decay=tc.weight_decay),
            "scaler": {} if self.scale is None else {  # a torch GradScaler's state_dict()
                **_SCALER, "scale": float(self.scale[k]), "_growth_tracker": int(self.growth_tracker[k])},
            **self.data.member_state(k),  # "torch-1": the generators' states; "counter-1": the evaluation count
            "pending_losses": torch.stack([p[k] for p in self.pending]).cpu() if self.pending else torch.zeros(0),
            **({"clamp_state": self.clamps.member_state_dict(k)} if tc.interventions else {}),
        }

    def _resume(self) -> None:
        """Continue from the newest step every member folder holds as a checkpoint or resume point, its metrics
        cover and whose files are sound (a damaged one is skipped with a warning for the next older; none: a fresh
        start; `resume.resume_step` refuses metrics that reach none, saying how to recover). The other resume
        points go (older, or of an attempt cut off)."""
        if any(out is None for out in self.outs):
            return
        saved = [_resumable(out, run) for out, run in zip(self.outs, self.runs)]
        checkpoints = set.intersection(*(c for c, _ in saved))
        points = set.intersection(*(p for _, p in saved)) - checkpoints
        found = run_folder.read_newest_checkpoint(self.outs, [r.model for r in self.runs], checkpoints | points,
                                                  stacklevel=4, resume_points=points)
        for out in self.outs:
            run_folder.remove_resume_points(out, keep=found[0] if found is not None and found[0] in points else None)
        if found is not None:
            self._load(*found)
            return
        for out in self.outs:  # a fresh start: rows of an earlier attempt go (checkpoints were listed, none usable)
            if (out / run_folder.METRICS_FILE).exists():
                run_folder.write_metrics(out, [])

    def _load(self, step: int, loaded: list[tuple[dict, dict]]) -> None:
        """Set every member to its checkpoint of `step` (weights, training state), its metrics cut to that step."""
        clamp_states: list = []
        pending = [self._load_member(k, out, step, *loaded[k], clamp_states) for k, out in enumerate(self.outs)]
        self.clamps.load_member_states(clamp_states, device=self.device)
        self.pending = [torch.stack(col) for col in zip(*pending)]
        self.optimizer.step_count = step
        self.start = self.resumed_from = step

    def _load_member(self, k: int, out: Path, step: int, weights: dict, state: dict,
                     clamp_states: list) -> list[torch.Tensor]:
        self.stack.load_member(k, weights)
        self.optimizer.load_member_state(k, state["optimizer"])
        if self.scale is not None:
            self.scale[k] = state["scaler"]["scale"]
            self.growth_tracker[k] = state["scaler"]["_growth_tracker"]
        self.data.load_member(k, state)
        clamp_states.append(state.get("clamp_state", {}))
        failed_at = int(state.get("stack_failed_at", -1))  # written by the stacked engine before it was the only one
        self.failed[k] = None if failed_at < 0 else failed_at
        # the rows up to the checkpoint; the rest (and a row torn by a crash) is cut off and retrained
        self.rows[k] = [r for r in run_folder.load_metrics(out) if r["step"] <= step]
        run_folder.write_metrics(out, self.rows[k])
        return [t.to(self.device) for t in state["pending_losses"].unbind()]

    def _finish(self, build_models: bool) -> list[TrainResult]:
        results = []
        for k, (run, out) in enumerate(zip(self.runs, self.outs)):
            done = self.failed[k] is None
            metadata = WeightsMetadata(train_seq_len=run.train.seq_len, step=run.train.steps if done else None)
            model = self.stack.hooked_model(k, device=self.device, metadata=metadata) if build_models else None
            if model is not None:
                model.eval()
            if done:
                if out is not None:
                    self.stack.save_member(k, out, train_seq_len=run.train.seq_len, step=run.train.steps)
                    run_folder.remove_resume_points(out)  # the run has ended: its final weights replace it
                final, failed = _final(self.rows[k]), None
            else:
                final = _failed_final(self.failed[k], self.references[k])
                failed = f"diverged at step {self.failed[k]}: {self.rows[k][-1]['reason']}"
            results.append(TrainResult(model=model, metrics=self.rows[k], final=final, config=run, out_dir=out,
                                       resumed_from=self.resumed_from, failed=failed,
                                       engine=self.engine if self.whole is None else self.whole.engine))
        return results


def _resumable(out: Path, run: RunConfig) -> tuple[set[int], set[int]]:
    """The checkpoint steps and the resume-point steps of a run folder that its metrics cover
    (`resume.resume_step`: a resume never leaves a gap in metrics.jsonl; RunFolderError, saying how to recover,
    when none is covered). Damaged final weights of a finished folder are restored from them (with a warning)."""
    steps = [s for s, _ in run_folder.list_checkpoints(out)]
    points = [s for s, _ in run_folder.list_resume_points(out)]
    rows = run_folder.load_metrics(out)
    has_weights = (out / run_folder.WEIGHTS_FILE).exists()
    damaged = _final_weights_problem(out, run) if has_weights and resume.metrics_complete(run.train, rows) else None
    newest = resume.resume_step(out, run.train, steps, rows, final_weights=has_weights, damaged=damaged,
                                resume_points=points)
    if newest is None:
        return set(), set()
    return {s for s in steps if s <= newest}, {s for s in points if s <= newest}
