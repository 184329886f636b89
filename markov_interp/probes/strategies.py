"""Strategy similarity: which textbook predictor the model's next-state laws are closest to.

Edelman et al. 2024 ("The Evolution of Statistical Induction Heads") train transformers on random Markov
kernels and watch them pass through three phases: the uniform law (at initialisation), the in-context unigram
estimator (state counts so far, ignoring the current state), then the in-context bigram estimator (transition
counts from the current state: an induction-head circuit). They tell the phases apart by the KL divergence
between the model's predictions and each strategy. This module measures the same divergences on one probe
batch, plus, for a fixed chain, the two predictors a model can store in its weights: the stationary law pi
(the unigram solution of Makkuva et al.) and the true kernel.

For random kernels one more law is a candidate: `state_and_counts`, the best prediction from the current state
and the in-context state counts alone (what one attention layer can compute: its query sees the current state,
its attention averages over the states so far, but no head can match a key's previous state with the current
one). It sits between the in-context unigram and bigram laws (see `state_and_counts_probs`).

Direction: KL(strategy || model), the excess log-loss the model would pay if the strategy's law were the
truth (the same direction as `kl_curve` and `theory.kl_divergence(true, predicted)`). It stays finite
whatever the strategy, because a softmax puts mass on every state, whereas KL(model || kernel) is infinite for
a kernel with zero entries.
"""

import dataclasses
import functools
from typing import Any, Optional

import torch
from jaxtyping import Int
from torch import Tensor

from markov_interp import theory
from markov_interp.config import check_int
from markov_interp.models import HookedModel
from markov_interp.sources import RandomMarkov, add_beta_predictions
from markov_interp.probes._common import (
    ProbeBatch,
    Probs,
    check_batch,
    json_safe,
    kernel_probs,
    next_state_probs,
    stationary_probs,
)
from markov_interp.probes._display import ProbeResult, dataframe

__all__ = ["STATE_AND_COUNTS", "STRATEGIES", "STRATEGY_LABELS", "StrategySimilarity", "in_context_name",
           "in_context_order", "state_and_counts_probs", "strategy_probs", "strategy_similarity"]

_GRAM = {0: "unigram", 1: "bigram", 2: "trigram"}
MAX_ORDER = 4  # in-context estimators are named up to this order (sources of higher order are refused)


def in_context_name(order: int) -> str:
    """The strategy name of the in-context add-beta estimator of `order` ("in_context_unigram" for 0,
    "in_context_bigram" for 1, "in_context_trigram" for 2, "in_context_4gram" for 3, ...)."""
    check_int("order", order, minimum=0, maximum=MAX_ORDER)
    return f"in_context_{_GRAM.get(order, f'{order + 1}gram')}"


def in_context_order(name: str) -> Optional[int]:
    """The order of an in-context strategy name (None for the others)."""
    for k in range(MAX_ORDER + 1):
        if name == in_context_name(k):
            return k
    return None


STATE_AND_COUNTS = "state_and_counts"
# Every strategy name, in the order ties are broken (simplest first); stationary / kernel: fixed chains only;
# state_and_counts: random kernels only.
STRATEGIES = ("uniform", "stationary", "kernel", in_context_name(0), STATE_AND_COUNTS,
              *(in_context_name(k) for k in range(1, MAX_ORDER + 1)))
STRATEGY_LABELS = {
    "uniform": "uniform 1/V",
    "stationary": "stationary law pi",
    "kernel": "true kernel",
    STATE_AND_COUNTS: "current state and in-context state counts",
    **{in_context_name(k): f"in-context {_GRAM.get(k, f'{k + 1}-gram')} (order {k})" for k in range(MAX_ORDER + 1)},
}
MIN_GAP = 1e-4  # nats: two candidate laws closer than this on the probe tokens are one law (the simpler name)
N_PRIOR_KERNELS = 4096  # prior kernels the state-and-counts law averages over
_CHUNK = 16  # sequences per chunk of the state-and-counts weights ([chunk, pos, N_PRIOR_KERNELS] float64)


@functools.lru_cache(maxsize=8)
def _state_laws(vocab: int, order: int, alpha: float, n_kernels: int, seed: int) -> tuple:
    """log pi [M, V] and the next-state law given the current state q [M, V, V] of `n_kernels` prior kernels."""
    kernels = RandomMarkov(vocab, order=order, alpha=alpha).sample_kernels(
        n_kernels, torch.Generator().manual_seed(seed))
    contexts = theory.stationary_context_laws(kernels)  # [M, V**order], the current state is the last digit
    joint = (contexts[..., None] * kernels).reshape(n_kernels, -1, vocab, vocab).sum(1)  # [M, state, next]
    pi = joint.sum(-1)
    return pi.clamp_min(1e-30).log().float(), (joint / pi[..., None].clamp_min(1e-300)).float()


def state_and_counts_probs(
    tokens: Int[Tensor, "batch pos"], vocab: int, *, order: int, alpha: float, n_kernels: int = N_PRIOR_KERNELS,
    seed: int = 0,
) -> Probs:
    """The prediction of the next state from the current state x_t and the in-context state counts n (of
    x_0..x_t) alone, under the random-kernel prior: sum over prior kernels P of w(P) P(next | x_t), with
    P(next | x_t) the kernel's next-state law given the current state (older states averaged under its stationary
    context law) and w(P) proportional to prod_v pi_P(v)^n_v, the probability of the counts if the states were drawn
    independently from the kernel's stationary law pi_P. The prior is Dirichlet(alpha) rows of order `order`, read
    off `n_kernels` seeded draws (a fixed law: the same `seed` gives the same numbers).

    At t = 0 this is the prior's law given the first state; as the counts grow it follows the kernels whose
    stationary law matches them, so it uses the current state (unlike the in-context unigram law) without
    counting transitions (unlike the bigram law). On binary kernels with alpha = 1, at long contexts with
    balanced counts it predicts a switch with probability 2/3: kernels with pi = (1/2, 1/2) have p = q, and under
    the prior's weighting p is 2/3 on average.

    >>> probs = state_and_counts_probs(torch.tensor([[0, 1, 0, 1]]), 2, order=1, alpha=1.0)
    >>> bool(probs[0, 3, 0] > 0.5)  # balanced counts, now in state 1: a switch back to 0 is the better guess
    True
    """
    log_pi, q = _state_laws(vocab, order, float(alpha), n_kernels, seed)
    tokens = tokens.cpu()
    counts = torch.nn.functional.one_hot(tokens, vocab).to(torch.float32).cumsum(1)
    # float32 weights: log-weights are at most a few thousand nats, softmax subtracts their maximum
    mixed = torch.cat([torch.softmax(counts[start:start + _CHUNK] @ log_pi.T, dim=-1) @ q.reshape(n_kernels, -1)
                       for start in range(0, tokens.shape[0], _CHUNK)])  # [batch, pos, state * next]
    rows = mixed.double().reshape(*tokens.shape, vocab, vocab)
    rows = rows / rows.sum(-1, keepdim=True)
    return torch.gather(rows, 2, tokens[..., None, None].expand(-1, -1, 1, vocab))[:, :, 0]


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False, repr=False)
class StrategySimilarity(ProbeResult):
    """Mean KL(strategy || model) in nats, over all positions and sequences of a probe batch, per strategy,
    with the gaps between the strategies themselves on the same tokens.

    `divergences`: {strategy: mean KL(strategy || model)} for the uniform law, (fixed chains) the stationary
    law pi and the true kernel of the source's order, and the in-context add-beta estimators of every order
    0..source order. `gaps[s]`: mean KL(s' || s) to the nearest other strategy s' (how far apart the laws the
    model is compared with are on these tokens: the yardstick of `classify_mechanism`'s fit). `aliases[s]`
    names the simpler strategy that s coincides with (gap below `MIN_GAP`; e.g. pi = uniform on a symmetric
    chain); aliased strategies are never `closest`. Ties go to the simpler strategy (`STRATEGIES` order).
    """

    divergences: dict[str, float]
    gaps: dict[str, float]
    aliases: dict[str, str]
    order: int  # the source's order (highest in-context estimator)
    beta: float  # add-beta smoothing of the in-context strategies
    losses: dict[str, float] = dataclasses.field(default_factory=dict)  # each law's mean loss on the batch, nats

    @property
    def candidates(self) -> tuple[str, ...]:
        """The strategies the model is classified against (aliases removed), simplest first."""
        return tuple(n for n in self.divergences if n not in self.aliases)

    @property
    def ranking(self) -> tuple[str, ...]:
        """Candidates from closest to farthest (stable: ties keep the simpler one first)."""
        return tuple(sorted(self.candidates, key=self.divergences.__getitem__))

    @property
    def closest(self) -> str:
        """The strategy whose laws the model's predictions are closest to (smallest mean KL)."""
        return self.ranking[0]

    def __getattr__(self, name: str) -> Optional[float]:
        # uniform, stationary, kernel, in_context_unigram, ... as attributes (None where not defined)
        if name in STRATEGIES:
            return self.divergences.get(name)
        raise AttributeError(name)

    @property
    def in_context_kgram(self) -> float:
        """Divergence to the in-context estimator of the source's order."""
        return self.divergences[in_context_name(self.order)]

    def to_dataframe(self) -> Any:
        """One row per candidate law (index its name, closest first; aliased laws last): its label, mean
        KL(law || model) in nats, the gap to the nearest other law, and the simpler law it coincides with.

        Returns:
            A pandas DataFrame.
        """
        names = [*self.ranking, *(n for n in self.divergences if n in self.aliases)]
        return dataframe(({"law": n, "label": STRATEGY_LABELS.get(n, n), "divergence": self.divergences[n],
                           "gap": self.gaps[n], "same_as": self.aliases.get(n)} for n in names), index="law")

    def summary(self) -> str:
        """The closest law and the runner-up, then every candidate's divergence."""
        ranking = self.ranking
        label = lambda name: STRATEGY_LABELS.get(name, name)  # noqa: E731
        head = f"closest law: {label(ranking[0])}, mean KL(law || model) {self.divergences[ranking[0]]:.4f} nats"
        if len(ranking) > 1:
            head += f" (runner-up {label(ranking[1])} {self.divergences[ranking[1]]:.4f})"
        rest = ", ".join(f"{n} {self.divergences[n]:.4f}" for n in ranking)
        return f"{head}\nall candidates (nats): {rest}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: divergences, gaps, aliases, order, beta, closest, each law's loss."""
        return json_safe({
            "divergences": dict(self.divergences), "gaps": dict(self.gaps), "aliases": dict(self.aliases),
            "order": self.order, "beta": self.beta, "closest": self.closest, "losses": dict(self.losses),
        })


def strategy_probs(batch: ProbeBatch, *, beta: float | int | None = None) -> dict[str, Probs]:
    """Each strategy's next-state law at every position of `batch` ({name: [batch pos vocab]}, float64, CPU).

    `beta` defaults to `batch.beta` (the source's alpha for random kernels, 1/2 otherwise).

    >>> from markov_interp.sources import BinaryChain
    >>> from markov_interp.probes import sample_batch
    >>> laws = strategy_probs(sample_batch(BinaryChain(0.2, 0.3), n_sequences=2, seq_len=4, seed=0))
    >>> list(laws), tuple(laws["uniform"].shape)
    (['uniform', 'stationary', 'kernel', 'in_context_unigram', 'in_context_bigram'], (2, 4, 2))
    """
    beta = float(batch.beta if beta is None else beta)
    if batch.order > MAX_ORDER:
        raise ValueError(f"strategies are defined up to order {MAX_ORDER}, the source has order {batch.order}")
    tokens = batch.tokens.cpu()
    laws = {"uniform": torch.full((*tokens.shape, batch.vocab), 1.0 / batch.vocab, dtype=torch.float64)}
    if not batch.random_kernel:
        laws["stationary"] = stationary_probs(batch).cpu()
        laws["kernel"] = kernel_probs(batch).cpu()
    for k in range(batch.order + 1):
        laws[in_context_name(k)] = add_beta_predictions(tokens, batch.vocab, order=k, beta=beta)
        if k == 0 and batch.random_kernel:
            laws[STATE_AND_COUNTS] = state_and_counts_probs(tokens, batch.vocab, order=batch.order, alpha=beta)
    return laws


def _gaps(laws: dict[str, Probs]) -> tuple[dict[str, float], dict[str, str]]:
    names = list(laws)
    pair = {(a, b): float(theory.kl_divergence(laws[a], laws[b]).mean()) for a in names for b in names if a != b}
    aliases: dict[str, str] = {}
    for i, name in enumerate(names):
        for simpler in names[:i]:
            if simpler not in aliases and max(pair[simpler, name], pair[name, simpler]) < MIN_GAP:
                aliases[name] = simpler
                break
    kept = [n for n in names if n not in aliases]
    gaps = {n: min((pair[o, n] for o in kept if o != n), default=float("inf")) for n in names}
    return gaps, aliases


def strategy_similarity(
    model: HookedModel, batch: ProbeBatch, *, beta: float | int | None = None, probs: Optional[Probs] = None,
    laws: Optional[dict[str, Probs]] = None,
) -> StrategySimilarity:
    """How close the model's next-state laws are to each strategy (see `StrategySimilarity`).

    Mean KL(strategy || model) in nats over every position and sequence of `batch`; `probs` reuses a forward
    pass already made, `laws` the strategies' laws already computed (`strategy_probs(batch, beta=beta)`), `beta`
    defaults to `batch.beta`. Along training on random kernels, `closest` moves from
    "uniform" to "in_context_unigram" to "in_context_bigram" as the induction head forms (Edelman et al.).

    >>> strategy_similarity(model, batch).closest  # a hand-built induction circuit on random kernels
    'in_context_bigram'
    """
    batch = check_batch(batch, "strategy_similarity")
    beta = float(batch.beta if beta is None else beta)
    if probs is None:
        probs = next_state_probs(model, batch.tokens)
    probs = probs.cpu().to(torch.float64)
    laws = strategy_probs(batch, beta=beta) if laws is None else laws
    divergences = {name: float(theory.kl_divergence(law, probs).mean()) for name, law in laws.items()}
    gaps, aliases = _gaps(laws)
    tokens = batch.tokens.cpu()
    losses = {name: float(theory.target_log_loss(law, tokens).mean()) for name, law in laws.items()}
    return StrategySimilarity(divergences=divergences, gaps=gaps, aliases=aliases, order=int(batch.order),
                              beta=float(beta), losses=losses)
