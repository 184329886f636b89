"""What a representation probe reads back: the targets, one small named function each, on the probe's tokens.

A `Target` is a value at every position of every sequence, [batch, pos] class labels (read back as accuracy) or
[batch, pos, output] real numbers (read back as R^2), with the positions where it is defined (`valid`). Each is a
quantity a mechanism for the in-context law could hold in its residual stream:

- `state` (lag l): x_{t-l}, the state l steps back (l = 0: the current state). A previous-token head writes the
  lag-1 state into the positions after it, which an induction head's keys then read.
- `state_counts`: n_x, how often each state occurred in x_0..x_t: the statistics of the in-context unigram law
  (a uniform head's output is their frequencies, `normalize=True`).
- `transition_counts`: n(c, x), the transitions c -> x seen so far: the statistics of the in-context k-gram law.
- `switch_counts`: how often the state changed so far. On two states n01 and n10 differ by at most one, so the
  switch count and the state counts determine every transition count: a model can reach the in-context bigram
  law by switch counting, without an induction head.
- `add_beta_row`: (n(c_t, x) + beta) / (n(c_t) + V beta), the add-beta estimate of the transition row of the
  current context (`sources.add_beta_predictions`).
- `posterior`: the Bayes-optimal law of the next state given x_0..x_t under the source (its `predictive`: the
  in-context posterior predictive for random kernels, the pool posterior for a finite pool, the kernel row for a
  fixed chain).
- `position`: t.

`probe_target(name, tokens, ...)` builds any of them by name (`TARGETS`); `Target.from_tensor` wraps a tensor of
one's own ([batch, pos] integer labels or [batch, pos, ...] reals, e.g. an HMM's belief states).
"""

import dataclasses
import inspect
from collections.abc import Callable, Sequence
from typing import Any, Optional

import torch
from jaxtyping import Bool, Int
from torch import Tensor

from markov_interp.config import check_bool, check_int, check_number
from markov_interp.sources import Source, add_beta_predictions, state_counts, transition_counts
from markov_interp.probes._common import ProbeBatch, _describe, context_labels
from markov_interp.probes._display import ProbeResult

__all__ = ["Target", "probe_target"]


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False, repr=False)
class Target(ProbeResult):
    """A quantity at every position of a batch of sequences, for a probe to read back (module docstring).

    `values` is [batch, pos] integer labels in 0..n_classes-1 (a classification target: accuracy) or
    [batch, pos, output] float64 (a real-valued target: R^2); `valid` marks the positions where it is defined
    (the state at lag l from position l on); `outputs` names the classes or the real outputs.
    """

    name: str
    values: Tensor
    valid: Bool[Tensor, "batch pos"]
    n_classes: Optional[int] = None
    outputs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        classes = self.n_classes is not None
        if classes and (self.values.ndim != 2 or self.values.dtype != torch.long):
            raise ValueError(f"a classification target's values must be int64 [batch, pos], got "
                             f"{_describe(self.values)}")
        if not classes and (self.values.ndim != 3 or not self.values.dtype.is_floating_point):
            raise ValueError(f"a real-valued target's values must be float [batch, pos, output], got "
                             f"{_describe(self.values)}")
        if self.valid.dtype != torch.bool or tuple(self.valid.shape) != tuple(self.values.shape[:2]):
            raise ValueError(f"valid must be a boolean [batch, pos] = {tuple(self.values.shape[:2])} tensor, got "
                             f"{_describe(self.valid)}")
        width = self.n_classes if classes else self.values.shape[-1]
        if len(self.outputs) != width:
            raise ValueError(f"outputs must name the {width} {'classes' if classes else 'outputs'}, got "
                             f"{len(self.outputs)} names")

    @property
    def kind(self) -> str:
        """"class" (read back as accuracy) or "real" (read back as R^2)."""
        return "class" if self.n_classes is not None else "real"

    @property
    def shape(self) -> tuple[int, int]:
        """(batch, pos): the sequences and positions it is given on."""
        return tuple(self.values.shape[:2])

    def _headline(self) -> str:
        batch, seq = self.shape
        what = f"{self.n_classes} classes" if self.n_classes is not None else f"{len(self.outputs)} real outputs"
        return f"{self.name}: {what} on {batch} x {seq} positions ({int(self.valid.sum())} defined)"

    @classmethod
    def from_tensor(cls, values: Tensor, *, name: str = "given", valid: Optional[Tensor] = None,
                    n_classes: Optional[int] = None) -> "Target":
        """A target of one's own: integer `values` [batch, pos] are class labels (0..n_classes-1, n_classes
        defaulting to the largest label + 1), float values [batch, pos] or [batch, pos, ...] are real outputs
        (trailing axes flattened).

        Args:
            values: the target at every position.
            name: what it is called in results.
            valid: [batch, pos] booleans, the positions where it is defined (default: all; NaN rows of a real
                target are left out too).
            n_classes: the number of classes of integer labels.

        Returns:
            The `Target`.

        >>> Target.from_tensor(torch.tensor([[0, 2, 1]])).n_classes
        3
        >>> Target.from_tensor(torch.zeros(2, 5, 3, 2)).outputs[:2]
        ('0', '1')
        """
        if not isinstance(values, Tensor) or values.ndim < 2 or values.dtype == torch.bool:
            raise ValueError(f"a target must be a [batch, pos] integer or [batch, pos, ...] float tensor, got "
                             f"{_describe(values)}")
        given = torch.ones(values.shape[:2], dtype=torch.bool, device=values.device) if valid is None else valid
        if not isinstance(given, Tensor) or given.dtype != torch.bool or given.shape != values.shape[:2]:
            raise ValueError(f"valid must be a boolean tensor of shape {tuple(values.shape[:2])}, got "
                             f"{_describe(given)}")
        if values.dtype.is_floating_point:
            flat = values.reshape(*values.shape[:2], -1).to(torch.float64)
            given = given & flat.isfinite().all(-1)
            return cls(name=name, values=flat, valid=given, outputs=tuple(str(i) for i in range(flat.shape[-1])))
        if values.ndim != 2:
            raise ValueError(f"integer labels must be [batch, pos], got {_describe(values)}")
        labels = values.long()
        if bool(given.any()) and int(labels[given].min()) < 0:
            raise ValueError(f"class labels must be >= 0, got {int(labels[given].min())}")
        top = int(labels[given].max()) + 1 if bool(given.any()) else 0
        n = max(top, 2) if n_classes is None else n_classes
        check_int("n_classes", n, minimum=max(top, 2))
        return cls(name=name, values=labels, valid=given, n_classes=n, outputs=tuple(str(i) for i in range(n)))


def _all(tokens: Tensor) -> Tensor:
    return torch.ones(tokens.shape, dtype=torch.bool, device=tokens.device)


def _from(tokens: Tensor, first: int) -> Bool[Tensor, "batch pos"]:
    """Positions t >= `first`."""
    return (torch.arange(tokens.shape[1], device=tokens.device) >= first).expand(tokens.shape)


def _check_vocab(tokens: Tensor, vocab: int) -> None:
    check_int("vocab", vocab, minimum=2)
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab):
        raise ValueError(f"tokens must lie in 0..{vocab - 1}, got values {int(tokens.min())}..{int(tokens.max())}")


def state_target(tokens: Int[Tensor, "batch pos"], *, vocab: int, lag: int = 0) -> Target:
    """x_{t-lag} at every position t >= lag: the current state (lag 0) or the state `lag` steps back.

    Args:
        tokens: the states.
        vocab: the number of states V (the classes).
        lag: how far back (0 .. seq_len - 1).

    Returns:
        A classification target, defined from position `lag` on.

    >>> state_target(torch.tensor([[0, 1, 1]]), vocab=2, lag=1).values.tolist()
    [[0, 0, 1]]
    """
    _check_vocab(tokens, vocab)
    check_int("lag", lag, minimum=0)
    if lag >= tokens.shape[1]:
        raise ValueError(f"lag {lag} reaches beyond the sequences: they have {tokens.shape[1]} positions, so the "
                         f"lag must be at most {tokens.shape[1] - 1}")
    values = torch.roll(tokens.long(), lag, dims=1)
    values[:, :lag] = 0  # undefined there (valid is False); any label in range
    name = "state" if lag == 0 else f"state (lag {lag})"
    return Target(name=name, values=values, valid=_from(tokens, lag), n_classes=vocab,
                  outputs=tuple(str(s) for s in range(vocab)))


def _counted(counts: Tensor, n_counted: Tensor, normalize: bool) -> tuple[Tensor, Tensor]:
    """`counts` [batch, pos, k] as they are, or divided by how many items were counted at each position (valid
    where at least one was)."""
    check_bool("normalize", normalize)
    if not normalize:
        return counts, torch.ones(counts.shape[:2], dtype=torch.bool, device=counts.device)
    return counts / n_counted.clamp_min(1)[None, :, None], (n_counted > 0).expand(counts.shape[:2])


def state_count_target(tokens: Int[Tensor, "batch pos"], *, vocab: int, normalize: bool = False) -> Target:
    """n_x: how many of x_0..x_t equal each state x (`sources.state_counts`), or their frequencies n_x / (t + 1).

    Args:
        tokens: the states.
        vocab: the number of states V (one output per state).
        normalize: divide by t + 1 (what a head attending uniformly to x_0..x_t writes).

    Returns:
        A real-valued target [batch, pos, V].
    """
    _check_vocab(tokens, vocab)
    positions = torch.arange(tokens.shape[1], device=tokens.device, dtype=torch.float64)
    values, valid = _counted(state_counts(tokens, vocab), positions + 1, normalize)
    return Target(name="state frequencies" if normalize else "state counts", values=values, valid=valid,
                  outputs=tuple(f"n{s}" for s in range(vocab)))


def transition_count_target(tokens: Int[Tensor, "batch pos"], *, vocab: int, order: int = 1,
                            normalize: bool = False) -> Target:
    """n(c, x): the transitions from each context c of `order` states to each state x seen in x_0..x_t
    (`sources.transition_counts`), or their frequencies among the t + 1 - order transitions so far.

    Args:
        tokens: the states.
        vocab: the number of states V.
        order: the context length k.
        normalize: divide by the number of transitions so far (positions before the first one are undefined).

    Returns:
        A real-valued target [batch, pos, V**k * V], outputs named "n01" (context 0, next state 1).
    """
    _check_vocab(tokens, vocab)
    counts = transition_counts(tokens, vocab, order=order)
    seen = (torch.arange(tokens.shape[1], device=tokens.device, dtype=torch.float64) + 1 - order).clamp_min(0)
    values, valid = _counted(counts.flatten(2), seen, normalize)
    names = tuple(f"n{c}{x}" for c in context_labels(vocab, order) for x in range(vocab))
    return Target(name="transition frequencies" if normalize else "transition counts", values=values, valid=valid,
                  outputs=names)


def switch_count_target(tokens: Int[Tensor, "batch pos"], *, normalize: bool = False) -> Target:
    """How many times the state changed in x_0..x_t (#{u <= t: x_u != x_{u-1}}), or the rate per transition.

    Args:
        tokens: the states.
        normalize: divide by the t transitions so far (position 0 is then undefined).

    Returns:
        A real-valued target [batch, pos, 1].

    >>> switch_count_target(torch.tensor([[0, 1, 1, 0]])).values[0, :, 0].tolist()
    [0.0, 1.0, 1.0, 2.0]
    """
    switches = torch.zeros(tokens.shape, dtype=torch.float64, device=tokens.device)
    switches[:, 1:] = (tokens[:, 1:] != tokens[:, :-1]).to(torch.float64)
    transitions = torch.arange(tokens.shape[1], device=tokens.device, dtype=torch.float64)
    values, valid = _counted(switches.cumsum(1)[..., None], transitions, normalize)
    return Target(name="switch rate" if normalize else "switch counts", values=values, valid=valid,
                  outputs=("switches",))


def add_beta_row_target(tokens: Int[Tensor, "batch pos"], *, vocab: int, beta: float | int = 0.5,
                        order: int = 1) -> Target:
    """(n(c_t, x) + beta) / (n(c_t) + V beta): the add-beta estimate of the transition row of the current context
    c_t (`sources.add_beta_predictions`; uniform before the context is full).

    Args:
        tokens: the states.
        vocab: the number of states V.
        beta: the pseudo-count (1/2: Krichevsky-Trofimov; the prior's alpha for random kernels).
        order: the context length k.

    Returns:
        A real-valued target [batch, pos, V]: one law per position.
    """
    _check_vocab(tokens, vocab)
    check_number("beta", beta, positive=True)
    check_int("order", order, minimum=1)
    values = add_beta_predictions(tokens, vocab, order=order, beta=beta)
    return Target(name=f"add-{beta:g} row (order {order})", values=values, valid=_all(tokens),
                  outputs=tuple(f"p{x}" for x in range(vocab)))


def posterior_target(tokens: Int[Tensor, "batch pos"], *, source: Optional[Source] = None) -> Target:
    """The Bayes-optimal law of x_{t+1} given x_0..x_t under `source` (its `predictive`): the
    in-context posterior predictive for random kernels, the pool posterior's mixture for a finite pool, the kernel
    row for a fixed chain.

    Args:
        tokens: the states (drawn from `source`).
        source: the Markov source (required).

    Returns:
        A real-valued target [batch, pos, V].
    """
    if not isinstance(source, Source):
        raise ValueError(f"the posterior target needs source= a Markov source (sources.Source), got "
                         f"{type(source).__name__}")
    _check_vocab(tokens, source.vocab)
    values = source.predictive(tokens)
    return Target(name="posterior predictive", values=values.to(torch.float64), valid=_all(tokens),
                  outputs=tuple(f"p{x}" for x in range(source.vocab)))


def position_target(tokens: Int[Tensor, "batch pos"]) -> Target:
    """The position t itself (a real number): what a probe reads from the position embedding or from
    attention that spreads over the prefix.

    Args:
        tokens: the states (only their shape is used).

    Returns:
        A real-valued target [batch, pos, 1].
    """
    positions = torch.arange(tokens.shape[1], device=tokens.device, dtype=torch.float64)
    return Target(name="position", values=positions.expand(tokens.shape)[..., None].clone(), valid=_all(tokens),
                  outputs=("t",))


TARGETS: dict[str, Callable[..., Target]] = {
    "state": state_target,
    "state_counts": state_count_target,
    "transition_counts": transition_count_target,
    "switch_counts": switch_count_target,
    "add_beta_row": add_beta_row_target,
    "posterior": posterior_target,
    "position": position_target,
}


def probe_target(name: str, tokens: Any, *, vocab: Optional[int] = None, **options: Any) -> Target:
    """The target `name` (one of `TARGETS`) on `tokens`, with its options.

    Args:
        name: "state" (lag=), "state_counts" (normalize=), "transition_counts" (order=, normalize=),
            "switch_counts" (normalize=), "add_beta_row" (beta=, order=), "posterior" (source=), "position".
        tokens: the states [batch, pos], or a `ProbeBatch` (its vocab, and its beta for "add_beta_row").
        vocab: the number of states (default: the batch's; needed with bare tokens for the targets over states).
        options: the target's own keyword options (module docstring).

    Returns:
        The `Target`.

    >>> probe_target("state", torch.tensor([[0, 1, 1, 0]]), vocab=2, lag=2).values[0, 2:].tolist()
    [0, 1]
    """
    if name not in TARGETS:
        raise ValueError(f"unknown target {name!r}; the targets are {sorted(TARGETS)}")
    fn = TARGETS[name]
    if isinstance(tokens, ProbeBatch):
        vocab = tokens.vocab if vocab is None else vocab
        if name == "add_beta_row":
            options.setdefault("beta", tokens.beta)
        tokens = tokens.tokens
    if not isinstance(tokens, Tensor) or tokens.ndim != 2 or tokens.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"tokens must be an integer tensor [batch, pos] or a ProbeBatch, got {_describe(tokens)}")
    takes = list(inspect.signature(fn).parameters)[1:]
    unknown = sorted(set(options) - set(takes) - {"vocab"})
    if unknown:
        raise ValueError(f"target {name!r} takes no option {unknown}; its options are "
                         f"{[t for t in takes if t != 'vocab']}")
    if "vocab" in takes:
        if vocab is None:
            raise ValueError(f"target {name!r} needs vocab= (the number of states) with bare tokens")
        options["vocab"] = vocab
    return fn(tokens, **options)


def check_target(target: Target, shape: Sequence[int]) -> None:
    """A clear error unless `target` is given on `shape` = (batch, pos), the sequences of the activations."""
    if tuple(target.shape) != tuple(shape):
        raise ValueError(f"target {target.name!r} is given on {tuple(target.shape)} (batch, pos) but the "
                         f"activations are {tuple(shape)}: compute it on the same tokens")
    if not bool(target.valid.any()):
        raise ValueError(f"target {target.name!r} is defined at no position")
    if target.kind == "real" and not bool(target.values[target.valid].isfinite().all()):
        raise ValueError(f"target {target.name!r} has non-finite values at positions marked valid")
