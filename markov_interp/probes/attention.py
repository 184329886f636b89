"""Attention probes: which heads attend to earlier tokens at a fixed lag, to induction targets, to the same state.

Olsson et al.'s scores, for Markov states of any order, each beside a chance level that holds on any chain:

- previous-token score at lag l: mean attention from i to i - l (queries i >= l). For an order-k circuit the
  heads of lags 1..k copy the last k states into each position. Its chance is the same score for uniform
  causal attention (query i spreads 1/(i+1) over keys 0..i): attention to a lag is a matter of positions,
  not of tokens, so this chance does not depend on the chain.
- induction score of order k: mean attention mass from i to keys j < i whose k preceding states equal the k
  states ending at i (x_{j-1-m} = x_{i-m} for m < k; queries with at least one such key). Those keys hold
  what followed earlier visits to the current context; attending to them and copying x_j is the in-context
  k-gram estimate. The key j = i is left out: its previous state is x_{i-1}, so a head that attends to
  itself would otherwise score whenever the chain stays put.
- same-token score: mean attention mass from i >= 1 on keys j <= i holding the same state (x_j = x_i). Its
  chance is uniform attention's on the same tokens, so it holds the alphabet's: on two states about half of the
  keys hold the current state (0.5-0.64 on the trained models' batches), on three a third.
- **sink**: the mean attention on position 0 (queries i >= 1). Trained heads often park most of their attention
  there (an attention sink) and give the previous position only a share; what the sink adds (x_0) is the same for
  every key of a sequence. The **previous-token score beyond the sink** at lag l reads the attention with the
  sink taken out: mean over queries i > l of a_{i,i-l} / (1 - a_{i,0}), against uniform attention over keys
  1..i (chance: the mean of 1/i). A head giving i - 1 a share of 0.15 and position 0 the rest scores 1 there,
  and ~0.08 (under chance) on the plain score. Either is supporting evidence: what a head carries is read from
  its edges (`edge_content`).

**The induction baseline keeps the tokens' statistics.** On a sticky chain consecutive states repeat, so a
previous-token head (key i - 1, whose previous state x_{i-2} usually equals x_i) and a same-token head (keys
with x_j = x_i, whose previous state usually equals x_j) put much of their mass on "matching" keys without
looking at the match at all. The baseline of a head is therefore the mass it would put on matching keys if
it attended exactly where it does but the match were drawn at its rate in the batch *given what the head
could see without the match*: the lag i - j (bucketed), the current state x_i, the key's own state x_j and,
for order k > 1, whether the order-(k-1) match holds. That is, baseline = mean over the scored queries of
sum_j a_ij r(stratum(i, j)), with r the batch's match rate in the stratum. A head that attends by position
or by the key's own state scores its baseline (excess 0); an induction head of order k, which attends by
the match itself, scores far above it; a first-order induction head gets no order-2 excess, because the
order-2 baseline conditions on the first-order match. `excess` = (score - baseline) / (1 - baseline). The
uniform-attention chance of the induction score (over the same candidate keys j < i) is kept for display.
"""

import dataclasses
import math
from typing import Any, Optional

import torch
from jaxtyping import Bool, Float, Shaped
from torch import Tensor

from markov_interp.config import check_int
from markov_interp.models import HookedModel, heads_per_layer
from markov_interp.probes._common import (
    Tokens,
    TokensOrBatch,
    as_tokens,
    check_tokens,
    json_safe,
    pattern_hook,
)
from markov_interp.probes._display import ProbeResult, dataframe, displayed

__all__ = ["AttentionScores", "TokenStatistics", "attention_scores", "induction_baseline", "induction_keys",
           "induction_score", "previous_token_score", "same_token_score", "token_statistics", "uniform_causal_pattern"]

Pattern = Float[Tensor, "batch head query_pos key_pos"]
KeyMask = Bool[Tensor, "batch query_pos key_pos"]
nan = float("nan")
_SMALL_LAGS = 4  # lags 1..4 are their own strata; longer ones share buckets growing by 1.5x


def _causal(seq: int, device: torch.device) -> Bool[Tensor, "query_pos key_pos"]:
    return torch.ones(seq, seq, dtype=torch.bool, device=device).tril()


def uniform_causal_pattern(tokens: Tokens) -> Float[Tensor, "batch 1 query_pos key_pos"]:
    """Uniform causal attention (one head): query i puts 1/(i+1) on each key 0..i. Chance for every score."""
    batch, seq = tokens.shape
    mask = _causal(seq, tokens.device).to(torch.float32)
    pattern = mask / mask.sum(-1, keepdim=True)
    return pattern.expand(batch, 1, seq, seq)


_CHUNK = 8  # sequences per step of the [batch, head, query, key]-sized work: its temporaries stay 1/8 of a batch


def _masked_mass(pattern: Pattern, keys: KeyMask, queries: Bool[Tensor, "batch query_pos"]) -> Float[Tensor, " head"]:
    """Mean over the selected queries (and the batch) of the attention mass each head puts on `keys`."""
    return _weighted_mass(pattern, keys, queries)


def _weighted_mass(
    pattern: Pattern, weights: Shaped[Tensor, "batch query_pos key_pos"], queries: Bool[Tensor, "batch query_pos"]
) -> Float[Tensor, " head"]:
    # per query, a few sequences at a time (each query's mass is its own sum: the same numbers as in one step)
    mass = torch.cat([torch.einsum("bhqk,bqk->bhq", pattern[i:i + _CHUNK], weights[i:i + _CHUNK].to(pattern.dtype))
                      for i in range(0, pattern.shape[0], _CHUNK)]) if pattern.shape[0] else \
        pattern.new_zeros(pattern.shape[:3])
    weight = queries.to(pattern.dtype)
    total = weight.sum()
    if float(total) == 0:
        return torch.zeros(pattern.shape[1], dtype=pattern.dtype, device=pattern.device)
    return torch.einsum("bhq,bq->h", mass, weight) / total


def check_pattern(pattern: Any, tokens: Any) -> None:
    """A clear error unless `pattern` is [batch, head, query_pos, key_pos] over the `tokens` [batch, pos] (as
    `cache["pattern", layer]` is for `run_with_cache(tokens)`).

    Args:
        pattern: attention patterns of one layer.
        tokens: the states they were computed on.

    Returns:
        None; raises ValueError naming the shapes otherwise.
    """
    if not isinstance(tokens, Tensor) or tokens.ndim != 2:
        shape = tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__
        raise ValueError(f"tokens must be a tensor [batch, pos], got {shape}")
    batch, seq = tokens.shape
    if not isinstance(pattern, Tensor) or pattern.ndim != 4 or tuple(pattern.shape[2:]) != (seq, seq) \
            or pattern.shape[0] != batch:
        shape = tuple(pattern.shape) if isinstance(pattern, Tensor) else type(pattern).__name__
        hint = " (one sequence? add the batch axis: pattern[None], tokens[None])" if isinstance(pattern, Tensor) \
            and pattern.ndim == 3 else ""
        raise ValueError(f"pattern must be [batch, head, query_pos, key_pos] = [{batch}, head, {seq}, {seq}] for "
                         f"tokens of shape {tuple(tokens.shape)} (cache['pattern', layer]), got {shape}{hint}")


def _check_positive(name: str, value: int) -> None:
    check_int(name, value, minimum=1)


def previous_token_score(pattern: Pattern, tokens: Tokens, *, lag: int = 1) -> Float[Tensor, " head"]:
    """Mean attention from each query i >= lag to key i - lag, per head (1: a perfect lag-`lag` head).

    >>> tokens = torch.tensor([[0, 1, 1, 0]])
    >>> previous_token_score(uniform_causal_pattern(tokens), tokens)  # chance: mean of 1/2, 1/3, 1/4
    tensor([0.3611])
    """
    check_pattern(pattern, tokens)
    _check_positive("lag", lag)
    batch, seq = tokens.shape
    keys = torch.zeros(seq, seq, dtype=torch.bool, device=pattern.device)
    if lag < seq:
        keys[torch.arange(lag, seq), torch.arange(0, seq - lag)] = True
    queries = torch.arange(seq, device=pattern.device) >= lag
    return _masked_mass(pattern, keys.expand(batch, -1, -1), queries.expand(batch, -1))


def induction_candidates(tokens: Tokens, *, order: int = 1) -> KeyMask:
    """cand[b, i, j] = (order <= j < i and i >= order - 1): keys whose `order` preceding states exist, j != i."""
    _check_positive("order", order)
    seq = tokens.shape[1]
    i = torch.arange(seq, device=tokens.device)[:, None]
    j = torch.arange(seq, device=tokens.device)[None, :]
    cand = (j < i) & (j >= order) & (i >= order - 1)
    return cand.expand(tokens.shape[0], -1, -1)


def induction_keys(tokens: Tokens, *, order: int = 1) -> KeyMask:
    """keys[b, i, j] = candidate j < i whose `order` preceding states equal the `order` states ending at i.

    For order 1: x_{j-1} = x_i, the positions that followed earlier visits to the current state.
    """
    cand = induction_candidates(tokens, order=order)
    return cand & _match(tokens, order)


def _match(tokens: Tokens, order: int) -> KeyMask:
    """match[b, i, j] = (x_{j-1-m} = x_{i-m} for m < order), False where an index falls before 0."""
    batch, seq = tokens.shape
    match = torch.ones(batch, seq, seq, dtype=torch.bool, device=tokens.device)
    for m in range(order):
        query = torch.full_like(tokens, -1)
        query[:, m:] = tokens[:, : seq - m]  # x_{i-m}
        key = torch.full_like(tokens, -2)
        key[:, m + 1:] = tokens[:, : seq - m - 1]  # x_{j-1-m}
        match &= query[:, :, None] == key[:, None, :]
    return match


def _lag_bucket(lag: int) -> int:
    return lag if lag <= _SMALL_LAGS else _SMALL_LAGS + 1 + int(math.floor(math.log(lag / (_SMALL_LAGS + 1), 1.5)))


@dataclasses.dataclass(frozen=True)
class _InductionTerms:
    """The candidate pairs (i, j) of an order-k induction score, j = i - lag for lag = 1, 2, ... in turn (queries
    i = order + lag .. seq - 1), flat: `index` [pair] is i x seq + j, `query` [pair] is i; `match` and `rate` are
    [batch, pair]; `scored` [batch, pos] marks the queries with at least one match. (No [i, j] tensors: the pairs
    are half of them, and a pattern is read at them with one gather.)
    """

    order: int
    index: Tensor
    query: Tensor
    match: Bool[Tensor, "batch pair"]
    rate: Float[Tensor, "batch pair"]
    scored: Bool[Tensor, "batch pos"]


def _pairs(seq: int, order: int, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    """(query i, key j, lag bucket) of every candidate pair, j = i - lag for lag = 1, 2, ... in turn (queries
    i = order + lag .. seq - 1): `_InductionTerms`' pair order."""
    lags = torch.arange(1, max(seq - order, 1), device=device)
    counts = seq - order - lags
    lag = torch.repeat_interleave(lags, counts)
    starts = torch.cumsum(counts, 0) - counts  # each lag's first pair
    query = torch.arange(len(lag), device=device) - torch.repeat_interleave(starts, counts) + order + lag
    buckets = torch.tensor([_lag_bucket(int(k)) for k in lags], dtype=torch.long, device=device)
    return query, query - lag, torch.repeat_interleave(buckets, counts)


def _induction_terms(tokens: Tokens, order: int, vocab: int) -> _InductionTerms:
    _check_positive("order", order)
    batch, seq = tokens.shape
    query, key, bucket = _pairs(seq, order, tokens.device)
    lower = torch.ones(batch, len(query), dtype=torch.bool, device=tokens.device)
    for m in range(order - 1):  # x_{i-m} == x_{j-1-m} for m < order - 1
        lower &= tokens[:, query - m] == tokens[:, key - 1 - m]
    match = lower & (tokens[:, query - order + 1] == tokens[:, key - order])
    hits_at = torch.zeros(batch, seq, dtype=torch.int32, device=tokens.device)
    scored = hits_at.index_add_(1, query, match.to(torch.int32)) > 0  # queries with at least one match
    small = tokens.to(torch.int32)  # the strata in int32, built in place: [batch, pair] tensors are the memory here
    stratum = small[:, query].add_((bucket * vocab).to(torch.int32)).mul_(vocab).add_(small[:, key]).mul_(2).add_(lower)
    del lower, small
    keep = scored[:, query]  # rates over the scored queries only (see induction_match_rate)
    n_strata = (_lag_bucket(max(seq, 1)) + 1) * vocab * vocab * 2
    # match / candidate counts per stratum: whole numbers, exact in float64 in any order of summation
    counts = torch.bincount(stratum[keep], minlength=n_strata).double()
    hits = torch.bincount(stratum[keep & match], minlength=n_strata).double()
    rate = (hits / counts.clamp_min(1))[stratum]
    return _InductionTerms(order=order, index=query * seq + key, query=query, match=match, rate=rate, scored=scored)


def _lag_mass(pattern: Pattern, terms: _InductionTerms, use_rate: bool) -> Float[Tensor, " head"]:
    """Mean over scored queries of sum over candidate keys of a_ij x (match or baseline rate), per head."""
    return _lag_masses(pattern, terms, (use_rate,))[0]


def _lag_masses(pattern: Pattern, terms: _InductionTerms, rates: tuple[bool, ...]) -> list[Float[Tensor, " head"]]:
    """`_lag_mass` for each `use_rate` in `rates`, the pattern read at the pairs once."""
    index = terms.index.to(pattern.device)
    at_pairs = torch.cat([pattern[i:i + _CHUNK].flatten(2).index_select(2, index)  # a broadcast pattern: no copy
                          for i in range(0, pattern.shape[0], _CHUNK)]).double() if pattern.shape[0] else \
        pattern.new_zeros(0, pattern.shape[1], len(index), dtype=torch.float64)  # [batch, head, pair]
    n_scored = int(terms.scored.sum())
    out = []
    for use_rate in rates:
        weight = (terms.rate if use_rate else terms.match.double()) * terms.scored[:, terms.query]
        total = torch.einsum("bhp,bp->h", at_pairs, weight.to(pattern.device))
        out.append((total / n_scored if n_scored else total).to(pattern.dtype))
    return out


def induction_match_rate(
    tokens: Tokens, *, order: int = 1, vocab: Optional[int] = None
) -> Float[Tensor, "batch query_pos key_pos"]:
    """r[b, i, j]: the batch's rate of order-`order` matches among candidate keys in the stratum of (i, j).

    The stratum is (lag bucket of i - j, x_i, x_j, order-(order-1) match); see the module docstring. Rates
    are taken over the queries the score averages (those with at least one match), so that a head that
    attends by position scores its baseline exactly in expectation. Zero outside the candidate keys of the
    scored queries. (A dense view for inspection; the scores read the pairs alone.)
    """
    vocab = int(tokens.max()) + 1 if vocab is None else vocab
    terms = _induction_terms(tokens, order, vocab)
    batch, seq = tokens.shape
    out = torch.zeros(batch, seq * seq, dtype=torch.float64, device=tokens.device)
    out[:, terms.index] = terms.rate * terms.scored[:, terms.query]
    return out.view(batch, seq, seq)


def induction_score(pattern: Pattern, tokens: Tokens, *, order: int = 1) -> Float[Tensor, " head"]:
    """Mean attention mass from query i on keys j < i matching the last `order` states, per head.

    Queries with no such key are skipped. Near 1 for a perfect induction head of that order (it attends only
    to positions that followed earlier visits to the current context; what it puts on j = i is not counted).
    """
    check_pattern(pattern, tokens)
    tokens = tokens.to(pattern.device)
    return _lag_mass(pattern, _induction_terms(tokens, order, int(tokens.max()) + 1), use_rate=False)


def induction_baseline(
    pattern: Pattern, tokens: Tokens, *, order: int = 1, vocab: Optional[int] = None
) -> Float[Tensor, " head"]:
    """Per head, the induction score it would get if matches occurred at the batch's rate given what it can
    see without them (lag, x_i, x_j, lower-order match): the chance level that keeps the tokens' statistics.

    >>> tokens = torch.tensor([[0, 0, 0, 1, 1, 1, 0, 0]])  # a sticky sequence
    >>> prev = torch.zeros(1, 1, 8, 8); prev[0, 0, 0, 0] = 1; prev[0, 0, torch.arange(1, 8), torch.arange(7)] = 1
    >>> bool(torch.isclose(induction_score(prev, tokens), induction_baseline(prev, tokens, vocab=2)))
    True
    """
    check_pattern(pattern, tokens)
    tokens = tokens.to(pattern.device)
    vocab = int(tokens.max()) + 1 if vocab is None else vocab
    return _lag_mass(pattern, _induction_terms(tokens, order, vocab), use_rate=True)


def same_token_score(pattern: Pattern, tokens: Tokens) -> Float[Tensor, " head"]:
    """Mean attention mass from query i >= 1 on keys j <= i holding the same state, x_j = x_i, per head."""
    check_pattern(pattern, tokens)
    tokens = tokens.to(pattern.device)
    seq = tokens.shape[1]
    keys = (tokens[:, :, None] == tokens[:, None, :]) & _causal(seq, tokens.device)
    queries = (torch.arange(seq, device=tokens.device) >= 1).expand(tokens.shape[0], -1)
    return _masked_mass(pattern, keys, queries)


_NAMES = ("previous_token", "induction", "same_token")


def _rescale(score: Tensor, chance: "Tensor | float") -> Tensor:
    chance = torch.as_tensor(chance, dtype=score.dtype)
    room = 1.0 - chance
    return torch.where(room > 1e-6, (score - chance) / room.clamp_min(1e-6), torch.zeros_like(score))


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False, repr=False)
class AttentionScores(ProbeResult):
    """Per-head attention scores as [layer, head] grids (per lag / order as [lag, layer, head]), with chance.

    `previous_token_lags[l - 1]` is the lag-l previous-token score, `induction_orders[k - 1]` the order-k
    induction score and `induction_baselines[k - 1]` its per-head baseline (module docstring). The
    first-order grids are also `previous_token` and `induction`. `excess(name)` rescales a score to
    (score - chance) / (1 - chance): 0 at chance, 1 for a head that puts all its attention where the score
    looks; the chance of the induction score is the head's own baseline. `*_chance` are the scores of uniform
    causal attention on the same tokens (for the induction score: over the candidate keys j < i).
    """

    previous_token: Float[Tensor, "layer head"]  # lag 1
    induction: Float[Tensor, "layer head"]  # order 1
    same_token: Float[Tensor, "layer head"]
    previous_token_chance: float
    induction_chance: float
    same_token_chance: float
    # every lag / order (default: the first-order grids alone, the induction baseline = induction_chance)
    previous_token_lags: Optional[Float[Tensor, "lag layer head"]] = None
    previous_token_lag_chance: tuple[float, ...] = ()
    induction_orders: Optional[Float[Tensor, "order layer head"]] = None
    induction_baselines: Optional[Float[Tensor, "order layer head"]] = None
    induction_order_chance: tuple[float, ...] = ()
    sink: Optional[Float[Tensor, "layer head"]] = None  # mean attention on position 0 (queries i >= 1)
    beyond_sink_lags: Optional[Float[Tensor, "lag layer head"]] = None  # lag scores with the sink taken out
    beyond_sink_chance: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.previous_token_lags is None:
            object.__setattr__(self, "previous_token_lags", self.previous_token[None])
            object.__setattr__(self, "previous_token_lag_chance", (float(self.previous_token_chance),))
        if self.induction_orders is None:
            object.__setattr__(self, "induction_orders", self.induction[None])
            object.__setattr__(self, "induction_order_chance", (float(self.induction_chance),))
        if self.induction_baselines is None:
            object.__setattr__(self, "induction_baselines",
                               torch.full_like(self.induction_orders, float(self.induction_chance)))
        if len(self.previous_token_lag_chance) != self.previous_token_lags.shape[0]:
            raise ValueError("previous_token_lag_chance needs one chance level per lag")

    @property
    def max_lag(self) -> int:
        return int(self.previous_token_lags.shape[0])

    @property
    def max_order(self) -> int:
        return int(self.induction_orders.shape[0])

    def lag_excess(self, lag: int) -> Float[Tensor, "layer head"]:
        """Excess previous-token score at `lag` (1..max_lag)."""
        if not 1 <= lag <= self.max_lag:
            raise ValueError(f"lag must be in 1..{self.max_lag}, got {lag!r}")
        return _rescale(self.previous_token_lags[lag - 1], self.previous_token_lag_chance[lag - 1])

    def lag_excess_beyond_sink(self, lag: int) -> Float[Tensor, "layer head"]:
        """Excess previous-token score at `lag` with position 0's attention taken out (module docstring); NaN grid
        where the scores were made without it."""
        if self.beyond_sink_lags is None:
            return torch.full_like(self.previous_token, nan)
        if not 1 <= lag <= self.beyond_sink_lags.shape[0]:
            raise ValueError(f"lag must be in 1..{self.beyond_sink_lags.shape[0]}, got {lag!r}")
        return _rescale(self.beyond_sink_lags[lag - 1], self.beyond_sink_chance[lag - 1])

    def induction_excess(self, order: int) -> Float[Tensor, "layer head"]:
        """Excess order-`order` induction score over each head's own baseline (1..max_order)."""
        if not 1 <= order <= self.max_order:
            raise ValueError(f"order must be in 1..{self.max_order}, got {order!r}")
        return _rescale(self.induction_orders[order - 1], self.induction_baselines[order - 1])

    def excess(self, name: str) -> Float[Tensor, "layer head"]:
        """(score - chance) / (1 - chance) for `name` in {"previous_token", "induction", "same_token"} (first
        order / lag 1)."""
        if name == "previous_token":
            return self.lag_excess(1)
        if name == "induction":
            return self.induction_excess(1)
        if name == "same_token":
            return _rescale(self.same_token, self.same_token_chance)
        raise ValueError(f"unknown score {name!r}; expected one of {list(_NAMES)}")

    def top_head(self, name: str, *, layers: Optional[range] = None) -> tuple[int, int]:
        """(layer, head) with the largest excess score `name`, optionally among `layers` only."""
        grid = self.excess(name)
        allowed = range(grid.shape[0]) if layers is None else layers
        best, where = -float("inf"), (-1, -1)
        for layer in allowed:
            for head in range(grid.shape[1]):
                if float(grid[layer, head]) > best:
                    best, where = float(grid[layer, head]), (layer, head)
        return where

    def _grids(self) -> dict[str, Tensor]:
        """Every [layer, head] grid by column name: raw score, chance / baseline and excess per lag and order."""
        out: dict[str, Tensor] = {}
        for lag in range(1, self.max_lag + 1):
            name = "previous_token" if lag == 1 else f"previous_token_lag{lag}"
            out[name] = self.previous_token_lags[lag - 1]
            out[f"{name}_excess"] = self.lag_excess(lag)
        for order in range(1, self.max_order + 1):
            name = "induction" if order == 1 else f"induction_order{order}"
            out[name] = self.induction_orders[order - 1]
            out[f"{name}_baseline"] = self.induction_baselines[order - 1]
            out[f"{name}_excess"] = self.induction_excess(order)
        out["same_token"], out["same_token_excess"] = self.same_token, self.excess("same_token")
        if self.sink is not None:
            out["sink"] = self.sink
            for lag in range(1, self.beyond_sink_lags.shape[0] + 1):
                out[f"beyond_sink_lag{lag}_excess"] = self.lag_excess_beyond_sink(lag)
        return out

    def to_dataframe(self) -> Any:
        """One row per head (index "L0H1"; absent heads, NaN scores, left out): layer, head, and for every lag and
        order the raw score, the induction baseline and the excess over chance (0 chance, 1 perfect).

        Returns:
            A pandas DataFrame.
        """
        grids = {name: grid.detach().cpu() for name, grid in self._grids().items()}
        n_layers, n_heads = self.previous_token.shape
        rows = []
        for layer in range(n_layers):
            for head in range(n_heads):
                values = {name: float(grid[layer, head]) for name, grid in grids.items()}
                if all(math.isnan(v) for k, v in values.items() if not k.endswith("_baseline")):
                    continue  # an absent head (a layer with fewer heads): NaN in every score grid
                rows.append({"component": f"L{layer}H{head}", "layer": layer, "head": head, **values})
        return dataframe(rows, index="component")

    def summary(self) -> str:
        """The strongest head of each score (by excess over chance), one line per score."""
        n_layers, n_heads = self.previous_token.shape
        lines = []
        tops = []
        for name, label, chance in (("previous_token", "previous-token", self.previous_token_chance),
                                    ("induction", "induction", None), ("same_token", "same-token",
                                                                       self.same_token_chance)):
            layer, head = self.top_head(name)
            if layer < 0:
                continue
            excess = float(self.excess(name)[layer, head])
            tops.append(f"{label} L{layer}H{head} {excess:.2f}")
            raw = float(getattr(self, name)[layer, head])
            base = (f"chance {chance:.3f}" if chance is not None
                    else f"its baseline {float(self.induction_baselines[0, layer, head]):.3f}")
            lines.append(f"{label}: L{layer}H{head} scores {raw:.3f} ({base}, excess {excess:.2f})")
        more = "" if self.max_lag == self.max_order == 1 else f"; lags 1..{self.max_lag}, orders 1..{self.max_order}"
        plural = lambda n, word: f"{n} {word}{'' if n == 1 else 's'}"  # noqa: E731
        head = (f"{plural(n_layers, 'layer')} x {plural(n_heads, 'head')}{more}; strongest by excess over chance: "
                + ", ".join(tops))
        return "\n".join([head, *lines])

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: grids as nested lists [layer][head] (per lag / order: [lag][layer][head])."""
        out: dict[str, Any] = {}
        for name in _NAMES:
            out[name] = getattr(self, name).tolist()
            out[f"{name}_chance"] = getattr(self, f"{name}_chance")
            out[f"{name}_excess"] = self.excess(name).tolist()
        out["previous_token_lags"] = self.previous_token_lags.tolist()
        out["previous_token_lag_chance"] = list(self.previous_token_lag_chance)
        out["previous_token_lag_excess"] = [self.lag_excess(lag).tolist() for lag in range(1, self.max_lag + 1)]
        out["induction_orders"] = self.induction_orders.tolist()
        out["induction_baselines"] = self.induction_baselines.tolist()
        out["induction_order_excess"] = [self.induction_excess(k).tolist() for k in range(1, self.max_order + 1)]
        if self.sink is not None:
            out["sink"] = self.sink.tolist()
            out["beyond_sink_lags"] = self.beyond_sink_lags.tolist()
            out["beyond_sink_chance"] = list(self.beyond_sink_chance)
            out["beyond_sink_lag_excess"] = [self.lag_excess_beyond_sink(lag).tolist()
                                             for lag in range(1, self.beyond_sink_lags.shape[0] + 1)]
        return json_safe(out)


def attention_hook_names(model: HookedModel) -> list[str]:
    """The hooks `attention_scores` reads: every layer's attention pattern."""
    return [pattern_hook(layer) for layer in range(model.cfg.n_layers)]


@displayed
@dataclasses.dataclass(frozen=True, eq=False)
class TokenStatistics:
    """What the attention scores need of the tokens alone, computed once for every model scored on them (a run's
    checkpoints): the candidate keys, matches and baseline rates of each induction order, and every chance level.
    Made by `token_statistics`; `attention_scores(..., statistics=...)` uses it."""

    shape: tuple[int, int]  # the tokens' [batch, pos]
    max_lag: int
    terms: tuple[_InductionTerms, ...]  # orders 1..max_order
    lag_chance: tuple[float, ...]
    order_chance: tuple[float, ...]
    same_token_chance: float

    def _headline(self) -> str:
        return (f"{self.shape[0]} sequences x {self.shape[1]} states, lags 1..{self.max_lag}, orders 1.."
                f"{len(self.terms)}; chance: previous-token {self.lag_chance[0]:.3f}, induction "
                f"{self.order_chance[0]:.3f}, same-token {self.same_token_chance:.3f}")

    def to_dict(self) -> dict[str, Any]:
        return json_safe({"shape": list(self.shape), "max_lag": self.max_lag, "max_order": len(self.terms),
                          "lag_chance": list(self.lag_chance), "order_chance": list(self.order_chance),
                          "same_token_chance": self.same_token_chance})


def token_statistics(tokens: TokensOrBatch, *, vocab: int, max_order: int = 1,
                     max_lag: Optional[int] = None) -> TokenStatistics:
    """The token-only part of `attention_scores` on `tokens` (see `TokenStatistics`).

    Args:
        tokens: the states [batch, pos] (or a `ProbeBatch`) the patterns will be computed on.
        vocab: the number of states (the model's d_vocab).
        max_order, max_lag: as in `attention_scores`.

    Returns:
        A `TokenStatistics`.
    """
    tokens = as_tokens(tokens)
    _check_positive("max_order", max_order)
    max_lag = max_order if max_lag is None else max_lag
    _check_positive("max_lag", max_lag)
    terms = tuple(_induction_terms(tokens, k, int(vocab)) for k in range(1, max_order + 1))
    uniform, cpu = uniform_causal_pattern(tokens.cpu()), tokens.cpu()
    return TokenStatistics(
        shape=tuple(tokens.shape), max_lag=max_lag, terms=terms,
        lag_chance=tuple(float(previous_token_score(uniform, cpu, lag=lag)[0]) for lag in range(1, max_lag + 1)),
        order_chance=tuple(_uniform_induction_chance(cpu, t) for t in terms),
        same_token_chance=float(same_token_score(uniform, cpu)[0]))


@torch.no_grad()
def attention_scores(
    model: HookedModel, tokens: TokensOrBatch, *, cache: Optional[Any] = None, max_order: int = 1,
    max_lag: Optional[int] = None, statistics: Optional[TokenStatistics] = None,
) -> AttentionScores:
    """Previous-token scores at lags 1..`max_lag` (default `max_order`), induction scores of orders
    1..`max_order` with their baselines, and same-token scores of every head (see `AttentionScores`).

    `cache` may be an `ActivationCache` (or dict) that already holds the patterns of `attention_hook_names`,
    from a `run_with_cache` on the same `tokens`; it is only read. `statistics` (`token_statistics` of the same
    tokens) saves recomputing the token-only part when several models are scored on one batch; its orders and
    lags then stand for `max_order` and `max_lag`.

    >>> scores = attention_scores(model, tokens)  # a hand-built induction circuit
    >>> scores.excess("previous_token")[0, 0].item(), round(scores.excess("induction")[1, 0].item(), 1)
    (1.0, 0.9)
    """
    tokens = as_tokens(tokens)
    if statistics is None:
        statistics = token_statistics(tokens, vocab=int(model.cfg.d_vocab), max_order=max_order, max_lag=max_lag)
    elif tuple(tokens.shape) != statistics.shape:
        raise ValueError(f"statistics were computed for tokens of shape {statistics.shape}, got "
                         f"{tuple(tokens.shape)}")
    names = attention_hook_names(model)
    if cache is None:
        _, cache = model.run_with_cache(check_tokens(model, tokens), names_filter=names)
    tok = tokens.to(cache[names[0]].device)
    move = lambda t: dataclasses.replace(  # noqa: E731  (to the patterns' device)
        t, **{name: getattr(t, name).to(tok.device) for name in ("index", "query", "match", "rate", "scored")})
    terms = [move(t) for t in statistics.terms]  # shared by every layer
    lags, orders, bases, same, sinks, beyond = [], [], [], [], [], []
    for hook in names:
        pattern = cache[hook].float()
        lags.append(torch.stack([previous_token_score(pattern, tok, lag=lag)
                                 for lag in range(1, statistics.max_lag + 1)]))
        sink, past = beyond_sink_scores(pattern, max_lag=statistics.max_lag)
        sinks.append(sink)
        beyond.append(past)
        for grid, masses in zip((orders, bases), zip(*(_lag_masses(pattern, t, (False, True)) for t in terms))):
            grid.append(torch.stack(masses))  # the scores, then the baselines, of orders 1..max_order
        same.append(same_token_score(pattern, tok))
    by_layer = lambda grids: torch.stack(grids, dim=1).cpu()  # noqa: E731  [lag/order, layer, head]
    absent = _absent_heads(model)  # surplus heads of layers with fewer heads: NaN, never a role
    lag_grids, order_grids = by_layer(lags).masked_fill(absent, nan), by_layer(orders).masked_fill(absent, nan)
    return AttentionScores(
        previous_token=lag_grids[0],
        induction=order_grids[0],
        same_token=torch.stack(same).cpu().masked_fill(absent, nan),
        previous_token_chance=statistics.lag_chance[0],
        induction_chance=statistics.order_chance[0],
        same_token_chance=statistics.same_token_chance,
        previous_token_lags=lag_grids,
        previous_token_lag_chance=statistics.lag_chance,
        induction_orders=order_grids,
        induction_baselines=by_layer(bases).masked_fill(absent, nan),
        induction_order_chance=statistics.order_chance,
        sink=torch.stack(sinks).cpu().masked_fill(absent, nan),
        beyond_sink_lags=by_layer(beyond).masked_fill(absent, nan),
        beyond_sink_chance=beyond_sink_chance(int(tokens.shape[1]), statistics.max_lag),
    )


def beyond_sink_scores(pattern: Pattern, *, max_lag: int) -> tuple[Float[Tensor, " head"], Float[Tensor, "lag head"]]:
    """(mean attention on position 0 from queries i >= 1, the previous-token score at lags 1..`max_lag` with that
    attention taken out: mean over queries i > lag of a_{i,i-lag} / (1 - a_{i,0})), per head (module docstring).
    Queries that put everything on position 0 are left out of the second.

    >>> pattern = torch.zeros(1, 1, 4, 4); pattern[0, 0, :, 0] = 0.85; pattern[0, 0, 0, 0] = 1
    >>> pattern[0, 0, torch.arange(1, 4), torch.arange(3)] += 0.15
    >>> sink, past = beyond_sink_scores(pattern, max_lag=1); round(float(sink[0]), 2), round(float(past[0, 0]), 2)
    (0.9, 1.0)
    """
    _check_positive("max_lag", max_lag)
    seq = pattern.shape[-1]
    sink = pattern[:, :, 1:, 0].mean((0, 2)) if seq > 1 else pattern.new_full(pattern.shape[1:2], nan)
    rest = (1 - pattern[:, :, :, 0]).clamp_min(0)
    out = []
    for lag in range(1, max_lag + 1):
        i = torch.arange(min(lag + 1, seq), seq, device=pattern.device)  # empty when the lag reaches past
        if len(i) == 0:
            out.append(pattern.new_full(pattern.shape[1:2], nan))
            continue
        share, room = pattern[:, :, i, i - lag], rest[:, :, i]
        seen = room > 1e-6
        ratio = torch.where(seen, share / room.clamp_min(1e-6), torch.zeros_like(share))
        out.append(ratio.sum((0, 2)) / seen.sum((0, 2)).clamp_min(1))
    return sink, torch.stack(out)


def beyond_sink_chance(seq: int, max_lag: int) -> tuple[float, ...]:
    """The previous-token score beyond the sink of uniform attention over keys 1..i: the mean of 1/i over the
    queries i = lag + 1 .. seq - 1, per lag 1..`max_lag` (NaN where there is none)."""
    return tuple(float(torch.mean(1 / torch.arange(lag + 1, seq, dtype=torch.float64))) if seq > lag + 1 else nan
                 for lag in range(1, max_lag + 1))


def _absent_heads(model: HookedModel) -> Bool[Tensor, "layer head"]:
    """True for the heads a layer does not have (`models.heads_per_layer` below the grid's width)."""
    counts = torch.tensor(heads_per_layer(model))
    return torch.arange(int(model.cfg.n_heads))[None, :] >= counts[:, None]


def _uniform_induction_chance(tokens: Tokens, terms: _InductionTerms) -> float:
    """Induction score of attention spread uniformly over the candidate keys j < i (display only)."""
    cand = induction_candidates(tokens[:1], order=terms.order)[0].to(torch.float32)  # positions only
    pattern = (cand / cand.sum(-1, keepdim=True).clamp_min(1)).expand(tokens.shape[0], 1, -1, -1)
    return float(_lag_mass(pattern.to(terms.scored.device), terms, use_rate=False)[0])
