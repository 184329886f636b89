"""Exact laws of one fixed chain (a kernel, or each sequence's known kernel): stationary laws, entropies,
the true next-state law at every position and the log-losses built from them.

- `stationary_distribution`: the law pi the chain settles into.
- `unigram_loss`: H(pi), the loss of the best predictor that ignores the context. A single-layer transformer
  stuck at a bad local minimum sits here (Makkuva et al.).
- `entropy_rate`: sum_s pi(s) H(P(. | s)), the loss of the true kernel, which is the best any predictor can do on
  a fixed chain (exact at every position when the first states are drawn from pi).
- `stationary_predictions`: pi at every position, given each sequence's kernel: the one computation behind
  `plateau_predictions` for fixed chains and the probes' `stationary_probs` (the true next-state law given a
  kernel is `sources.kernel_predictions`).

Order-k kernels ([V]*k + [V]) are handled through the chain on contexts (the last k states).
"""

from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from markov_interp.sources import KernelSource, validate_kernel
from markov_interp.sources.contexts import context_kernel as _context_kernel
from markov_interp.sources.contexts import solve_stationary as _solve_stationary
from markov_interp.sources.contexts import stationary_context_law

Kernel = Any  # a [V]*k + [V] array-like or a fixed chain; validated by sources.validate_kernel


def _as_kernel(kernel: Kernel) -> Tensor:
    if isinstance(kernel, KernelSource):
        pool = kernel.pool
        if pool is None or pool.shape[0] != 1:
            raise ValueError(f"{kernel!r} has no single kernel: each of its sequences draws one from a prior or pool")
        return pool[0].reshape([kernel.vocab] * (kernel.order + 1))
    k = torch.as_tensor(kernel, dtype=torch.float64)
    return validate_kernel(k, order=max(k.ndim - 1, 1))


def stationary_context_distribution(kernel: Kernel, *, check: bool = True) -> Float[Tensor, " context"]:
    """Stationary law over contexts (the last k states, base-V index, oldest first) of an order-k kernel.

    For order 1 this is the stationary distribution pi itself. Raises ValueError when the law is not unique
    (a reducible chain with several closed classes).
    """
    if check:
        return stationary_context_law(_as_kernel(kernel))
    return _solve_stationary(_context_kernel(kernel.to(torch.float64)))


def stationary_context_laws(kernels: Float[Tensor, "batch context vocab"]) -> Float[Tensor, "batch context"]:
    """Stationary laws over contexts of many kernels at once (rows flattened to [V**k, V], as `RandomMarkov`
    draws them). No uniqueness check: for irreducible chains such as Dirichlet-drawn ones."""
    return _solve_stationary(kernels.to(torch.float64))


def stationary_distribution(kernel: Kernel) -> Float[Tensor, " vocab"]:
    """The stationary law pi of the chain: the long-run frequency of each state (float64, sums to 1).

    For a binary chain with switching probabilities p, q this is (q, p) / (p + q). For an order-k kernel it is
    the law of a single state under the stationary law of contexts.

    >>> stationary_distribution([[0.8, 0.2], [0.3, 0.7]])
    tensor([0.6000, 0.4000], dtype=torch.float64)
    """
    k = _as_kernel(kernel)
    vocab = k.shape[-1]
    contexts = stationary_context_distribution(k)
    return contexts.reshape(-1, vocab).sum(0)


def entropy(probs: Float[Tensor, "*batch vocab"]) -> Float[Tensor, "*batch"]:
    """Shannon entropy in nats over the last axis, with 0 log 0 = 0."""
    return -torch.special.xlogy(probs, probs).sum(-1)


def entropy_rate(kernel: Kernel) -> float:
    """The entropy rate sum_c pi(c) H(P(. | c)) in nats: the bigram-optimal (k-gram-optimal) loss.

    The loss of predicting with the true kernel, the global minimum of a transformer's training loss. For the
    binary chain it is (q h(p) + p h(q)) / (p + q).

    >>> round(entropy_rate([[0.8, 0.2], [0.3, 0.7]]), 4)
    0.5446
    """
    k = _as_kernel(kernel)
    pi = stationary_context_distribution(k)
    return float((pi * entropy(_context_kernel(k))).sum())


def unigram_loss(kernel: Kernel) -> float:
    """H(pi) in nats: the loss of the best context-free predictor, which always predicts pi.

    The loss at the bad local minima of single-layer transformers (Makkuva et al.).

    >>> round(unigram_loss([[0.8, 0.2], [0.3, 0.7]]), 4)
    0.673
    """
    return float(entropy(stationary_distribution(kernel)))


def cross_entropy(
    predicted: Float[Tensor, "*batch vocab"], true: Float[Tensor, "*batch vocab"]
) -> Float[Tensor, "*batch"]:
    """Expected log-loss -sum_x true(x) log predicted(x) in nats of predicting `predicted` when `true` holds."""
    return -torch.special.xlogy(true, predicted).sum(-1)


def kl_divergence(
    true: Float[Tensor, "*batch vocab"], predicted: Float[Tensor, "*batch vocab"]
) -> Float[Tensor, "*batch"]:
    """KL(true || predicted) in nats: the excess loss of predicting `predicted` over the true law."""
    return cross_entropy(predicted, true) - entropy(true)


def target_log_loss(
    probs: Float[Tensor, "batch pos vocab"], tokens: Int[Tensor, "batch pos"]
) -> Float[Tensor, "batch target"]:
    """-log probs[b, t, x_{t+1}] for t = 0..T-2: the log-loss of every next-state prediction on a sequence."""
    nxt = tokens[:, 1:, None].to(probs.device)
    return -torch.log(torch.gather(probs[:, :-1], 2, nxt)[..., 0].clamp_min(1e-300))


def _check_source(source: Any) -> None:
    """Refuse what is not a `sources.KernelSource` (the kernel references need each sequence's kernel)."""
    if not isinstance(source, KernelSource):
        raise ValueError(f"unknown source type {type(source).__name__}: theory's kernel references need a source "
                         "with vocab, order, alpha, support, pool, sample, predictive and initial_context_laws "
                         "(sources.KernelSource)")


def stationary_state_laws(kernels: Float[Tensor, "batch context vocab"]) -> Float[Tensor, "batch vocab"]:
    """The stationary law pi of one state under each kernel ([V**k, V] rows, one per sequence).

    A single kernel (batch 1: a fixed chain) is checked to have a unique stationary law (ValueError otherwise);
    a batch of Dirichlet-drawn kernels is irreducible and solved at once without the check.
    """
    vocab = kernels.shape[-1]
    if kernels.shape[0] == 1:
        contexts = stationary_context_law(kernels[0])[None]
    else:
        contexts = stationary_context_laws(kernels)
    return contexts.reshape(kernels.shape[0], -1, vocab).sum(1)


def stationary_predictions(
    kernels: Float[Tensor, "#batch context vocab"], tokens: Int[Tensor, "batch pos"]
) -> Float[Tensor, "batch pos vocab"]:
    """Each sequence's stationary law pi at every position: the best predictor that ignores the context (a batch
    of 1 kernel serves every sequence: a fixed chain)."""
    pis = stationary_state_laws(kernels.cpu()).to(tokens.device)
    return pis[:, None, :].expand(tokens.shape[0], tokens.shape[1], -1).contiguous()
