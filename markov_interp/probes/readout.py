"""Kernel readout: the transition matrix a model that learned the kernel carries in its weights.

Group the model's predicted next-state laws by the current context (the last `order` states) and average:
for a model that learned the kernel directly every group holds the same law, the implied kernel row; for a
unigram model every row is pi. Compared with the true kernel this says how well the weights store it
(Makkuva et al.: tied single-layer models with p + q > 1 often store pi instead of the kernel).
"""

import dataclasses
from typing import Any, Optional

import torch
from jaxtyping import Float, Int
from torch import Tensor

from markov_interp import theory
from markov_interp.probes._common import Model, ProbeBatch, Probs, Tokens, contexts, json_safe, next_state_probs


def implied_kernel(
    probs: Probs, tokens: Tokens, *, vocab: int, order: int = 1, skip: int = 0
) -> tuple[Float[Tensor, "context next_state"], Int[Tensor, " context"]]:
    """Mean predicted law grouped by the last `order` states, and how many predictions each row averages.

    Rows are indexed by the base-V number of the context (oldest state first), as `data` kernels are; rows
    of unseen contexts are NaN. `skip` leaves out the first positions (where an in-context learner has seen
    little).

    >>> tokens = torch.tensor([[0, 1, 1]])
    >>> probs = torch.tensor([[[0.8, 0.2], [0.3, 0.7], [0.5, 0.5]]], dtype=torch.float64)
    >>> implied_kernel(probs, tokens, vocab=2)
    (tensor([[0.8000, 0.2000],
            [0.4000, 0.6000]], dtype=torch.float64), tensor([1, 2]))
    """
    ctx = contexts(tokens, vocab=vocab, order=order)[:, skip:].reshape(-1).to(probs.device)
    flat = probs[:, skip:].reshape(-1, vocab).to(torch.float64)
    keep = ctx >= 0
    ctx, flat = ctx[keep], flat[keep]
    n_ctx = vocab**order
    sums = torch.zeros(n_ctx, vocab, dtype=torch.float64, device=flat.device).index_add_(0, ctx, flat)
    counts = torch.bincount(ctx, minlength=n_ctx)
    rows = sums / counts[:, None].clamp_min(1)
    rows[counts == 0] = float("nan")
    return rows.cpu(), counts.cpu()


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class KernelReadout:
    """The model's implied kernel beside the true one (None for random-kernel sources: nothing to store).

    `max_abs_error` is the largest entry-wise difference; `weighted_kl` the excess loss of predicting with the
    implied kernel, sum_c pi(c) KL(P(.|c) || implied(.|c)) in nats (contexts never seen are left out).
    """

    implied: Float[Tensor, "context next_state"]
    counts: Int[Tensor, " context"]
    true: Optional[Float[Tensor, "context next_state"]]
    max_abs_error: Optional[float]
    weighted_kl: Optional[float]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (rows of unseen contexts as None)."""
        return json_safe({
            "implied": self.implied,
            "counts": self.counts,
            "true": self.true,
            "max_abs_error": self.max_abs_error,
            "weighted_kl": self.weighted_kl,
        })


def kernel_readout(model: Model, batch: ProbeBatch, *, probs: Optional[Probs] = None, skip: int = 0) -> KernelReadout:
    """Implied transition matrix of the model on `batch` compared with the source's kernel.

    >>> # kernel_readout(model, sample_batch(BinaryChain(0.2, 0.3), n_sequences=64, seq_len=128, seed=0)).implied
    """
    if probs is None:
        probs = next_state_probs(model, batch.tokens)
    implied, counts = implied_kernel(probs, batch.tokens, vocab=batch.vocab, order=batch.order, skip=skip)
    if batch.random_kernel:
        return KernelReadout(implied=implied, counts=counts, true=None, max_abs_error=None, weighted_kl=None)
    true = batch.kernels[0].cpu().to(torch.float64)
    seen = counts > 0
    shape = [batch.vocab] * (batch.order + 1)
    ctx_law = theory.stationary_context_distribution(true.reshape(shape), check=False)
    kl = theory.kl_divergence(true[seen], implied[seen].clamp_min(1e-300))
    return KernelReadout(
        implied=implied,
        counts=counts,
        true=true,
        max_abs_error=float((implied[seen] - true[seen]).abs().max()),
        weighted_kl=float((ctx_law[seen] * kl).sum() / ctx_law[seen].sum()),
    )
