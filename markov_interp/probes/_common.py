"""Shared pieces of the probes: axis names, hook names, the device, one probe batch, total variation.

Every probe works on any TransformerLens hooked model (a `TransformerBridge` from `markov_interp.models`, a
hand-built bridge, or a `HookedTransformer`): it only uses `model.cfg` (n_layers, n_heads, d_vocab),
`run_with_cache(names_filter=...)`, `run_with_hooks(fwd_hooks=...)` and the standard hook names below, which
both TransformerLens model families share. States are integer tokens 0..V-1; there is no tokenizer and no BOS.
"""

import dataclasses
import functools
import inspect
import math
import types
import typing
import warnings
from collections.abc import Sequence
from typing import Any, Optional, Union

import torch
from jaxtyping import Float, Int
from torch import Tensor

from markov_interp import theory
from markov_interp._display import displayed
from markov_interp._plan import Need, check_needs, memory_limit
from markov_interp.config import SEED_MAX, check_int, check_type, check_value, shown
from markov_interp.sources import (
    HiddenSource,
    KernelSource,
    Source,
    add_beta_predictions,
    context_index,
    kernel_predictions,
)
from markov_interp.models import HookedModel, weights_metadata
# the hook-name functions of the probes; their one home is `models.hooks` (TransformerLens's names)
from markov_interp.models.hooks import attn_out_hook, mlp_out_hook, pattern_hook, z_hook  # noqa: F401

Tokens = Int[Tensor, "batch pos"]
Probs = Float[Tensor, "batch pos vocab"]
HeadScores = Float[Tensor, "layer head"]


def has_mlp(model: HookedModel, layer: int) -> bool:
    """Whether block `layer` has an MLP (attention-only models have none)."""
    return not getattr(model.cfg, "attn_only", False) and mlp_out_hook(layer) in model.hook_dict


DEFAULT_PROBE_LENGTH = 128  # probe length for a model whose training length is unknown (capped at n_ctx)
PROBE_SEQUENCES = 64  # sequences of the default probe batch (classify_mechanism; discover_circuit reads its head)


class ProbeLengthWarning(UserWarning):
    """A probe ran on sequences longer than the model was trained on (positions it never saw in training)."""


def training_length(model: HookedModel) -> Optional[int]:
    """The sequence length the model was trained at, None when unknown.

    It is what the model's weights file records (`models.weights_metadata(model).train_seq_len`): for a model of
    `models.load` / `runs.load_model` (the run's config.json completes run folders written before the weights
    recorded it) and the models `training.train` / `train_many` return. On a model of your own, set
    `model.markov_train_seq_len = 64` to get the same defaults and warnings (it takes precedence; the package
    itself never sets it).

    Args:
        model: a TransformerLens hooked model.

    Returns:
        The training length, or None.
    """
    value = getattr(model, "markov_train_seq_len", None)  # set by hand on a model of one's own
    if value is None:
        value = weights_metadata(model).train_seq_len
    return None if value is None else int(value)


def probe_length(model: HookedModel, seq_len: Optional[int] = None) -> int:
    """The sequence length a probe runs at: `seq_len` when given, else the model's training length when known
    (`training_length`: what its weights file records), else min(n_ctx, DEFAULT_PROBE_LENGTH). Every entry point
    (Python probes, `probe`, `report`, sweeps) uses this rule (`probe_length_for`, the same rule before a model
    is loaded).

    Args:
        model: a TransformerLens hooked model.
        seq_len: an explicit length (an integer >= 2); refused beyond the model's n_ctx, and beyond its training
            length it warns once per model (`ProbeLengthWarning`).

    Returns:
        The probe length.
    """
    length = probe_length_for(int(model.cfg.n_ctx), training_length(model), seq_len)
    if seq_len is not None:
        check_probe_length(model, length)  # the warning beyond the training length, once per model
    return length


def probe_length_for(n_ctx: int, trained: Optional[int], seq_len: Optional[int] = None) -> int:
    """`probe_length`'s rule on the numbers it reads of a model: what `markov-interp probe` / `report` size
    their probe batch by before loading the model (`n_ctx` of the run's model config, `trained` its
    `train.seq_len`).

    Args:
        n_ctx: the model's context length.
        trained: its training length, or None when unknown.
        seq_len: an explicit length (an integer >= 2, at most `n_ctx`), or None.

    Returns:
        The probe length: `seq_len`, else min(trained, n_ctx), else min(n_ctx, DEFAULT_PROBE_LENGTH).

    >>> probe_length_for(256, 64), probe_length_for(256, None), probe_length_for(256, 64, seq_len=32)
    (64, 128, 32)
    """
    if seq_len is None:
        return min(trained, n_ctx) if trained is not None else min(n_ctx, DEFAULT_PROBE_LENGTH)
    check_int("seq_len", seq_len, minimum=2)
    if seq_len > n_ctx:
        raise ValueError(f"probe sequences of length {seq_len} exceed the model's n_ctx={n_ctx}")
    return int(seq_len)


def check_probe_length(model: HookedModel, seq_len: int) -> None:
    """Refuse sequences longer than the model's n_ctx; warn (once per model) beyond its training length.

    Args:
        model: a TransformerLens hooked model (remembers that it warned in `_markov_probe_length_warned`).
        seq_len: the length a probe is about to run at.

    Returns:
        None; raises ValueError beyond n_ctx, warns `ProbeLengthWarning` beyond the training length.
    """
    n_ctx = int(model.cfg.n_ctx)
    if seq_len > n_ctx:
        raise ValueError(f"probe sequences of length {seq_len} exceed the model's n_ctx={n_ctx}")
    trained = training_length(model)
    if trained is None or seq_len <= trained or getattr(model, "_markov_probe_length_warned", False):
        return
    model._markov_probe_length_warned = True
    warnings.warn(
        f"probing at sequence length {seq_len}, but the model was trained on sequences of {trained}: positions "
        f"{trained}..{seq_len - 1} were never seen in training, so probe numbers there describe extrapolation "
        f"(pass seq_len <= {trained}; this warning is shown once per model)",
        ProbeLengthWarning, stacklevel=3,
    )


def as_tokens(value: Any) -> Any:
    """The tokens of a `ProbeBatch`, anything else unchanged: every probe that reads tokens takes a batch too.

    Args:
        value: tokens [batch, pos], a `ProbeBatch`, or None.

    Returns:
        `value.tokens` for a batch, else `value`.
    """
    return value.tokens if isinstance(value, ProbeBatch) else value


def model_device(model: HookedModel) -> torch.device:
    """The device the model's weights live on (tokens are moved there before a forward pass)."""
    for param in model.parameters():
        return param.device
    return torch.device("cpu")


def check_tokens(model: HookedModel, tokens: Any) -> Tensor:
    """Validate a token batch against the model (2-D integer states in 0..V-1, at most n_ctx long) and move it
    to the model's device; a `ProbeBatch` stands for its tokens. Beyond the model's training length it warns
    once (`check_probe_length`)."""
    tokens = as_tokens(tokens)
    if not isinstance(tokens, Tensor) or tokens.ndim != 2 or tokens.dtype not in (torch.int64, torch.int32):
        hint = " (one sequence? use tokens[None])" if isinstance(tokens, Tensor) and tokens.ndim == 1 else ""
        raise ValueError(f"tokens must be an integer tensor [batch, pos], got {_describe(tokens)}{hint}")
    vocab = int(model.cfg.d_vocab)
    check_probe_length(model, int(tokens.shape[1]))
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab):
        raise ValueError(f"tokens must lie in 0..{vocab - 1}, got values {int(tokens.min())}..{int(tokens.max())}")
    return tokens.to(model_device(model), torch.long)


def state_labels(tokens: Any, *, names: Optional[Sequence[str]] = None) -> Any:
    """Labels of states for circuitsvis and plots, like TransformerLens's `model.to_str_tokens`.

    Args:
        tokens: states as a tensor [pos] (or [1, pos]) or a sequence of ints; [batch, pos] gives one list per
            sequence.
        names: a name per state (e.g. "ABC" or ["sun", "rain"]); default the state's number.

    Returns:
        One string per position (a list of such lists for a batch).

    >>> state_labels(torch.tensor([[0, 1, 1]]))
    ['0', '1', '1']
    >>> state_labels([0, 2, 1], names="ABC")
    ['A', 'C', 'B']
    """
    values = tokens.detach().cpu() if isinstance(tokens, Tensor) else torch.as_tensor(tokens)
    if values.ndim == 2 and values.shape[0] == 1:
        values = values[0]
    if values.ndim not in (1, 2) or values.dtype.is_floating_point or values.dtype == torch.bool:
        raise ValueError(f"tokens must be integer states [pos] or [batch, pos], got {_describe(tokens)}")
    if values.ndim == 2:
        return [state_labels(row, names=names) for row in values]
    if names is not None and values.numel() and not 0 <= int(values.min()) <= int(values.max()) < len(names):
        raise ValueError(f"names has {len(names)} entries but the states run {int(values.min())}..{int(values.max())}")
    return [str(int(t)) if names is None else str(names[int(t)]) for t in values]


def context_labels(vocab: int, order: int) -> list[str]:
    """Labels of the V**order contexts in kernel-row order (base-V digits, oldest state first: "01" = 0 then 1).

    Args:
        vocab: the number of states V.
        order: the context length k.

    Returns:
        V**k labels.

    >>> context_labels(2, 2)
    ['00', '01', '10', '11']
    """
    digits = [""]
    for _ in range(order):
        digits = [prefix + str(state) for prefix in digits for state in range(vocab)]
    return digits


def _describe(value: Any) -> str:
    if isinstance(value, Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return type(value).__name__


# ------------------------------------------------------------------------------------------ predictions
@torch.no_grad()
def next_state_probs(model: HookedModel, tokens: "TokensOrBatch", *, fwd_hooks: Optional[list] = None) -> Probs:
    """The model's predicted law of x_{t+1} after x_0..x_t at every position t (float64, rows sum to 1).

    `fwd_hooks` (TransformerLens `(hook_name, fn)` pairs) run during the forward pass, e.g. ablations.

    >>> probs = next_state_probs(model, tokens)
    >>> probs.shape, float((probs.sum(-1) - 1).abs().max()) < 1e-9
    (torch.Size([16, 32, 3]), True)
    """
    tokens = check_tokens(model, tokens)
    if fwd_hooks:
        logits = model.run_with_hooks(tokens, fwd_hooks=fwd_hooks)
    else:
        logits = model(tokens)
    return torch.softmax(logits.double(), dim=-1)


def total_variation(p: Float[Tensor, "*#batch vocab"], q: Float[Tensor, "*#batch vocab"]) -> Float[Tensor, "..."]:
    """Total-variation distance 1/2 sum |p - q| between two laws over the last axis (0: equal, 1: disjoint).

    Leading axes broadcast against each other.

    >>> float(total_variation(torch.tensor([0.8, 0.2]), torch.tensor([0.3, 0.7])))
    0.5
    """
    return 0.5 * (p - q).abs().sum(-1)


# ------------------------------------------------------------------------------------------- probe batch
@displayed
@dataclasses.dataclass(frozen=True, kw_only=True, eq=False, repr=False)
class ProbeBatch:
    """Sequences a probe runs on, with the source they were drawn from and the kernel of each sequence.

    `source` is the source (its `predictive` is the Bayes-optimal law a model is compared with). A source without
    a kernel (a hidden Markov source, `sources.HiddenSource`) gives `kernels`, `order` and `initial` None: the
    probes that compare the model with each sequence's kernel refuse it (`check_batch`). `kernels[b]` is
    sequence b's kernel as [V**order, V] (rows indexed by the base-V number of the last `order` states, oldest
    first): the same fixed kernel for every row of a `MarkovChain`, a fresh Dirichlet draw per row of a
    `RandomMarkov`. `initial[b]` is the law sequence b's first `order` states were drawn from, over contexts
    (`source.initial_context_laws(kernels)`); None stands for each kernel's stationary context law.
    """

    tokens: Int[Tensor, "batch pos"]
    kernels: Optional[Float[Tensor, "batch context vocab"]]  # None: a source without a kernel
    vocab: int
    order: Optional[int]
    random_kernel: bool  # the source's `in_context`: a kernel per sequence (none to learn in weights)
    beta: float  # add-beta smoothing of the in-context references: the prior's alpha, 1/2 for a fixed chain
    source: Source
    initial: Optional[Float[Tensor, "batch context"]] = None

    def _headline(self) -> str:  # one line, not the tensors
        batch, seq = self.tokens.shape
        if self.kernels is None:
            return f"{batch} sequences x {seq} states over {self.vocab} states from {self.source!r} (no kernel)"
        kind = "a random kernel per sequence" if self.random_kernel else "one fixed kernel"
        return (f"{batch} sequences x {seq} states over {self.vocab} states, order {self.order}, {kind}, "
                f"beta {self.beta:g}")


TokensOrBatch = Union[Tokens, ProbeBatch]  # what a probe that reads tokens takes: tokens or a ProbeBatch


def check_batch(batch: Any, where: str) -> ProbeBatch:
    """`batch` if it is a `ProbeBatch`, else a clear error: probes that compare the model with each sequence's
    kernel need the kernels, which bare tokens do not carry.

    Args:
        batch: what the probe was given.
        where: the probe's name, for the message.

    Returns:
        `batch`, checked.
    """
    if not isinstance(batch, ProbeBatch):
        raise ValueError(f"{where} compares the model with each sequence's kernel, so it takes a ProbeBatch "
                         f"(probes.sample_batch(source, n_sequences=..., seq_len=..., seed=...)), got {_describe(batch)}")
    if batch.kernels is None:
        raise ValueError(f"{where} compares the model with each sequence's kernel, and {batch.source!r} has none "
                         f"(it needs a sources.KernelSource; a hidden Markov source's batch goes to the belief "
                         f"probes, probes.beliefs.belief_probes)")
    return batch


def sample_batch(source: Source, *, n_sequences: int, seq_len: int, seed: int) -> ProbeBatch:
    """Draw `n_sequences` sequences of `seq_len` states from `source` with a CPU generator seeded by `seed`: with
    each sequence's kernel for a `sources.KernelSource`, the tokens alone for any other source (`kernels` None)."""
    check_int("n_sequences", n_sequences, minimum=2)
    check_int("seq_len", seq_len, minimum=2)
    check_int("seed", seed)
    if not isinstance(source, Source):
        raise ValueError(f"source must be {_SOURCE_TAKES}, got {type(source).__name__}")
    gen = torch.Generator().manual_seed(seed)
    if not isinstance(source, KernelSource):
        return ProbeBatch(tokens=source.sample(n_sequences, seq_len, gen), kernels=None, vocab=source.vocab,
                          order=None, random_kernel=source.in_context, beta=0.5, source=source)
    tokens, kernels = source.sample(n_sequences, seq_len, gen, return_kernels=True)
    kernels = kernels.contiguous()  # a fixed chain gives one kernel expanded over the rows
    return ProbeBatch(
        tokens=tokens, kernels=kernels, vocab=source.vocab, order=source.order, random_kernel=source.in_context,
        beta=default_beta(source), source=source, initial=source.initial_context_laws(kernels),
    )


def check_source_matches(model: HookedModel, source: Source) -> None:
    """Refuse a source whose number of states differs from the model's vocabulary."""
    if int(source.vocab) != int(model.cfg.d_vocab):
        raise ValueError(f"source has {source.vocab} states but the model's d_vocab is {model.cfg.d_vocab}")


def contexts(tokens: Tokens, *, vocab: int, order: int) -> Int[Tensor, "batch pos"]:
    """Base-V index of the last `order` states at every position (-1 where fewer than `order` states)."""
    return context_index(tokens, vocab, order)


def kernel_probs(batch: ProbeBatch) -> Probs:
    """The true next-state law at every position given each sequence's kernel (`sources.kernel_predictions`; for
    a fixed chain the same computation as its `predictive`): the kernel row of the current context. For random
    kernels it is an oracle that knows each sequence's kernel, not the Bayes law the data allow
    (`batch.source.predictive`).

    Positions with fewer than `order` states (order > 1 only) get the exact law of the next state given the
    states so far under the sequence's initial context law. (Before this was shared with `theory`, they got the
    stationary law pi instead; probe values at those first positions of order-k chains moved.)
    """
    initial = batch.initial
    if initial is None:
        initial = theory.stationary_context_laws(_distinct_kernels(batch).cpu()).to(batch.kernels.device)
    return kernel_predictions(_distinct_kernels(batch), batch.tokens, initial)


def _distinct_kernels(batch: ProbeBatch) -> Float[Tensor, "kernels context vocab"]:
    """The kernels as [1, V**k, V] for a fixed chain (one kernel serves every row), else one per sequence."""
    check_batch(batch, "a kernel law (kernel_probs, stationary_probs)")
    return batch.kernels if batch.random_kernel else batch.kernels[:1]


def stationary_laws(batch: ProbeBatch) -> Float[Tensor, "batch vocab"]:
    """The stationary law pi of each sequence's kernel (one law for a fixed chain, one per row otherwise)."""
    pis = theory.stationary_state_laws(_distinct_kernels(batch).cpu())
    return pis.to(batch.kernels.device).expand(batch.kernels.shape[0], -1)


def stationary_probs(batch: ProbeBatch) -> Probs:
    """The stationary law pi broadcast to every position: the best predictor that ignores the context
    (`theory.stationary_predictions`, the same computation as `theory.plateau_predictions` for a fixed chain)."""
    return theory.stationary_predictions(_distinct_kernels(batch), batch.tokens)


def in_context_unigram_probs(tokens: Tokens, vocab: int, *, beta: float | int) -> Probs:
    """In-context add-beta estimate of the next state from state counts x_0..x_t (ignores the current state).

    The best predictor that uses the context but not the current state (Edelman et al.'s unigram phase);
    `sources.add_beta_predictions` with order 0.
    """
    return add_beta_predictions(tokens, vocab, order=0, beta=beta)


target_losses = theory.target_log_loss


def json_safe(value: Any) -> Any:
    """`value` with tensors turned into lists and NaN / infinities into None (strict JSON has neither)."""
    if isinstance(value, Tensor):
        value = value.detach().cpu().tolist()
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def default_beta(source: KernelSource) -> float:
    """The add-beta smoothing used for in-context references: the alpha of a source with a prior (random kernels),
    else 1/2."""
    return float(source.alpha) if source.alpha is not None else 0.5


def ratio_of_means(numerator: Float[Tensor, " batch"], denominator: Float[Tensor, " batch"]) -> tuple[float, float]:
    """mean(numerator) / mean(denominator) over sequences and its standard error (delta method: the SE of
    mean(numerator - r x denominator) / mean(denominator)); NaN when the denominator's mean is 0.

    >>> ratio_of_means(torch.tensor([1.0, 3.0]), torch.tensor([2.0, 2.0]))
    (1.0, 0.5)
    """
    num, den = numerator.double(), denominator.double()
    mean_den = float(den.mean())
    if mean_den == 0 or not math.isfinite(mean_den):
        return math.nan, math.nan
    ratio = float(num.mean()) / mean_den
    n = num.shape[0]
    spread = float((num - ratio * den).std()) if n > 1 else math.nan
    return ratio, spread / math.sqrt(n) / abs(mean_den)


# ---------------------------------------------------------------------------------------- argument types
_TAKES = {  # what a parameter of each annotated type takes, in words
    HookedModel: "a TransformerLens hooked model (HookedTransformer or TransformerBridge, e.g. models.load(run))",
    ProbeBatch: "a ProbeBatch (probes.sample_batch(source, n_sequences=..., seq_len=..., seed=...))",
    Tensor: "a torch tensor",
    HiddenSource: "a hidden Markov source (a sources.HiddenSource: HiddenMarkov, e.g. sources.hmm_preset('mess3'))",
}
_SOURCE_TAKES = ("a Markov source (a sources.Source: BinaryChain, MarkovChain, RandomMarkov, CyclicMarkov, HiddenMarkov, "
                 "...; e.g. SourceConfig(...).build())")
_SKIP = (int, float, str, bool, type(None))  # plain values: the probes' own ValueErrors name bad ones


def _expected(annotation: Any) -> Optional[tuple[tuple[type, ...], str]]:
    """(types, words) a parameter annotated `annotation` takes (None included in the types where the annotation
    allows it), or None for annotations not checked here (plain values, containers, callables, Any)."""
    if typing.get_origin(annotation) in (Union, types.UnionType):
        parts = [_expected(a) for a in typing.get_args(annotation) if a is not type(None)]
        if not parts or any(p is None for p in parts):
            return None
        allowed = tuple(t for p in parts for t in p[0]) + ((type(None),) if type(None) in typing.get_args(
            annotation) else ())
        return allowed, " or ".join(p[1] for p in parts)
    if annotation in (Source, KernelSource):
        return (annotation,), _SOURCE_TAKES
    array_type = getattr(annotation, "array_type", None)  # a jaxtyping array type: Int[Tensor, "batch pos"]
    if isinstance(array_type, type):
        kind = {"Int": "an integer tensor", "Float": "a float tensor", "Bool": "a boolean tensor"}.get(
            annotation.__name__.split("[")[0].rsplit(".", 1)[-1], "a tensor")
        return (array_type,), f"{kind} [{', '.join(annotation.dim_str.split())}]"
    if not isinstance(annotation, type) or annotation in _SKIP or typing.get_origin(annotation) is not None:
        return None
    if annotation.__module__.split(".")[0] not in ("markov_interp", "torch"):
        return None
    return (annotation,), _TAKES.get(annotation, f"a {annotation.__name__}")


def _describe_value(value: Any) -> str:
    return _describe(value) if isinstance(value, Tensor) else f"{type(value).__name__} {shown(value)}"[:120]


# ------------------------------------------------------------------------------------------- argument values
MAX_PROBE_SIZE = 2**20  # sequences, positions, lags, kernels a probe's argument may name (the plan bounds products)
MAX_PROBE_ORDER = 16  # orders of in-context laws and induction (V**k contexts; the plan bounds them by V)
MAX_STEPS = 1024  # integration steps of edge attribution (each a forward and backward pass)
MAX_PSEUDOCOUNT = 1e9  # beta, alpha: an add-beta estimator with more is the uniform law to within 1e-3 nats

_PLANNED = dict(minimum=1, maximum=2**62)  # sizes the memory plan bounds (`probe_needs`): PlanTooLarge names them
_SIZE = dict(minimum=1, maximum=MAX_PROBE_SIZE)
_ORDER = dict(minimum=0, maximum=MAX_PROBE_ORDER)
_FRACTION = dict(minimum=0, maximum=1)
_LAG = dict(minimum=0, maximum=MAX_PROBE_SIZE)  # a lag of 0 is the current position
# The bounds of the probes' plain arguments, by name (`checked` applies them to every public probe, and to the
# keywords a probe passes on: `circuit_formation(**discover)`); a probe's own checks (a minimum of 2, a choice of
# names) still follow. A new parameter gets `DEFAULT_LIMITS` by its type until it is named here.
PARAMETER_LIMITS: dict[str, dict[str, Any]] = {
    "n_sequences": _PLANNED, "circuit_sequences": _PLANNED, "seq_len": _PLANNED, "n_ctx": _PLANNED,
    "trained": _PLANNED, "n_kernels": _PLANNED, "vocab": _SIZE, "lag": _LAG, "max_lag": _SIZE,
    "n_flip_positions": _SIZE, "max_edges": dict(minimum=0, maximum=MAX_PROBE_SIZE),
    "skip": dict(minimum=0, maximum=MAX_PROBE_SIZE), "position": dict(minimum=-MAX_PROBE_SIZE, maximum=MAX_PROBE_SIZE),
    "seed": dict(minimum=0, maximum=SEED_MAX),
    "order": _ORDER, "max_order": _ORDER, "source_order": _ORDER,
    "steps": dict(minimum=1, maximum=MAX_STEPS),
    "beta": dict(minimum=0, maximum=MAX_PSEUDOCOUNT), "alpha": dict(minimum=0, maximum=MAX_PSEUDOCOUNT),
    # fractions of a total: min_fraction 2 or infinity used to be accepted (no edge can carry twice the total)
    "min_fraction": _FRACTION, "target_faithfulness": _FRACTION, "early": _FRACTION, "late": _FRACTION,
    "in_context_fraction": dict(minimum=-1, maximum=2),
    "min_effect": dict(minimum=0, maximum=1e6), "threshold": dict(minimum=-1e6, maximum=1e6),
    "head_excess": dict(minimum=-1e6, maximum=1e6),
    # representation probes (`fit_probe`, and its options passed on by `linear_probe` / `probe_layers`)
    "n_bootstrap": dict(minimum=0, maximum=2**62), "n_boot": dict(minimum=0, maximum=2**62),  # planned
    "penalty": dict(minimum=0, maximum=MAX_PSEUDOCOUNT), "test_fraction": _FRACTION, "cut": _FRACTION,
    "max_iter": dict(minimum=1, maximum=MAX_PROBE_SIZE),
}
DEFAULT_LIMITS: dict[Any, dict[str, Any]] = {int: dict(minimum=0, maximum=MAX_PROBE_SIZE),
                                             float: dict(minimum=-1e6, maximum=1e6)}
_PLAIN = (int, float, bool, str)


def _plain_kind(annotation: Any) -> Any:
    """The plain type a parameter annotated `annotation` takes (int, float, bool, str, a Literal; Optional
    unwrapped; `float | int` is float), or None for anything else (tensors, containers, models, callables)."""
    if typing.get_origin(annotation) is typing.Literal:
        return annotation
    arms = [a for a in typing.get_args(annotation) if a is not type(None)] if typing.get_origin(annotation) in (
        Union, types.UnionType) else [annotation]
    if arms and all(a in (int, float) for a in arms):
        return float if float in arms else int
    return arms[0] if len(arms) == 1 and (arms[0] in _PLAIN or typing.get_origin(arms[0]) is typing.Literal) \
        else None


def parameter_limits(name: str, annotation: Any) -> Optional[dict[str, Any]]:
    """The bounds `checked` applies to a probe parameter (`PARAMETER_LIMITS` by name, else `DEFAULT_LIMITS` by
    type; {} for booleans, strings and Literals, whose type alone is checked), None when it is no plain value."""
    kind = _plain_kind(annotation)
    if kind is None:
        return None
    if kind in (int, float):
        return dict(PARAMETER_LIMITS.get(name, DEFAULT_LIMITS[kind]))
    return {}


def check_finite_model(model: HookedModel, where: str) -> None:
    """Refuse a model whose weights hold NaN or infinity: its probes would name a mechanism for a broken model
    (NaN weights used to be labelled "other"). The one message of every probe; checked again only after a
    weight changes (the tensors' version counters).

    Args:
        model: a hooked model.
        where: the probe, for the message.

    Raises:
        ValueError: naming up to three of the non-finite weights.
    """
    params = list(model.named_parameters())
    key = tuple((id(p), p._version) for _, p in params)
    if getattr(model, "_markov_finite_key", None) == key:
        return
    bad = [name.replace("._original_component", "") for name, p in params  # a bridge's names as TL's
           if p.is_floating_point() and not bool(torch.isfinite(p).all())]
    if bad:
        raise ValueError(f"{where}: the model's weights hold NaN or infinity ({', '.join(bad[:3])}"
                         f"{' ...' if len(bad) > 3 else ''}); probes refuse a model whose weights are not finite "
                         "(a diverged run has no trained model)")
    model._markov_finite_key = key


def _probe_size(arguments: dict[str, Any], model: Optional[HookedModel]) -> tuple[int, int, list[tuple[str, int]]]:
    """(sequences, positions, the arguments they come from) of the batch a probe call runs on: the sizes it draws
    (`n_sequences`, `circuit_sequences`, `seq_len`, else the model's probe length) or the tokens it is given."""
    batch, length, fields = 0, 0, []
    for name, value in arguments.items():
        value = as_tokens(value)
        if isinstance(value, Tensor) and value.ndim >= 2:
            batch, length = max(batch, int(value.shape[0])), max(length, int(value.shape[1]))
    for name in ("n_sequences", "circuit_sequences"):
        if isinstance(arguments.get(name), int):
            batch = max(batch, arguments[name])
            fields.append((name, arguments[name]))
    seq_len = arguments.get("seq_len")
    if isinstance(seq_len, int):
        length = max(length, seq_len)
        fields.append(("seq_len", seq_len))
    elif batch and not length and model is not None:
        length = min(int(model.cfg.n_ctx), training_length(model) or DEFAULT_PROBE_LENGTH)
    return batch, length, fields


# probes whose orders are not orders of in-context laws (induction matches k states: no V**k tables), or that
# compute none (sampling)
_ORDERS_WITHOUT_TABLES = frozenset({"attention_scores", "token_statistics", "induction_score", "induction_keys",
                                    "sample_batch", "swap_plan",
                                    "induction_baseline", "read_circuit", "in_context_name", "circuit_verdict"})


def probe_needs(where: str, arguments: dict[str, Any]) -> list[Any]:
    """The memory a probe call will hold, from its arguments, before anything is allocated (`_plan.Need`s; lower
    bounds): the model's weights and one forward pass over its batch, the sampled sequences and their kernels,
    in-context tables of V**(k+1) counts per position for laws of order k, prior kernels, bootstrap resamples.

    Args:
        where: the probe's name.
        arguments: its arguments by name (defaults filled in).

    Returns:
        The needs (`check_needs` adds them up against the device's memory).
    """
    from markov_interp.sources.sampling import sampler_bytes
    from markov_interp.models.memory import hooked_needs

    checkpoints = arguments.get("checkpoints")
    model = arguments.get("model")
    if model is None and isinstance(checkpoints, (list, tuple)) and checkpoints:
        model = checkpoints[0][1]
    model = model if isinstance(model, HookedModel) else None
    source = arguments.get("source") if isinstance(arguments.get("source"), Source) else None
    batch, length, fields = _probe_size(arguments, model)
    needs = []
    if model is not None:
        needs += hooked_needs(model, batch=batch, seq_len=length, fields=fields)
    vocab = arguments.get("vocab") if isinstance(arguments.get("vocab"), int) else (
        source.vocab if source is not None else int(model.cfg.d_vocab) if model is not None else None)
    source_order = getattr(source, "order", 1)  # a source without an order is planned as a first-order chain
    if source is not None and batch:
        random = source.in_context
        kernels = batch * vocab**source_order * vocab * 8 if random else 0
        needs.append(Need.of("the probe sequences and their kernels", kernels + sampler_bytes(
            vocab=source.vocab, order=source_order, batch=batch, length=length + 1, random=random), fields))
    orders = [arguments[n] for n in ("order", "max_order", "source_order") if isinstance(arguments.get(n), int)]
    orders += [source_order] if source is not None else []
    if orders and vocab and where not in _ORDERS_WITHOUT_TABLES:
        order = max(orders)
        needs.append(Need.of(f"the in-context tables of order {order}", max(batch * length, 1) * vocab ** (order + 1)
                             * 8, fields + [("order", order), ("vocab", vocab)]))
    if isinstance(arguments.get("n_kernels"), int) and vocab:  # their draws and laws, and each position's weights
        n_kernels, order = arguments["n_kernels"], arguments.get("order") or 1
        per_kernel = vocab ** (order + 1) * 48 + vocab * vocab * 8 + batch * length * 12
        needs.append(Need.of("the prior's kernels", n_kernels * per_kernel,
                             [("n_kernels", n_kernels), ("order", order), ("vocab", vocab)]))
    for name in ("n_bootstrap", "n_boot"):  # a resample's draws and its counts per sequence (int64 and float64)
        if isinstance(arguments.get(name), int) and not isinstance(arguments[name], bool) and batch:
            needs.append(Need.of("the bootstrap resamples", arguments[name] * batch * 16,
                                 [(name, arguments[name])] + fields))
    return needs


_TOKENS = ("tokens", "clean_tokens", "corrupted_tokens", "reference_tokens")  # states, in 0..vocab - 1
_LAWS = ("probs", "true", "base", "logits")  # [batch, pos, vocab]


def check_vocabulary(where: str, arguments: dict[str, Any]) -> None:
    """A probe's `vocab` argument against the states and laws it is given: tokens in 0..vocab - 1, laws over
    `vocab` states (a vocab of 1 beside binary tokens used to end in an IndexError).

    Args:
        where: the probe, for the message.
        arguments: its arguments by name.

    Raises:
        ValueError: naming the argument that disagrees with `vocab`.
    """
    vocab = arguments.get("vocab")
    if type(vocab) is not int:  # a plain integer (not a bool): the entry check refused the rest
        return
    for name in _TOKENS + _LAWS:
        value = as_tokens(arguments.get(name))
        if not isinstance(value, Tensor) or not value.numel() or value.ndim < 2:
            continue
        if name in _TOKENS and not value.is_floating_point() and (int(value.min()) < 0 or int(value.max()) >= vocab):
            raise ValueError(f"{where}: {name} hold states {int(value.min())}..{int(value.max())}, outside "
                             f"0..{vocab - 1} (vocab={vocab})")
        if name in _LAWS and value.ndim == 3 and int(value.shape[-1]) != vocab:
            raise ValueError(f"{where}: {name} are laws over {int(value.shape[-1])} states, but vocab={vocab}")


def _check_call(fn: Any, signature: inspect.Signature, limits: dict[str, dict], hints: dict[str, Any],
                bound: inspect.BoundArguments) -> None:
    """`checked`'s value checks of one call: the plain arguments against their limits, keywords passed on
    (`**discover`) against `PARAMETER_LIMITS` by name, the models' weights finite, `vocab` against the states
    and laws given, the call's memory plan."""
    name = fn.__name__
    for param, value in bound.arguments.items():
        kind = signature.parameters[param].kind
        if kind is inspect.Parameter.VAR_KEYWORD:
            for key, item in value.items():
                if key in PARAMETER_LIMITS and isinstance(item, (int, float)) and not isinstance(item, bool):
                    check_value(f"{name}: {key}", item, float, **PARAMETER_LIMITS[key])
        elif param in limits:
            try:  # a wrong type is a TypeError, as for the other arguments; a value out of its bounds a ValueError
                value = check_type(f"{name}: {param}", value, hints[param])
            except ValueError as err:
                raise TypeError(str(err)) from None
            check_value(f"{name}: {param}", value, hints[param], **limits[param])
    for param, value in bound.arguments.items():
        if isinstance(value, HookedModel):
            check_finite_model(value, name)
        elif param == "checkpoints" and isinstance(value, (list, tuple)):
            for item in value:
                if isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[1], HookedModel):
                    check_finite_model(item[1], name)
    full = signature.bind_partial(*bound.args, **bound.kwargs)
    full.apply_defaults()
    arguments = {**full.arguments, **next((v for p, v in full.arguments.items()
                                           if signature.parameters[p].kind is inspect.Parameter.VAR_KEYWORD), {})}
    check_vocabulary(name, arguments)
    needs = probe_needs(name, arguments)
    if needs:
        model = next((v for v in arguments.values() if isinstance(v, HookedModel)), None)
        device = model_device(model) if model is not None else torch.device("cpu")
        check_needs(needs, memory_limit(device), where=name, before="anything was allocated")


def checked(fn: Any) -> Any:
    """`fn` whose arguments are checked first, in the one place every public probe passes through (each is
    exported through it, `markov_interp.probes`):

    - arguments of package, torch and source types: a wrong type raises TypeError naming the parameter and what
      it takes (instead of an AttributeError from deep inside);
    - plain values (ints, floats, booleans, strings): their type (TypeError) and their bounds (`parameter_limits`:
      by name, else by type, so a new parameter is bounded by default; ValueError naming the parameter);
    - a model whose weights hold NaN or infinity is refused with one message (`check_finite_model`); a `vocab`
      that disagrees with the tokens or laws given is refused (`check_vocabulary`);
    - the call's memory plan (`probe_needs` against the device's memory): sizes beyond it raise
      `PlanTooLarge` naming the parameter and the estimate, before anything is allocated
      (`classify_mechanism(model, source, n_sequences=10**9)` used to be killed for memory).

    Args:
        fn: a probe function with annotated parameters.

    Returns:
        The wrapped function (same signature and docstring; `__wrapped__` is `fn`).

    >>> from markov_interp.probes import classify_mechanism
    >>> classify_mechanism(None, None)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    TypeError: classify_mechanism: model must be a TransformerLens hooked model ..., got NoneType None
    """
    signature = inspect.signature(fn)
    try:
        hints = typing.get_type_hints(fn)
    except (NameError, TypeError):  # an annotation that does not resolve: check only the ones that do
        hints = {k: v for k, v in fn.__annotations__.items() if not isinstance(v, str)}
    checks = {name: spec for name in signature.parameters if name in hints
              for spec in [_expected(hints[name])] if spec is not None}
    limits = {name: lim for name in signature.parameters if name in hints
              for lim in [parameter_limits(name, hints[name])] if lim is not None}

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:  # the types of what was given first; a missing argument is then Python's own error
            bound = signature.bind_partial(*args, **kwargs)
        except TypeError as err:  # an unknown or surplus argument: Python's own message, with the probe's name
            raise TypeError(f"{fn.__name__}: {err}") from None
        for name, value in bound.arguments.items():
            spec = checks.get(name)
            if spec is not None and not isinstance(value, spec[0]):
                raise TypeError(f"{fn.__name__}: {name} must be {spec[1]}, got {_describe_value(value)}")
        _check_call(fn, signature, limits, hints, bound)
        return fn(*args, **kwargs)

    wrapper.__markov_checked__ = True
    return wrapper
