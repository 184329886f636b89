"""Training: the paper's recipe on fresh Markov batches, through the fused fast path, reproducibly.

Defaults follow Makkuva et al. ("Attention with Markov", arXiv 2402.04161) and their reference code: a fresh
batch of 16 sequences every step (no dataset), every position a prediction target, AdamW with betas
(0.9, 0.95), weight decay 1e-3 on linear weights only (not the tied embedding, positions, LayerNorm or
biases), lr 2e-3 with a one-cycle schedule (2% cosine warm-up from lr/100, cosine decay to lr/5, exactly
`torch.optim.lr_scheduler.OneCycleLR(div_factor=100, final_div_factor=0.05, pct_start=0.02)`), no gradient
clipping, fp32. Precision is explicit: fp16 / bf16 autocast are options, fp16 without loss scaling by
default as in the reference code (its outcome differs: see the notes), with `loss_scaling=True` on request.

A run folder holds `config.json` (the `RunConfig`), `metrics.jsonl` (one JSON row per logged step: train
loss, learning rate and, at evaluation steps, the loss on fresh evaluation batches beside the `theory`
reference losses), `model.safetensors` (final weights, TransformerLens names, see `models.save`) and
`checkpoints/` (weights plus optimizer, scaler and generator state at log-spaced steps). Re-running the same
config on the folder resumes from the newest checkpoint and ends bit-identical to an uninterrupted run; a
finished run is loaded, not retrained; a folder holding another config is refused.
"""

import dataclasses
import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any, Optional

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from markov_interp._io import atomic_path, atomic_write
from markov_interp import models, theory
from markov_interp.data import SourceConfig
from markov_interp.models import ModelConfig

__all__ = [
    "TrainConfig",
    "RunConfig",
    "TrainResult",
    "train",
    "train_many",
    "one_cycle_lr",
    "checkpoint_steps",
    "evaluate",
    "resolve_device",
    "load_metrics",
    "list_checkpoints",
    "CONFIG_FILE",
    "METRICS_FILE",
    "CHECKPOINT_DIR",
]

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
CHECKPOINT_DIR = "checkpoints"
_PRECISIONS = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}


# ------------------------------------------------------------------------------------------------ configs
@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """How to train: optimiser, schedule, precision, budget, evaluation and checkpoints (paper defaults)."""

    steps: int = 400  # optimiser steps (the paper uses 400-1000)
    batch_size: int = 16  # sequences per step, fresh every step
    seq_len: int = 256  # model input length; seq_len + 1 states are sampled so every position is a target
    lr: float | int = 2e-3  # peak learning rate
    optimizer: str = "adamw"  # "adamw" or "sgd"
    betas: tuple | list = (0.9, 0.95)  # AdamW betas
    momentum: float | int = 0.0  # SGD momentum
    weight_decay: float | int = 1e-3  # on linear weights only (attention, MLP, untied unembedding)
    schedule: str = "one-cycle"  # "one-cycle" (2% warm-up from lr/100, cosine to lr/5) or "constant"
    warmup_frac: float | int = 0.02  # one-cycle warm-up fraction
    grad_clip: Optional[float | int] = None  # max gradient norm; None: no clipping (the paper's setting)
    precision: str = "fp32"  # "fp32", "fp16" or "bf16" (autocast)
    loss_scaling: bool = False  # fp16 only: dynamic loss scaling (the reference code has none)
    seed: int = 0  # model init and data streams
    device: str = "auto"  # "auto" (cuda when available), "cpu", "cuda", "cuda:1", ...
    log_every: int = 10  # a metrics row (mean train loss since the previous row) every this many steps
    eval_every: int = 100  # evaluate every this many steps (and at the last step); 0: last step only
    eval_batches: int = 4  # fresh evaluation batches per evaluation
    n_checkpoints: int = 8  # checkpoints at log-spaced steps (the last step always included); 0: none

    def __post_init__(self) -> None:
        for name, minimum in (("steps", 1), ("batch_size", 1), ("seq_len", 1), ("log_every", 1),
                              ("eval_every", 0), ("eval_batches", 1), ("n_checkpoints", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {self.seed!r}")
        for name in ("lr", "weight_decay", "momentum", "warmup_frac"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if not 0 <= self.warmup_frac < 1:
            raise ValueError(f"warmup_frac must be in [0, 1), got {self.warmup_frac}")
        betas = tuple(self.betas) if isinstance(self.betas, (list, tuple)) else self.betas
        ok = isinstance(betas, tuple) and len(betas) == 2
        if not (ok and all(isinstance(b, (int, float)) and 0 <= b < 1 for b in betas)):
            raise ValueError(f"betas must be two numbers in [0, 1), got {self.betas!r}")
        object.__setattr__(self, "betas", tuple(float(b) for b in betas))
        if self.optimizer not in ("adamw", "sgd"):
            raise ValueError(f"optimizer must be 'adamw' or 'sgd', got {self.optimizer!r}")
        if self.schedule not in ("one-cycle", "constant"):
            raise ValueError(f"schedule must be 'one-cycle' or 'constant', got {self.schedule!r}")
        if self.precision not in _PRECISIONS:
            raise ValueError(f"precision must be one of {list(_PRECISIONS)}, got {self.precision!r}")
        if self.loss_scaling and self.precision != "fp16":
            raise ValueError(f"loss_scaling=True only applies to precision='fp16', got precision={self.precision!r}")
        clip = self.grad_clip
        if clip is not None and (isinstance(clip, bool) or not isinstance(clip, (int, float)) or not clip > 0):
            raise ValueError(f"grad_clip must be None or a number > 0, got {self.grad_clip!r}")
        if not isinstance(self.device, str) or not self.device:
            raise ValueError(f"device must be a string such as 'auto', 'cpu' or 'cuda', got {self.device!r}")

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["betas"] = list(self.betas)
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "TrainConfig":
        """Inverse of `to_dict`; unknown keys raise ValueError naming them."""
        return cls(**_known_keys(cls, data))


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Everything that determines a training run: data source, model and training recipe."""

    source: SourceConfig
    model: ModelConfig
    train: TrainConfig

    def __post_init__(self) -> None:
        for name, kind in (("source", SourceConfig), ("model", ModelConfig), ("train", TrainConfig)):
            if not isinstance(getattr(self, name), kind):
                raise ValueError(f"{name} must be a {kind.__name__}, got {type(getattr(self, name)).__name__}")
        if self.source.vocab_size != self.model.d_vocab:
            raise ValueError(
                f"vocab mismatch: the source emits {self.source.vocab_size} states but the model has "
                f"d_vocab={self.model.d_vocab}"
            )
        if self.train.seq_len > self.model.n_ctx:
            raise ValueError(
                f"seq_len={self.train.seq_len} exceeds the model's n_ctx={self.model.n_ctx}"
            )

    def to_dict(self) -> dict:
        return {"source": self.source.to_dict(), "model": self.model.to_dict(), "train": self.train.to_dict()}

    @classmethod
    def from_dict(cls, data: dict) -> "RunConfig":
        """Inverse of `to_dict`; unknown keys (at any level) raise ValueError naming them."""
        data = _known_keys(cls, data)
        for name in ("source", "model", "train"):
            if name not in data:
                raise ValueError(f"run config lacks {name!r}")
        return cls(
            source=SourceConfig.from_dict(data["source"]),
            model=ModelConfig.from_dict(data["model"]),
            train=TrainConfig.from_dict(data["train"]),
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, indent=2)

    @classmethod
    def from_json(cls, text: str) -> "RunConfig":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"run config is not valid JSON: {err}") from None
        return cls.from_dict(data)


def _known_keys(cls: type, data: Any) -> dict:
    if not isinstance(data, dict):
        raise ValueError(f"{cls.__name__} must be given a dict, got {type(data).__name__}")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} keys {unknown}; valid keys are {sorted(known)}")
    return dict(data)


@dataclasses.dataclass
class TrainResult:
    """What `train` returns: the hooked model, the metrics rows, the final evaluation and the run folder."""

    model: Any  # transformer_lens TransformerBridge (with .markov_config)
    metrics: list  # rows as written to metrics.jsonl
    final: dict  # {"step", "eval_loss", "entropy_rate", "unigram_loss", ("bayes_loss")}
    config: RunConfig
    out_dir: Optional[Path] = None
    resumed_from: Optional[int] = None  # checkpoint step the run resumed from, None if fresh
    already_done: bool = False  # True when a finished run folder was loaded instead of trained
    failed: Optional[str] = None  # train_many: why a stack member was stopped (it diverged), None if it finished


# ---------------------------------------------------------------------------------------------- schedule
def one_cycle_lr(step: int, *, total: int, lr: float, warmup_frac: float = 0.02, start_div: float = 100.0,
                 final_div: float = 5.0) -> float:
    """Learning rate at 0-based `step` of the one-cycle schedule: cosine from lr/start_div up to lr over
    the first warmup_frac of `total` steps, then cosine down to lr/final_div at the last step: the values of
    torch's `OneCycleLR(max_lr=lr, total_steps=total, pct_start=warmup_frac, div_factor=start_div,
    final_div_factor=final_div / start_div)` (the reference code's schedule, 2e-5 -> 2e-3 -> 4e-4)."""
    initial, final = lr / start_div, lr / final_div
    warm_end = float(warmup_frac * total) - 1
    last = total - 1

    def cos(start: float, end: float, pct: float) -> float:
        return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)

    if step <= warm_end:
        return cos(initial, lr, step / warm_end) if warm_end > 0 else lr
    if last <= warm_end:
        return lr
    return cos(lr, final, (step - warm_end) / (last - warm_end))


def _lr_at(cfg: TrainConfig, step: int) -> float:
    if cfg.schedule == "constant":
        return cfg.lr
    return one_cycle_lr(step, total=cfg.steps, lr=cfg.lr, warmup_frac=cfg.warmup_frac)


def checkpoint_steps(steps: int, n: int) -> list[int]:
    """`n` log-spaced steps in [1, steps] (rounded, distinct), always including `steps`; [] when n == 0."""
    if n <= 0:
        return []
    if n == 1 or steps == 1:
        return [steps]
    out = {max(1, min(steps, round(math.exp(math.log(steps) * i / (n - 1))))) for i in range(n)}
    out.add(steps)
    return sorted(out)


# --------------------------------------------------------------------------------------------- utilities
def resolve_device(device: str) -> torch.device:
    """"auto" -> cuda when available, else cpu; anything else as given (errors if unavailable)."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as err:
        raise ValueError(f"device {device!r} is not a valid torch device: {err}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available")
    return dev


def _derive_seed(seed: int, stream: str) -> int:
    digest = hashlib.sha256(f"markov-interp:{seed}:{stream}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _write_metrics(path: Path, rows: list[dict]) -> None:
    atomic_write(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows).encode())


def load_metrics(run_dir: "str | os.PathLike") -> list[dict]:
    """The rows of a run folder's metrics.jsonl (an unreadable trailing line raises ValueError)."""
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return []
    rows = []
    for i, line in enumerate(path.read_text().splitlines()):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path} line {i + 1} is not JSON: {err}") from None
    return rows


def _decay_groups(model: Any, weight_decay: float) -> list[dict]:
    """Linear weights decay; embeddings (tied or not), positions, LayerNorm and biases do not."""
    fp = models.fast_params(model)
    decay_ids = set()
    for entry in fp.blocks:
        for module in (entry[1], entry[2], entry[3], entry[4], entry[6], entry[7]):
            if module is not None:
                decay_ids.add(id(module.weight))
    if not fp.cfg.tie_weights:
        decay_ids.add(id(fp.head.weight))
    params = list(model.parameters())
    decay = [p for p in params if id(p) in decay_ids]
    no_decay = [p for p in params if id(p) not in decay_ids]
    assert len(decay) + len(no_decay) == len(params)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _make_optimizer(model: Any, cfg: TrainConfig) -> torch.optim.Optimizer:
    groups = _decay_groups(model, cfg.weight_decay)
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, foreach=True)
    return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, foreach=True)


def _loss(logits: Float[Tensor, "batch pos vocab"], targets: Int[Tensor, "batch pos"]) -> Tensor:
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


@torch.no_grad()
def evaluate(model: Any, source: Any, *, seq_len: int, batch_size: int, n_batches: int,
             generator: torch.Generator, precision: str = "fp32") -> float:
    """Mean next-state cross-entropy (nats) of `model` on `n_batches` fresh batches of `seq_len` inputs
    (every position a target): comparable with `theory.reference_losses(source, seq_len + 1)`."""
    fp = models.fast_params(model)
    device = generator.device
    total = 0.0
    for _ in range(n_batches):
        tokens = source.sample(batch_size, seq_len + 1, generator=generator)
        with _autocast(device, precision):
            logits = models.fast_forward(fp, tokens[:, :-1])
        total += _loss(logits, tokens[:, 1:]).item()
    return total / n_batches


def _autocast(device: torch.device, precision: str) -> Any:
    dtype = _PRECISIONS[precision]
    return torch.autocast(device_type=device.type, dtype=dtype, enabled=dtype is not None)


# ------------------------------------------------------------------------------------------- run folder
def _config_diff(a: dict, b: dict, prefix: str = "") -> list[str]:
    diffs = []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key, "<absent>"), b.get(key, "<absent>")
        if isinstance(va, dict) and isinstance(vb, dict):
            diffs += _config_diff(va, vb, f"{prefix}{key}.")
        elif va != vb:
            diffs.append(f"{prefix}{key}: {va!r} in folder vs {vb!r} requested")
    return diffs


def _comparable(run: RunConfig) -> dict:
    data = run.to_dict()
    data["train"].pop("device")  # where a run executes does not change what it is
    return data


def _prepare_folder(out_dir: Path, run: RunConfig) -> None:
    config_path = out_dir / CONFIG_FILE
    if config_path.exists():
        try:
            saved = RunConfig.from_json(config_path.read_text())
        except ValueError as err:
            raise ValueError(f"{config_path} is not a valid run config: {err}") from None
        diffs = _config_diff(_comparable(saved), _comparable(run))
        if diffs:
            raise ValueError(
                f"{out_dir} holds a run with a different config; refusing to overwrite it. Differences: "
                + "; ".join(diffs)
            )
        return
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ValueError(f"{out_dir} is not empty and has no {CONFIG_FILE}; refusing to write a run into it")
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(config_path, run.to_json().encode())


def _checkpoint_paths(out_dir: Path, step: int) -> tuple[Path, Path]:
    base = out_dir / CHECKPOINT_DIR / f"step_{step:07d}"
    return base.with_suffix(".safetensors"), base.with_suffix(".pt")


def list_checkpoints(run_dir: "str | os.PathLike") -> list[tuple[int, Path]]:
    """(step, weights file) of every complete checkpoint in a run folder (weights and training state), by step.

    The checkpoints sit at log-spaced steps, for studying the training dynamics (probe each one).
    """
    folder = Path(run_dir) / CHECKPOINT_DIR
    found = []
    for path in folder.glob("step_*.pt") if folder.is_dir() else ():
        step_text = path.stem.split("_", 1)[1]
        if step_text.isdigit():
            weights, _ = _checkpoint_paths(Path(run_dir), int(step_text))
            if weights.exists():
                found.append((int(step_text), weights))
    return sorted(found)


def _newest_checkpoint(out_dir: Path) -> Optional[int]:
    found = list_checkpoints(out_dir)
    return found[-1][0] if found else None


def _save_checkpoint(out_dir: Path, step: int, model: Any, state: dict) -> None:
    weights, extra = _checkpoint_paths(out_dir, step)
    weights.parent.mkdir(exist_ok=True)
    models.save(model, weights)
    with atomic_path(extra) as tmp:
        torch.save(state, tmp)


def _load_checkpoint(out_dir: Path, step: int, model: Any) -> dict:
    weights, extra = _checkpoint_paths(out_dir, step)
    _, state = models.read_weights(weights)
    models.load_weights_into(model, state, source=str(weights))
    try:
        return torch.load(extra, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types on corrupt / truncated files
        raise ValueError(f"checkpoint {extra} is unreadable ({type(err).__name__}: {err})") from None


# ------------------------------------------------------------------------------------------------- train
def train(run: RunConfig, out_dir: "str | os.PathLike | None" = None, *, progress: bool = True) -> TrainResult:
    """Train `run.model` on fresh batches of `run.source` with `run.train`'s recipe; returns the hooked model.

    Each step draws `batch_size` sequences of `seq_len + 1` states from a generator seeded by `seed`; the
    loss is the mean next-state cross-entropy over all positions (nats). Evaluation uses fresh batches from a
    separate generator and is logged beside `theory.reference_losses`: the entropy rate (the bigram / k-gram
    optimum the paper's models should reach) and the unigram loss (the stationary-law plateau of the tied
    one-layer model), or for random kernels the in-context Bayes loss. With `out_dir`, writes / resumes a run
    folder (see the module docstring); without, trains in memory. No output besides the tqdm bar.
    """
    if not isinstance(run, RunConfig):
        raise ValueError(f"run must be a RunConfig, got {type(run).__name__}")
    tc = run.train
    device = resolve_device(tc.device)
    out = Path(out_dir) if out_dir is not None else None
    if out is not None:
        _prepare_folder(out, run)
        if (out / models.WEIGHTS_FILE).exists():
            return _finished(out, run, device)

    source = run.source.build()
    # rounded: the last bits of theory's linear algebra vary between calls; rows must compare exactly
    references = {k: round(float(v), 12) for k, v in theory.reference_losses(source, tc.seq_len + 1).items()}
    model = models.build(run.model, seed=tc.seed, device=device)
    model.train()
    optimizer = _make_optimizer(model, tc)
    scaler = torch.amp.GradScaler(device.type, enabled=tc.loss_scaling)
    train_gen = torch.Generator(device=device).manual_seed(_derive_seed(tc.seed, "train-data"))
    eval_gen = torch.Generator(device=device).manual_seed(_derive_seed(tc.seed, "eval-data"))
    rows: list[dict] = []
    pending: list[Tensor] = []  # train losses since the last metrics row
    start = 0
    resumed_from = None
    if out is not None:
        newest = _newest_checkpoint(out)
        if newest is not None:
            state = _load_checkpoint(out, newest, model)
            optimizer.load_state_dict(state["optimizer"])
            scaler.load_state_dict(state["scaler"])
            train_gen.set_state(state["train_generator"])
            eval_gen.set_state(state["eval_generator"])
            start = resumed_from = newest
            pending = [t.to(device) for t in state["pending_losses"].unbind()]
            rows = [r for r in load_metrics(out) if r["step"] <= newest]
            _write_metrics(out / METRICS_FILE, rows)
        elif (out / METRICS_FILE).exists():
            _write_metrics(out / METRICS_FILE, [])

    fp = models.fast_params(model)
    ckpt_steps = set(checkpoint_steps(tc.steps, tc.n_checkpoints))
    bar = tqdm(total=tc.steps, initial=start, disable=not progress, desc="train", unit="step", dynamic_ncols=True)
    try:
        for step in range(start + 1, tc.steps + 1):
            lr = _lr_at(tc, step - 1)
            for group in optimizer.param_groups:
                group["lr"] = lr
            tokens = source.sample(tc.batch_size, tc.seq_len + 1, generator=train_gen)
            with _autocast(device, tc.precision):
                logits = models.fast_forward(fp, tokens[:, :-1])
            loss = _loss(logits, tokens[:, 1:])
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            if tc.grad_clip is not None:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
            scaler.step(optimizer)
            scaler.update()
            pending.append(loss.detach())
            bar.update(1)

            is_eval = step == tc.steps or (tc.eval_every > 0 and step % tc.eval_every == 0)
            if step % tc.log_every == 0 or is_eval or step == tc.steps:
                row = {"step": step, "lr": lr, "train_loss": torch.stack(pending).float().mean().item()}
                pending = []
                if is_eval:
                    model.eval()
                    row["eval_loss"] = evaluate(model, source, seq_len=tc.seq_len, batch_size=tc.batch_size,
                                                n_batches=tc.eval_batches, generator=eval_gen,
                                                precision=tc.precision)
                    model.train()
                    row.update(references)
                rows.append(row)
                bar.set_postfix(loss=f"{row['train_loss']:.4f}", refresh=False)
                if out is not None:
                    _write_metrics(out / METRICS_FILE, rows)
            if out is not None and step in ckpt_steps:
                _save_checkpoint(out, step, model, {
                    "step": step,
                    "optimizer": optimizer.state_dict(),
                    "scaler": scaler.state_dict(),
                    "train_generator": train_gen.get_state(),
                    "eval_generator": eval_gen.get_state(),
                    "pending_losses": torch.stack(pending).cpu() if pending else torch.zeros(0),
                })
    finally:
        bar.close()

    models.check_tied(model)
    model.eval()
    if out is not None:
        models.save(model, out)
    final = _final(rows, references)
    return TrainResult(model=model, metrics=rows, final=final, config=run, out_dir=out, resumed_from=resumed_from)


def train_many(runs: "list[RunConfig]", out_dirs: "Optional[list[str | os.PathLike]]" = None, *,
               progress: bool = True) -> list[TrainResult]:
    """Train compatible runs (same shapes; they may differ in seed, source parameters, init options, lr and
    weight decay) as one stacked model, each member equal to its solo `train(run)` up to float rounding and
    writing a normal run folder; a member that diverges is recorded (`TrainResult.failed`) and frozen while
    the others finish. Incompatible runs raise ValueError naming the field. See `markov_interp.stacked_training`.
    """
    from markov_interp.stacked_training import train_many as _train_many

    return _train_many(runs, out_dirs, progress=progress)


def _final(rows: list[dict], references: dict) -> dict:
    last = [r for r in rows if "eval_loss" in r]
    assert last, "training always evaluates at its last step"
    return {"step": last[-1]["step"], "eval_loss": last[-1]["eval_loss"], **references}


def _finished(out: Path, run: RunConfig, device: torch.device) -> TrainResult:
    model = models.load(out, device=device, expect=run.model)
    rows = load_metrics(out)
    evals = [r for r in rows if "eval_loss" in r]
    if not evals or evals[-1]["step"] != run.train.steps:
        raise ValueError(f"{out} has final weights but its {METRICS_FILE} does not end at step {run.train.steps}")
    references = {k: v for k, v in evals[-1].items() if k not in ("step", "lr", "train_loss", "eval_loss")}
    return TrainResult(model=model, metrics=rows, final=_final(rows, references), config=run, out_dir=out,
                       already_done=True)
