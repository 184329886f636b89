"""Attention probes: which heads attend to the previous token, to induction targets, to the same state.

Olsson et al.'s scores, for Markov states. With 2 or 3 states, chance is high (half the earlier positions of
a binary sequence hold the current state), so every score comes with its chance level: the same score for
uniform causal attention (query i spreads 1/(i+1) over keys 0..i) on the same tokens.

- previous-token score: mean attention from i to i - 1 (queries i >= 1). Layer 0 of a two-layer model
  trained on random kernels becomes a previous-token head.
- induction score: mean attention mass from i to keys j <= i whose previous state equals the current one,
  x_{j-1} = x_i (queries with at least one such key). Those keys hold what followed earlier visits to the
  current state; attending to them and copying x_j is the in-context bigram estimate.
- same-token score: mean attention mass from i to keys j <= i with x_j = x_i (queries i >= 1).
"""

import dataclasses
from typing import Any, Optional

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from markov_interp.probes._common import Model, Tokens, check_tokens, json_safe, pattern_hook

Pattern = Float[Tensor, "batch head query_pos key_pos"]


def _causal(seq: int, device: torch.device) -> Bool[Tensor, "query_pos key_pos"]:
    return torch.ones(seq, seq, dtype=torch.bool, device=device).tril()


def uniform_causal_pattern(tokens: Tokens) -> Float[Tensor, "batch head query_pos key_pos"]:
    """Uniform causal attention (one head): query i puts 1/(i+1) on each key 0..i. Chance for every score."""
    batch, seq = tokens.shape
    mask = _causal(seq, tokens.device).to(torch.float32)
    pattern = mask / mask.sum(-1, keepdim=True)
    return pattern.expand(batch, 1, seq, seq)


def _masked_mass(
    pattern: Pattern, keys: Bool[Tensor, "batch query_pos key_pos"], queries: Bool[Tensor, "batch query_pos"]
) -> Float[Tensor, " head"]:
    """Mean over the selected queries (and the batch) of the attention mass each head puts on `keys`."""
    mass = (pattern * keys[:, None].to(pattern.dtype)).sum(-1)  # [batch, head, query]
    weight = queries.to(pattern.dtype)
    total = weight.sum()
    if float(total) == 0:
        return torch.zeros(pattern.shape[1], dtype=pattern.dtype, device=pattern.device)
    return torch.einsum("bhq,bq->h", mass, weight) / total


def previous_token_score(pattern: Pattern, tokens: Tokens) -> Float[Tensor, " head"]:
    """Mean attention from each query i >= 1 to key i - 1, per head (1: a perfect previous-token head).

    >>> tokens = torch.tensor([[0, 1, 1, 0]])
    >>> previous_token_score(uniform_causal_pattern(tokens), tokens)  # chance: mean of 1/2, 1/3, 1/4
    tensor([0.3611])
    """
    batch, seq = tokens.shape
    keys = torch.zeros(seq, seq, dtype=torch.bool, device=pattern.device)
    keys[torch.arange(1, seq), torch.arange(0, seq - 1)] = True
    queries = torch.arange(seq, device=pattern.device) >= 1
    return _masked_mass(pattern, keys.expand(batch, -1, -1), queries.expand(batch, -1))


def induction_keys(tokens: Tokens) -> Bool[Tensor, "batch query_pos key_pos"]:
    """keys[b, i, j] = (1 <= j <= i and x_{j-1} = x_i): the positions an induction head should attend to."""
    seq = tokens.shape[1]
    prev = torch.cat([torch.full_like(tokens[:, :1], -1), tokens[:, :-1]], dim=1)  # x_{j-1}, -1 at j = 0
    match = tokens[:, :, None] == prev[:, None, :]
    return match & _causal(seq, tokens.device)


def induction_score(pattern: Pattern, tokens: Tokens) -> Float[Tensor, " head"]:
    """Mean attention mass from query i on keys j <= i with x_{j-1} = x_i, per head.

    Queries with no such key are skipped. 1 for a perfect induction head (it attends only to positions that
    followed earlier visits to the current state).
    """
    tokens = tokens.to(pattern.device)
    keys = induction_keys(tokens)
    return _masked_mass(pattern, keys, keys.any(-1))


def same_token_score(pattern: Pattern, tokens: Tokens) -> Float[Tensor, " head"]:
    """Mean attention mass from query i >= 1 on keys j <= i holding the same state, x_j = x_i, per head."""
    tokens = tokens.to(pattern.device)
    seq = tokens.shape[1]
    keys = (tokens[:, :, None] == tokens[:, None, :]) & _causal(seq, tokens.device)
    queries = (torch.arange(seq, device=tokens.device) >= 1).expand(tokens.shape[0], -1)
    return _masked_mass(pattern, keys, queries)


_SCORES = {
    "previous_token": previous_token_score,
    "induction": induction_score,
    "same_token": same_token_score,
}


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class AttentionScores:
    """Per-head attention scores as [layer, head] grids, each beside its chance level.

    `*_chance` is the score of uniform causal attention on the same tokens (one number: it does not depend
    on the head). `excess(name)` rescales a score to (score - chance) / (1 - chance): 0 at chance, 1 for a
    head that puts all its attention where the score looks.
    """

    previous_token: Float[Tensor, "layer head"]
    induction: Float[Tensor, "layer head"]
    same_token: Float[Tensor, "layer head"]
    previous_token_chance: float
    induction_chance: float
    same_token_chance: float

    def excess(self, name: str) -> Float[Tensor, "layer head"]:
        """(score - chance) / (1 - chance) for `name` in {"previous_token", "induction", "same_token"}."""
        if name not in _SCORES:
            raise ValueError(f"unknown score {name!r}; expected one of {sorted(_SCORES)}")
        chance = getattr(self, f"{name}_chance")
        return (getattr(self, name) - chance) / max(1.0 - chance, 1e-12)

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

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: grids as nested lists [layer][head]."""
        out: dict[str, Any] = {}
        for name in _SCORES:
            out[name] = getattr(self, name).tolist()
            out[f"{name}_chance"] = getattr(self, f"{name}_chance")
            out[f"{name}_excess"] = self.excess(name).tolist()
        return json_safe(out)


def attention_hook_names(model: Model) -> list[str]:
    """The hooks `attention_scores` reads: every layer's attention pattern."""
    return [pattern_hook(layer) for layer in range(model.cfg.n_layers)]


@torch.no_grad()
def attention_scores(model: Model, tokens: Tokens, *, cache: Optional[Any] = None) -> AttentionScores:
    """Previous-token, induction and same-token scores of every head, beside chance (see `AttentionScores`).

    `cache` may be an `ActivationCache` (or dict) that already holds the patterns of `attention_hook_names`,
    from a `run_with_cache` on the same `tokens`; it is only read.

    >>> # scores = attention_scores(model, tokens); scores.excess("previous_token")[0]  # layer-0 heads
    """
    names = attention_hook_names(model)
    if cache is None:
        _, cache = model.run_with_cache(check_tokens(model, tokens), names_filter=names)
    grids = {name: [] for name in _SCORES}
    for hook in names:
        pattern = cache[hook].float()
        for name, fn in _SCORES.items():
            grids[name].append(fn(pattern, tokens.to(pattern.device)).cpu())
    uniform = uniform_causal_pattern(tokens.cpu())
    chance = {name: float(fn(uniform, tokens.cpu())[0]) for name, fn in _SCORES.items()}
    return AttentionScores(
        previous_token=torch.stack(grids["previous_token"]),
        induction=torch.stack(grids["induction"]),
        same_token=torch.stack(grids["same_token"]),
        previous_token_chance=chance["previous_token"],
        induction_chance=chance["induction"],
        same_token_chance=chance["same_token"],
    )
