"""Exact references of a hidden Markov source (`sources.HiddenMarkov`, any `sources.HiddenSource`): what loss a
model trained on it should reach.

- `word_law` / `context_loss`: the stationary law of k + 1 consecutive tokens, and from it the loss of the best
  predictor that sees only the last k tokens, H(X_k | X_0..X_{k-1}) (k = 0: the unigram loss H(X_0)). Exact.
- `mixed_states`: the mixed-state presentation, every belief the forward filter can reach after n tokens with
  its probability (equal beliefs merged), which is what the per-position Bayes loss and the belief simplex of
  Shai et al. are made of.
- `bayes_loss_curve`: the Bayes-optimal loss at position t, E[-log P(x_{t+1} | x_0..x_t)] =
  E[H(P(. | x_0..x_t))], which falls from the one-token loss to the entropy rate as the belief synchronises.
- `entropy_rate_bounds` / `hidden_entropy_rate`: its limit. Exact for a unifilar presentation (sum_i pi_i H(P(x |
  i)); RRXOR, Z1R); otherwise bracketed: the Bayes loss at position d is an upper bound, the loss of the filter
  that also knows the first hidden state a lower bound (Cover & Thomas, Theorem 4.5.1), both exact by enumeration
  and tight within 3e-7 for Mess3; a long-run Monte Carlo estimate with its standard error where they are not.
- `hidden_references`: all of these for a sequence length, as a `theory.ReferenceLosses` (cached in memory), and
  `stationary_token_predictions`, the plateau: the hidden family of `theory.reference_losses` (registered here).

Each value says how it was found: "exact" (enumeration; no error), "bracket" (its error is the half-width of a
rigorous interval, which bounds the error) or "monte carlo" (its error is a standard error).
"""

import dataclasses
import functools
import math
from collections.abc import Iterator
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from markov_interp._display import displayed
from markov_interp._plan import Need, planned, power, size
from markov_interp.config import check_int, check_number
from markov_interp.sources import HiddenMarkov, HiddenSource
from markov_interp.theory._stats import _mean_se
from markov_interp.theory.fixed import entropy
from markov_interp.theory.references import ReferenceFamily, ReferenceLosses, register_references

MAX_STATES = 1 << 18  # beliefs an enumeration may hold (about a second for Mess3, exact to position 10)
MAX_DEPTH = 4096  # tokens an enumeration follows at most (a process whose beliefs stay few but never settle)
_MERGE_SCALE = 1e10  # beliefs equal to 1e-10 in every entry are one mixed state
_SETTLED = 1e-12  # the bracket's width below which the belief has synchronised for good
_MC_ROUND = 2048  # sequences per Monte Carlo round
_MC_MAX = 1 << 17  # sequences at most (the standard error then stays above tol, and says so)
WORD_LIMIT = 1 << 22  # words x hidden states `word_law` builds at most


def _as_hmm(source: object) -> HiddenMarkov:
    """`source` as a `HiddenMarkov` (any `sources.HiddenSource` through its transition matrices)."""
    if isinstance(source, HiddenMarkov):
        return source
    if isinstance(source, HiddenSource):
        return HiddenMarkov(source.transition_matrices)
    raise ValueError(f"expected a hidden Markov source (a sources.HiddenSource such as sources.HiddenMarkov), got "
                     f"{type(source).__name__}")


def _hidden_needs(a: Any) -> list[Need]:
    """What a reference of a hidden Markov source holds: the mixed states of an enumeration (at most max_states,
    and at most V**n_tokens, beliefs over the hidden states, with their weights and a branch of each), the Monte
    Carlo's rounds of `_MC_ROUND` sequences over the positions (tokens, beliefs, laws), the curve itself."""
    hmm = a.get("hmm")
    if not isinstance(hmm, HiddenSource):
        return []
    hidden, vocab = int(hmm.hidden), int(hmm.vocab)
    states = size(a, "max_states") if "max_states" in a else 0
    if "n_tokens" in a:
        states = min(states, power(vocab, size(a, "n_tokens")))
    positions = size(a, "n_positions") or size(a, "seq_len")
    fields = [(name, size(a, name)) for name in ("max_states", "n_tokens", "n_positions", "seq_len") if name in a]
    return [Need.of("the mixed states", states * (hidden + 1) * vocab * 16, fields),
            Need.of("the Monte Carlo rounds", positions * _MC_ROUND * (hidden + vocab + 2) * 8, fields)]


def word_law(hmm: HiddenSource, length: int) -> Float[Tensor, " word"]:
    """P(x_0..x_{length-1}) of every word of `length` tokens under the stationary process, words in base-vocab
    order (x_0 most significant): pi T[x_0] T[x_1] ... 1.

    Args:
        hmm: the source.
        length: the word length (0: the empty word, probability 1).

    Returns:
        float64 [vocab ** length], summing to 1.

    >>> from markov_interp.sources import hmm_preset
    >>> word_law(hmm_preset("z1r"), 2)  # 00, 01, 10, 11
    tensor([0.1667, 0.3333, 0.3333, 0.1667], dtype=torch.float64)
    """
    hmm = _as_hmm(hmm)
    check_int("length", length, minimum=0)
    if power(hmm.vocab, length) * hmm.hidden > WORD_LIMIT:  # V**length itself would take hours for length 2**40
        raise ValueError(f"{hmm.vocab}**{length} words of {hmm.hidden} hidden states exceed {WORD_LIMIT} entries")
    forward = hmm.stationary[None]  # [word, hidden]: P(word, state after it)
    for _ in range(length):
        forward = hmm.next_joint(forward).reshape(-1, hmm.hidden)  # the filter's step, unnormalised
    return forward.sum(-1)


def context_loss(hmm: HiddenSource, k: int) -> float:
    """The loss in nats of the best predictor that sees only the last k tokens: H(X_k | X_0..X_{k-1}) =
    H(X_0..X_k) - H(X_0..X_{k-1}) under the stationary process (the (k+1)-gram law, `word_law`). Exact.

    k = 0 is the unigram loss (the plateau of a model that ignores the context); k = 1 the loss of a model that
    learnt the bigram law, k = 2 the trigram. They fall towards the entropy rate, and reach it for a Markov
    chain of order <= k; the hidden state makes the gap that only a longer context closes.

    Args:
        hmm: the source.
        k: how many tokens the predictor sees (>= 0).

    Returns:
        The loss in nats per token.

    >>> from markov_interp.sources import hmm_preset
    >>> [round(context_loss(hmm_preset("z1r"), k) / math.log(2), 4) for k in (0, 1, 2)]  # in bits
    [1.0, 0.9183, 0.6667]
    """
    check_int("k", k, minimum=0)
    longer = float(entropy(word_law(hmm, k + 1)))
    return longer - (float(entropy(word_law(hmm, k))) if k else 0.0)


# ------------------------------------------------------------------------------------ mixed-state enumeration
def _branch(hmm: HiddenMarkov, beliefs: Float[Tensor, "state hidden"],
            weights: Float[Tensor, " state"]) -> tuple[Tensor, Tensor]:
    """The beliefs after one more token, with their probabilities, equal beliefs merged (their weighted mean)."""
    joint = hmm.next_joint(beliefs)  # P(x, next state | belief)
    p_token = joint.sum(-1)
    child_weights = weights[:, None] * p_token
    keep = child_weights > 0
    children = joint[keep] / p_token[keep][:, None]
    child_weights = child_weights[keep]
    index, count = _equal_rows(torch.round(children * _MERGE_SCALE).to(torch.int64))
    merged = torch.zeros(count, dtype=torch.float64).index_add_(0, index, child_weights)
    means = torch.zeros(len(merged), beliefs.shape[1], dtype=torch.float64)
    means.index_add_(0, index, children * child_weights[:, None])
    return means / merged[:, None], merged


def _deeper(hmm: HiddenMarkov, beliefs: Float[Tensor, "state hidden"], weights: Float[Tensor, " state"],
            max_states: int) -> Iterator[tuple[Tensor, Tensor]]:
    """The mixed-state recursion: from (beliefs, weights), the beliefs a token deeper with their probabilities
    (`_branch`), then a token deeper again, for as long as a step cannot branch into more than `max_states`."""
    while len(beliefs) * hmm.vocab <= max_states:
        beliefs, weights = _branch(hmm, beliefs, weights)
        yield beliefs, weights


def _equal_rows(rows: Tensor) -> tuple[Tensor, int]:
    """A group index per row, equal rows in one group, and the number of groups: rows sorted by a hash (one sort
    of int64, several times faster than `torch.unique(dim=0)`), then equal neighbours grouped. Only equal rows
    share a group; equal rows kept apart by a hash collision only cost a merge."""
    mixed = rows[:, 0].clone()
    for column in range(1, rows.shape[1]):
        mixed = mixed * 1_000_003 + rows[:, column]  # int64, wraps around
    order = torch.sort(mixed).indices
    ranked = rows[order]
    starts = torch.ones(len(rows), dtype=torch.bool)
    starts[1:] = (ranked[1:] != ranked[:-1]).any(1)
    groups = torch.cumsum(starts, 0) - 1
    index = torch.empty_like(groups)
    index[order] = groups
    return index, int(groups[-1]) + 1


@planned(_hidden_needs)
def mixed_states(hmm: HiddenSource, n_tokens: int, *,
                 max_states: int = MAX_STATES) -> tuple[Float[Tensor, "state hidden"], Float[Tensor, " state"]]:
    """Every belief the forward filter reaches after `n_tokens` tokens from the stationary start, with its
    probability: the mixed-state presentation of the process at that depth (the points of Shai et al.'s belief
    simplex, weighted). Beliefs equal to 1e-10 are merged.

    Args:
        hmm: the source.
        n_tokens: how many tokens (0: the stationary law alone).
        max_states: refuse (ValueError) when a depth would branch into more beliefs than this.

    Returns:
        (beliefs [state, hidden], probabilities [state]), float64; the probabilities sum to 1.

    >>> from markov_interp.sources import hmm_preset
    >>> beliefs, probs = mixed_states(hmm_preset("z1r"), 3)  # synchronised after three tokens
    >>> beliefs, probs
    (tensor([[0., 0., 1.],
            [0., 1., 0.],
            [1., 0., 0.]], dtype=torch.float64), tensor([0.3333, 0.3333, 0.3333], dtype=torch.float64))
    """
    hmm = _as_hmm(hmm)
    check_int("n_tokens", n_tokens, minimum=0)
    check_int("max_states", max_states, minimum=1)
    state = hmm.stationary[None], torch.ones(1, dtype=torch.float64)
    deeper = _deeper(hmm, *state, max_states)
    for depth in range(n_tokens):
        beliefs = state[0]
        state = next(deeper, None)
        if state is None:
            raise ValueError(f"the mixed states after {depth + 1} tokens may number {len(beliefs) * hmm.vocab}, "
                             f"more than max_states={max_states}")
    return state


@dataclasses.dataclass(frozen=True)
class _Enumeration:
    """The exact per-position losses from the stationary start (`upper`, the Bayes loss) and from a known first
    hidden state (`lower`), as deep as the enumeration went; `settled` when they met (within 1e-12)."""

    upper: tuple[float, ...]
    lower: tuple[float, ...]

    @property
    def bracket(self) -> tuple[float, float]:
        """(lower, upper): the deepest lower and upper bounds of the entropy rate."""
        return min(self.lower[-1], self.upper[-1]), self.upper[-1]

    @property
    def settled(self) -> bool:
        """Whether the bounds met: every later position's Bayes loss is then the entropy rate within 1e-12."""
        return self.upper[-1] - self.lower[-1] <= _SETTLED


def _expected_entropy(beliefs: Tensor, weights: Tensor, emission: Tensor) -> float:
    return float((weights * entropy(beliefs @ emission)).sum())


def _hmm_key(hmm: HiddenMarkov) -> tuple:
    """A hashable key of the process (its matrices), for the caches."""
    return tuple(hmm.transition_matrices.shape), tuple(hmm.transition_matrices.flatten().tolist())


def _from_key(key: tuple) -> HiddenMarkov:
    shape, values = key
    return HiddenMarkov(torch.tensor(values, dtype=torch.float64).reshape(shape))


@functools.lru_cache(maxsize=32)
def _enumerate(key: tuple, max_states: int) -> _Enumeration:
    """Both enumerations side by side, a token at a time, until the bounds meet (within 1e-12), both outgrow
    `max_states` beliefs (each stops there; the lower one never goes deeper than the upper one) or MAX_DEPTH."""
    hmm = _from_key(key)
    emission = hmm.emission_law
    known = hmm.stationary > 0
    upper: list[float] = []
    lower: list[float] = []
    walks = ((upper, _deeper(hmm, hmm.stationary[None], torch.ones(1, dtype=torch.float64), max_states)),
             (lower, _deeper(hmm, torch.eye(hmm.hidden, dtype=torch.float64)[known], hmm.stationary[known],
                             max_states)))
    for _ in range(MAX_DEPTH):
        if upper and lower and upper[-1] - lower[-1] <= _SETTLED:
            break
        grew = False
        for losses, walk in walks:
            if losses is lower and len(lower) >= len(upper):
                continue  # the lower enumeration never goes deeper than the upper one
            state = next(walk, None)
            if state is not None:
                losses.append(_expected_entropy(*state, emission))
                grew = True
        if not grew:
            break
    if not upper or not lower:
        raise ValueError(f"the HMM's {hmm.hidden} hidden states and {hmm.vocab} tokens branch into more than "
                         f"max_states={max_states} beliefs at the first token")
    return _Enumeration(tuple(upper), tuple(lower))


@planned(_hidden_needs)
def entropy_rate_bounds(hmm: HiddenSource, *, max_states: int = MAX_STATES) -> tuple[float, float]:
    """A rigorous bracket (lower, upper) of the entropy rate, both ends exact by enumeration.

    The Bayes loss at position d, H(X_{d+1} | X_0..X_d), falls to the entropy rate; the loss of the filter that
    also knows the first hidden state, H(X_{d+1} | X_0..X_d, S_0), rises to it (Cover & Thomas, Theorem 4.5.1).
    Both are enumerated as deep as `max_states` beliefs allow (or until they meet within 1e-12): for Mess3 the
    bracket is about 2e-7 wide; for a unifilar presentation the lower end is the entropy rate at every depth.

    Args:
        hmm: the source.
        max_states: the most beliefs an enumeration may hold.

    Returns:
        (lower, upper) in nats.

    >>> from markov_interp.sources import hmm_preset
    >>> lower, upper = entropy_rate_bounds(hmm_preset("mess3"))
    >>> round(lower, 6), upper - lower < 1e-6
    (0.793457, True)
    """
    hmm = _as_hmm(hmm)
    check_int("max_states", max_states, minimum=1)
    return _enumerate(_hmm_key(hmm), max_states).bracket


# --------------------------------------------------------------------------------------------- Monte Carlo
def _mc_curve(hmm: HiddenMarkov, n_positions: int, first: int, *, seed: int, tol: float,
              n_sequences: int | None) -> tuple[Tensor, Tensor, float]:
    """Rao-Blackwellised Monte Carlo of the Bayes loss at positions first..n_positions-1: the mean entropy of the
    Bayes prediction over sequences of the process (`seed`'s), in rounds until every standard error is below
    `tol` (at most _MC_MAX sequences) or over exactly `n_sequences`. Returns the means, their standard errors and
    the standard error of their sum / n_positions (per sequence, so the positions' correlation is counted)."""
    generator = torch.Generator().manual_seed(seed)
    total = torch.zeros(n_positions - first, dtype=torch.float64)
    square = torch.zeros_like(total)
    row_total = row_square = torch.zeros((), dtype=torch.float64)
    target = _MC_MAX if n_sequences is None else n_sequences
    done = 0
    while done < target:
        size = min(_MC_ROUND, target - done)
        tokens = hmm.sample(size, n_positions, generator=generator)
        values = entropy(hmm.bayes_predictions(tokens))[:, first:]  # E[-log P(x_{t+1} | ...)] given the prefix
        total, square = total + values.sum(0), square + (values**2).sum(0)
        rows = values.sum(1) / n_positions
        row_total, row_square = row_total + rows.sum(), row_square + (rows**2).sum()
        done += size
        if n_sequences is None and float(_mean_se(total, square, done)[1].max()) < tol:
            break
    means, errors = _mean_se(total, square, done)
    return means, errors, float(_mean_se(row_total, row_square, done)[1])


def _window_entropies(hmm: HiddenMarkov, size: int, burn_in: int,
                      generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Per sequence, the mean over positions burn_in..2 burn_in - 1 of the Bayes loss's entropy from the
    stationary start (upper) and from the known first hidden state (lower): (midpoint, upper - lower)."""
    tokens, states = hmm.sample(size, 2 * burn_in, generator=generator, return_states=True)
    emission = hmm.emission_law
    upper = entropy(hmm.belief_states(tokens)[:, burn_in:] @ emission).mean(1)
    start = torch.nn.functional.one_hot(states[:, 0], hmm.hidden).to(torch.float64)
    lower = entropy(hmm.belief_states(tokens, initial=start)[:, burn_in:] @ emission).mean(1)
    return (upper + lower) / 2, upper - lower


def _mc_entropy_rate(hmm: HiddenMarkov, *, seed: int, tol: float) -> tuple[float, float]:
    """The entropy rate by Monte Carlo where the enumerated bracket is too wide: the midpoint of the upper and
    lower per-position losses (`entropy_rate_bounds`' two filters, on the same sampled sequences) averaged over a
    window of late positions, the window moved later (doubling from 64) until the mean gap is below `tol`.
    Returns (value, error): the error adds the half-gap (which bounds the midpoint's bias) to the standard error
    in quadrature."""
    generator = torch.Generator().manual_seed(seed)
    burn_in = 64
    mid, gap = _window_entropies(hmm, _MC_ROUND, burn_in, generator)
    while float(gap.mean()) / 2 > tol / 2 and burn_in < MAX_DEPTH:
        burn_in *= 2
        mid, gap = _window_entropies(hmm, _MC_ROUND, burn_in, generator)
    total, square, gaps, done = mid.sum(), (mid**2).sum(), gap.sum(), len(mid)
    while done < _MC_MAX and float(_mean_se(total, square, done)[1]) > tol / 2:
        mid, gap = _window_entropies(hmm, _MC_ROUND, burn_in, generator)
        total, square, gaps, done = total + mid.sum(), square + (mid**2).sum(), gaps + gap.sum(), done + len(mid)
    mean, se = _mean_se(total, square, done)
    return float(mean), math.hypot(float(se), float(gaps) / done / 2)


# -------------------------------------------------------------------------------------------- the references
@planned(_hidden_needs)
def hidden_entropy_rate(hmm: HiddenSource, *, tol: float = 5e-4, seed: int = 0,
                        max_states: int = MAX_STATES) -> tuple[float, float, str]:
    """The entropy rate in nats: the loss of the Bayes-optimal predictor once its belief has synchronised, the
    global optimum of a model trained on the process (late in the sequence).

    - "exact": a unifilar presentation (RRXOR, Z1R, a Markov chain), sum_i pi_i H(P(x | i)); or bounds that met.
    - "bracket": the midpoint of `entropy_rate_bounds` when its half-width (the error returned) is <= tol
      (Mess3: about 1.1e-7).
    - "monte carlo": otherwise, a long-run estimate with its error (see `_mc_entropy_rate`), from `seed`.

    Args:
        hmm: the source.
        tol: the largest error accepted from the bracket and aimed at by the Monte Carlo.
        seed: the Monte Carlo's seed.
        max_states: the most beliefs an enumeration may hold.

    Returns:
        (value, error, method).

    >>> from markov_interp.sources import hmm_preset
    >>> value, error, method = hidden_entropy_rate(hmm_preset("rrxor"))
    >>> round(value / math.log(2), 6), error, method  # 2/3 bit
    (0.666667, 0.0, 'exact')
    """
    hmm = _as_hmm(hmm)
    check_number("tol", tol, positive=True)
    check_int("seed", seed, minimum=0)
    check_int("max_states", max_states, minimum=1)
    if hmm.unifilar:
        return float((hmm.stationary * entropy(hmm.emission_law)).sum()), 0.0, "exact"
    enumeration = _enumerate(_hmm_key(hmm), max_states)
    lower, upper = enumeration.bracket
    if enumeration.settled:
        return upper, 0.0, "exact"
    if (upper - lower) / 2 <= tol:
        return (upper + lower) / 2, (upper - lower) / 2, "bracket"
    return (*_mc_entropy_rate(hmm, seed=seed, tol=tol), "monte carlo")


@displayed
@dataclasses.dataclass(frozen=True, kw_only=True)
class BayesLossCurve:
    """The Bayes-optimal loss at each position t = 0..n-1 (predicting x_{t+1} from x_0..x_t), in nats.

    - `values`, `errors`: per position; positions below `exact_positions` are exact (error 0); the later ones
      were found by `method`: "exact" (the bounds met: the entropy rate within 1e-12), "bracket" (the entropy
      rate's bracket, error its half-width) or "monte carlo" (error a standard error).
    - `mean`, `mean_error`: the average over the positions, what a model's mean loss over a sequence of n + 1
      tokens is compared with.
    """

    values: tuple[float, ...] = dataclasses.field(repr=False)
    errors: tuple[float, ...] = dataclasses.field(repr=False)
    exact_positions: int
    method: str
    mean: float
    mean_error: float


@planned(_hidden_needs)
def bayes_loss_curve(hmm: HiddenSource, n_positions: int, *, tol: float = 5e-4, seed: int = 0,
                     n_sequences: int | None = None, max_states: int = MAX_STATES) -> BayesLossCurve:
    """The Bayes-optimal loss per position, E[-log P(x_{t+1} | x_0..x_t)] for t = 0..n_positions-1, from the
    stationary start: the loss a model reaches when its prediction is the forward filter's. It falls from the
    bigram loss (position 0: `context_loss(hmm, 1)`) to the entropy rate as the belief synchronises.

    Exact by enumerating the mixed states (`mixed_states`) while they number at most `max_states` (Mess3: positions
    0..10; RRXOR, Z1R: every position). Beyond: the entropy rate's bracket when it is tight within `tol`, else
    Rao-Blackwellised Monte Carlo (the mean entropy of the Bayes prediction over `seed`'s sequences) to a standard
    error below `tol` per position, or over exactly `n_sequences`.

    Args:
        hmm: the source.
        n_positions: how many positions (a sequence of n_positions + 1 tokens has that many targets).
        tol, seed, n_sequences: see above.
        max_states: the most beliefs an enumeration may hold.

    Returns:
        A `BayesLossCurve`.

    >>> from markov_interp.sources import hmm_preset
    >>> [round(v, 4) for v in bayes_loss_curve(hmm_preset("z1r"), 4).values]
    [0.6365, 0.4621, 0.231, 0.231]
    """
    hmm = _as_hmm(hmm)
    check_int("n_positions", n_positions, minimum=1)
    check_number("tol", tol, positive=True)
    check_int("seed", seed, minimum=0)
    check_int("n_sequences", n_sequences, minimum=2, none_ok=True)
    check_int("max_states", max_states, minimum=1)
    enumeration = _enumerate(_hmm_key(hmm), max_states)
    exact = min(len(enumeration.upper), n_positions)
    values = list(enumeration.upper[:exact])
    errors = [0.0] * exact
    rest = n_positions - exact
    lower, upper = enumeration.bracket
    method, mean_error = "exact", 0.0
    if rest and enumeration.settled:
        values += [upper] * rest
        errors += [0.0] * rest
    elif rest and (upper - lower) / 2 <= tol:
        method, mean_error = "bracket", (upper - lower) / 2 * rest / n_positions
        values += [(upper + lower) / 2] * rest
        errors += [(upper - lower) / 2] * rest
    elif rest:
        means, ses, mean_error = _mc_curve(hmm, n_positions, exact, seed=seed, tol=tol, n_sequences=n_sequences)
        method = "monte carlo"
        values += means.tolist()
        errors += ses.tolist()
    return BayesLossCurve(values=tuple(values), errors=tuple(errors), exact_positions=exact, method=method,
                          mean=sum(values) / n_positions, mean_error=mean_error)


@planned(_hidden_needs)
def hidden_references(hmm: HiddenSource, seq_len: int, *, seed: int = 0, tol: float = 5e-4,
                      n_sequences: int | None = None, max_states: int = MAX_STATES) -> ReferenceLosses:
    """All the references of a hidden Markov source for sequences of `seq_len` tokens (seq_len - 1 targets), as
    the `ReferenceLosses` every source's references are (cached in memory; `theory.reference_losses` gives them
    for any `sources.HiddenSource`).

    - `bayes_loss` (`bayes_loss_se`) and `bayes_curve` (`bayes_curve_se`): `bayes_loss_curve`'s mean and values,
      the optimum a model's loss is measured against;
    - `entropy_rate`, `entropy_rate_se`, `entropy_rate_method`: `hidden_entropy_rate` (value, error, method);
    - `unigram_loss`, `bigram_loss`, `trigram_loss`: `context_loss` for k = 0, 1, 2 (exact).

    Args:
        hmm: the source.
        seq_len: the sequence length.
        seed, tol, n_sequences, max_states: as `hidden_entropy_rate` and `bayes_loss_curve` take them.

    Returns:
        A `ReferenceLosses` (`hidden` True).

    >>> from markov_interp.sources import hmm_preset
    >>> refs = hidden_references(hmm_preset("mess3"), 64)
    >>> round(refs.bayes_loss, 4), refs.entropy_rate_method, refs.hidden
    (0.7949, 'bracket', True)
    """
    hmm = _as_hmm(hmm)
    check_int("seq_len", seq_len, minimum=2)
    check_number("tol", tol, positive=True)
    check_int("seed", seed, minimum=0)
    check_int("n_sequences", n_sequences, minimum=2, none_ok=True)
    check_int("max_states", max_states, minimum=1)
    return _hidden_references(_hmm_key(hmm), seq_len, seed, float(tol), n_sequences, max_states)


@functools.lru_cache(maxsize=32)
def _hidden_references(key: tuple, seq_len: int, seed: int, tol: float, n_sequences: int | None,
                       max_states: int) -> ReferenceLosses:
    hmm = _from_key(key)
    rate, error, method = hidden_entropy_rate(hmm, tol=tol, seed=seed, max_states=max_states)
    curve = bayes_loss_curve(hmm, seq_len - 1, tol=tol, seed=seed, n_sequences=n_sequences, max_states=max_states)
    unigram, bigram, trigram = (context_loss(hmm, k) for k in range(3))
    return ReferenceLosses(entropy_rate=rate, entropy_rate_se=error, entropy_rate_method=method,
                           unigram_loss=unigram, bigram_loss=bigram, trigram_loss=trigram, bayes_loss=curve.mean,
                           bayes_loss_se=curve.mean_error, bayes_curve=curve.values, bayes_curve_se=curve.errors)


def stationary_token_predictions(hmm: HiddenSource,
                                 tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos vocab"]:
    """The stationary law of one token (pi times the emission law) at every position: the best predictor that
    ignores the context, whose loss is `context_loss(hmm, 0)`; the plateau of the hidden family.

    >>> from markov_interp.sources import hmm_preset
    >>> stationary_token_predictions(hmm_preset("z1r"), torch.tensor([[0, 1]]))[0, 0]
    tensor([0.5000, 0.5000], dtype=torch.float64)
    """
    hmm = _as_hmm(hmm)
    law = (hmm.stationary @ hmm.emission_law).to(tokens.device)
    return law.expand(*tokens.shape, hmm.vocab)


register_references(ReferenceFamily("hidden", HiddenSource, hidden_references, stationary_token_predictions))
