"""Kernel readout: the transition matrix a model that learned the kernel carries in its weights.

Group the model's predicted next-state laws by the current context (the last `order` states) and average:
for a model that learned the kernel directly every group holds the same law, the implied kernel row; for a
unigram model every row is pi. Compared with the true kernel this says how well the weights store it
(Makkuva et al.: tied single-layer models with p + q > 1 often store pi instead of the kernel).
"""

import dataclasses
import math
from typing import Any, Optional

import torch
from jaxtyping import Float, Int
from torch import Tensor

from markov_interp import theory
from markov_interp.models import HookedModel
from markov_interp.probes._common import (
    ProbeBatch,
    Probs,
    Tokens,
    check_batch,
    context_labels,
    contexts,
    json_safe,
    next_state_probs,
)
from markov_interp.probes._display import ProbeResult, dataframe

__all__ = ["KernelReadout", "implied_kernel", "kernel_readout"]


def implied_kernel(
    probs: Probs, tokens: Tokens, *, vocab: int, order: int = 1, skip: int = 0
) -> tuple[Float[Tensor, "context next_state"], Int[Tensor, " context"]]:
    """Mean predicted law grouped by the last `order` states, and how many predictions each row averages.

    Rows are indexed by the base-V number of the context (oldest state first), as the sources' kernels are; rows
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


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False, repr=False)
class KernelReadout(ProbeResult):
    """The model's implied kernel beside the true one (None for random-kernel sources: nothing to store).

    `max_abs_error` is the largest entry-wise difference; `weighted_kl` the excess loss of predicting with the
    implied kernel, sum_c pi(c) KL(P(.|c) || implied(.|c)) in nats (contexts never seen are left out).
    """

    implied: Float[Tensor, "context next_state"]
    counts: Int[Tensor, " context"]
    true: Optional[Float[Tensor, "context next_state"]]
    max_abs_error: Optional[float]
    weighted_kl: Optional[float]

    def to_dataframe(self) -> Any:
        """One row per context (index: its states, oldest first, e.g. "01"): the model's implied P(next = s)
        ("model P(s)"), the true kernel's ("true P(s)", fixed chains) and how many predictions the row averages.

        Returns:
            A pandas DataFrame.
        """
        n_contexts, vocab = self.implied.shape
        order = max(1, round(math.log(n_contexts, vocab))) if vocab > 1 else 1
        implied = self.implied.detach().cpu().tolist()
        true = None if self.true is None else self.true.detach().cpu().tolist()
        rows = []
        for c, label in enumerate(context_labels(vocab, order)):
            row: dict[str, Any] = {"context": label, **{f"model P({s})": implied[c][s] for s in range(vocab)}}
            if true is not None:
                row.update({f"true P({s})": true[c][s] for s in range(vocab)})
            rows.append({**row, "count": int(self.counts[c])})
        return dataframe(rows, index="context")

    def summary(self) -> str:
        """How well the implied kernel matches the true one (fixed chains)."""
        shape = f"{self.implied.shape[0]} contexts x {self.implied.shape[1]} next states"
        if self.max_abs_error is None:
            return (f"implied kernel ({shape}): random kernels, so there is no one true kernel; the rows are the "
                    "model's mean prediction per context")
        return (f"implied kernel ({shape}): max |model - true| {self.max_abs_error:.4f}, pi-weighted KL "
                f"{self.weighted_kl:.5f} nats")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (rows of unseen contexts as None)."""
        return json_safe({
            "implied": self.implied,
            "counts": self.counts,
            "true": self.true,
            "max_abs_error": self.max_abs_error,
            "weighted_kl": self.weighted_kl,
        })


def kernel_readout(
    model: HookedModel, batch: ProbeBatch, *, probs: Optional[Probs] = None, skip: int = 0
) -> KernelReadout:
    """Implied transition matrix of the model on `batch` compared with the source's kernel.

    >>> readout = kernel_readout(model, batch)  # on random kernels: the average law the model predicts per state
    >>> readout.implied.shape, float((readout.implied.sum(-1) - 1).abs().max()) < 1e-6
    (torch.Size([3, 3]), True)
    """
    batch = check_batch(batch, "kernel_readout")
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
