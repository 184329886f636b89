"""What a source is: the `Source` protocol and its two families (`KernelSource`, a source with a finite-order kernel
per sequence; `HiddenSource`, a source emitting from a hidden chain), the first-context laws the kernel sources
share, and `SourceConfig`, the base of one config class per kind, registered by name.

A kind is a config class (a frozen, keyword-only dataclass deriving from `SourceConfig`) registered with
`@register_source("name")`; its first docstring line is the kind's one-line help (the CLI's `--source` help) and
`build()` returns the source. `SourceConfig(kind="random", vocab=3)` builds the registered kind's config, and
`SourceConfig.from_dict` / `from_json` read any kind's table back by its "kind" key, so a run config holds one
`SourceConfig` whatever its kind.
"""

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Optional, Protocol, TypeVar, Union, runtime_checkable

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from markov_interp.config import Config, check_choice, shown
from markov_interp.sources.contexts import stationary_context_law

Tokens = Int[Tensor, "batch pos"]
Probs = Float[Tensor, "batch pos vocab"]
Kernels = Float[Tensor, "batch context vocab"]  # one kernel per sequence, flattened to [V**order, V]
InitialLaw = Union[str, Tensor, list, tuple]  # "stationary", "uniform" or a law over the first contexts

ROW_SUM_TOL = 1e-6  # how far a law's entries may sum from 1


# ---------------------------------------------------------------------------------------------- protocols
@runtime_checkable
class Source(Protocol):
    """What every source owes training, theory and the probes.

    - `vocab`: the states are 0..vocab-1.
    - `in_context`: True when the law of a sequence must be estimated from the sequence itself (each sequence
      has its own kernel, fresh from a prior or one of a finite pool): the in-context task, whose training
      defaults and references differ; False for a fixed chain, whose law a model can learn in its weights.
    - `sample(batch, seq_len, generator=None, *, device=None)`: `batch` independent sequences of `seq_len` states,
      int64 [batch, pos], from `generator` alone (same generator state, same tokens).
    - `predictive(tokens)`: the Bayes-optimal law of x_{t+1} given x_0..x_t at every position t, float64
      [batch, pos, vocab]: the best any predictor can do on this source, what a model's predictions are compared
      with (a fixed chain: its kernel's row, exact before an order-k context is full; fresh Dirichlet kernels: the
      in-context add-alpha posterior predictive; a finite pool: the pool's exact Bayes mixture).

    Optional: `config`, the `SourceConfig` that builds an equal source (theory keys its cached Monte Carlo on it);
    `sample_stream`, its draws from the counter stream (`StreamSource`: what training uses for runs on stream
    "counter-1"). A source with a finite-order kernel per sequence also satisfies `KernelSource`, which the kernel
    probes and the kernels' reference losses need.
    """

    vocab: int

    @property
    def in_context(self) -> bool: ...

    def sample(self, batch: int, seq_len: int, generator: Optional[torch.Generator] = None, *,
               device: Any = None) -> Any: ...

    def predictive(self, tokens: Tokens) -> Probs: ...


@runtime_checkable
class KernelSource(Source, Protocol):
    """A `Source` whose every sequence is a Markov chain of order `order` with a kernel of its own: what theory's
    kernel references (entropy rate, stationary laws, in-context Monte Carlo) and the kernel probes read.

    - `order`: the next state depends on the last `order` states.
    - `alpha`: the Dirichlet concentration of the prior the kernels come from, None for a fixed chain.
    - `support`: for a source with a prior, the transitions it gives positive probability as a boolean
      [V**order, V] (each row's Dirichlet(alpha) is over that row's allowed states); None when every transition
      is allowed, and for fixed chains (their kernel says it).
    - `pool`: the finite set of kernels a sequence draws from, uniformly, as [N, V**order, V] float64 (a fixed
      chain is a pool of one kernel); None when every sequence draws a fresh kernel from the prior.
    - `sample(..., return_kernels=True)`: the tokens and each sequence's kernel [batch, V**order, V].
    - `initial_context_laws(kernels)`: the law of each sequence's first `order` states over contexts, given its
      kernel (the stationary law of that kernel, or a fixed law).
    - `initial`: the first-context law as given, "stationary" or a tuple over the V**order contexts.
    """

    order: int

    @property
    def alpha(self) -> Optional[float]: ...

    @property
    def support(self) -> Optional[Bool[Tensor, "context vocab"]]: ...

    @property
    def pool(self) -> Optional[Float[Tensor, "kernel context vocab"]]: ...

    @property
    def initial(self) -> str | tuple[float, ...]: ...

    def sample(self, batch: int, seq_len: int, generator: Optional[torch.Generator] = None, *,
               device: Any = None, return_kernels: bool = False) -> Any: ...

    def initial_context_laws(self, kernels: Kernels) -> Float[Tensor, "batch context"]: ...


@runtime_checkable
class StreamSource(Protocol):
    """A source that draws from the counter stream (`markov_interp.streams`, the data of runs on stream
    "counter-1"), for several members at once.

    - `sample_stream(batch, seq_len, keys, step)`: [member, batch, seq_len] int64 tokens, member m's from its key
      `keys[m]` (`streams.member_keys`, [member, 2] on the device to draw on) at `step` (an int or a 0-dim int64
      tensor on that device, < 2**32): every random number a pure function of (key, step, purpose, index), drawn
      with `streams.words` / `streams.gamma` (a new kind of draw takes a new entry of `streams.PURPOSES`), so a
      member's tokens are the same alone and beside any others, and a run resumes from its step alone. Ideally one
      pass for all members, reading no device value (a capturable step).

    The kernel sources implement it (`sampling.kernel_stream_sampler`). A source without it still trains on
    "counter-1": each member draws `sample(batch, seq_len, generator=g)` from a generator seeded, at every step,
    by its "generator" words (`sources.stream_sampler`): the same numbers alone and in any stack and a resume from
    the step alone, but one draw per member, and one host read a step. Its numbers change when it adopts
    `sample_stream`: adopt it before runs that must resume are trained.
    """

    def sample_stream(self, batch: int, seq_len: int, keys: Int[Tensor, "member 2"],
                      step: Any) -> Int[Tensor, "member batch pos"]: ...


@runtime_checkable
class HiddenSource(Source, Protocol):
    """A `Source` that emits from a hidden Markov chain given by labelled transition matrices (`sources.hmm`): what
    theory's hidden references (`theory.hidden`) and the belief probes (`probes.beliefs`) read. It has no kernel
    of finite order: the law of the next token depends on the whole prefix through the belief.

    - `hidden`: the number of hidden states.
    - `transition_matrices`: T[x, i, j] = P(emit x, move to j | in i), float64 [vocab, hidden, hidden].
    - `belief_states(tokens)`: P(hidden state after x_t | x_0..x_t) from the stationary start, float64
      [batch, pos, hidden] (the forward filter; its `predictive` is the belief times the emission law).
    """

    hidden: int

    @property
    def transition_matrices(self) -> Float[Tensor, "vocab hidden hidden"]: ...

    def belief_states(self, tokens: Tokens) -> Float[Tensor, "batch pos hidden"]: ...


def initial_context_law(initial: InitialLaw, kernel: Tensor | None, vocab: int, order: int) -> Tensor | str:
    """The law of the first `order` states as a law over the V**order contexts, or "stationary" when it is each
    kernel's own and no single kernel is given.

    Args:
        initial: "stationary", "uniform" or a probability vector over the contexts.
        kernel: the chain's one kernel, or None for kernels drawn per sequence.
        vocab, order: the chain's states and order.

    Returns:
        A float64 law over contexts, or the keyword "stationary".
    """
    n_ctx = vocab**order
    if isinstance(initial, str):
        if initial not in ("stationary", "uniform"):
            raise ValueError(f"initial must be 'stationary', 'uniform' or a probability vector, got {shown(initial)}")
        if initial == "uniform":
            return torch.full((n_ctx,), 1.0 / n_ctx, dtype=torch.float64)
        return stationary_context_law(kernel) if kernel is not None else "stationary"
    law = torch.as_tensor(initial, dtype=torch.float64).flatten()
    if law.numel() == vocab and order > 1:
        raise ValueError(f"an initial law for an order-{order} chain must be over the {n_ctx} contexts (V**k)")
    if law.numel() != n_ctx:
        raise ValueError(f"initial law must have {n_ctx} entries, got {law.numel()}")
    if not torch.isfinite(law).all() or (law < 0).any() or abs(law.sum().item() - 1) > ROW_SUM_TOL:
        raise ValueError(f"initial law must be non-negative and sum to 1, got {law.tolist()}")
    return law


# ------------------------------------------------------------------------------------------------- configs
C = TypeVar("C", bound="SourceConfig")
_REGISTRY: dict[str, type["SourceConfig"]] = {}
DEFAULT_KIND = "binary"  # the kind of a source config that names none

# The table every config.json of the first four kinds holds: they were written by one config class whose fields
# were the union of theirs, so each file also holds the options its kind lacks, at these values. A kind that sets
# `_flat_layout` writes them still (in this order, after "kind"), so its files and sweep cell ids (hashes of the
# JSON) stay what they were; on reading, an option of another kind is accepted at such a value (`_absent`).
FLAT_LAYOUT = {"p": None, "q": None, "kernel": None, "order": 1, "vocab": None, "alpha": 1.0, "initial": "stationary"}


class _KindDispatch(type):
    """The metaclass of `SourceConfig`: `SourceConfig(kind=..., **options)` builds the registered kind's config,
    and every config class refuses, with one `ValueError`, the options of other kinds and missing options."""

    def __call__(cls, *args: Any, **options: Any) -> Any:
        if args:
            raise TypeError(f"{cls.__name__} takes keyword arguments only, got {len(args)} positional")
        kind = options.pop("kind", DEFAULT_KIND if cls is SourceConfig else cls.kind)
        if cls is SourceConfig:
            cls = source_config_class(kind)
        elif kind != cls.kind:
            raise ValueError(f"{cls.__name__} is the config of kind {cls.kind!r}, got kind={kind!r}")
        return super(_KindDispatch, cls).__call__(**cls._own_options(options))


@dataclasses.dataclass(frozen=True, kw_only=True)
class SourceConfig(Config, metaclass=_KindDispatch):
    """A serialisable description of a source: what a run folder records and `build()` turns into a source.

    The base of one config class per kind: `SourceConfig(kind="random", vocab=3, alpha=1.0)` is the registered
    kind's config (`RandomMarkovConfig(vocab=3, alpha=1.0)`, an instance of `SourceConfig`), and
    `SourceConfig.from_dict` reads any kind back by its "kind" key (default "binary"). Serialisation, `replace`
    and unknown-key refusal come from `config.Config`; options of another kind are refused naming them, except at
    the values a file of the flat layout holds for them (`FLAT_LAYOUT`).

    A kind declares: its fields (the options), `build()`, and in its first docstring line its one-line help;
    optionally `run_defaults` (the options `default_run` and `markov-interp train` fill in when not given),
    `states_option` (the option that sets the number of states, which the memory plan names) and `_flat_layout`.

    >>> cfg = SourceConfig(kind="random", vocab=3, alpha=1.0)
    >>> type(cfg).__name__, cfg.kind, isinstance(cfg, SourceConfig), SourceConfig.from_json(cfg.to_json()) == cfg
    ('RandomMarkovConfig', 'random', True, True)
    """

    kind: ClassVar[str]  # set by `register_source`
    run_defaults: ClassVar[dict[str, Any]] = {}
    states_option: ClassVar[Optional[str]] = "vocab"
    _flat_layout: ClassVar[bool] = False  # written with the keys of `FLAT_LAYOUT` (the first four kinds)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):  # arrays (kernels, laws) as nested tuples: hashable, comparable
            value = getattr(self, f.name)
            if isinstance(value, (list, tuple, Tensor)):
                object.__setattr__(self, f.name, _to_tuple(value))
        self.build()  # validates every value once, with the sources' own messages

    def build(self) -> Source:
        """The source object this config describes."""
        raise NotImplementedError(f"{type(self).__name__} does not say how to build its source")

    @property
    def in_context(self) -> bool:
        """Whether each sequence's law must be estimated in context (the built source's `in_context`): the
        in-context task, whose defaults and references differ from a fixed chain's."""
        return self.build().in_context

    @property
    def vocab_size(self) -> int:
        """Number of states the source emits."""
        return self.build().vocab

    @classmethod
    def summary(cls) -> str:
        """The kind's one-line help: the first line of its class docstring."""
        return (cls.__doc__ or cls.__name__).strip().splitlines()[0]

    def data_bytes(self, *, batch: int, length: int, members: int) -> Optional[tuple[int, int]]:
        """(sampler, references): the bytes the training plan (`training.plan`) counts for drawing `members` x
        `batch` sequences of `length` states and for theory's references; None (the default) for a chain with a
        kernel of order `order` per sequence, which the plan estimates itself from `order` and `pool_size`."""
        return None

    def reference_key(self) -> dict[str, Any]:
        """The options that identify this source's laws in theory's reference cache: the kind and every option set
        (None left out)."""
        return {k: v for k, v in self.to_dict().items() if v is not None}

    def to_dict(self) -> dict[str, Any]:
        """{"kind": ..., every option} (JSON-ready; `FLAT_LAYOUT`'s keys first for a kind of the flat layout)."""
        own = super().to_dict()
        if not self._flat_layout:
            return {"kind": self.kind, **own}
        flat = {key: own.pop(key, absent) for key, absent in FLAT_LAYOUT.items()}
        return {"kind": self.kind, **flat, **own}

    @classmethod
    def from_dict(cls: type[C], data: Any, *, where: Optional[str] = None) -> C:
        """The config of the kind `data["kind"]` names (default "binary"), with `data`'s options. Unknown keys,
        options of another kind, missing options and non-tables raise ValueError (errors about the keys name the
        section `where`)."""
        if not isinstance(data, Mapping):
            place = f"{where} must be" if where else "must be given"
            raise ValueError(f"{cls.__name__}: {place} a table (dict) of options, got {type(data).__name__} {data!r}")
        _check_known(data, where)
        return cls(**data)

    @classmethod
    def _own_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        """`options` less those of other kinds at their absent values, after refusing the others and any missing
        option (the checks `SourceConfig(...)` and `from_dict` share)."""
        own = {f.name: f for f in dataclasses.fields(cls)}
        _check_known(options)
        foreign = [name for name, value in options.items() if name not in own and not _absent(name, value)]
        if foreign:  # an option of another kind would be stored but never used
            raise ValueError(f"a {cls.kind} source does not use {foreign}; it takes {list(own)}")
        missing = [name for name, f in own.items() if name not in options and f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING]
        if missing:
            raise ValueError(f"a {cls.kind} source needs {' and '.join(missing)}")
        return {name: value for name, value in options.items() if name in own}


def register_source(kind: str) -> Callable[[type[C]], type[C]]:
    """Register a config class as the source kind `kind` (a class decorator, over `@dataclasses.dataclass(frozen=True,
    kw_only=True)`): `SourceConfig(kind=kind, ...)`, `SourceConfig.from_dict`, run configs, sweeps and the CLI's
    `--source` then know it.

    Args:
        kind: the name configs and files give the kind.

    Returns:
        The decorator; it sets the class's `kind`. A name registered already raises ValueError.
    """
    def register(cls: type[C]) -> type[C]:
        if not (isinstance(cls, type) and issubclass(cls, SourceConfig) and dataclasses.is_dataclass(cls)):
            raise ValueError(f"register_source({kind!r}) takes a dataclass deriving from SourceConfig, got {cls!r}")
        if kind in _REGISTRY:
            raise ValueError(f"source kind {kind!r} is registered already ({_REGISTRY[kind].__name__})")
        cls.kind = kind
        _REGISTRY[kind] = cls
        return cls

    return register


def source_kinds() -> tuple[str, ...]:
    """The registered source kinds, in registration order (the CLI's `--source` choices).

    >>> source_kinds()[:4]
    ('binary', 'markov', 'random', 'cyclic')
    """
    return tuple(_REGISTRY)


def source_config_class(kind: Any) -> type[SourceConfig]:
    """The config class registered as `kind`; ValueError naming the registered kinds otherwise."""
    check_choice("source kind", kind, source_kinds())
    return _REGISTRY[kind]


def source_options() -> dict[str, Any]:
    """Every option a source config of some registered kind takes, "kind" included, with its annotation (the union
    of the kinds' annotations where several take it): the "source.*" keys runs, sweeps and tables accept."""
    options: dict[str, Any] = {"kind": str}
    for cls in _REGISTRY.values():
        for f in dataclasses.fields(cls):
            options[f.name] = Union[options[f.name], f.type] if f.name in options else f.type
    return options


def _check_known(options: Mapping[str, Any], where: Optional[str] = None) -> None:
    """Refuse keys that no registered kind takes, naming them and the valid ones (and the section `where`)."""
    known = source_options()
    unknown = sorted(set(options) - set(known), key=str)
    if unknown:
        raise ValueError(f"{where + ': ' if where else ''}unknown SourceConfig keys {unknown}; valid keys are "
                         f"{sorted(known)}")


def _absent(name: str, value: Any) -> bool:
    """Whether `value` is what a config of a kind without option `name` may hold for it: None, or the option's
    default in a kind that takes it (alpha 1.0, order 1, zero_diagonal False: what flat-layout files hold; a bool
    only where the default is one)."""
    if value is None:
        return True
    defaults = [f.default for cls in _REGISTRY.values() for f in dataclasses.fields(cls) if f.name == name]
    return any(default is not dataclasses.MISSING and isinstance(default, bool) == isinstance(value, bool)
               and default == value for default in defaults)


def _to_tuple(value: Any) -> Any:
    if isinstance(value, Tensor):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return tuple(_to_tuple(v) for v in value)
    return value
