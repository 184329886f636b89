"""The hooked model: the paper's transformers as TransformerLens models, built in one place, saved and loaded.

`hooked_model(cfg, state)` is the one place a hooked model is built: from a state dict in the on-disk layout
(`models.init.state_shapes`: what `save` writes, what `initial_state` and training give). `build(cfg, seed=...)`
is `hooked_model(cfg, initial_state(cfg, seed))` and `load(path)` reads the weights and calls it. The model is
TransformerLens's own, of the installed version (`transformer-lens>=2.16,<5`; `hooked_kind()`), so every
TransformerLens tool works on it: `run_with_cache`, `cache["pattern", 0]`, `run_with_hooks` with
`blocks.0.attn.hook_pattern`, ...

- TL 4.x: a `TransformerBridge` from the public `TransformerBridge.boot_native`, with the paper's choices set on
  its native modules (bias-free modules, a trainable output bias). Tying is one shared `nn.Parameter`
  (`model.embed.W_E` and `model.unembed.W_U.T` are the same storage); it survives `.to(device)` and `save` /
  `load` (safetensors refuses shared tensors, so `save` writes one copy and `load` re-ties).
- TL 2.x / 3.x: a `HookedTransformer`: zero biases where the config has none; TL has no tying, so a tied model
  holds an equal copy (`W_U = W_E.T`), which makes it a model for analysis (`state_dict_for_save` refuses
  copies that have drifted apart). Training never uses this model (it trains `models.stack`), so training ties
  properly and gives the same weights on every TL version.

`markov_interp.models._tl` holds the version-specific conversions (public TransformerLens API only);
`tl_config` / `tl_state_dict` convert a saved model for TransformerLens's unmodified model of the installed
version (strict `load_state_dict`), and `state_dict_for_save(model, cfg)` reads such a model back.

Heads per layer: TransformerLens models have one head count. A config whose layers differ (`n_heads=(1, 2)`)
is built with the largest count in every layer and the surplus heads' weights zero (present in `hook_pattern`
/ `hook_z`, writing nothing); `heads_per_layer(model)` gives the real counts, and `save` writes each layer's
real shapes. Move models with `model.to(device, print_details=False)` to keep TransformerLens quiet.

The hooked model carries its config as `model.markov_config` (a `ModelConfig`). What a weights file records beside
it (the training length, the step: `WeightsMetadata`) stays with the file's metadata: `weights_metadata(model)`
gives it for a model built from the file (`load`) or by training, without setting anything on TransformerLens's
object.
"""

import dataclasses
import functools
import inspect
import json
import os
import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ContextManager, Optional, Protocol, runtime_checkable

import torch
from jaxtyping import Float, Int
from torch import Tensor

from markov_interp._io import atomic_write, loads_json, read_regular
from markov_interp.devices import resolve_device
from markov_interp.models import _tl
from markov_interp.models._tl import first_norm, forward_from, hooked_kind, is_bridge, tl_version
from markov_interp.models.config import ModelConfig
from markov_interp.models.init import initial_state, state_shapes

__all__ = [
    "first_norm",
    "forward_from",
    "HookedConfig",
    "protocol_members",
    "HookedModel",
    "hooked_model",
    "build",
    "save",
    "save_state",
    "load",
    "NonFiniteWeights",
    "read_weights",
    "read_weights_file",
    "weights_step",
    "WeightsMetadata",
    "weights_metadata",
    "canonical_safetensors",
    "state_dict_for_save",
    "check_state",
    "check_tied",
    "heads_per_layer",
    "hooked_kind",
    "is_bridge",
    "tl_version",
    "tl_config",
    "tl_state_dict",
    "WEIGHTS_FILE",
]

WEIGHTS_FILE = "model.safetensors"
_CONFIG_KEY = "markov_interp.model_config"
_TRAIN_SEQ_LEN_KEY = "markov_interp.train_seq_len"  # written by training: the probes' default length
_STEP_KEY = "markov_interp.step"  # written by training: the step the weights are from


@functools.cache
def protocol_members(protocol: type) -> frozenset[str]:
    """The names a Protocol class declares (annotations, methods, properties; its bases' too), what
    `isinstance(x, protocol)` requires of `x`."""
    names: set[str] = set()
    for base in protocol.__mro__:
        if base in (Protocol, object) or base.__module__ == "typing":
            continue
        names |= set(getattr(base, "__annotations__", {}))
        names |= {k for k in vars(base) if not k.startswith("_") or k == "__call__"}
    return frozenset(names - {"_is_protocol", "_is_runtime_protocol"})


_MISSING = object()


@functools.cache
def _instance_members(protocol: type, kind: type) -> tuple[str, ...]:
    """The members of `protocol` that the class `kind` itself lacks (an instance must hold them)."""
    on_class = {name for base in kind.__mro__ for name in vars(base)}  # not the metaclass's (`type.__call__`)
    return tuple(sorted(protocol_members(protocol) - on_class))


class _StaticMembers(type(Protocol)):
    """`isinstance` against a runtime-checkable Protocol, with members looked up as Python 3.12 does
    (`inspect.getattr_static`, the class's members once per class): 3.11's `hasattr` runs properties, and
    TransformerLens's weight views (`W_Q`, ...) stack tensors, ~1.5 ms a check, while the test run's type
    checker checks every typed call."""

    def __instancecheck__(cls, instance: Any) -> bool:
        own = _instance_members(cls, type(instance))
        return all(inspect.getattr_static(instance, name, _MISSING) is not _MISSING for name in own)


class HookedConfig(Protocol):
    """What the package reads of a hooked model's TransformerLens config (`HookedTransformerConfig` on TL 2 / 3,
    `TransformerBridgeConfig` on TL 4). `attn_only` and `normalization_type` are read with a default
    (`getattr(model.cfg, "attn_only", False)`), so a config may lack them."""

    n_layers: int
    n_heads: int  # TL's one count: the largest layer's (`heads_per_layer(model)` gives each layer's)
    d_head: int
    d_model: int
    d_vocab: int
    n_ctx: int


@runtime_checkable
class HookedModel(Protocol, metaclass=_StaticMembers):
    """What the package's probes, reports, interventions and experiments use of a hooked TransformerLens model:
    `hooked_model` builds a `TransformerBridge` on TL 4 and a `HookedTransformer` on TL 2 / 3, and both (or any
    TransformerLens model of either family) have this surface.

    - `cfg`: the TransformerLens config (`HookedConfig`); `hook_dict`: {hook name: hook point}.
    - the forward (`model(tokens)`: logits [batch, pos, vocab]), `run_with_cache(tokens, names_filter=...)` ->
      (logits, cache), `run_with_hooks(tokens, fwd_hooks=[(name, fn)])` -> logits, `hooks(fwd_hooks=...)` (a
      context manager holding the hooks), `all_composition_scores(mode)`.
    - TransformerLens's weight views `W_E` [vocab, d_model], `W_U` [d_model, vocab], `W_Q` / `W_K` / `W_V`
      [layer, head, d_model, d_head], `W_O` [layer, head, d_head, d_model].
    - the torch module methods (`parameters`, `named_parameters`, `state_dict`, `load_state_dict`, `to`, `eval`).

    Models built here also carry `markov_config` (their `ModelConfig`; not part of the protocol, the probes read
    it with a default, so a hand-built TransformerLens model works too); what their weights file records (the
    training length) is `weights_metadata(model)`. `isinstance(model, HookedModel)` checks the names only.
    """

    cfg: HookedConfig

    @property
    def hook_dict(self) -> Mapping[str, Any]: ...

    @property
    def W_E(self) -> Float[Tensor, "vocab d_model"]: ...

    @property
    def W_U(self) -> Float[Tensor, "d_model vocab"]: ...

    @property
    def W_Q(self) -> Float[Tensor, "layer head d_model d_head"]: ...

    @property
    def W_K(self) -> Float[Tensor, "layer head d_model d_head"]: ...

    @property
    def W_V(self) -> Float[Tensor, "layer head d_model d_head"]: ...

    @property
    def W_O(self) -> Float[Tensor, "layer head d_head d_model"]: ...

    def __call__(self, tokens: Int[Tensor, "batch pos"], *args: Any, **kwargs: Any) -> Any: ...

    def run_with_cache(self, tokens: Int[Tensor, "batch pos"], *args: Any, **kwargs: Any) -> tuple[Any, Any]: ...

    def run_with_hooks(self, tokens: Int[Tensor, "batch pos"], *args: Any, **kwargs: Any) -> Any: ...

    def hooks(self, *args: Any, **kwargs: Any) -> ContextManager[Any]: ...

    def all_composition_scores(self, mode: str) -> Float[Tensor, "layer head layer2 head2"]: ...

    def parameters(self, recurse: bool = True) -> Iterator[torch.nn.Parameter]: ...

    def named_parameters(self, *args: Any, **kwargs: Any) -> Iterator[tuple[str, torch.nn.Parameter]]: ...

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Tensor]: ...

    def load_state_dict(self, *args: Any, **kwargs: Any) -> Any: ...

    def to(self, *args: Any, **kwargs: Any) -> Any: ...

    def eval(self) -> Any: ...


# ------------------------------------------------------------------------------------------------- build
def hooked_model(cfg: ModelConfig, state: Mapping[str, Tensor], device: Any = None,
                 *, source: str = "weights", metadata: Optional["WeightsMetadata"] = None) -> HookedModel:
    """The hooked model of `cfg` holding the weights `state` (the on-disk layout, `models.init.state_shapes`).

    The one place a hooked model is built (`build`, `load`, training results and stack members all come
    here). Non-finite values are loaded as they are (a diverged run's weights are data).

    Args:
        cfg: the model config.
        state: {name: tensor} as `save` writes it; missing, unexpected or wrongly shaped tensors raise ValueError
            naming them (prefixed by `source`).
        device: where the model lives (default CPU).
        source: how errors name the weights.
        metadata: what the weights' file records (or training knows) beside them; `weights_metadata(model)` gives
            it back (None: an empty `WeightsMetadata`).

    Returns:
        TransformerLens's model of the installed version (`hooked_kind()`) with `markov_config = cfg`, in eval
        mode: a tied `TransformerBridge` shares one Parameter between `model.embed` and `model.unembed` (a
        `HookedTransformer` holds an equal copy); layers with fewer heads than the largest count have zero
        surplus heads. The global RNG is neither read nor advanced.
    """
    if not isinstance(cfg, ModelConfig):
        raise ValueError(f"cfg must be a ModelConfig, got {type(cfg).__name__}")
    check_state(cfg, state, source=source)
    model = _tl.build(cfg, state)
    object.__setattr__(model, "markov_config", cfg)
    if metadata is not None:
        _METADATA[model] = metadata
    if device is not None:  # the one device check: "meta" or a missing GPU is a ValueError naming the device
        model.to(resolve_device(device), print_details=False)
    check_tied(model)
    return model


def build(cfg: ModelConfig, *, seed: int, device: Any = None) -> HookedModel:
    """A freshly initialised hooked model for `cfg`: `hooked_model(cfg, initial_state(cfg, seed))`.

    The same (cfg, seed) gives the same weights on any device, and the same weights as training starts from
    (see `models.init.initial_state` for the initialisations); the global RNG is neither read nor advanced.

    Args:
        cfg: the model config.
        seed: the initialiser's seed.
        device: where the model lives (default CPU).

    Returns:
        The hooked model (`markov_config = cfg`).
    """
    return hooked_model(cfg, initial_state(cfg, seed), device)


def heads_per_layer(model: HookedModel) -> tuple[int, ...]:
    """The heads each layer of a hooked model really has, layer 0 first.

    A plain TransformerLens model has `cfg.n_heads` in every layer. A markov-interp model whose layers have
    different head counts is built with the largest count in every layer, the surplus heads' weights at zero
    (they exist in `hook_pattern` / `hook_z` but write nothing): probes, interventions and reports skip them.
    """
    cfg = getattr(model, "markov_config", None)
    if cfg is not None:
        return tuple(cfg.heads_per_layer)
    return (int(model.cfg.n_heads),) * int(model.cfg.n_layers)


def tl_config(cfg: ModelConfig) -> Any:
    """TransformerLens's config for `cfg` on the installed version, for its unmodified model.

    Args:
        cfg: the model config.

    Returns:
        A `HookedTransformerConfig` (TL 2 / 3: `HookedTransformer(tl_config(cfg))`) or a `TransformerBridgeConfig`
        (TL 4: `TransformerBridge.boot_native(tl_config(cfg))`), every layer with the largest head count.
    """
    return _tl.tl_config(cfg)


def tl_state_dict(cfg: ModelConfig, state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Saved weights as the state dict of TransformerLens's unmodified model of the installed version.

    A `model.safetensors` holds only the tensors the config has; TL's own model (`tl_config(cfg)`) insists on
    zero biases, the tied unembedding as a copy and zero heads padding smaller layers: this adds them, so
    `load_state_dict(tl_state_dict(cfg, state), strict=True)` works and the model computes `hooked_model`'s
    logits. `state_dict_for_save(model, cfg)` is the way back.

    Args:
        cfg: the model config.
        state: on-disk tensors (`read_weights(path)`); ValueError naming any missing, unexpected or misshapen.

    Returns:
        {TransformerLens name: tensor} (copies; a HookedTransformer's buffers included).
    """
    check_state(cfg, state)
    return _tl.tl_state_dict(cfg, state)


# ------------------------------------------------------------------------------------------- tying check
def check_tied(model: HookedModel) -> None:
    """Assert a tied model's embedding and unembedding are one Parameter (a bridge) or equal copies (a
    HookedTransformer: TL has no tying), and an untied bridge's are not shared (internal invariant)."""
    cfg: ModelConfig = model.markov_config
    if not is_bridge(model):
        same = torch.allclose(model.W_U.T, model.W_E, rtol=0, atol=0, equal_nan=True)  # a diverged run is data
        assert not cfg.tie_weights or same, "tied copies W_U.T and W_E differ"
        return
    embed, head = _tl.raw(model.embed).weight, _tl.raw(model.unembed).weight
    if cfg.tie_weights:
        assert embed is head, "weight tying broken: embedding and unembedding are different tensors"
    else:
        assert embed is not head, "untied model shares embedding and unembedding"


def state_dict_for_save(model: HookedModel, cfg: Optional[ModelConfig] = None) -> dict[str, Tensor]:
    """The model's weights in the on-disk layout (`models.init.state_shapes`), from either kind.

    Args:
        model: a hooked model (`hooked_model`'s), or TransformerLens's own model booted from `tl_config(cfg)`.
        cfg: its config; default `model.markov_config`.

    Returns:
        {name: tensor}: contiguous CPU copies, each layer's real heads only, a tied unembedding stored once (as
        `embed.weight`), only the biases the config has. ValueError where the config cannot hold the model: a
        non-zero bias it lacks, non-zero weights in a padded head, a tied unembedding that differs from the
        embedding (a trained HookedTransformer's copies).
    """
    return _tl.disk_state(model, cfg if cfg is not None else model.markov_config)


def check_state(cfg: ModelConfig, state: Mapping[str, Tensor], *, source: str = "weights") -> None:
    """Refuse a state dict that does not fit `cfg`'s on-disk layout: ValueError naming missing, unexpected or
    wrongly shaped tensors (prefixed by `source`, e.g. the file)."""
    expected = state_shapes(cfg)
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ValueError(f"{source}: missing tensors {missing}, unexpected tensors {unexpected}")
    bad = {k: (tuple(state[k].shape), expected[k]) for k in expected if tuple(state[k].shape) != expected[k]}
    if bad:
        detail = ", ".join(f"{k} has shape {got}, expected {want}" for k, (got, want) in sorted(bad.items()))
        raise ValueError(f"{source}: wrong shapes: {detail}")


# ------------------------------------------------------------------------------------------ save / load
def save_state(cfg: ModelConfig, state: Mapping[str, Tensor], path: "str | os.PathLike", *,
               train_seq_len: Optional[int] = None, step: Optional[int] = None) -> Path:
    """Write weights in the on-disk layout with `cfg` in the file's metadata, atomically: the one writer of
    weight files (`save`, training's checkpoints and final weights).

    The same weights and metadata always give the same bytes (`canonical_safetensors`), so identical runs write
    byte-identical files.

    Args:
        cfg: the model config (embedded as JSON; `load` needs nothing else).
        state: {name: tensor} in the on-disk layout of `cfg` (checked: ValueError naming what does not fit).
        path: a `.safetensors` file, or a folder that gets `model.safetensors`.
        train_seq_len: the sequence length the weights were trained at (training writes it; `load` gives it
            back in `weights_metadata(model)`, the probes' default length), or None.
        step: the training step of the weights (training writes it: a checkpoint copied to another step's name
            is recognised, `read_weights_file`), or None.

    Returns:
        The file written.
    """
    from safetensors.torch import save as st_save

    check_state(cfg, state, source=str(path))
    path = Path(path)
    if path.suffix != ".safetensors":
        path.mkdir(parents=True, exist_ok=True)
        path = path / WEIGHTS_FILE
    tensors = {name: tensor.detach().to("cpu").contiguous() for name, tensor in state.items()}
    metadata = {_CONFIG_KEY: cfg.to_json(), "format": "pt"}
    if train_seq_len is not None:
        metadata[_TRAIN_SEQ_LEN_KEY] = str(int(train_seq_len))
    if step is not None:
        metadata[_STEP_KEY] = str(int(step))
    atomic_write(path, canonical_safetensors(st_save(tensors, metadata=metadata)))
    return path


def canonical_safetensors(data: bytes) -> bytes:
    """`data` (a safetensors file) with its header JSON written with sorted keys and no spaces, padded with spaces
    to a multiple of 8 bytes as safetensors pads it: safetensors writes `__metadata__` from a hash map, in an
    order that changes from process to process, so two writes of the same weights differed in bytes.

    Args:
        data: the bytes of a safetensors file.

    Returns:
        The same file with its header in one canonical form (the tensors' bytes untouched).
    """
    header, body = _split_header(data, "safetensors data")
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + body


def _split_header(data: bytes, source: str) -> tuple[dict, bytes]:
    """(header JSON, tensor bytes) of a safetensors file; ValueError naming `source` when the header is cut
    short or not a JSON object."""
    size = int.from_bytes(data[:8], "little") if len(data) >= 8 else -1
    if size < 0 or 8 + size > len(data):
        raise ValueError(f"{source} is not a readable safetensors file (its header is cut short: "
                         f"{len(data)} bytes; truncated?)")
    try:
        header = loads_json(data[8:8 + size], f"{source}'s safetensors header")  # depth-limited
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{source} is not a readable safetensors file (header: {err})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{source} is not a readable safetensors file (its header is not a JSON object)")
    return header, data[8 + size:]


def save(model: HookedModel, path: "str | os.PathLike", cfg: Optional[ModelConfig] = None) -> Path:
    """Write `model`'s weights to `path` (a `.safetensors` file, or a folder that gets `model.safetensors`).

    TransformerLens state-dict names; a tied unembedding is stored once; each layer's real heads; the
    `ModelConfig` is embedded as JSON in the file's metadata, so `load(path)` needs nothing else. Written
    atomically. Returns the file.
    """
    cfg = cfg if cfg is not None else model.markov_config
    if cfg != model.markov_config:
        raise ValueError("cfg does not match the model's markov_config")
    check_tied(model)
    return save_state(cfg, state_dict_for_save(model), path)


def _resolve_weights_path(path: "str | os.PathLike") -> Path:
    path = Path(path)
    if path.is_dir():
        path = path / WEIGHTS_FILE
    if not path.exists():
        raise FileNotFoundError(f"no model weights at {path}")
    return path


def read_weights(path: "str | os.PathLike") -> tuple[ModelConfig, dict[str, Tensor]]:
    """The config and raw tensors of a file written by `save`; corrupt files raise ValueError."""
    cfg, state, _ = read_weights_file(path)
    return cfg, state


def read_weights_file(path: "str | os.PathLike") -> tuple[ModelConfig, dict[str, Tensor], dict[str, str]]:
    """The config, raw tensors and metadata of a weights file written by `save` / `save_state`.

    The file is read by Python first (`_io.read_regular`: a regular file, at most this machine's memory), so a file
    this process may not read raises PermissionError naming it (safetensors' own open reports "No such file" for
    it), and a FIFO or device there is refused instead of read.

    Args:
        path: a `.safetensors` file, or a folder holding `model.safetensors`.

    Returns:
        (config, {name: tensor}, metadata); the metadata holds the training length and step when training wrote
        the file (`weights_step`).

    Raises:
        FileNotFoundError: nothing there. PermissionError: not readable. ValueError: a truncated or corrupt
        file, or one without a markov-interp config, naming the file.
    """
    from safetensors.torch import load as st_load

    from markov_interp.models.memory import memory_limit

    path = _resolve_weights_path(path)
    # a regular file, not larger than this machine's memory (a model that large could not be loaded anyway)
    data = read_regular(path, "weights file", limit=memory_limit("cpu")[0])
    header, _ = _split_header(data, str(path))
    try:
        state = st_load(data)
    except Exception as err:  # safetensors raises its own error types on corrupt headers / truncation
        raise ValueError(f"{path} is not a readable safetensors file ({type(err).__name__}: {err})") from None
    metadata = header.get("__metadata__") or {}
    if not isinstance(metadata, dict) or _CONFIG_KEY not in metadata:
        raise ValueError(f"{path} has no markov-interp model config in its metadata (not written by models.save?)")
    try:
        cfg = ModelConfig.from_dict(loads_json(metadata[_CONFIG_KEY], f"{path}: the model config in its metadata"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: model config in metadata is not valid JSON ({err})") from None
    except (ValueError, TypeError) as err:
        raise ValueError(f"{path}: invalid model config in metadata: {err}") from None
    return cfg, state, metadata


def weights_step(metadata: Mapping[str, str]) -> Optional[int]:
    """The training step recorded in a weights file's metadata (`read_weights_file`), None when none is."""
    return _recorded_int(metadata, _STEP_KEY)


def _recorded_int(metadata: Mapping[str, str], key: str) -> Optional[int]:
    value = metadata.get(key)
    return int(value) if isinstance(value, str) and value.isdigit() else None


@dataclasses.dataclass(frozen=True, kw_only=True)
class WeightsMetadata:
    """What a weights file records beside its tensors and model config (`save_state` writes it): the sequence
    length the weights were trained at, the probes' default length (`probes.probe_length`), and the training
    step. None where the file records nothing (`save` of a model of one's own).

    >>> WeightsMetadata.of({"markov_interp.train_seq_len": "64", "markov_interp.step": "400"})
    WeightsMetadata(train_seq_len=64, step=400)
    """

    train_seq_len: Optional[int] = None
    step: Optional[int] = None

    @classmethod
    def of(cls, metadata: Mapping[str, str]) -> "WeightsMetadata":
        """Read from a weights file's metadata strings (`read_weights_file`); absent or malformed entries: None."""
        return cls(train_seq_len=_recorded_int(metadata, _TRAIN_SEQ_LEN_KEY), step=weights_step(metadata))


# model -> the metadata of the weights it was built from: kept beside the model, not set on TransformerLens's object
# (a weak reference: the entry goes with the model)
_METADATA: "weakref.WeakKeyDictionary[Any, WeightsMetadata]" = weakref.WeakKeyDictionary()
_NO_METADATA = WeightsMetadata()


def weights_metadata(model: HookedModel) -> WeightsMetadata:
    """The metadata of the weights `model` was built from: the file's for `load` (and `runs.load_model`, which
    completes the training length of older run folders from their config), the run's for a model `training`
    returns; empty (all None) for any other model.

    Args:
        model: a hooked model.

    Returns:
        Its `WeightsMetadata`.
    """
    return _METADATA.get(model, _NO_METADATA)


class NonFiniteWeights(ValueError):
    """A weights file holds NaN or infinity (`load(..., finite=True)`); `keys` names the tensors as the file does."""

    def __init__(self, message: str, keys: list[str]) -> None:
        super().__init__(message)
        self.keys = keys


def load(path: "str | os.PathLike", *, device: Any = None, expect: Optional[ModelConfig] = None,
         finite: bool = False, train_seq_len: Optional[int] = None) -> HookedModel:
    """The hooked model saved at `path` (a run folder, or a `.safetensors` file written by `save`).

    Tying is restored (one shared Parameter). A missing file raises FileNotFoundError; a corrupt file, a
    missing / unexpected / wrongly shaped tensor, or a config different from `expect` raise ValueError
    naming the problem. `model.markov_config` holds the config; `weights_metadata(model)` what the file records
    beside it: the length the weights were trained at when training wrote the file (None otherwise, e.g. after
    `save`), the probes' default length (`probes.probe_length`), and the step. `train_seq_len` stands in for a
    file that records no length (run folders written before training recorded it: `runs.load_model` passes the
    folder config's). With `finite`, weights holding NaN or infinity raise `NonFiniteWeights` naming the tensors
    by the file's keys (not TransformerLens's module paths).
    """
    cfg, state, metadata = read_weights_file(path)
    if expect is not None and expect != cfg:
        diff = {k: (v, getattr(expect, k)) for k, v in cfg.to_dict().items() if getattr(expect, k) != v}
        raise ValueError(f"{path}: model config differs from the expected one (saved, expected): {diff}")
    bad = [name for name, tensor in state.items() if not torch.isfinite(tensor).all()] if finite else []
    if bad:
        raise NonFiniteWeights(f"{path} holds non-finite weights ({', '.join(bad[:3])}"
                               f"{' ...' if len(bad) > 3 else ''})", bad)
    recorded = WeightsMetadata.of(metadata)
    if recorded.train_seq_len is None and train_seq_len is not None:
        recorded = dataclasses.replace(recorded, train_seq_len=int(train_seq_len))
    model = hooked_model(cfg, state, device, source=str(path), metadata=recorded)
    model.eval()
    return model
