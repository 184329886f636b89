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

Configs (`TrainConfig`, `RunConfig`) derive from `config.Config` (sorted JSON, unknown keys refused). Options are
named by dotted keys "section.field" (`split_key`, the one parser, shared with sweep specs and `--set`):
`build_run(sections, overrides)` builds a run from section tables, `default_run(source, **overrides)` holds the
source-dependent defaults of `markov-interp train`, and `override_run(run, overrides)` sets options of a complete
run. `train` returns a `TrainResult` whose `final` is typed (`FinalLosses`).
"""

import dataclasses
import hashlib
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Optional

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from markov_interp._io import atomic_path, atomic_write
from markov_interp import intervene, models, runfolder, theory
from markov_interp.config import Config, check_bool, check_choice, check_int, check_number
from markov_interp.data import Source, SourceConfig
from markov_interp.models import ModelConfig
from markov_interp.runfolder import RunFolderBusy, RunFolderError, TrainingDiverged

if TYPE_CHECKING:
    from transformer_lens.model_bridge import TransformerBridge
else:  # transformer_lens takes seconds to import; `markov-interp train` never needs it (see models.py)
    TransformerBridge = Any

__all__ = [
    "TrainConfig",
    "RunConfig",
    "TrainResult",
    "FinalLosses",
    "default_run",
    "build_run",
    "override_run",
    "split_key",
    "run_options",
    "train",
    "TrainingDiverged",
    "RunFolderBusy",
    "RunFolderError",
    "train_many",
    "one_cycle_lr",
    "checkpoint_steps",
    "evaluation_steps",
    "evaluate",
    "evaluate_paired",
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
class TrainConfig(Config):
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
    eval_log_points: int = 0  # extra evaluations at log-spaced steps (dense early, where plateaus are left)
    n_checkpoints: int = 8  # checkpoints at log-spaced steps (the last step always included); 0: none
    interventions: tuple | list = ()  # freezes and clamps during training (`intervene.Freeze` / `Clamp`)

    # Fields added after run folders and sweep ids were first written: left out of config.json (and so of cell
    # ids) at these values, so earlier files round-trip byte for byte and earlier sweeps keep their cells.
    _LATER_FIELDS: ClassVar[dict] = {"eval_log_points": 0, "interventions": ()}

    def __post_init__(self) -> None:
        for name, minimum in (("steps", 1), ("batch_size", 1), ("seq_len", 1), ("log_every", 1),
                              ("eval_every", 0), ("eval_batches", 1), ("eval_log_points", 0), ("n_checkpoints", 0),
                              ("seed", 0)):
            check_int(name, getattr(self, name), minimum=minimum)
        for name in ("lr", "weight_decay", "momentum", "warmup_frac"):
            check_number(name, getattr(self, name), minimum=0)
        check_number("lr", self.lr, positive=True)
        if not 0 <= self.warmup_frac < 1:
            raise ValueError(f"warmup_frac must be in [0, 1), got {self.warmup_frac}")
        betas = tuple(self.betas) if isinstance(self.betas, (list, tuple)) else self.betas
        ok = isinstance(betas, tuple) and len(betas) == 2
        if not (ok and all(isinstance(b, (int, float)) and 0 <= b < 1 for b in betas)):
            raise ValueError(f"betas must be two numbers in [0, 1), got {self.betas!r}")
        object.__setattr__(self, "betas", tuple(float(b) for b in betas))
        check_choice("optimizer", self.optimizer, ("adamw", "sgd"))
        check_choice("schedule", self.schedule, ("one-cycle", "constant"))
        check_choice("precision", self.precision, tuple(_PRECISIONS))
        check_bool("loss_scaling", self.loss_scaling)
        if self.loss_scaling and self.precision != "fp16":
            raise ValueError(f"loss_scaling=True only applies to precision='fp16', got precision={self.precision!r}")
        if self.grad_clip is not None:
            check_number("grad_clip", self.grad_clip, positive=True)
        if not isinstance(self.device, str) or not self.device:
            raise ValueError(f"device must be a string such as 'auto', 'cpu' or 'cuda', got {self.device!r}")
        object.__setattr__(self, "interventions", intervene.parse_interventions(self.interventions))


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunConfig(Config):
    """Everything that determines a training run: data source, model and training recipe.

    Its JSON (`to_json`, what a run folder's config.json holds) reproduces the run bit for bit: `train(
    RunConfig.from_json(text))` retrains the same weights.
    """

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
        intervene.check_interventions(self.train.interventions, self.model, files=False)

    def to_json(self, *, indent: Optional[int] = 2) -> str:
        """Sorted JSON, indented (the form of a run folder's config.json)."""
        return super().to_json(indent=indent)


# ------------------------------------------------------------------------------------ dotted options
_SECTIONS: dict[str, type] = {"source": SourceConfig, "model": ModelConfig, "train": TrainConfig}
# The CLI's default source of each kind (what `default_run` starts from when given no source).
_SOURCE_DEFAULTS: dict[str, dict] = {"binary": {"p": 0.2, "q": 0.3}, "markov": {}, "random": {"vocab": 2}}


def run_options() -> dict[str, list[str]]:
    """The options a dotted key "section.field" may name, per section ("model" also takes "preset")."""
    out = {name: sorted(f.name for f in dataclasses.fields(cls)) for name, cls in _SECTIONS.items()}
    out["model"] = sorted(out["model"] + ["preset"])
    return out


_OWNER = {field: section for section, fields in run_options().items() for field in fields}
assert len(_OWNER) == sum(len(v) for v in run_options().values()), "option names must be unique across sections"


def split_key(key: Any, *, where: str = "options") -> tuple[str, str]:
    """("section", "field") of a dotted key such as "train.lr" after checking it names an option; otherwise a
    one-line ValueError naming `where`, the key and the valid options. The one parser of dotted keys: sweep
    specs, `--set` and `build_run` all use it."""
    sections = list(_SECTIONS)
    if not isinstance(key, str) or key.count(".") != 1:
        raise ValueError(
            f"{where}: key {key!r} must be 'section.field' with section one of {sections} "
            "(e.g. 'source.p', 'model.n_layers', 'train.lr')"
        )
    section, field = key.split(".")
    if section not in _SECTIONS:
        raise ValueError(f"{where}: key {key!r} has unknown section {section!r}; expected one of {sections}")
    valid = run_options()[section]
    if field not in valid:
        raise ValueError(f"{where}: key {key!r} names no {section} option; valid {section} options are {valid}")
    return section, field


def build_run(sections: Mapping[str, Any], overrides: Optional[Mapping[str, Any]] = None, *,
              where: str = "overrides") -> RunConfig:
    """A validated `RunConfig` from section tables (`{"source": {...}, "model": {...}, "train": {...}}`, each
    optional and partial) with dotted `overrides` ("train.lr": 0.01, ...) set on top.

    The model section may name a `preset` (its other keys override the preset's fields; d_head / d_mlp
    follow d_model unless given); `d_vocab` follows the source unless given. A missing source section is
    the binary chain p=0.2, q=0.3. Options not given take the configs' defaults. Sweep cells and the CLI
    both build their runs here.
    """
    if not isinstance(sections, Mapping):
        raise ValueError(f"{where}: expected a table of sections {list(_SECTIONS)}, got {sections!r}")
    unknown = sorted(set(sections) - set(_SECTIONS))
    if unknown:
        raise ValueError(f"{where}: unknown sections {unknown}; expected some of {list(_SECTIONS)}")
    merged = {}
    for name in _SECTIONS:
        table = sections.get(name) or {}
        if not isinstance(table, Mapping):
            raise ValueError(f"{where}: {name} must be a table of options, got {table!r}")
        merged[name] = dict(table)
    for key, value in (overrides or {}).items():
        section, field = split_key(key, where=where)
        merged[section][field] = value
    source = (SourceConfig.from_dict(merged["source"], where="source") if merged["source"]
              else SourceConfig(kind="binary", **_SOURCE_DEFAULTS["binary"]))
    model_opts = merged["model"]
    model_opts.setdefault("d_vocab", source.vocab_size)
    name = model_opts.pop("preset", None)
    model = models.preset(name, **model_opts) if name is not None else ModelConfig.from_dict(model_opts, where="model")
    return RunConfig(source=source, model=model, train=TrainConfig.from_dict(merged["train"], where="train"))


def _dotted(overrides: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Keys as "section.field"; a bare field name is put in the one section that has it."""
    out = {}
    for key, value in overrides.items():
        if isinstance(key, str) and "." not in key:
            if key not in _OWNER:
                raise ValueError(f"{where}: {key!r} names no option; valid options are {sorted(_OWNER)}")
            key = f"{_OWNER[key]}.{key}"
        out[key] = value
    return out


def default_run(source: Optional[SourceConfig] = None, **overrides: Any) -> RunConfig:
    """The run `markov-interp train` makes, with its source-dependent defaults; the CLI calls this too.

    Fixed kernels (binary, markov): the paper's one-layer model (`preset("paper-1layer")`), 300 steps at lr
    2e-3 (the paper's); random kernels: `preset("attn-only-2layer")`, 1000 steps at lr 1e-2 (the two-layer
    attention-only model then reaches the in-context Bayes loss within ~1000 steps). Everything else takes
    the configs' defaults. `overrides` are options as bare field names (`steps=500`, `n_layers=2`,
    `preset="paper-2layer"`, `kind="random"`) or dotted keys (`**{"train.lr": 0.01}`); source options apply to
    `source`, or without one to the default source of their kind (binary p=0.2, q=0.3; random on 2 states).

    >>> default_run(kind="random", vocab=3).model.d_vocab, default_run().train.steps
    (3, 300)
    """
    where = "default_run"
    overrides = _dotted(overrides, where)
    source_opts = {k.split(".")[1]: v for k, v in overrides.items() if split_key(k, where=where)[0] == "source"}
    rest = {k: v for k, v in overrides.items() if not k.startswith("source.")}
    if source is not None and not isinstance(source, SourceConfig):
        raise ValueError(f"source must be a SourceConfig, got {type(source).__name__}")
    if source is None:
        kind = source_opts.get("kind", "binary")
        base = {"kind": kind, **_SOURCE_DEFAULTS.get(kind, {})}
    else:
        base = source.to_dict()
    source = SourceConfig.from_dict({**base, **source_opts}, where="source")
    random = source.kind == "random"
    sections = {
        "source": source.to_dict(),
        "model": {"preset": "attn-only-2layer" if random else "paper-1layer"},
        "train": {"steps": 1000 if random else 300, "lr": 1e-2 if random else 2e-3},
    }
    return build_run(sections, rest, where=where)


def override_run(run: RunConfig, overrides: Mapping[str, Any], *, where: str = "overrides") -> RunConfig:
    """`run` with dotted `overrides` set (e.g. {"train.lr": 0.01}), through `build_run`.

    Sizes that `run` derives keep following what they derive from, as in `ModelConfig.replace`: d_head and
    d_mlp when they hold their defaults (so `model.n_heads=2` halves d_head), d_vocab the source. With no
    overrides the run comes back unchanged (`markov-interp train --config RUN/config.json` retrains RUN bit for
    bit). `model.preset` is refused: `run` states every model field, so set those instead.
    """
    if not isinstance(run, RunConfig):
        raise ValueError(f"run must be a RunConfig, got {type(run).__name__}")
    overrides = _dotted(overrides, where)
    if "model.preset" in overrides:
        raise ValueError(f"{where}: 'model.preset' cannot change a complete run config; set model fields instead")
    sections = run.to_dict()
    model, derived = sections["model"], run.model
    if derived.d_head * derived.n_heads == derived.d_model:
        del model["d_head"]
    if derived.d_mlp == 4 * derived.d_model:
        del model["d_mlp"]
    del model["d_vocab"]  # a valid run's d_vocab is its source's vocabulary
    return build_run(sections, overrides, where=where)


@dataclasses.dataclass(frozen=True, kw_only=True)
class FinalLosses:
    """The end of a run: its last evaluation beside the `theory` reference losses at the training length."""

    step: int  # the last step (training always evaluates there)
    eval_loss: float  # mean next-state cross-entropy on fresh evaluation batches (nats)
    train_loss: float  # mean training loss of the last metrics row (nats)
    references: dict[str, float]  # theory.reference_losses(source, seq_len + 1), rounded to 12 digits

    @property
    def entropy_rate(self) -> float:
        """Loss of the true kernel (for random kernels: of an oracle knowing each sequence's kernel)."""
        return self.references["entropy_rate"]

    @property
    def unigram_loss(self) -> float:
        """The plateau: H(pi) for fixed kernels; for random kernels the in-context unigram estimator's loss."""
        return self.references["unigram_loss"]

    @property
    def bayes_loss(self) -> Optional[float]:
        """The in-context Bayes loss (random kernels only; None for fixed kernels)."""
        return self.references.get("bayes_loss")

    @property
    def optimum(self) -> float:
        """The best loss a model can reach: the in-context Bayes loss for random kernels, else the entropy rate."""
        return self.bayes_loss if self.bayes_loss is not None else self.entropy_rate

    @property
    def excess_loss(self) -> float:
        """eval_loss - optimum (nats)."""
        return self.eval_loss - self.optimum


@dataclasses.dataclass
class TrainResult:
    """What `train` returns: the hooked model, the metrics rows, the final evaluation and the run folder."""

    model: TransformerBridge  # with .markov_config
    metrics: list[dict]  # rows as written to metrics.jsonl
    final: FinalLosses
    config: RunConfig
    out_dir: Optional[Path] = None
    resumed_from: Optional[int] = None  # checkpoint step the run resumed from, None if fresh
    already_done: bool = False  # True when a finished run folder was loaded instead of trained
    failed: Optional[str] = None  # train_many: why a stack member was stopped (it diverged), None if it finished

    def __post_init__(self) -> None:  # the probes default to the training length (probes._common.probe_length)
        if self.model is not None:
            self.model.markov_train_seq_len = self.config.train.seq_len


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


def evaluation_steps(tc: TrainConfig) -> frozenset[int]:
    """The steps at which a run evaluates: every `eval_every`-th step, `eval_log_points` log-spaced steps (a
    cadence plus density early on, where escape times are measured) and always the last step.

    >>> sorted(evaluation_steps(TrainConfig(steps=100, eval_every=50, eval_log_points=4)))
    [1, 5, 22, 50, 100]
    """
    every = range(tc.eval_every, tc.steps + 1, tc.eval_every) if tc.eval_every > 0 else ()
    return frozenset({tc.steps, *every, *checkpoint_steps(tc.steps, tc.eval_log_points)})


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


def _decay_groups(model: TransformerBridge, weight_decay: float) -> list[dict]:
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


def _make_optimizer(model: TransformerBridge, cfg: TrainConfig) -> torch.optim.Optimizer:
    groups = _decay_groups(model, cfg.weight_decay)
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, foreach=True)
    return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, foreach=True)


def _loss(logits: Float[Tensor, "batch pos vocab"], targets: Int[Tensor, "batch pos"]) -> Tensor:
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


@torch.no_grad()
def evaluate(model: TransformerBridge, source: Source, *, seq_len: int, batch_size: int, n_batches: int,
             generator: torch.Generator, precision: str = "fp32", interventions: Optional[dict] = None) -> float:
    """Mean next-state cross-entropy (nats) of `model` on `n_batches` fresh batches of `seq_len` inputs
    (every position a target): comparable with `theory.reference_losses(source, seq_len + 1)`."""
    return evaluate_paired(model, source, seq_len=seq_len, batch_size=batch_size, n_batches=n_batches,
                           generator=generator, precision=precision, interventions=interventions)["eval_loss"]


@torch.no_grad()
def evaluate_paired(model: TransformerBridge, source: Source, *, seq_len: int, batch_size: int, n_batches: int,
                    generator: torch.Generator, precision: str = "fp32",
                    interventions: Optional[dict] = None) -> dict[str, float]:
    """`evaluate`'s loss ("eval_loss") beside the losses of the true predictor ("eval_true_loss") and of the
    plateau predictor ("eval_plateau_loss", `theory.plateau_predictions`) on the *same* evaluation tokens: the
    model's paired excess is eval_loss - eval_true_loss, the plateau's eval_plateau_loss - eval_true_loss
    (`dynamics.escape_time`). `interventions`: `{hook name: fn}` clamps for the model's forward
    (`intervene.clamp_hooks` with update=False: evaluations never move running means)."""
    fp = models.fast_params(model)
    device = generator.device
    totals = [0.0, 0.0, 0.0]
    for _ in range(n_batches):
        tokens = source.sample(batch_size, seq_len + 1, generator=generator)
        with _autocast(device, precision):
            logits = models.fast_forward(fp, tokens[:, :-1], interventions)
        for i, value in enumerate((_loss(logits, tokens[:, 1:]).item(), *theory.paired_losses(source, tokens))):
            totals[i] += value
    return paired_row(totals, n_batches)


def paired_row(totals: list[float], n_batches: int) -> dict[str, float]:
    """The evaluation columns of a metrics row from summed (model, true, plateau) batch losses."""
    return {key: total / n_batches for key, total in zip(PAIRED_KEYS, totals)}


PAIRED_KEYS = ("eval_loss", "eval_true_loss", "eval_plateau_loss")


def references_of(row: Mapping[str, Any]) -> dict[str, float]:
    """The `theory` reference losses logged in an evaluation row (everything but the step, lr and losses)."""
    return {k: v for k, v in row.items() if k not in ("step", "lr", "train_loss", *PAIRED_KEYS)}


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
    if out_dir.exists() and any(p.name not in runfolder.OWN_FILES for p in out_dir.iterdir()):
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


def _save_checkpoint(out_dir: Path, step: int, model: TransformerBridge, state: dict) -> None:
    weights, extra = _checkpoint_paths(out_dir, step)
    weights.parent.mkdir(exist_ok=True)
    models.save(model, weights)
    with atomic_path(extra) as tmp:
        torch.save(state, tmp)


def _load_checkpoint(out_dir: Path, step: int, model: TransformerBridge) -> dict:
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

    Faults: the folder is locked while this runs (`runfolder.lock`; a second writer gets `RunFolderBusy` at
    once) and stale temporary files of killed writes are removed first; a resume checks that metrics.jsonl
    reaches its checkpoint (`runfolder.resume_step`). At the first non-finite loss (or weights) training stops,
    the run is recorded as diverged (a metrics row and status.json; checkpoints up to then are kept) and
    `TrainingDiverged` is raised, again at once on any later call for that folder.

    Interventions (`run.train.interventions`, see `markov_interp.intervene`): the update t -> t + 1 runs with
    the freezes and clamps active at t, the evaluation at step t with the clamps active at t (running means
    are not updated by evaluations), so the final losses are those measured with the interventions active at
    the last step. Running means are checkpointed ("clamp_state"); a resume is bit-identical.
    """
    if not isinstance(run, RunConfig):
        raise ValueError(f"run must be a RunConfig, got {type(run).__name__}")
    if out_dir is None:
        return _train(run, None, progress)
    out = runfolder.check_writable_dir(out_dir, "run folder")
    with runfolder.lock(out):
        runfolder.remove_stale_tmp(out)
        return _train(run, out, progress)


def _train(run: RunConfig, out: Optional[Path], progress: bool) -> TrainResult:
    """`train`'s work: `out` is a run folder whose lock the caller holds, or None (in memory)."""
    tc = run.train
    device = resolve_device(tc.device)
    if out is not None:
        _prepare_folder(out, run)
        status = runfolder.divergence(out)
        if status is not None:
            raise TrainingDiverged(runfolder.diverged_message(out, status), step=status.get("step"), run_dir=out,
                                   checkpoint=status.get("last_finite_checkpoint"))
        if (out / models.WEIGHTS_FILE).exists():
            done = _finished(out, run, device)  # None when its metrics are incomplete: the resume repairs them
            if done is not None:
                return done

    intervene.check_interventions(tc.interventions, run.model)  # tensor files too, before any step
    source = run.source.build()
    # rounded: the last bits of theory's linear algebra vary between calls; rows must compare exactly
    references = theory.reference_losses(source, tc.seq_len + 1).as_row(digits=12)
    # the plain native module (no hooks, no transformer_lens); the hooked model is built from it at the end
    model = models.native_module(run.model, models.initial_state(run.model, tc.seed), device=device)
    clamps = intervene.ClampState()
    optimizer = _make_optimizer(model, tc)
    scaler = torch.amp.GradScaler(device.type, enabled=tc.loss_scaling)
    train_gen = torch.Generator(device=device).manual_seed(_derive_seed(tc.seed, "train-data"))
    eval_gen = torch.Generator(device=device).manual_seed(_derive_seed(tc.seed, "eval-data"))
    rows: list[dict] = []
    pending: list[Tensor] = []  # train losses since the last metrics row
    resumed_from = None
    if out is not None:
        resumed_from, rows, pending = _resume(out, tc, model, optimizer, scaler, (train_gen, eval_gen), clamps)
    start = resumed_from or 0

    fp = models.fast_params(model)
    # the parameters by state-dict name, once (freezes name them; building the dict each step costs ~0.6 ms)
    freezes = any(isinstance(i, intervene.Freeze) for i in tc.interventions)
    params = models.disk_parameters(model) if freezes else {}
    ckpt_steps = set(checkpoint_steps(tc.steps, tc.n_checkpoints))
    eval_steps = evaluation_steps(tc)
    bar = tqdm(total=tc.steps, initial=start, disable=not progress, desc="train", unit="step", dynamic_ncols=True)
    try:
        for step in range(start + 1, tc.steps + 1):
            lr = _lr_at(tc, step - 1)
            hooks, frozen = _interventions_at(run, params, clamps, step - 1, update=True)
            pending.append(_step(model, fp, optimizer, scaler, source, tc, train_gen, lr, hooks, frozen))
            bar.update(1)

            is_eval = step in eval_steps
            if step % tc.log_every == 0 or is_eval or step == tc.steps:
                hooks = _interventions_at(run, params, clamps, step, update=False)[0] if is_eval else None
                row = _metrics_row(out, rows, step, lr, pending, model, source, tc, eval_gen if is_eval else None,
                                   hooks)
                pending = []
                if is_eval:
                    row.update(references)
                rows.append(row)
                bar.set_postfix(loss=f"{row['train_loss']:.4f}", refresh=False)
                if out is not None:
                    _write_metrics(out / METRICS_FILE, rows)
            if out is not None and step in ckpt_steps:
                _check_finite(out, rows, step, model, pending)  # a checkpoint is only ever finite
                _save_checkpoint(out, step, model, {
                    "step": step,
                    "optimizer": optimizer.state_dict(),
                    "scaler": scaler.state_dict(),
                    "train_generator": train_gen.get_state(),
                    "eval_generator": eval_gen.get_state(),
                    "pending_losses": torch.stack(pending).cpu() if pending else torch.zeros(0),
                    **({"clamp_state": clamps.state_dict()} if tc.interventions else {}),
                })
    finally:
        bar.close()

    models.check_tied(model)
    _check_finite(out, rows, tc.steps, model, [])
    if out is not None:
        models.save(model, out)
    hooked = models.hooked_model(run.model, models.state_dict_for_save(model), device=device)
    final = _final(rows, references)
    return TrainResult(model=hooked, metrics=rows, final=final, config=run, out_dir=out, resumed_from=resumed_from)


def _resume(out: Path, tc: TrainConfig, model: TransformerBridge, optimizer: torch.optim.Optimizer,
            scaler: torch.amp.GradScaler, generators: tuple,
            clamps: intervene.ClampState) -> tuple[Optional[int], list[dict], list[Tensor]]:
    """Restore the newest checkpoint its metrics cover (`runfolder.resume_step`) into model, optimizer, scaler,
    the (train, eval) generators and the clamps' running means; (its step or None, the metrics rows up to it,
    the pending train losses)."""
    on_disk = load_metrics(out)
    newest = runfolder.resume_step(out, tc, [s for s, _ in list_checkpoints(out)], on_disk,
                                   final_weights=(out / models.WEIGHTS_FILE).exists())
    if newest is None:
        if (out / METRICS_FILE).exists():
            _write_metrics(out / METRICS_FILE, [])
        return None, [], []
    state = _load_checkpoint(out, newest, model)
    optimizer.load_state_dict(state["optimizer"])
    scaler.load_state_dict(state["scaler"])
    generators[0].set_state(state["train_generator"])
    generators[1].set_state(state["eval_generator"])
    device = generators[0].device
    clamps.load_state_dict(state.get("clamp_state", {}), device=device)
    rows = [r for r in on_disk if r["step"] <= newest]
    _write_metrics(out / METRICS_FILE, rows)
    return newest, rows, [t.to(device) for t in state["pending_losses"].unbind()]


def _interventions_at(run: RunConfig, params: dict[str, Tensor], clamps: intervene.ClampState, t: int, *,
                      update: bool) -> tuple[dict, list[Tensor]]:
    """The clamp hooks and the frozen parameters (from `params`, the model's by state-dict name) active at
    time t (updates done so far; see `intervene`)."""
    tc = run.train
    if not tc.interventions:
        return {}, []
    hooks = intervene.clamp_hooks(tc.interventions, run.model, t, state=clamps, update=update)
    names = intervene.frozen_names(tc.interventions, run.model, t)
    return hooks, [params[name] for name in sorted(names)]


def _step(model: TransformerBridge, fp: Any, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
          source: Source, tc: TrainConfig, generator: torch.Generator, lr: float, hooks: Optional[dict] = None,
          frozen: Optional[list[Tensor]] = None) -> Tensor:
    """One optimiser step on a fresh batch through the fused forward (with the clamp `hooks`); the (detached)
    training loss. `frozen` parameters lose their gradient, so torch's AdamW / SGD skip them entirely (no
    step, moment, step count or decay) and clipping leaves them out of the norm. A parameter that a clamp cuts
    off from the loss (q and k of a clamped pattern) gets a zero gradient instead: it is not frozen, it decays."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    tokens = source.sample(tc.batch_size, tc.seq_len + 1, generator=generator)
    with _autocast(generator.device, tc.precision):
        logits = models.fast_forward(fp, tokens[:, :-1], hooks)
    loss = _loss(logits, tokens[:, 1:])
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    if hooks:  # a parameter a clamp cuts off the loss gets a zero gradient: it still decays (stacked does the same)
        for param in model.parameters():
            if param.grad is None:
                param.grad = torch.zeros_like(param)
    for param in frozen or ():
        param.grad = None
    if tc.grad_clip is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def _metrics_row(out: Optional[Path], rows: list[dict], step: int, lr: float, pending: list[Tensor],
                 model: TransformerBridge, source: Source, tc: TrainConfig,
                 eval_gen: Optional[torch.Generator], hooks: Optional[dict] = None) -> dict:
    """The metrics row of `step` (mean train loss since the last row; with `eval_gen`, the paired evaluation);
    stops the run as diverged at a non-finite loss."""
    row = {"step": step, "lr": lr, "train_loss": torch.stack(pending).float().mean().item()}
    if not math.isfinite(row["train_loss"]):
        _diverge(out, rows, step + 1 - len(pending) + _first_non_finite(pending), "train loss")
    if eval_gen is not None:
        model.eval()
        row.update(evaluate_paired(model, source, seq_len=tc.seq_len, batch_size=tc.batch_size,
                                   n_batches=tc.eval_batches, generator=eval_gen, precision=tc.precision,
                                   interventions=hooks))
        if not math.isfinite(row["eval_loss"]):
            _diverge(out, rows, step, f"evaluation loss {row['eval_loss']}")
        model.train()
    return row


def _first_non_finite(losses: list[Tensor]) -> int:
    """Index of the first non-finite loss in `losses` (the per-step losses since the last metrics row)."""
    bad = (~torch.isfinite(torch.stack(losses))).nonzero()
    return int(bad[0, 0]) if len(bad) else len(losses) - 1


def _check_finite(out: Optional[Path], rows: list[dict], step: int, model: Any, pending: list[Tensor]) -> None:
    """Stop as diverged if a loss since the last row or a weight is not finite (one sync, at checkpoints and
    at the end only: per-step checks would stall the GPU)."""
    if pending and not bool(torch.isfinite(torch.stack(pending)).all()):
        _diverge(out, rows, step + 1 - len(pending) + _first_non_finite(pending), "train loss")
    if not all(bool(torch.isfinite(p).all()) for p in model.parameters()):
        _diverge(out, rows, step, "weights")


def _diverge(out: Optional[Path], rows: list[dict], step: int, what: str) -> None:
    """Record the run as diverged at `step` (metrics row, status.json) and raise `TrainingDiverged`."""
    reason = f"non-finite {what}"
    where = f"{out}: " if out is not None else ""
    checkpoint = None
    if out is not None:
        rows.append({"step": step, "diverged": True, "reason": reason})
        _write_metrics(out / METRICS_FILE, rows)
        kept = [s for s, _ in list_checkpoints(out) if s < step]
        checkpoint = kept[-1] if kept else None
        runfolder.mark_diverged(out, step=step, reason=reason, checkpoint=checkpoint)
    kept_text = f"; last finite checkpoint: step {checkpoint}" if checkpoint is not None else ""
    raise TrainingDiverged(
        f"{where}training diverged at step {step} ({reason}){kept_text}; lower the learning rate or clip "
        "gradients, and train into a new folder", step=step, run_dir=out, checkpoint=checkpoint)


def train_many(runs: "list[RunConfig]", out_dirs: "Optional[list[str | os.PathLike]]" = None, *,
               progress: bool = True) -> list[TrainResult]:
    """Train compatible runs (same shapes; they may differ in seed, source parameters, init options, lr and
    weight decay) as one stacked model, each member equal to its solo `train(run)` up to float rounding and
    writing a normal run folder; a member that diverges is recorded (`TrainResult.failed`) and frozen while
    the others finish. Incompatible runs raise ValueError naming the field. See `markov_interp.stacked_training`.
    """
    from markov_interp.stacked_training import train_many as _train_many

    return _train_many(runs, out_dirs, progress=progress)


def _final(rows: list[dict], references: dict) -> FinalLosses:
    last = [r for r in rows if "eval_loss" in r]
    assert last, "training always evaluates at its last step"
    return FinalLosses(step=last[-1]["step"], eval_loss=last[-1]["eval_loss"], train_loss=last[-1]["train_loss"],
                       references=dict(references))


def _finished(out: Path, run: RunConfig, device: torch.device, *,
              load_model: bool = True) -> Optional[TrainResult]:
    """The finished run in `out` (its model loaded unless `load_model=False`: `train_many` without hooked
    models), or None when its metrics are incomplete beside the final weights (a resume repairs them)."""
    rows = load_metrics(out)
    evals = [r for r in rows if "eval_loss" in r]
    if not evals or evals[-1]["step"] != run.train.steps or not runfolder.metrics_complete(run.train, rows):
        return None  # incomplete metrics beside final weights: resume from a checkpoint (runfolder.resume_step)
    model = models.load(out, device=device, expect=run.model) if load_model else None
    references = references_of(evals[-1])
    return TrainResult(model=model, metrics=rows, final=_final(rows, references), config=run, out_dir=out,
                       already_done=True)
