"""Strategy similarity: which textbook predictor the model's next-state laws are closest to.

Edelman et al. 2024 ("The Evolution of Statistical Induction Heads") train transformers on random Markov
kernels and watch them pass through three phases: the uniform law (at initialisation), the in-context unigram
estimator (state counts so far, ignoring the current state), then the in-context bigram estimator (transition
counts from the current state: an induction-head circuit). They tell the phases apart by the KL divergence
between the model's predictions and each strategy. This module measures the same divergences on one probe
batch, plus, for a fixed chain, the two predictors a model can store in its weights: the stationary law pi
(the unigram solution of Makkuva et al.) and the true kernel.

Direction: KL(strategy || model), the excess log-loss the model would pay if the strategy's law were the
truth (the same direction as `kl_curve` and `theory.kl_divergence(true, predicted)`). It stays finite
whatever the strategy, because a softmax puts mass on every state, whereas KL(model || kernel) is infinite for
a kernel with zero entries.
"""

import dataclasses
from typing import Any, Optional

import torch

from markov_interp import theory
from markov_interp.probes._common import (
    Model,
    ProbeBatch,
    Probs,
    in_context_unigram_probs,
    json_safe,
    kernel_probs,
    next_state_probs,
    stationary_probs,
)

# Every strategy, in the order ties are broken (simplest first); the last two exist for fixed chains only.
STRATEGIES = ("uniform", "in_context_unigram", "in_context_kgram", "stationary", "kernel")
STRATEGY_LABELS = {
    "uniform": "uniform 1/V",
    "in_context_unigram": "in-context unigram",
    "in_context_kgram": "in-context k-gram (bigram for order 1)",
    "stationary": "stationary law pi",
    "kernel": "true kernel",
}


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class StrategySimilarity:
    """Mean KL(strategy || model) in nats, over all positions and sequences of a probe batch, per strategy.

    `uniform`: 1/V; `in_context_unigram`: add-beta state counts over x_0..x_t (order 0);
    `in_context_kgram`: add-beta transition counts from the last `order` states (the source's order; the
    in-context bigram for order 1); `stationary` and `kernel`: pi and the true kernel rows, for fixed chains
    only (None for random kernels, where no law can be stored in the weights). `closest` names the strategy
    with the smallest divergence (ties go to the simpler one, in `STRATEGIES` order).
    """

    uniform: float
    in_context_unigram: float
    in_context_kgram: float
    stationary: Optional[float]
    kernel: Optional[float]
    order: int  # order of the in-context k-gram strategy (the source's order)
    beta: float  # add-beta smoothing of the in-context strategies

    @property
    def divergences(self) -> dict[str, float]:
        """{strategy: mean KL(strategy || model)} over the strategies defined for this source."""
        values = {name: getattr(self, name) for name in STRATEGIES}
        return {name: value for name, value in values.items() if value is not None}

    @property
    def closest(self) -> str:
        """The strategy whose laws the model's predictions are closest to (smallest mean KL)."""
        divergences = self.divergences
        return min(divergences, key=divergences.__getitem__)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of the fields, plus `closest`."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return json_safe({**out, "closest": self.closest})


def strategy_probs(batch: ProbeBatch, *, beta: float | int | None = None) -> dict[str, Probs]:
    """Each strategy's next-state law at every position of `batch` ({name: [batch pos vocab]}, float64, CPU).

    `beta` defaults to `batch.beta` (the source's alpha for random kernels, 1/2 otherwise).

    >>> from markov_interp.data import BinaryChain
    >>> from markov_interp.probes import sample_batch
    >>> laws = strategy_probs(sample_batch(BinaryChain(0.2, 0.3), n_sequences=2, seq_len=4, seed=0))
    >>> list(laws), tuple(laws["uniform"].shape)
    (['uniform', 'in_context_unigram', 'in_context_kgram', 'stationary', 'kernel'], (2, 4, 2))
    """
    beta = float(batch.beta if beta is None else beta)
    tokens = batch.tokens.cpu()
    laws = {
        "uniform": torch.full((*tokens.shape, batch.vocab), 1.0 / batch.vocab, dtype=torch.float64),
        "in_context_unigram": in_context_unigram_probs(tokens, batch.vocab, beta=beta),
        "in_context_kgram": theory.add_beta_predictions(tokens, batch.vocab, order=batch.order, beta=beta),
    }
    if not batch.random_kernel:
        laws["stationary"] = stationary_probs(batch).cpu()
        laws["kernel"] = kernel_probs(batch).cpu()
    return laws


def strategy_similarity(
    model: Model, batch: ProbeBatch, *, beta: float | int | None = None, probs: Optional[Probs] = None
) -> StrategySimilarity:
    """How close the model's next-state laws are to each strategy of Edelman et al. (see `StrategySimilarity`).

    Mean KL(strategy || model) in nats over every position and sequence of `batch`; `probs` reuses a forward
    pass already made, `beta` defaults to `batch.beta`. Along training on random kernels, `closest` moves from
    "uniform" to "in_context_unigram" to "in_context_kgram" as the induction head forms.

    >>> # batch = sample_batch(RandomMarkov(3), n_sequences=64, seq_len=32, seed=0)
    >>> # strategy_similarity(model, batch).closest  # "in_context_kgram" for an induction circuit
    """
    beta = float(batch.beta if beta is None else beta)
    if probs is None:
        probs = next_state_probs(model, batch.tokens)
    probs = probs.cpu().to(torch.float64)
    divergences = {
        name: float(theory.kl_divergence(law, probs).mean()) for name, law in strategy_probs(batch, beta=beta).items()
    }
    return StrategySimilarity(
        uniform=divergences["uniform"],
        in_context_unigram=divergences["in_context_unigram"],
        in_context_kgram=divergences["in_context_kgram"],
        stationary=divergences.get("stationary"),
        kernel=divergences.get("kernel"),
        order=int(batch.order),
        beta=float(beta),
    )
