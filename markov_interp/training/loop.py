"""Training many runs as one stacked model (`training.train_many`): seeds and grid cells trained together.

Runs that share their shapes (architecture, vocab, n_ctx, seq_len, batch size, steps, optimiser kind and
hyper-parameters other than lr / weight decay, schedule, precision, evaluation and checkpoint plan, device)
train as one `stacked.Stack`: one batched forward, one backward of the summed member losses (members share
no parameter, so each member's gradient is its solo gradient), one elementwise optimiser step with
per-member learning rate and weight decay. Members may differ in seed, source parameters of the same kind and
vocab (p, q, kernel, alpha, order, initial law), initialisation options, learning rate and weight decay.

**A member is its solo run.** It draws its batches from the generator `training.train` would use
(`_derive_seed(seed, "train-data")`), evaluates on the solo evaluation stream, starts from `models.build(cfg,
seed=seed)` and follows torch's AdamW / SGD arithmetic, so its weights match `train(run)` up to float
rounding (tested at 1e-4 after 100 steps; in practice far closer).

**Run folders.** Each member writes a normal run folder (config.json, metrics.jsonl, model.safetensors,
checkpoints/) in exactly the solo format: its checkpoints hold its own weights and a `torch.optim` state dict
(plus its generators and pending losses), so `load`, probes and reports read it unchanged and solo `train`
could resume it. A stacked group resumes from the newest checkpoint step that every member folder holds
(members checkpoint together, so that is the newest one unless a kill fell between two members' writes) and
ends bit-identical to an uninterrupted group; members whose folder is already finished are loaded, not
retrained, and the others train as a smaller stack (members are independent, so that changes nothing).

**Loss scaling** (fp16): every member has its own GradScaler (scale, growth tracker, skipped overflow steps,
and so its own AdamW step count), checkpointed as the solo scaler's state dict.

**Interventions** (`TrainConfig.interventions`, `markov_interp.intervene`): members must have equal ones (they
are part of `stack_key`); clamps run as stacked-forward hooks with a member axis, running means per member (in
each member's checkpoint, solo format), and frozen parameters are skipped by the optimiser with their own
per-parameter step counts, as torch's AdamW skips a parameter without a gradient (not with fp16 loss scaling).

**Divergence.** A member whose training loss or gradient is not finite at some step is frozen there (its
weights and optimiser state are those before the step), recorded as failed in its metrics (a row
`{"step": s, "failed": ...}`) and in `TrainResult.failed`, and the others finish. Its folder keeps its last
finite weights as model.safetensors and counts as finished (a rerun loads it).
"""

import contextlib
import dataclasses
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

import torch
from tqdm.auto import tqdm

from markov_interp import intervene, models, runfolder, stacked, theory, training
from markov_interp._io import atomic_path
from markov_interp.training import RunConfig, TrainConfig, TrainResult

__all__ = ["train_many", "check_compatible", "stack_key", "MEMBER_TRAIN_FIELDS", "FAILED_KEY"]

# TrainConfig fields in which the members of a stack may differ (everything else must match).
MEMBER_TRAIN_FIELDS = ("seed", "lr", "weight_decay")
FAILED_KEY = "diverged"  # the metrics row key of a member that diverged (as solo `train` writes it)
# torch.amp.GradScaler's defaults, which solo `train` uses for loss_scaling=True
_SCALER = {"scale": 65536.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000}
_FAILED_MESSAGE = "non-finite training loss or gradient; member frozen at its last finite weights"


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
                f"vocab) and the model's init options ({', '.join(stacked.INIT_FIELDS)})"
            )


def stack_key(run: RunConfig) -> Optional[str]:
    """What must agree for runs to share a stack, as text (None for a run that cannot be stacked)."""
    train = {k: v for k, v in run.train.to_dict().items() if k not in MEMBER_TRAIN_FIELDS}
    return json.dumps({"source": [run.source.kind, run.source.vocab_size],
                       "model": stacked.shape_config(run.model).to_dict(), "train": train}, sort_keys=True)


def _differences(a: RunConfig, b: RunConfig) -> list[tuple[str, Any, Any]]:
    out = []
    if a.source.kind != b.source.kind:
        out.append(("source.kind", a.source.kind, b.source.kind))
    elif a.source.vocab_size != b.source.vocab_size:
        out.append(("source vocab", a.source.vocab_size, b.source.vocab_size))
    ma, mb = stacked.shape_config(a.model).to_dict(), stacked.shape_config(b.model).to_dict()
    out += [(f"model.{k}", ma[k], mb[k]) for k in ma if ma[k] != mb[k]]
    ta, tb = dataclasses.asdict(a.train), dataclasses.asdict(b.train)  # every field, also those to_dict omits
    out += [(f"train.{k}", ta[k], tb[k]) for k in ta if k not in MEMBER_TRAIN_FIELDS and ta[k] != tb[k]]
    return out


# ------------------------------------------------------------------------------------------------ entry
def train_many(runs: Sequence[RunConfig], out_dirs: Optional[Sequence["str | os.PathLike"]] = None, *,
               progress: bool = True, models_out: bool = True) -> list[TrainResult]:
    """Train compatible `runs` as one stacked model; one `TrainResult` per run, in order (see module doc).

    `models_out=False` leaves `TrainResult.model` None: nothing then imports transformer_lens (seconds of
    start-up), which is how `markov-interp train` runs.
    """
    runs = list(runs)
    check_compatible(runs)
    if out_dirs is not None:
        outs: list[Optional[Path]] = [Path(d) for d in out_dirs]
        if len(outs) != len(runs):
            raise ValueError(f"got {len(runs)} runs but {len(outs)} out_dirs")
        resolved = [o.resolve() for o in outs]
        if len(set(resolved)) != len(resolved):
            raise ValueError(f"out_dirs must be distinct folders, got {[str(o) for o in outs]}")
    else:
        outs = [None] * len(runs)
    device = training.resolve_device(runs[0].train.device)
    with contextlib.ExitStack() as locks:  # every member folder locked, as solo `train` locks its one
        for out in outs:
            if out is not None:
                locks.enter_context(runfolder.lock(runfolder.check_writable_dir(out, "run folder")))
                runfolder.remove_stale_tmp(out)
        return _train_locked(runs, outs, device, progress, models_out)


def _train_locked(runs: list[RunConfig], outs: list[Optional[Path]], device: torch.device, progress: bool,
                  models_out: bool) -> list[TrainResult]:
    results: list[Optional[TrainResult]] = [None] * len(runs)
    todo = []
    for i, (run, out) in enumerate(zip(runs, outs)):
        if out is not None:
            training._prepare_folder(out, run)
            status = runfolder.divergence(out)
            # final weights beside incomplete metrics (a damaged folder) resume like solo `train`: see _resume
            finished = (out / models.WEIGHTS_FILE).exists() and runfolder.metrics_complete(
                run.train, training.load_metrics(out))
            if status is not None or finished:
                results[i] = _finished_member(out, run, device, models_out, status)
                continue
        todo.append(i)
    if todo:
        group = _Group.create([runs[i] for i in todo], [outs[i] for i in todo], device)
        for i, result in zip(todo, group.train(progress, models_out)):
            results[i] = result
    return results  # type: ignore[return-value]


def _finished_member(out: Path, run: RunConfig, device: torch.device, models_out: bool,
                     status: Optional[dict]) -> TrainResult:
    if status is None:  # finished: the caller checked that its metrics are complete
        done = training._finished(out, run, device, load_model=models_out)
        assert done is not None, f"{out}: complete metrics were checked before"
        return done
    rows = training.load_metrics(out)
    has_weights = (out / models.WEIGHTS_FILE).exists()
    model = models.load(out, device=device, expect=run.model) if models_out and has_weights else None
    references = theory.reference_losses(run.source.build(), run.train.seq_len + 1).as_row(digits=12)
    return TrainResult(model=model, metrics=rows, final=_failed_final(status["step"], references), config=run,
                       out_dir=out, already_done=True,
                       failed=_failure_text(status["step"], status.get("reason", "non-finite loss")))


def _failure_text(step: int, reason: str = _FAILED_MESSAGE) -> str:
    return f"diverged at step {step}: {reason}"


def _failed_final(step: int, references: dict) -> training.FinalLosses:
    return training.FinalLosses(step=step, eval_loss=math.nan, train_loss=math.nan, references=references)


# ----------------------------------------------------------------------------------------------- sampling
def _resumable(out: Path, run: RunConfig) -> set[int]:
    """The checkpoint steps of a member folder that its metrics cover (`runfolder.resume_step`: a resume never
    leaves a gap in metrics.jsonl; RunFolderError, saying how to recover, when none is covered)."""
    steps = [s for s, _ in training.list_checkpoints(out)]
    newest = runfolder.resume_step(out, run.train, steps, training.load_metrics(out),
                                   final_weights=(out / models.WEIGHTS_FILE).exists())
    return {s for s in steps if newest is not None and s <= newest}


def member_sampler(sources: list, generators: list, batch: int, length: int):
    """A function drawing one batch per member, `[member, batch, length]`: member k's rows are exactly
    `sources[k].sample(batch, length, generator=generators[k])` (each generator draws what it would alone).

    For fixed-kernel chains of one vocab and order the uniforms are drawn per member and the chain is
    built for all members at once (one pass instead of K: on a GPU, K small samplers cost as much as the
    stacked model's step); other sources are sampled member by member.
    """
    batched = _batched_chain_sampler(sources, generators, batch, length)
    if batched is not None:
        return batched
    return lambda: torch.stack([s.sample(batch, length, generator=g) for s, g in zip(sources, generators)])


def _batched_chain_sampler(sources: list, generators: list, batch: int, length: int):
    """`MarkovChain.sample` for K chains at once (same arithmetic, per-member draws), or None if not applicable."""
    from markov_interp import data

    if not all(isinstance(s, data.MarkovChain) for s in sources):
        return None
    vocab, order = sources[0].vocab, sources[0].order
    steps = length - order
    if steps < 1 or any(s.vocab != vocab or s.order != order for s in sources):
        return None
    device = generators[0].device
    try:  # the sampler's internals (data.MarkovChain.sample); any change there falls back to the plain path
        init_cdf = torch.stack([s._initial.to(device).cumsum(-1) for s in sources])  # [member, context]
        cdf = torch.stack([s._cdf.to(device) for s in sources])  # [member, context, vocab]
        apply_binary, compose = data._apply_binary_maps, data._compose_prefix
    except AttributeError:
        return None
    n_members, n_ctx = init_cdf.shape
    digits = vocab ** torch.arange(order - 1, -1, -1, device=device)
    context_ids = torch.arange(n_ctx, device=device)

    def sample() -> torch.Tensor:
        u0, u = [], []
        for g in generators:  # member k's generator: its first state, then its step uniforms (solo order)
            u0.append(torch.rand(batch, 1, generator=g, device=device, dtype=torch.float64))
            u.append(torch.rand(batch, steps, 1, 1, generator=g, device=device, dtype=torch.float64))
        first = (init_cdf[:, None, :] <= torch.stack(u0)).sum(-1).clamp_(max=n_ctx - 1).reshape(-1)
        per_seq = cdf[:, None].expand(-1, batch, -1, -1).reshape(n_members * batch, n_ctx, vocab)
        nxt = (per_seq[:, None, :, :] <= torch.cat(u)).sum(-1).clamp_(max=vocab - 1)
        if n_ctx == 2:
            later = apply_binary(nxt, first)
        else:
            step_maps = nxt if order == 1 else (context_ids * vocab + nxt) % n_ctx
            contexts = torch.gather(compose(step_maps), -1, first[:, None, None].expand(-1, steps, 1))
            later = contexts[..., 0] if order == 1 else contexts[..., 0] % vocab
        head = (first[:, None] // digits) % vocab
        tokens = torch.cat([head, later], dim=1)[:, :length]
        return tokens.reshape(n_members, batch, length)

    return sample


def _on_step(step: int) -> None:
    """Called after every completed step (after its checkpoint); tests replace it to simulate a kill."""


# ------------------------------------------------------------------------------------------------ group
@dataclasses.dataclass
class _Group:
    """The state of one stacked training group: the stack, its optimiser, each member's streams and rows."""

    runs: list
    outs: list
    device: torch.device
    sources: list
    references: list  # per member: theory's reference losses (rounded like solo rows)
    stack: stacked.Stack
    optimizer: stacked.StackedOptimizer
    train_gens: list
    eval_gens: list
    rows: list = dataclasses.field(default_factory=list)  # per member: metrics rows
    pending: list = dataclasses.field(default_factory=list)  # per step: [member] train losses since last row
    failed: list = dataclasses.field(default_factory=list)  # per member: step it diverged, or None
    start: int = 0
    resumed_from: Optional[int] = None
    sample_train: Any = None  # () -> [member, batch, seq_len + 1] tokens from the training streams
    sample_eval: Any = None  # the same from the evaluation streams
    scale: Any = None  # fp16 loss scaling: [member] scales and growth trackers, one torch GradScaler per member
    growth_tracker: Any = None
    clamps: Any = None  # intervene.ClampState: running means of mean clamps, [member, ...]

    @classmethod
    def create(cls, runs: list, outs: list, device: torch.device) -> "_Group":
        tc: TrainConfig = runs[0].train
        intervene.check_interventions(tc.interventions, runs[0].model)  # tensor files too, before any step
        if tc.loss_scaling and any(isinstance(i, intervene.Freeze) for i in tc.interventions):
            raise ValueError("freeze interventions are not supported with fp16 loss scaling in stacked training; "
                             "train these runs solo or without loss_scaling")
        sources = [r.source.build() for r in runs]
        cache: dict[str, dict] = {}
        references = []
        for run, source in zip(runs, sources):
            key = run.source.to_json()
            if key not in cache:  # rounded: rows must compare exactly with solo rows
                cache[key] = theory.reference_losses(source, tc.seq_len + 1).as_row(digits=12)
            references.append(cache[key])
        stack = stacked.build_stack([r.model for r in runs], [r.train.seed for r in runs], device=device)
        optimizer = stacked.StackedOptimizer(stack, kind=tc.optimizer, betas=tc.betas, momentum=tc.momentum)
        gens = [[torch.Generator(device=device).manual_seed(training._derive_seed(r.train.seed, stream))
                 for r in runs] for stream in ("train-data", "eval-data")]
        group = cls(runs=runs, outs=outs, device=device, sources=sources, references=references, stack=stack,
                    optimizer=optimizer, train_gens=gens[0], eval_gens=gens[1],
                    rows=[[] for _ in runs], failed=[None] * len(runs), clamps=intervene.ClampState())
        if tc.loss_scaling:  # GradScaler's defaults: init scale 2**16, growth 2, backoff 0.5, interval 2000
            optimizer.count_members()
            group.scale = torch.full((len(runs),), _SCALER["scale"], device=device)
            group.growth_tracker = torch.zeros(len(runs), dtype=torch.int32, device=device)
        length = tc.seq_len + 1
        group.sample_train = member_sampler(sources, group.train_gens, tc.batch_size, length)
        group.sample_eval = member_sampler(sources, group.eval_gens, tc.batch_size, length)
        group._resume()
        return group

    @property
    def tc(self) -> TrainConfig:
        return self.runs[0].train

    # -- training loop
    def train(self, progress: bool, build_models: bool = True) -> list[TrainResult]:
        tc, n = self.tc, len(self.runs)
        wd = torch.tensor([r.train.weight_decay for r in self.runs], dtype=torch.float64, device=self.device)
        alive = torch.tensor([f is None for f in self.failed], device=self.device)
        failed_at = torch.tensor([-1 if f is None else f for f in self.failed], device=self.device)
        ckpt_steps = set(training.checkpoint_steps(tc.steps, tc.n_checkpoints))
        eval_steps = training.evaluation_steps(tc)
        # the whole schedule on the device up front: no host-to-device copy inside the step loop
        lr_table = torch.tensor([[training._lr_at(r.train, s) for r in self.runs] for s in range(tc.steps)],
                                dtype=torch.float64, device=self.device)
        bar = tqdm(total=tc.steps, initial=self.start, disable=not progress, desc=f"train x{n}", unit="step",
                   dynamic_ncols=True)
        try:
            for step in range(self.start + 1, tc.steps + 1):
                lrs = [training._lr_at(r.train, step - 1) for r in self.runs]
                losses, ok = self._step(lr_table[step - 1], wd, alive, step - 1)
                failed_at = torch.where(alive & ~ok, step, failed_at)
                alive = alive & ok
                self.pending.append(losses)
                bar.update(1)
                is_eval = step in eval_steps
                if step % tc.log_every == 0 or is_eval or step in ckpt_steps:
                    self._note_failures(failed_at)
                if step % tc.log_every == 0 or is_eval:
                    self._log(step, lrs, is_eval)
                if step in ckpt_steps:
                    self._checkpoint(step, lrs)
                _on_step(step)
        finally:
            bar.close()
        return self._finish(build_models)

    def _hooks(self, t: int, update: bool) -> dict:
        """The clamps active at time t as stacked-forward hooks (members share their interventions)."""
        tc = self.tc
        if not tc.interventions:
            return {}
        return intervene.clamp_hooks(tc.interventions, self.runs[0].model, t, state=self.clamps, update=update,
                                     member_axis=True)

    def _step(self, lr: torch.Tensor, wd: torch.Tensor, alive: torch.Tensor,
              t: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Update t -> t + 1 of every member (with the interventions active at t); returns the [member] losses
        and which members stayed finite."""
        tc = self.tc
        tokens = self.sample_train()
        with training._autocast(self.device, tc.precision):
            logits = stacked.stacked_forward(self.stack, tokens[..., :-1], self._hooks(t, update=True))
        losses = stacked.stacked_loss(logits, tokens[..., 1:])
        self.optimizer.zero_grad()
        frozen = frozenset(intervene.frozen_names(tc.interventions, self.runs[0].model, t))
        if self.scale is None:
            losses.sum().backward()
            for name, param in self.stack.params.items():  # as solo training (training._step)
                if name in frozen:  # no gradient: no update, no share in clipping
                    param.grad = None
                elif param.grad is None:  # cut off from the loss by a clamp: a zero gradient
                    param.grad = torch.zeros_like(param)
            ok = torch.isfinite(losses) & self.optimizer.member_finite()
            update = alive & ok
        else:
            update, ok = self._scaled_backward(losses, alive)
        if tc.grad_clip is not None:
            self.optimizer.clip_grad_norm(tc.grad_clip)
        self.optimizer.step(lr, wd, update, frozen)
        return losses.detach(), ok

    def _scaled_backward(self, losses: torch.Tensor, alive: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """fp16 loss scaling per member, torch's GradScaler step by step: backward of scale * loss, unscale with
        the fp64 reciprocal, skip a member's step when its gradient overflowed (halving its scale), double the
        scale after 2000 clean steps. A member fails only when its loss itself is not finite."""
        (losses * self.scale).sum().backward()
        inv_scale = self.scale.double().reciprocal().float()
        for param in self.stack.parameters():
            param.grad.mul_(inv_scale.view(-1, *([1] * (param.ndim - 1))))
        found_inf = ~self.optimizer.member_finite()
        tracker = torch.where(found_inf, 0, self.growth_tracker + 1)
        grow = tracker == _SCALER["growth_interval"]
        grown = self.scale * _SCALER["growth_factor"]
        scale = torch.where(grow & torch.isfinite(grown), grown, self.scale)
        self.scale = torch.where(found_inf, self.scale * _SCALER["backoff_factor"], scale)
        self.growth_tracker = torch.where(grow, 0, tracker).to(torch.int32)
        return alive & ~found_inf & torch.isfinite(losses), torch.isfinite(losses)

    def _note_failures(self, failed_at: torch.Tensor) -> None:
        for k, step in enumerate(failed_at.tolist()):
            if step >= 0 and self.failed[k] is None:
                self.failed[k] = step
                self.rows[k].append({"step": step, FAILED_KEY: True, "reason": _FAILED_MESSAGE})
                self._write_rows(k)
                out = self.outs[k]
                if out is not None:  # probe / report / sweeps read status.json: "diverged", not a mechanism
                    kept = [c for c, _ in training.list_checkpoints(out) if c < step]
                    runfolder.mark_diverged(out, step=step, reason=_FAILED_MESSAGE,
                                            checkpoint=kept[-1] if kept else None)

    def _log(self, step: int, lrs: list, is_eval: bool) -> None:
        # per member a contiguous row of its pending losses, reduced like solo's torch.stack(pending).mean()
        means = torch.stack(self.pending).float().T.contiguous().mean(dim=1).tolist()
        self.pending = []
        evals = self._evaluate(step) if is_eval else None
        for k in range(len(self.runs)):
            if self.failed[k] is not None:
                continue
            row = {"step": step, "lr": lrs[k], "train_loss": means[k]}
            if evals is not None:
                row.update(evals[k])
                row.update(self.references[k])
            self.rows[k].append(row)
            self._write_rows(k)

    @torch.no_grad()
    def _evaluate(self, step: int) -> list[dict[str, float]]:
        """Each member's evaluation columns on its own fresh batches (solo `training.evaluate_paired`'s stream:
        the model's loss beside the true and plateau predictors' on the same tokens), with the clamps active at
        `step` (running means not updated)."""
        tc = self.tc
        hooks = self._hooks(step, update=False)
        totals = [[0.0, 0.0, 0.0] for _ in self.runs]
        for _ in range(tc.eval_batches):
            tokens = self.sample_eval()
            with training._autocast(self.device, tc.precision):
                logits = stacked.stacked_forward(self.stack, tokens[..., :-1], hooks)
            for k, value in enumerate(stacked.stacked_loss(logits, tokens[..., 1:]).tolist()):
                true, plateau = theory.paired_losses(self.sources[k], tokens[k])
                for i, v in enumerate((value, true, plateau)):
                    totals[k][i] += v
        return [training.paired_row(t, tc.eval_batches) for t in totals]

    def _write_rows(self, k: int) -> None:
        if self.outs[k] is not None:
            training._write_metrics(self.outs[k] / training.METRICS_FILE, self.rows[k])

    # -- files
    def _checkpoint(self, step: int, lrs: list) -> None:
        """Every member's checkpoint in the solo format (plus its divergence step under `stack_failed_at`)."""
        for k, out in enumerate(self.outs):
            if out is None:
                continue
            weights, extra = training._checkpoint_paths(out, step)
            weights.parent.mkdir(exist_ok=True)
            self.stack.save_member(k, weights)
            tc = self.runs[k].train
            state = {
                "step": step,
                "optimizer": self.optimizer.solo_state_dict(k, lr=lrs[k], initial_lr=tc.lr,
                                                            weight_decay=tc.weight_decay),
                "scaler": {} if self.scale is None else {  # GradScaler.state_dict() of member k's scaler
                    **_SCALER, "scale": float(self.scale[k]), "_growth_tracker": int(self.growth_tracker[k])},
                "train_generator": self.train_gens[k].get_state(),
                "eval_generator": self.eval_gens[k].get_state(),
                "pending_losses": torch.stack([p[k] for p in self.pending]).cpu() if self.pending
                else torch.zeros(0),
                "stack_failed_at": -1 if self.failed[k] is None else self.failed[k],
                **({"clamp_state": self.clamps.member_state_dict(k)} if tc.interventions else {}),
            }
            with atomic_path(extra) as tmp:
                torch.save(state, tmp)

    def _resume(self) -> None:
        """Continue from the newest checkpoint step every member folder holds (none: a fresh start)."""
        if any(out is None for out in self.outs):
            return
        common = set.intersection(*(_resumable(out, run) for out, run in zip(self.outs, self.runs)))
        if not common:
            for out in self.outs:
                if (out / training.METRICS_FILE).exists():
                    training._write_metrics(out / training.METRICS_FILE, [])
            return
        step = max(common)
        clamp_states: list = []
        pending = [self._load_member(k, out, step, clamp_states) for k, out in enumerate(self.outs)]
        self.clamps.load_member_states(clamp_states, device=self.device)
        self.pending = [torch.stack(col) for col in zip(*pending)]
        self.optimizer.step_count = step
        self.start = self.resumed_from = step

    def _load_member(self, k: int, out: Path, step: int, clamp_states: list) -> list:
        weights, extra = training._checkpoint_paths(out, step)
        _, tensors = models.read_weights(weights)
        self.stack.load_member(k, tensors)
        try:
            state = torch.load(extra, map_location="cpu", weights_only=True)
        except Exception as err:  # torch raises several types on corrupt / truncated files
            raise ValueError(f"checkpoint {extra} is unreadable ({type(err).__name__}: {err})") from None
        self.optimizer.load_solo_state(k, state["optimizer"])
        if self.scale is not None:
            self.scale[k] = state["scaler"]["scale"]
            self.growth_tracker[k] = state["scaler"]["_growth_tracker"]
        self.train_gens[k].set_state(state["train_generator"])
        self.eval_gens[k].set_state(state["eval_generator"])
        clamp_states.append(state.get("clamp_state", {}))
        failed_at = int(state.get("stack_failed_at", -1))
        self.failed[k] = None if failed_at < 0 else failed_at
        self.rows[k] = [r for r in training.load_metrics(out) if r["step"] <= step]
        self._write_rows(k)
        return [t.to(self.device) for t in state["pending_losses"].unbind()]

    def _finish(self, build_models: bool) -> list[TrainResult]:
        results = []
        for k, (run, out) in enumerate(zip(self.runs, self.outs)):
            model = None
            if build_models:
                model = self.stack.hooked_model(k, device=self.device)
                model.eval()
            if out is not None:
                self.stack.save_member(k, out)
            if self.failed[k] is None:
                final, failed = training._final(self.rows[k], self.references[k]), None
            else:
                final, failed = _failed_final(self.failed[k], self.references[k]), _failure_text(self.failed[k])
            results.append(TrainResult(model=model, metrics=self.rows[k], final=final, config=run, out_dir=out,
                                       resumed_from=self.resumed_from, failed=failed))
        return results
