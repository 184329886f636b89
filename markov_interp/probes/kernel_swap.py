"""`kernel_swap`: does the model follow the context, or the kernel it holds in its weights?

At long contexts the in-context estimator of a fixed chain converges to the chain's kernel, so on the chain's own
sequences a model that stored the kernel and a model that estimates it in context predict alike. Feed sequences
whose kernel is *not* the training kernel and they part: a model that stored the kernel keeps predicting it
(`weights_law`), one that reads the context follows the new sequences (`context_law`). The in-context fraction is

    f = (L(weights law) - L(model)) / (L(weights law) - L(context law)),

losses in nats on the swap sequences' next states: 0 for a model that predicts from its weights, 1 for one that
follows the context as well as the in-context estimator does; `in_context_fraction` is f clipped to [0, 1] and
`raw_fraction` f itself; the SE is over sequences (delta method).

What is fed (`swap_plan`, dispatched on the `sources.KernelSource` protocol's `pool`):
- fixed chains (a pool of one kernel): a fresh Dirichlet(1) kernel per sequence ("random", the default), the
  states relabelled by a random permutation ("permute") or each row reversed ("flip"); the weights law is the
  training kernel's row of the current context, the context law the in-context add-beta estimator of the
  source's order (beta = 1 for Dirichlet(1) kernels, 1/2 otherwise);
- a finite pool of kernels (`RandomMarkov(pool_size=N)`): fresh kernels from the same prior, outside the pool
  (`source.out_of_pool()`, "pool", the default); the weights law is the pool's Bayes predictor (a model that
  memorised the pool and retrieves from it), the context law the in-context Bayes predictor of fresh kernels:
  retrieval against inference;
- fresh random kernels (Dirichlet(alpha) per sequence): kernels from an out-of-distribution prior, Dirichlet(alpha
  / 10) (nearly deterministic rows, never seen in training) ("prior", the default); the weights law is what the
  training prior predicts without the context (its mean, 1/V), the context law the in-context add-alpha
  estimator of the source's order (what the training prior's Bayes predictor does with the same context).

**A source may supply its own plan**: when `source` has a method `kernel_swap_plan(*, n_sequences, seq_len,
seed) -> SwapPlan`, `swap_plan(source)` uses it. A plan can also be passed to `swap_kernels(plan=...)` directly.
"""

import dataclasses
from typing import Any, Optional

import torch
from jaxtyping import Float
from torch import Tensor

from markov_interp.sources import MarkovChain, RandomMarkov, Source, add_beta_predictions
from markov_interp.models import HookedModel
from markov_interp._display import displayed
from markov_interp.probes._common import (
    ProbeBatch,
    Probs,
    check_source_matches,
    json_safe,
    next_state_probs,
    probe_length,
    ratio_of_means,
    sample_batch,
    target_losses,
)

__all__ = ["KernelSwap", "SwapPlan", "swap_kernels", "swap_plan"]

SWAPS = ("auto", "random", "permute", "flip", "prior", "pool")
OOD_ALPHA_DIVISOR = 10.0  # random-kernel sources: swap kernels drawn from Dirichlet(alpha / 10)


@displayed
@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class SwapPlan:
    """The sequences `kernel_swap` feeds (`batch`, with their kernels) and the two laws it compares the model
    with on them: `weights_law` (a model predicting from the training source's kernels alone) and `context_law`
    (a model following the context), each [batch pos vocab]."""

    batch: ProbeBatch
    weights_law: Probs
    context_law: Probs
    description: str

    def _headline(self) -> str:
        batch, seq = self.batch.tokens.shape
        return f"{batch} sequences x {seq} states: {self.description}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the description and the batch's shape (the laws are [batch, pos, vocab] tensors)."""
        return {"description": self.description, "n_sequences": int(self.batch.tokens.shape[0]),
                "seq_len": int(self.batch.tokens.shape[1]), "vocab": self.batch.vocab}

    def __post_init__(self) -> None:
        shape = (*self.batch.tokens.shape, self.batch.vocab)
        for name in ("weights_law", "context_law"):
            if tuple(getattr(self, name).shape) != shape:
                raise ValueError(f"{name} must have shape {shape}, got {tuple(getattr(self, name).shape)}")


@displayed
@dataclasses.dataclass(frozen=True, kw_only=True)
class KernelSwap:
    """How far the model follows the context on sequences whose kernel it was not trained on (module docstring).
    Losses in nats on the swap sequences."""

    in_context_fraction: float  # raw_fraction clipped to [0, 1]
    se: float
    raw_fraction: float
    model_loss: float
    weights_loss: float
    context_loss: float
    description: str
    n_sequences: int
    seq_len: int
    seed: int

    def _headline(self) -> str:
        return (f"in-context fraction {self.in_context_fraction:.2f} +- {self.se:.2f} (losses: model "
                f"{self.model_loss:.4f}, from the weights {self.weights_loss:.4f}, from the context "
                f"{self.context_loss:.4f} nats; {self.description})")

    def to_dict(self) -> dict[str, Any]:
        return json_safe(dataclasses.asdict(self))


def _permuted(kernel: Tensor, perm: Tensor, order: int) -> Tensor:
    """The kernel of the chain whose states are relabelled by `perm` (state s becomes perm[s])."""
    inverse = torch.argsort(perm)
    out = kernel
    for axis in range(order + 1):
        out = out.index_select(axis, inverse)
    return out


def _fixed_kernel(kernel: Tensor, order: int, swap: str, seed: int) -> Tensor:
    vocab = kernel.shape[-1]
    if swap == "flip":
        new = kernel.flip(-1)
    else:
        gen = torch.Generator().manual_seed(seed)
        perm = torch.randperm(vocab, generator=gen)
        while bool((perm == torch.arange(vocab)).all()):
            perm = torch.randperm(vocab, generator=gen)
        new = _permuted(kernel, perm, order)
    if float((new - kernel).abs().max()) < 1e-6:
        raise ValueError(f"swap={swap!r} leaves this chain's kernel unchanged (a symmetric kernel); use "
                         "swap='random'")
    return new


def _fixed_plan(source: Source, swap: str, n_sequences: int, seq_len: int, seed: int) -> SwapPlan:
    kernel = source.pool[0].reshape([source.vocab] * (source.order + 1))  # the one kernel
    if swap in ("auto", "random"):
        batch = sample_batch(RandomMarkov(source.vocab, order=source.order, alpha=1.0), n_sequences=n_sequences,
                             seq_len=seq_len, seed=seed)
        beta, what = 1.0, "a fresh Dirichlet(1) kernel per sequence"
    elif swap in ("permute", "flip"):
        swapped = MarkovChain(_fixed_kernel(kernel, source.order, swap, seed), order=source.order)
        batch = sample_batch(swapped, n_sequences=n_sequences, seq_len=seq_len, seed=seed)
        beta = 0.5
        what = "the states relabelled by a permutation" if swap == "permute" else "each kernel row reversed"
    else:
        raise ValueError(f"swap for a fixed chain must be 'auto', 'random', 'permute' or 'flip', got {swap!r}")
    weights = source.predictive(batch.tokens)
    context = add_beta_predictions(batch.tokens, source.vocab, order=source.order, beta=beta)
    return SwapPlan(batch=batch, weights_law=weights, context_law=context,
                    description=f"fixed chain, swap kernels: {what}; weights law: the training kernel; context "
                                f"law: in-context add-{beta:g} estimator of order {source.order}")


def _pool_plan(source: Source, swap: str, n_sequences: int, seq_len: int, seed: int) -> SwapPlan:
    if swap not in ("auto", "pool"):
        raise ValueError(f"swap for a pool of kernels must be 'auto' or 'pool', got {swap!r}")
    fresh = source.out_of_pool()
    batch = sample_batch(fresh, n_sequences=n_sequences, seq_len=seq_len, seed=seed)
    return SwapPlan(batch=batch, weights_law=source.predictive(batch.tokens),
                    context_law=fresh.predictive(batch.tokens),
                    description=f"pool of {source.pool.shape[0]} kernels, swap kernels: fresh ones from the same "
                                "prior, outside the pool; weights law: the pool's Bayes predictor (retrieval); "
                                "context law: the in-context Bayes predictor (inference)")


def _prior_plan(source: Source, swap: str, n_sequences: int, seq_len: int, seed: int) -> SwapPlan:
    if swap not in ("auto", "prior"):
        raise ValueError(f"swap for random kernels must be 'auto' or 'prior', got {swap!r}")
    alpha = source.alpha / OOD_ALPHA_DIVISOR
    batch = sample_batch(RandomMarkov(source.vocab, order=source.order, alpha=alpha), n_sequences=n_sequences,
                         seq_len=seq_len, seed=seed)
    shape = (*batch.tokens.shape, source.vocab)
    weights = torch.full(shape, 1.0 / source.vocab, dtype=torch.float64)
    context = add_beta_predictions(batch.tokens, source.vocab, order=source.order, beta=source.alpha)
    return SwapPlan(batch=batch, weights_law=weights, context_law=context,
                    description=f"random kernels, swap kernels from Dirichlet({alpha:g}) (training prior "
                                f"Dirichlet({source.alpha:g})); weights law: the prior's mean 1/V; context law: "
                                f"in-context add-{source.alpha:g} estimator of order {source.order}")


def swap_plan(source: Source, *, n_sequences: int, seq_len: int, seed: int = 0, swap: str = "auto") -> SwapPlan:
    """The swap sequences and reference laws for `source` (module docstring); a source's own
    `kernel_swap_plan(n_sequences=, seq_len=, seed=)` method is used when it has one and `swap` is "auto"."""
    if swap not in SWAPS:
        raise ValueError(f"swap must be one of {SWAPS}, got {swap!r}")
    own = getattr(source, "kernel_swap_plan", None)
    if own is not None and swap == "auto":
        return own(n_sequences=n_sequences, seq_len=seq_len, seed=seed)
    pool = getattr(source, "pool", None)
    if pool is None and hasattr(source, "alpha") and hasattr(source, "sample"):
        return _prior_plan(source, swap, n_sequences, seq_len, seed)
    if pool is not None and pool.shape[0] == 1:
        return _fixed_plan(source, swap, n_sequences, seq_len, seed)
    if pool is not None:
        return _pool_plan(source, swap, n_sequences, seq_len, seed)
    raise ValueError(f"source must follow the sources.KernelSource protocol (vocab, order, alpha, pool, sample), got "
                     f"{type(source).__name__}")


def _per_sequence(probs: Float[Tensor, "batch pos vocab"], tokens: Tensor) -> Float[Tensor, " batch"]:
    return target_losses(probs.cpu().double(), tokens.cpu()).mean(1)


@torch.no_grad()
def swap_kernels(
    model: HookedModel,
    source: Source,
    *,
    seq_len: Optional[int] = None,
    n_sequences: int = 64,
    seed: int = 0,
    swap: str = "auto",
    plan: Optional[SwapPlan] = None,
) -> KernelSwap:
    """How far `model` follows the context rather than the kernel it learned (module docstring).

    Args:
        model: a hooked model.
        source: the source the model was trained on.
        seq_len: length of the swap sequences (default `probe_length(model)`).
        n_sequences: swap sequences (the SE is over them).
        seed: seed of the swap kernels and sequences.
        swap: "auto" (the source's own plan, else "random" for fixed chains and "prior" for random kernels),
            "random", "permute", "flip" (fixed chains) or "prior" (random kernels).
        plan: a `SwapPlan` to use instead (any swap kernels with their reference laws).

    Returns:
        A `KernelSwap` whose `in_context_fraction` is in [0, 1] with its `se`.

    >>> swap_kernels(model, source).in_context_fraction > 0.9  # an induction circuit follows the context
    True
    """
    check_source_matches(model, source)
    if plan is None:
        plan = swap_plan(source, n_sequences=n_sequences, seq_len=probe_length(model, seq_len), seed=seed, swap=swap)
    tokens = plan.batch.tokens
    model_loss = _per_sequence(next_state_probs(model, tokens), tokens)
    weights_loss = _per_sequence(plan.weights_law, tokens)
    context_loss = _per_sequence(plan.context_law, tokens)
    raw, se = ratio_of_means(weights_loss - model_loss, weights_loss - context_loss)
    return KernelSwap(in_context_fraction=min(max(raw, 0.0), 1.0) if raw == raw else raw, se=se, raw_fraction=raw,
                      model_loss=float(model_loss.mean()), weights_loss=float(weights_loss.mean()),
                      context_loss=float(context_loss.mean()), description=plan.description,
                      n_sequences=int(tokens.shape[0]), seq_len=int(tokens.shape[1]), seed=seed)
