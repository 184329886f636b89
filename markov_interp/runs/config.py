"""Run configs: what a run is (`RunConfig` = source + model + `TrainConfig`: a run folder's config.json), and
dotted options.

Defaults follow Makkuva et al. ("Attention with Markov", arXiv 2402.04161) and their reference code: a fresh
batch of 16 sequences every step (no dataset), every position a prediction target, AdamW with betas
(0.9, 0.95), weight decay 1e-3 on linear weights only (not the tied embedding, positions, LayerNorm or
biases: `models.optim.decayed`), lr 2e-3 with a one-cycle schedule (`training.schedule`), no gradient
clipping, fp32. Precision is explicit: fp16 / bf16 autocast are options, fp16 without loss scaling by
default as in the reference code (its outcome differs: see the notes), with `loss_scaling=True` on request.

Configs (`TrainConfig`, `RunConfig`) derive from `config.Config` (sorted JSON, unknown keys refused). Options are
named by dotted keys "section.field" (`split_key`, the one parser, shared with sweep specs and `--set`):
`build_run(sections, overrides)` builds a run from section tables, `default_run(source, **overrides)` holds the
source-dependent defaults of `markov-interp train`, and `override_run(run, overrides)` sets options of a complete
run.
"""

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar, Optional

import torch

from markov_interp import clamps
from markov_interp.config import Config, check_bool, check_choice, check_int, check_number, check_seed, shown
from markov_interp.streams import COUNTER_STREAM, LEGACY_STREAM, STREAMS
from markov_interp.sources import DEFAULT_KIND, SourceConfig, source_config_class, source_options
from markov_interp.devices import resolve_device  # the one device check (re-exported here: training.resolve_device)
from markov_interp.models import ModelConfig, preset
from markov_interp.models.reduction import check_reduction

__all__ = [
    "TrainConfig",
    "RunConfig",
    "default_run",
    "build_run",
    "override_run",
    "split_key",
    "run_options",
    "resolve_device",
    "PRECISIONS",
    "COMPILE_MODES",
    "CAPTURE_MODES",
    "EXECUTION_FIELDS",
]

PRECISIONS = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}  # autocast dtype of each precision
# TrainConfig.compile: "off" runs the step eagerly (the reference); "default" compiles the forward, loss and
# backward and the optimiser update with torch.compile; "max" is torch.compile's "max-autotune" (kernel search;
# on CUDA also CUDA graphs). See models._compile and docs/training.md#compiled-steps.
COMPILE_MODES = ("off", "default", "max")
# TrainConfig.capture: "off" launches the step's kernels one by one; "graph" runs the whole steady-state step
# (sampling, forward, backward, update) as one CUDA graph on CUDA, and states why not elsewhere
# (`training.step`, docs/training.md#captured-steps).
CAPTURE_MODES = ("off", "graph")
# TrainConfig fields that say how a run executes, not what it is: left out of a sweep cell's id and of the comparison
# of a run folder's config.json with the run asked for (a run may resume on another device, at another cadence,
# captured or not).
EXECUTION_FIELDS = ("device", "resume_every", "capture")


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
    interventions: tuple | list = ()  # freezes and clamps during training (`clamps.Freeze` / `Clamp`)
    reduction: Optional[str] = None  # "canonical": train on the (e, w, b) family only (`models.reduction`)
    release: tuple | list = ()  # parts a reduction sets free (`models.reduction.RELEASABLE`)
    compile: str = "off"  # "off" (eager, the reference), "default" or "max": torch.compile of the step (COMPILE_MODES)
    # a resume point (the training state, `training.resume`) at the first metrics row this many steps after the
    # last save; None: at the first row 5 minutes of training after it; 0: none (only checkpoints resume)
    resume_every: Optional[int] = None
    # the random stream the data is drawn from (`markov_interp.streams`): "counter-1" counter-based, a function of
    # the run's seed and the step (one pass for the whole stack); "torch-1" a torch.Generator per run, what runs
    # were trained on before counter streams (a config.json that names no stream reads as "torch-1")
    stream: str = COUNTER_STREAM
    capture: str = "off"  # "off" or "graph": the whole steady-state step as one CUDA graph (CAPTURE_MODES)

    # Fields added after run folders and sweep ids were first written: left out of config.json (and so of cell
    # ids) at these values, so earlier files round-trip byte for byte and earlier sweeps keep their cells. `stream`
    # is left out at "torch-1", the stream of every earlier file (`RunConfig.from_dict` reads its absence so).
    _LATER_FIELDS: ClassVar[dict] = {"eval_log_points": 0, "interventions": (), "reduction": None, "release": (),
                                     "compile": "off", "resume_every": None, "stream": LEGACY_STREAM,
                                     "capture": "off"}

    def __post_init__(self) -> None:
        for name, minimum in (("steps", 1), ("batch_size", 1), ("seq_len", 1), ("log_every", 1),
                              ("eval_every", 0), ("eval_batches", 1), ("eval_log_points", 0), ("n_checkpoints", 0)):
            check_int(name, getattr(self, name), minimum=minimum)
        check_seed("seed", self.seed)
        for name in ("lr", "weight_decay", "momentum", "warmup_frac"):
            check_number(name, getattr(self, name), minimum=0)
        check_number("lr", self.lr, positive=True)
        if not 0 <= self.warmup_frac < 1:
            raise ValueError(f"warmup_frac must be in [0, 1), got {self.warmup_frac}")
        betas = tuple(self.betas) if isinstance(self.betas, (list, tuple)) else self.betas
        ok = isinstance(betas, tuple) and len(betas) == 2
        if not (ok and all(isinstance(b, (int, float)) and 0 <= b < 1 for b in betas)):
            raise ValueError(f"betas must be two numbers in [0, 1), got {shown(self.betas)}")
        object.__setattr__(self, "betas", tuple(float(b) for b in betas))
        check_choice("optimizer", self.optimizer, ("adamw", "sgd"))
        check_choice("schedule", self.schedule, ("one-cycle", "constant"))
        check_choice("precision", self.precision, tuple(PRECISIONS))
        check_choice("compile", self.compile, COMPILE_MODES)
        check_choice("stream", self.stream, STREAMS)
        check_choice("capture", self.capture, CAPTURE_MODES)
        check_bool("loss_scaling", self.loss_scaling)
        if self.loss_scaling and self.precision != "fp16":
            raise ValueError(f"loss_scaling=True only applies to precision='fp16', got precision={shown(self.precision)}")
        if self.grad_clip is not None:
            check_number("grad_clip", self.grad_clip, positive=True)
        check_int("resume_every", self.resume_every, minimum=0, none_ok=True)
        if not isinstance(self.device, str) or not self.device:
            raise ValueError(f"device must be a string such as 'auto', 'cpu' or 'cuda', got {shown(self.device)}")
        object.__setattr__(self, "interventions", clamps.parse_interventions(self.interventions))
        if isinstance(self.release, str) or not isinstance(self.release, (list, tuple)) or not all(
                isinstance(r, str) for r in self.release):
            raise ValueError(f"release must be a list of part names, got {shown(self.release)}")
        object.__setattr__(self, "release", tuple(self.release))


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
        clamps.check_interventions(self.train.interventions, self.model, files=False)
        check_reduction(self.train.reduction, self.train.release, self.model, optimizer=self.train.optimizer)

    def to_json(self, *, indent: Optional[int] = 2) -> str:
        """Sorted JSON, indented (the form of a run folder's config.json)."""
        return super().to_json(indent=indent)

    @classmethod
    def from_dict(cls, data: Any, *, where: Optional[str] = None) -> "RunConfig":
        """Inverse of `to_dict` (`config.Config.from_dict`). A run config is a whole record of a run (config.json,
        a table's row): one whose train table names no stream was written before counter streams, or by a run on
        "torch-1", so it reads as "torch-1" (the default "counter-1" is for runs built from defaults,
        `build_run`)."""
        train = data.get("train") if isinstance(data, Mapping) else None
        if isinstance(train, Mapping) and "stream" not in train:
            data = {**data, "train": {**train, "stream": LEGACY_STREAM}}
        return super().from_dict(data, where=where)


# ------------------------------------------------------------------------------------ dotted options
_SECTIONS: dict[str, type] = {"source": SourceConfig, "model": ModelConfig, "train": TrainConfig}


def run_options() -> dict[str, list[str]]:
    """The options a dotted key "section.field" may name, per section ("source": those of every registered source
    kind, `sources.source_options`; "model" also takes "preset")."""
    out = {name: sorted(f.name for f in dataclasses.fields(cls)) for name, cls in _SECTIONS.items() if name != "source"}
    out["source"] = sorted(source_options())
    out["model"] = sorted(out["model"] + ["preset"])
    return {name: out[name] for name in _SECTIONS}


def _owners() -> dict[str, str]:
    """The section of every option name (a bare name is put in the one section that has it)."""
    options = run_options()
    owner = {field: section for section, fields in options.items() for field in fields}
    assert len(owner) == sum(len(v) for v in options.values()), "option names must be unique across sections"
    return owner


def split_key(key: Any, *, where: str = "options") -> tuple[str, str]:
    """("section", "field") of a dotted key such as "train.lr" after checking it names an option; otherwise a
    one-line ValueError naming `where`, the key and the valid options. The one parser of dotted keys: sweep
    specs, `--set` and `build_run` all use it."""
    sections = list(_SECTIONS)
    if not isinstance(key, str) or key.count(".") != 1:
        raise ValueError(
            f"{where}: key {shown(key)} must be 'section.field' with section one of {sections} "
            "(e.g. 'source.p', 'model.n_layers', 'train.lr')"
        )
    section, field = key.split(".")
    if section not in _SECTIONS:
        raise ValueError(f"{where}: key {shown(key)} has unknown section {shown(section)}; expected one of {sections}")
    valid = run_options()[section]
    if field not in valid:
        raise ValueError(f"{where}: key {shown(key)} names no {section} option; valid {section} options are {valid}")
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
        raise ValueError(f"{where}: expected a table of sections {list(_SECTIONS)}, got {shown(sections)}")
    unknown = sorted(set(sections) - set(_SECTIONS))
    if unknown:
        raise ValueError(f"{where}: unknown sections {unknown}; expected some of {list(_SECTIONS)}")
    merged = {}
    for name in _SECTIONS:
        table = sections.get(name) or {}
        if not isinstance(table, Mapping):
            raise ValueError(f"{where}: {name} must be a table of options, got {shown(table)}")
        merged[name] = dict(table)
    for key, value in (overrides or {}).items():
        section, field = split_key(key, where=where)
        merged[section][field] = value
    source = (SourceConfig.from_dict(merged["source"], where="source") if merged["source"]
              else SourceConfig(**source_config_class(DEFAULT_KIND).run_defaults))
    model_opts = merged["model"]
    model_opts.setdefault("d_vocab", source.vocab_size)
    name = model_opts.pop("preset", None)
    model = preset(name, **model_opts) if name is not None else ModelConfig.from_dict(model_opts, where="model")
    return RunConfig(source=source, model=model, train=TrainConfig.from_dict(merged["train"], where="train"))


def _dotted(overrides: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Keys as "section.field"; a bare field name is put in the one section that has it."""
    out, owner = {}, _owners()
    for key, value in overrides.items():
        if isinstance(key, str) and "." not in key:
            if key not in owner:
                raise ValueError(f"{where}: {shown(key)} names no option; valid options are {sorted(owner)}")
            key = f"{owner[key]}.{key}"
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
        kind = source_opts.get("kind", DEFAULT_KIND)
        base = {"kind": kind, **source_config_class(kind).run_defaults}
    else:
        base = source.to_dict()
    source = SourceConfig.from_dict({**base, **source_opts}, where="source")
    random = source.in_context  # the in-context task: a kernel per sequence
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
    bit, on its own random stream: "torch-1" for a folder trained before counter streams, unless `train.stream` is
    set). `model.preset` is refused: `run` states every model field, so set those instead.
    """
    if not isinstance(run, RunConfig):
        raise ValueError(f"run must be a RunConfig, got {type(run).__name__}")
    overrides = _dotted(overrides, where)
    if "model.preset" in overrides:
        raise ValueError(f"{where}: 'model.preset' cannot change a complete run config; set model fields instead")
    sections = run.to_dict()
    model, derived = sections["model"], run.model
    if derived.d_head_is_default:
        del model["d_head"]
    if derived.d_mlp == 4 * derived.d_model:
        del model["d_mlp"]
    del model["d_vocab"]  # a valid run's d_vocab is its source's vocabulary
    sections["train"]["stream"] = run.train.stream  # a run keeps its stream (to_dict leaves "torch-1" out)
    return build_run(sections, overrides, where=where)
