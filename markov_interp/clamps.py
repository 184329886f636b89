"""Interventions during training: freeze parameters, clamp activations, for a range of steps.

A clamp's value is written by the package's one activation writer, `models.hooks.write`, which the probes' interventions
(`probes.interventions.set_component`) use too.

Probing a finished model shows *what* circuit it has; causal questions about *formation* need the circuit
changed while it forms. Two tools, on the TransformerLens names the rest of the package uses:

- **Freeze** (Bietti et al. 2023, "Birth of a Transformer: A Memory Viewpoint", freeze layers to see what the
  others learn alone): `Freeze(freeze="blocks.1.*", start=0, end=200)`. The glob (fnmatch) names parameters by
  their state-dict names as `models.save` writes them (`embed.weight`, `blocks.0.attn.q.weight`,
  `unembed.weight` (absent when tied), ...; `parameter_names(cfg)`). A frozen parameter gets no update at all:
  no gradient step, no AdamW moment or step-count update, no weight decay, and it is left out of gradient
  clipping's norm. A tied model has one matrix for embedding and unembedding: freezing `embed.weight` freezes
  the unembedding too.
- **Clamp** (Singh et al. 2024, "What needs to go right for an induction head?", clamp activations to study
  formation): `Clamp(clamp=HOOK, value=...)` replaces the activation at a hook point by a fixed value.
  Attention patterns (`blocks.i.attn.hook_pattern`, `[batch, head, query_pos, key_pos]`) take
  `previous_token` (lag k: query q attends to q - k; a query q < k, which has no such key, attends to position
  0), `uniform` (causal uniform, 1 / (q + 1)), `mixed` (half of each: (previous_token + uniform) / 2, lag k
  too), `self` (the identity) or a safetensors file holding one tensor
  `[q, k]` or `[head, q, k]` (cut to the sequence length; rows must be causal and sum to 1). Other points
  (`attn.hook_z` and q / k / v per head, `hook_attn_out`, `hook_mlp_out`, `mlp.hook_pre/post`,
  `hook_resid_pre/mid/post`, `hook_embed`, `hook_pos_embed`) take `zero`, `mean` or a file. `mean` is a running
  mean, BatchNorm style: per position and feature, initialised to the first clamped training batch's mean and
  then updated with momentum 0.1 on every training forward (value = 0.9 value + 0.1 batch mean, the batch
  mean detached); the clamp uses the value after this update. Evaluations do not update it (a mean clamp
  that is evaluated before any clamped training forward uses that evaluation batch's own mean). `heads`
  restricts a pattern or per-head clamp to some heads. A file's sha256 is recorded in the config entry, so a
  changed file is refused at the next start or resume.

**Step ranges.** An intervention is active at time t (the number of updates done so far) iff
start <= t < end (end None: to the end). The update t -> t + 1 runs with the interventions active at t, and
the evaluation logged at step t (after t updates) with those active at t. So `@:200` clamps the first 200
updates and the evaluation at step 200 already sees the released model; a run's final losses are measured
with the interventions active at its last step.

The fused training forward (`models.stack.stacked_forward`) takes `{hook name: fn}` (`models.hooks` names every
point); `clamp_hooks` builds those functions from the interventions active at t (acting on trailing axes, so
with or without a leading member axis) and `tl_hooks` the same clamps as TransformerLens `fwd_hooks`, so one
definition serves training and the hooked model. Heads are a layer's real heads: in a model whose layers differ
in head count (`n_heads=(1, 2)`), `blocks.1.attn.hook_z[1]` names layer 1's second head, and a clamp on the hooked
model (which has the largest count in every layer) acts on the real heads only. Running means live in a
`ClampState` (tensors only; saved in checkpoints, per member in stacks).

Interventions are recorded in `TrainConfig.interventions` (config.json: a dict per entry) and read from a dict
or a string: `GLOB[@START:END]` for a freeze (`--freeze`), `HOOK[HEADS]=VALUE[:LAG][@START:END]` for a clamp
(`--clamp blocks.0.attn.hook_pattern=previous_token@:200`, `blocks.0.attn.hook_z[1]=zero`).
"""

import contextlib
import contextvars
import dataclasses
import fnmatch
import functools
import hashlib
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar, Optional

import torch
from jaxtyping import Float
from torch import Tensor

from markov_interp._io import read_regular
from markov_interp._plan import Need, planned, size
from markov_interp.config import Config, check_int, shown
from markov_interp.models import HookedModel, ModelConfig, hooked_kind, is_bridge, state_shapes
from markov_interp.models.hooks import PER_HEAD, feature_shape, intervention_points, parse_name, write

__all__ = [
    "Freeze",
    "Clamp",
    "parse_intervention",
    "parse_interventions",
    "parse_freeze",
    "parse_clamp",
    "spec_text",
    "parameter_names",
    "clamp_points",
    "check_interventions",
    "stored_config",
    "active",
    "frozen_names",
    "ClampState",
    "clamp_hooks",
    "tl_hooks",
    "applied",
    "pattern_value",
    "PATTERN_VALUES",
    "ACTIVATION_VALUES",
]

PATTERN_VALUES = ("previous_token", "uniform", "self", "mixed")
_LAGGED = ("previous_token", "mixed")  # the pattern values that take a lag
ACTIVATION_VALUES = ("zero", "mean")
MOMENTUM = 0.1  # running-mean update weight, as torch's BatchNorm


# --------------------------------------------------------------------------------------------- configs
def _check_range(start: Any, end: Any, what: str) -> None:
    check_int(f"{what} start", start, minimum=0)
    if end is not None:
        check_int(f"{what} end", end, minimum=0)
        if end <= start:
            raise ValueError(f"{what}: empty step range [{start}, {end}) (end must be > start)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Freeze(Config):
    """Parameters matching the glob `freeze` get no update while start <= t < end (see module docstring)."""

    freeze: str  # fnmatch glob over state-dict names (`parameter_names`)
    start: int = 0  # first update (0-based) that is frozen
    end: Optional[int] = None  # first update that is free again; None: frozen to the end

    def __post_init__(self) -> None:
        if not isinstance(self.freeze, str) or not self.freeze:
            raise ValueError(f"freeze must be a non-empty glob of parameter names, got {self.freeze!r}")
        _check_range(self.start, self.end, f"freeze {self.freeze!r}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Clamp(Config):
    """The activation at hook point `clamp` is replaced by `value` while start <= t < end (module docstring)."""

    clamp: str  # TransformerLens hook name, e.g. "blocks.0.attn.hook_pattern"
    value: str  # "previous_token", "uniform", "self", "mixed" (patterns); "zero", "mean" (activations); or a file
    lag: int = 1  # previous_token's (and mixed's) lag k
    heads: Optional[tuple | list] = None  # pattern / per-head points: only these heads (None: all)
    start: int = 0
    end: Optional[int] = None
    sha256: Optional[str] = None  # of a tensor file (filled in when the entry is made)

    _LATER_FIELDS: ClassVar[dict] = {"sha256": None}  # left out of the JSON when None (built-in values)

    def __post_init__(self) -> None:
        if not isinstance(self.clamp, str) or not self.clamp:
            raise ValueError(f"clamp must be a hook name, got {self.clamp!r}")
        if not isinstance(self.value, str) or not self.value:
            raise ValueError(f"clamp {self.clamp!r}: value must be a name or a file path, got {self.value!r}")
        check_int(f"clamp {self.clamp!r} lag", self.lag, minimum=1)
        if self.heads is not None:
            heads = tuple(self.heads) if isinstance(self.heads, (list, tuple)) else self.heads
            if not isinstance(heads, tuple) or not heads:
                raise ValueError(f"clamp {self.clamp!r}: heads must be a non-empty list of head indices, got "
                                 f"{self.heads!r}")
            for h in heads:
                check_int(f"clamp {self.clamp!r} head", h, minimum=0)
            object.__setattr__(self, "heads", tuple(sorted(set(heads))))
        _check_range(self.start, self.end, f"clamp {self.clamp!r}")
        if self.is_file and self.sha256 is None:
            stored = _STORED.get()
            if stored is not None:  # a run folder's config.json: its readers open no file it names
                raise ValueError(f"clamp {shown(self.clamp)} names the file {shown(self.value)} without its sha256, "
                                 f"which {stored} records for every clamp file it was trained with; markov-interp "
                                 "opens no file a stored config names (restore the entry, or train a new run)")
            path = Path(self.value)
            if not path.is_file():
                raise ValueError(f"clamp {self.clamp!r}: value {shown(self.value)} is neither one of "
                                 f"{list(PATTERN_VALUES + ACTIVATION_VALUES)} nor an existing safetensors file")
            object.__setattr__(self, "sha256", _sha256(path))
            _read_tensor(self)  # a bad file is refused when the entry is made, not at the first step

    @property
    def is_file(self) -> bool:
        return self.value not in PATTERN_VALUES + ACTIVATION_VALUES

    @functools.cached_property
    def point(self) -> tuple[str, Optional[int]]:
        """(kind, layer) of the hook `clamp` names, parsed once (`models.hooks.parse_name`; ValueError for a name
        that is no hook of the package).

        >>> Clamp(clamp="blocks.1.attn.hook_z", value="zero").point
        ('z', 1)
        """
        return parse_name(self.clamp)

    @property
    def kind(self) -> str:
        """The activation's kind ("pattern", "z", "resid_pre", ...), as `models.hooks.write` takes it."""
        return self.point[0]

    @property
    def layer(self) -> Optional[int]:
        """The activation's block (None for the embeddings)."""
        return self.point[1]

    @property
    def per_head(self) -> bool:
        """Whether the activation has a head axis (q, k, v, z, the pattern)."""
        return self.kind in PER_HEAD

    @property
    def is_pattern(self) -> bool:
        return self.clamp.endswith(".attn.hook_pattern")

    def layer_heads(self, cfg: ModelConfig) -> int:
        """The real head count of the clamped layer in a model of `cfg`."""
        return cfg.heads_per_layer[self.layer]


Intervention = Freeze | Clamp


def _sha256(path: Path) -> str:
    return hashlib.sha256(read_regular(path, "clamp file")).hexdigest()


# Set while a stored config (a run folder's config.json) is read: its clamp file entries must carry their sha256
# and no file is opened to compute one (`stored_config`).
_STORED: contextvars.ContextVar[Optional[str]] = contextvars.ContextVar("markov_interp_stored_config", default=None)


@contextlib.contextmanager
def stored_config(where: str) -> Iterator[None]:
    """Inside the block, clamp entries come from the stored config `where` (`runs.read_run_config`: a run folder's
    config.json). A file entry must carry the sha256 recorded when it was made, and its file is not opened: probe,
    report and the config check of `train` read a run folder without opening a file outside it that its
    config.json names (an entry edited to name /etc/shadow without a sha256 used to be hashed, read whole)."""
    token = _STORED.set(where)
    try:
        yield
    finally:
        _STORED.reset(token)


# ------------------------------------------------------------------------------------------- parsing
_RANGE = re.compile(r"^(?P<body>.*?)(?:@(?P<start>\d*):(?P<end>\d*))?$")
_CLAMP = re.compile(r"^(?P<hook>[^\[\]=]+)(?:\[(?P<heads>[\d,\s]*)\])?=(?P<value>.+)$")


def _split_range(text: str) -> tuple[str, int, Optional[int]]:
    match = _RANGE.match(text)
    body, start, end = match["body"], match["start"], match["end"]
    return body, int(start) if start else 0, int(end) if end else None


def parse_freeze(text: str) -> Freeze:
    """`GLOB[@START:END]` (the `--freeze` form), e.g. "blocks.1.*@0:200" or "embed.weight".

    >>> parse_freeze("blocks.1.*@:200")
    Freeze(freeze='blocks.1.*', start=0, end=200)
    """
    if not isinstance(text, str) or "=" in text:
        raise ValueError(f"freeze {text!r} must be GLOB[@START:END], e.g. 'blocks.1.*@0:200'")
    glob, start, end = _split_range(text.strip())
    return Freeze(freeze=glob, start=start, end=end)


def parse_clamp(text: str) -> Clamp:
    """`HOOK[HEADS]=VALUE[:LAG][@START:END]` (the `--clamp` form).

    >>> parse_clamp("blocks.0.attn.hook_pattern[0,2]=previous_token:2@:200")  # doctest: +NORMALIZE_WHITESPACE
    Clamp(clamp='blocks.0.attn.hook_pattern', value='previous_token', lag=2, heads=(0, 2), start=0, end=200,
          sha256=None)
    """
    if not isinstance(text, str):
        raise ValueError(f"clamp must be a string HOOK[HEADS]=VALUE[@START:END], got {text!r}")
    body, start, end = _split_range(text.strip())
    match = _CLAMP.match(body)
    if match is None:
        raise ValueError(f"clamp {text!r} must be HOOK[HEADS]=VALUE[@START:END], e.g. "
                         "'blocks.0.attn.hook_pattern=previous_token@:200' or 'blocks.0.attn.hook_z[1]=zero'")
    value, lag = match["value"].strip(), 1
    lagged = re.match(r"^(previous_token|mixed):(\d+)$", value)
    if lagged:
        value, lag = lagged[1], int(lagged[2])
    heads = None
    if match["heads"] is not None:
        try:
            heads = [int(h) for h in match["heads"].split(",") if h.strip()]
        except ValueError:
            raise ValueError(f"clamp {text!r}: heads must be integers, e.g. [0,2]") from None
    return Clamp(clamp=match["hook"].strip(), value=value, lag=lag, heads=heads, start=start, end=end)


def parse_intervention(spec: Any) -> Intervention:
    """A `Freeze` or `Clamp` from itself, a dict (`{"freeze": ...}` or `{"clamp": ...}`, the config.json form)
    or a string (with "=": a clamp, `parse_clamp`; otherwise a freeze, `parse_freeze`)."""
    if isinstance(spec, (Freeze, Clamp)):
        return spec
    if isinstance(spec, str):
        return parse_clamp(spec) if "=" in spec else parse_freeze(spec)
    if isinstance(spec, Mapping):
        kinds = [k for k in ("freeze", "clamp") if k in spec]
        if len(kinds) != 1:
            raise ValueError(f"intervention {dict(spec)!r} must have exactly one of the keys 'freeze', 'clamp'")
        return (Freeze if kinds[0] == "freeze" else Clamp).from_dict(spec, where="intervention")
    raise ValueError(f"an intervention must be a dict or a string, got {type(spec).__name__} {spec!r}")


def parse_interventions(specs: Any) -> tuple[Intervention, ...]:
    """A tuple of interventions from a list of specs (`parse_intervention`)."""
    if not isinstance(specs, (list, tuple)):
        raise ValueError(f"interventions must be a list of freeze / clamp entries, got {specs!r}")
    return tuple(parse_intervention(s) for s in specs)


def spec_text(item: Intervention) -> str:
    """The string form of an intervention (what `--freeze` / `--clamp` take; `parse_intervention` reads it).

    >>> spec_text(parse_clamp("blocks.0.attn.hook_pattern[1]=previous_token:2@5:200"))
    'blocks.0.attn.hook_pattern[1]=previous_token:2@5:200'
    """
    span = "" if item.start == 0 and item.end is None else f"@{item.start or ''}:{'' if item.end is None else item.end}"
    if isinstance(item, Freeze):
        return item.freeze + span
    heads = "" if item.heads is None else f"[{','.join(map(str, item.heads))}]"
    lag = f":{item.lag}" if item.value in _LAGGED and item.lag != 1 else ""
    return f"{item.clamp}{heads}={item.value}{lag}{span}"


# ---------------------------------------------------------------------------------------- validation
def parameter_names(cfg: ModelConfig) -> list[str]:
    """The state-dict names of a model of `cfg` as `models.save` writes them (a tied unembedding is
    `embed.weight`), in the model's order: what freeze globs match (`models.init.state_shapes`)."""
    return list(state_shapes(cfg))


def clamp_points(cfg: ModelConfig) -> list[str]:
    """The hook names a clamp may name for a model of `cfg` (`models.hooks.intervention_points`)."""
    return intervention_points(cfg)


def check_interventions(interventions: Iterable[Intervention], cfg: ModelConfig, *, files: bool = True) -> None:
    """Refuse interventions that do not fit a model of `cfg`: globs matching no parameter, unknown hook
    names, values that do not apply to the hook, heads out of range (ValueError listing the valid options).
    With `files`, tensor files are read and checked too (hash, shape, a pattern's rows): training does this
    before its first step; a config read back for a report does not need the files."""
    names, points = parameter_names(cfg), clamp_points(cfg)
    for item in interventions:
        if isinstance(item, Freeze):
            if not fnmatch.filter(names, item.freeze):
                raise ValueError(f"freeze {item.freeze!r} matches no parameter; valid names are {names}")
            continue
        if item.clamp not in points:
            raise ValueError(f"clamp {item.clamp!r}: unknown hook name; valid names are {points}")
        values = (PATTERN_VALUES if item.is_pattern else ACTIVATION_VALUES)
        if not item.is_file and item.value not in values:
            raise ValueError(f"clamp {item.clamp!r}: value {item.value!r} does not apply; valid values are "
                             f"{list(values)} or a safetensors file")
        if item.heads is not None:
            if not item.per_head:
                raise ValueError(f"clamp {item.clamp!r}: heads apply only to per-head points "
                                 f"(attn.hook_{', attn.hook_'.join(PER_HEAD)})")
            n_heads = item.layer_heads(cfg)
            bad = [h for h in item.heads if h >= n_heads]
            if bad:
                raise ValueError(f"clamp {item.clamp!r}: heads {bad} out of range; valid heads are "
                                 f"{list(range(n_heads))} (its layer has {n_heads})")
        if item.value not in _LAGGED and item.lag != 1:
            raise ValueError(f"clamp {item.clamp!r}: lag applies only to {' and '.join(_LAGGED)}")
        if item.is_file and files:
            _check_file_shape(item, _read_tensor(item), cfg)


def _check_file_shape(item: Clamp, value: Tensor, cfg: ModelConfig) -> None:
    if item.is_pattern:
        n_heads = item.layer_heads(cfg)
        ok = value.ndim == 2 or (value.ndim == 3 and value.shape[0] == n_heads)
        want = f"[q, k] or [{n_heads}, q, k]"
    else:
        feature = feature_shape(cfg, item.kind, item.layer)
        ok = tuple(value.shape[-len(feature):]) == feature and value.ndim in (len(feature), len(feature) + 1)
        want = f"{list(feature)} or [pos, {', '.join(map(str, feature))}]"
    if not ok:
        raise ValueError(f"clamp {item.clamp!r}: tensor in {item.value} has shape {list(value.shape)}, "
                         f"expected {want}")


def _read_tensor(item: Clamp) -> Tensor:
    """The one tensor of a clamp's safetensors file (float32), after checking its sha256 and, for patterns,
    that its rows are causal and sum to 1."""
    from safetensors.torch import load as load_safetensors

    path = Path(item.value)
    if not path.is_file():
        raise ValueError(f"clamp {item.clamp!r}: file {item.value} does not exist")
    data = read_regular(path, "clamp file")  # once: the hash and the tensors are of the same bytes
    digest = hashlib.sha256(data).hexdigest()
    if item.sha256 is not None and digest != item.sha256:
        raise ValueError(f"clamp {item.clamp!r}: {item.value} changed since the run was configured (sha256 "
                         f"{digest}, recorded {item.sha256}); restore the file or start a new run")
    try:
        loaded = load_safetensors(data)
        keys, tensors = list(loaded), list(loaded.values())
    except Exception as err:  # safetensors raises its own error types on corrupt files
        raise ValueError(f"clamp {item.clamp!r}: {item.value} is not a readable safetensors file ({err})") from None
    if len(tensors) != 1:
        raise ValueError(f"clamp {item.clamp!r}: {item.value} must hold exactly one tensor, found {keys}")
    value = tensors[0].float()
    if item.is_pattern:
        _check_pattern(item, value)
    return value


def _check_pattern(item: Clamp, value: Tensor) -> None:
    if value.ndim not in (2, 3) or value.shape[-1] != value.shape[-2]:
        raise ValueError(f"clamp {item.clamp!r}: a pattern file holds [q, k] or [head, q, k] with q = k, got "
                         f"shape {list(value.shape)}")
    n = value.shape[-1]
    future = torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)
    if bool((value[..., future] != 0).any()):
        raise ValueError(f"clamp {item.clamp!r}: pattern in {item.value} is not causal (weight on later keys)")
    if (value < 0).any() or not torch.allclose(value.sum(-1), torch.ones(()), atol=1e-5):
        raise ValueError(f"clamp {item.clamp!r}: pattern rows in {item.value} must be non-negative and sum to 1")


# ------------------------------------------------------------------------------------------ schedule
def active(interventions: Iterable[Intervention], t: int) -> list[Intervention]:
    """The interventions active at time t (updates done so far): start <= t < end."""
    return [i for i in interventions if i.start <= t and (i.end is None or t < i.end)]


def frozen_names(interventions: Iterable[Intervention], cfg: ModelConfig, t: int) -> set[str]:
    """State-dict names of the parameters frozen at time t."""
    names = parameter_names(cfg)
    out: set[str] = set()
    for item in active(interventions, t):
        if isinstance(item, Freeze):
            out.update(fnmatch.filter(names, item.freeze))
    return out


# --------------------------------------------------------------------------------------------- values
def _pattern_needs(a: Any) -> list[Need]:
    """A pattern over seq x seq positions (float64 at most, and a causal mask)."""
    return [Need.of("the attention pattern", size(a, "seq") ** 2 * 16, [("seq", size(a, "seq"))])]


@planned(_pattern_needs)
def pattern_value(value: str, seq: int, *, lag: int = 1, device: Any = None,
                  dtype: torch.dtype = torch.float32) -> Float[Tensor, "query_pos key_pos"]:
    """A built-in clamped attention pattern `[query_pos, key_pos]` (rows causal, summing to 1).

    >>> pattern_value("previous_token", 3, lag=1).tolist()
    [[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]
    >>> pattern_value("mixed", 2, lag=1).tolist()
    [[1.0, 0.0], [0.75, 0.25]]
    """
    check_int("seq", seq, minimum=1)
    if value == "mixed":  # half a previous-token head, half uniform causal attention
        return 0.5 * (pattern_value("previous_token", seq, lag=lag, device=device, dtype=dtype)
                      + pattern_value("uniform", seq, device=device, dtype=dtype))
    query = torch.arange(seq, device=device)
    if value == "previous_token":  # a query without a key `lag` back attends to position 0
        keys = (query - lag).clamp(min=0)
        return torch.nn.functional.one_hot(keys, seq).to(dtype)
    if value == "self":
        return torch.eye(seq, device=device, dtype=dtype)
    if value == "uniform":
        causal = torch.tril(torch.ones(seq, seq, device=device, dtype=dtype))
        return causal / causal.sum(-1, keepdim=True)
    raise ValueError(f"unknown pattern value {value!r}; valid values are {list(PATTERN_VALUES)}")


class ClampState:
    """Running means of `mean` clamps (and cached file tensors), keyed by intervention index and hook.

    Solo: each mean is `[pos, *feature]`; in a stack `[member, pos, *feature]`. `state_dict()` holds tensors
    only (checkpoints load it with weights_only=True); `member_state_dict(k)` / `load_member_states` give
    and take member k's part in the solo format.
    """

    def __init__(self) -> None:
        self.means: dict[str, Tensor] = {}
        self._files: dict[tuple, Tensor] = {}

    def state_dict(self) -> dict[str, Tensor]:
        return {key: value.detach().to("cpu").clone() for key, value in self.means.items()}

    def load_state_dict(self, state: Mapping[str, Tensor], device: Any = None) -> None:
        self.means = {key: value.to(device).float().clone() for key, value in state.items()}

    def member_state_dict(self, k: int) -> dict[str, Tensor]:
        return {key: value[k].detach().to("cpu").clone() for key, value in self.means.items()}

    def load_member_states(self, states: list[Mapping[str, Tensor]], device: Any = None) -> None:
        """The stacked state from each member's solo-format state (members resume at one step, so their keys
        agree)."""
        keys = set(states[0])
        if any(set(s) != keys for s in states):
            raise ValueError("stack members' checkpoints disagree on their running-mean clamp state")
        self.means = {key: torch.stack([s[key] for s in states]).to(device).float() for key in keys}

    def file_value(self, item: Clamp, device: Any, dtype: torch.dtype) -> Tensor:
        key = (item.value, item.sha256, str(device), dtype)
        if key not in self._files:
            cpu_key = (item.value, item.sha256, "cpu", torch.float32)
            if cpu_key not in self._files:
                self._files[cpu_key] = _read_tensor(item)
            self._files[key] = self._files[cpu_key].to(device=device, dtype=dtype)
        return self._files[key]


def _clamp_fn(index: int, item: Clamp, *, state: ClampState, update: bool, batch_axis: int) -> Callable:
    """fn(activation) -> its clamped replacement; `batch_axis` is 0 (solo) or 1 (after a member axis)."""

    kind = item.kind  # for the one writer (`models.hooks.write`)

    def pattern(x: Tensor) -> Tensor:  # x: [..., head, q, k]
        seq = x.shape[-1]
        if item.is_file:
            value = _cut(state.file_value(item, x.device, torch.float32), seq, (-2, -1), item)
        else:
            value = pattern_value(item.value, seq, lag=item.lag, device=x.device)
        return write(x, value, kind, heads=item.heads)

    def activation(x: Tensor) -> Tensor:  # x: [(member,) batch, pos, *feature]
        feature_dims = x.ndim - batch_axis - 2
        if item.value == "zero":
            return write(x, torch.zeros((), device=x.device), kind, heads=item.heads)
        if item.value == "mean":
            mean = _running_mean(x, f"mean.{index}.{item.clamp}", state, update, batch_axis)
            return write(x, mean, kind, heads=item.heads)
        value = state.file_value(item, x.device, torch.float32)
        if value.ndim == feature_dims + 1:  # [pos, *feature]: cut to the sequence length
            value = _cut(value, x.shape[batch_axis + 1], (0,), item)
        return write(x, value, kind, heads=item.heads)

    if item.is_pattern:
        # every head replaced by a constant: the fused paths may skip forming the scores (`models.stack.pattern_input`)
        pattern.ignores_input = item.heads is None
        return pattern
    return activation


def _cut(value: Tensor, seq: int, axes: tuple, item: Clamp) -> Tensor:
    """`value` cut to `seq` positions along `axes`; a file shorter than the sequence is refused."""
    for axis in axes:
        if value.shape[axis] < seq:
            raise ValueError(f"clamp {item.clamp!r}: {item.value} covers {value.shape[axis]} positions, the "
                             f"sequence has {seq}")
        value = value.narrow(axis, 0, seq)
    return value


def _running_mean(x: Tensor, key: str, state: ClampState, update: bool, batch_axis: int) -> Tensor:
    """The running mean `[(member,) pos, *feature]` for this activation, updated first on training forwards."""
    batch_mean = x.detach().float().mean(dim=batch_axis)
    stored = state.means.get(key)
    if update:
        stored = state.means[key] = batch_mean if stored is None else torch.lerp(stored, batch_mean, MOMENTUM)
    value = batch_mean if stored is None else stored
    if value.shape[batch_axis] < x.shape[batch_axis + 1]:
        raise ValueError(f"{key}: the running mean covers {value.shape[batch_axis]} positions, the input has "
                         f"{x.shape[batch_axis + 1]}")
    value = value.narrow(batch_axis, 0, x.shape[batch_axis + 1])
    return value.unsqueeze(batch_axis)  # broadcast over the batch axis


def clamp_hooks(interventions: Iterable[Intervention], t: int, *, state: ClampState, update: bool,
                member_axis: bool = False) -> dict[str, Callable[[Tensor], Tensor]]:
    """`{hook name: fn}` for the fused forward (`models.stack.stacked_forward` with `member_axis=True`; without,
    for activations of one model): the clamps active at time t, in order (several on one point compose).
    `update`: a training forward (running means move); False for evaluations."""
    hooks: dict[str, Callable] = {}
    items = list(interventions)
    for item in active(items, t):
        if not isinstance(item, Clamp):
            continue
        fn = _clamp_fn(items.index(item), item, state=state, update=update, batch_axis=1 if member_axis else 0)
        hooks[item.clamp] = _compose(hooks[item.clamp], fn) if item.clamp in hooks else fn
    return hooks


def _compose(first: Callable, second: Callable) -> Callable:
    def both(x: Tensor) -> Tensor:
        return second(first(x))

    both.ignores_input = getattr(first, "ignores_input", False)
    return both


def tl_hooks(interventions: Iterable[Intervention], cfg: ModelConfig, t: int, *, state: ClampState,
             update: bool = False, model: Optional[HookedModel] = None) -> list[tuple[str, Callable]]:
    """The same clamps as TransformerLens `fwd_hooks` (`model.run_with_hooks(tokens, fwd_hooks=...)`).

    One translation: TransformerLens's bridge (TL 4) fires `hook_resid_mid` on the MLP's input only (it is
    `ln2.hook_in`), while the fused paths replace the residual stream itself (HookedTransformer's meaning, TL 2/3).
    For a bridge, a resid_mid clamp therefore also corrects `hook_resid_post` by the change it made. Attention-only
    blocks of either kind have no `hook_resid_mid`: the clamp is applied at `hook_resid_post`. Either way the
    hooked model computes what the fused paths compute. And in a layer with fewer heads than the hooked model's
    largest count, a per-head clamp sees the layer's real heads only (the surplus heads pass unchanged), as in the
    fused forward.

    `model`: the hooked model the hooks are for (its kind decides); default the kind `models.hooked_model` builds
    on the installed TransformerLens (`models.hooked_kind()`).
    """
    bridge = is_bridge(model) if model is not None else hooked_kind() == "TransformerBridge"
    items = list(interventions)
    hooks = dict(clamp_hooks(items, t, state=state, update=update))
    clamped = {item.clamp: item for item in active(items, t) if isinstance(item, Clamp)}
    for name, item in clamped.items():
        if item.per_head and item.layer_heads(cfg) < cfg.max_heads:
            hooks[name] = _on_real_heads(hooks[name], item.layer_heads(cfg), 3 if item.is_pattern else 2)
    for mid in [n for n in hooks if n.endswith("hook_resid_mid")]:
        if not bridge and not cfg.attn_only:
            continue  # HookedTransformer: hook_resid_mid is the residual stream
        fn, post_name = hooks.pop(mid), mid.replace("hook_resid_mid", "hook_resid_post")
        post = hooks.get(post_name)
        if cfg.attn_only:
            fix = fn
        else:
            fn, fix = _carry_to_residual(fn)
            hooks[mid] = fn
        hooks[post_name] = fix if post is None else _compose(fix, post)
    return [(name, (lambda fn: lambda x, hook: fn(x))(fn)) for name, fn in hooks.items()]


def _on_real_heads(fn: Callable, heads: int, axis_from_end: int) -> Callable:
    """`fn` applied to the first `heads` heads (head axis `-axis_from_end`) of a hooked model's activation; the
    surplus heads (zero weights, see `models.hooked`) pass unchanged."""

    def real(x: Tensor) -> Tensor:
        axis = x.ndim - axis_from_end
        surplus = x.narrow(axis, heads, x.shape[axis] - heads)
        return torch.cat([fn(x.narrow(axis, 0, heads)), surplus], dim=axis)

    return real


def _carry_to_residual(fn: Callable) -> tuple[Callable, Callable]:
    """(hook on the MLP input that records the change, hook on resid_post that applies it to the residual)."""
    seen: dict[str, Tensor] = {}

    def at_mid(x: Tensor) -> Tensor:
        seen["before"], seen["after"] = x, fn(x)
        return seen["after"]

    def at_post(x: Tensor) -> Tensor:
        return x - seen["before"] + seen["after"]

    return at_mid, at_post


@contextlib.contextmanager
def applied(model: HookedModel, interventions: Iterable[Any], t: int, *,
            state: Optional[ClampState] = None) -> Iterator[HookedModel]:
    """Run `model` (a hooked model) under the clamps of `interventions` active at time `t`, for probing.

    A trained clamped model's weights are plain: probed bare it is the model *without* its clamp (a layer whose
    pattern was clamped shows its untrained pattern). Inside `with clamps.applied(model, items, t):` every
    forward (`model(tokens)`, `run_with_cache`, the probes) sees the clamps active at t, e.g. `t = steps - 1`
    for the clamps of a run's last update. Freezes change nothing at inference and are ignored. A `mean` clamp
    uses `state`'s running mean (a fresh state: each batch's own mean, see `ClampState`).
    """
    items = parse_interventions(interventions)
    cfg = model.markov_config
    check_interventions(items, cfg)
    hooks = tl_hooks(items, cfg, t, state=state if state is not None else ClampState(), model=model)
    with model.hooks(fwd_hooks=hooks):
        yield model
