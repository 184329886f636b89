"""Graded gains: how much of each step up the ladder of in-context laws a model has climbed.

The in-context add-beta estimators of increasing order form a ladder (Edelman et al. 2024: uniform, then the
in-context unigram, then the bigram law, ...): on Markov data of order k each step up to order k lowers the loss.
For every order k the gain fraction is

    g_k = (L(law of order k - 1) - L(model)) / (L(law of order k - 1) - L(law of order k)),  (in-context laws)

losses in nats on the probe batch, with the convention that "order -1" is the uniform law: g_0 is the fraction of
the step from the uniform law to the in-context unigram, g_1 of the step from the unigram to the bigram law, and so
on up to the source's order + 1 (past the source's order the higher law is worse, not better: for a model at the
order-k law g_{k+1} near 0 says it conditions on no more than it needs, but for a model short of the order-k law
both losses sit below its own and g_{k+1} is a ratio of two negative numbers). g_k = 1 means the model does as well
as the order-k law, 0 as well as the order-(k-1) law; values outside [0, 1] are kept (a model between the uniform
law and the unigram law has g_1 < 0; one better than the bigram law on a fixed chain, g_1 > 1). Standard errors
are over sequences (`ratio_of_means`).

A single layer cannot match the previous state of a key with the current state, so its best in-context law is a
function of the current state and the state counts (`strategies.state_and_counts_probs`): it takes part of the
unigram -> bigram step, and `classify_mechanism` names one-layer models by it.
"""

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any, Optional

import torch

from markov_interp.sources import add_beta_predictions
from markov_interp._display import displayed
from markov_interp.probes._common import ProbeBatch, Probs, json_safe, ratio_of_means, target_losses

__all__ = ["Gains", "graded_gains"]


@displayed
@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class Gains(Mapping):
    """{k: g_k} (module docstring) with `se[k]`; `law_losses[k]` is the mean loss of the in-context law of order
    k (k = -1: uniform) and `model_loss` the model's, in nats on the probe batch. Reads as a mapping k -> g_k."""

    fractions: dict[int, float]
    se: dict[int, float]
    law_losses: dict[int, float]
    model_loss: float

    def __getitem__(self, k: int) -> float:
        return self.fractions[k]

    def __iter__(self) -> Iterator[int]:
        return iter(self.fractions)

    def __len__(self) -> int:
        return len(self.fractions)

    def describe(self) -> str:
        """"g_0 1.00 +- 0.01, g_1 0.42 +- 0.03, ..."."""
        return ", ".join(f"g_{k} {v:.2f} +- {self.se[k]:.2f}" for k, v in self.fractions.items())

    def to_dict(self) -> dict[str, Any]:
        return json_safe({"fractions": {str(k): v for k, v in self.fractions.items()},
                          "se": {str(k): v for k, v in self.se.items()},
                          "law_losses": {str(k): v for k, v in self.law_losses.items()},
                          "model_loss": self.model_loss})


def graded_gains(probs: Probs, batch: ProbeBatch, *, beta: float | int | None = None,
                 max_order: Optional[int] = None) -> Gains:
    """The gain fractions g_0 .. g_{max_order} of the model whose next-state laws on `batch` are `probs`.

    Args:
        probs: the model's laws on `batch.tokens` ([batch pos vocab]).
        batch: the probe batch.
        beta: add-beta smoothing of the in-context laws (default `batch.beta`).
        max_order: highest k (default the source's order + 1).

    Returns:
        A `Gains` mapping k -> g_k with standard errors.

    >>> from markov_interp.sources import RandomMarkov
    >>> from markov_interp.probes import sample_batch
    >>> batch = sample_batch(RandomMarkov(2), n_sequences=8, seq_len=64, seed=0)
    >>> law = add_beta_predictions(batch.tokens, 2, order=1, beta=1.0)
    >>> gains = graded_gains(law, batch)  # the bigram law itself climbs the unigram -> bigram step fully
    >>> sorted(gains), round(gains[1], 6)
    ([0, 1, 2], 1.0)
    """
    beta = float(batch.beta if beta is None else beta)
    top = batch.order + 1 if max_order is None else int(max_order)
    if top < 0:
        raise ValueError(f"max_order must be >= 0, got {max_order!r}")
    tokens = batch.tokens.cpu()
    per_seq = lambda p: target_losses(p.detach().cpu().double(), tokens).mean(1)  # noqa: E731
    model = per_seq(probs)
    laws = {-1: per_seq(torch.full((*tokens.shape, batch.vocab), 1.0 / batch.vocab, dtype=torch.float64))}
    for k in range(top + 1):
        laws[k] = per_seq(add_beta_predictions(tokens, batch.vocab, order=k, beta=beta))
    fractions, se = {}, {}
    for k in range(top + 1):
        fractions[k], se[k] = ratio_of_means(laws[k - 1] - model, laws[k - 1] - laws[k])
    return Gains(fractions=fractions, se=se, law_losses={k: float(v.mean()) for k, v in laws.items()},
                 model_loss=float(model.mean()))
