"""Activation patching between two sequences, and Q/K/V composition scores between heads.

Patching (the ROME / Wang et al. recipe): run the model on a *corrupted* sequence, put back one component's
activation from the *clean* run, and see how much of the clean prediction returns. For Markov data the
natural pair is two sequences that end in the same state but come from different contexts (different
kernels, `patching_pair`): a model that learned the kernel predicts the same for both, so nothing needs
restoring; for an induction circuit, patching the induction head (or the previous-token head feeding it)
restores the clean context's prediction.

The generic loop below is a few lines on `run_with_hooks`; TransformerLens's `patching` module gives the same
numbers but insists on `model.eval()` and a progress bar, which a probe should not impose.

Composition scores (Elhage et al. 2021, as `model.all_composition_scores`): how much a later head's Q, K or V
input reads what an earlier head's OV circuit writes. The induction circuit shows as K-composition from the
previous-token head to the induction head.
"""

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, Optional

import torch
from jaxtyping import Float
from torch import Tensor

from markov_interp import theory
from markov_interp.models import HookedModel
from markov_interp.probes._common import (Probs, Tokens, TokensOrBatch, as_tokens, check_tokens, json_safe,
                                          next_state_probs)
from markov_interp.probes._display import ProbeResult, dataframe
from markov_interp.probes.interventions import (
    Component,
    ComponentValues,
    as_components,
    intervened_probs,
    model_components,
)

__all__ = ["CompositionScores", "PatchingResult", "PositionPatching", "patching_by_position", "activation_patching",
           "composition_scores",           "head_composition", "patched_probs", "patching_pair"]


_MIN_BASELINE_KL = 1e-9
_PATTERN_ENTRIES = 1 << 23  # attention-pattern entries of one position-patching pass (chunks of positions)


def patching_pair(tokens: TokensOrBatch, *, seed: int = 0) -> tuple[Tokens, Tokens]:
    """(clean, corrupted): corrupted[b] is another sequence of the batch whose last state is set to clean[b]'s.

    The pair shares the final state and position but not the context, so a model that ignores the context
    predicts the same law at the last position for both.
    """
    from markov_interp.probes.ablation import derangement

    tokens = as_tokens(tokens)
    corrupted = tokens[derangement(tokens.shape[0], seed=seed)].clone()
    corrupted[:, -1] = tokens[:, -1]
    return tokens, corrupted


def check_pair(clean_tokens: Tokens, corrupted_tokens: Tokens, *, allow_identical: bool = False) -> None:
    """A clear error unless the clean and corrupted batches have one shape (and, unless allowed, differ).

    Args:
        clean_tokens: the clean run's states [batch, pos].
        corrupted_tokens: the corrupted run's states, the same shape.
        allow_identical: accept equal batches (`patched_probs`, which divides by nothing).

    Returns:
        None; raises ValueError otherwise.
    """
    for name, value in (("clean_tokens", clean_tokens), ("corrupted_tokens", corrupted_tokens)):
        if not isinstance(value, Tensor):
            raise ValueError(f"{name} must be a tensor [batch, pos] (or a ProbeBatch), got {type(value).__name__}")
    if clean_tokens.shape != corrupted_tokens.shape:
        raise ValueError(
            f"clean and corrupted tokens must have the same shape, got {tuple(clean_tokens.shape)} and "
            f"{tuple(corrupted_tokens.shape)}"
        )
    if not allow_identical and torch.equal(clean_tokens.cpu(), corrupted_tokens.cpu()):
        raise ValueError("clean and corrupted tokens are identical, so there is nothing to restore (every recovery "
                         "would be 0/0); corrupt the context, e.g. clean, corrupted = patching_pair(tokens)")


@torch.no_grad()
def patched_probs(
    model: HookedModel,
    clean_tokens: TokensOrBatch,
    corrupted_tokens: TokensOrBatch,
    components: Sequence[Any],
    *,
    positions: Optional[Sequence[int]] = None,
    clean_cache: Optional[Any] = None,
) -> Probs:
    """Next-state laws of the corrupted run with `components`' activations taken from the clean run.

    `positions` restricts the patch to those sequence positions (default: all). `clean_cache` may hold the
    clean activations already (only read).
    """
    comps = as_components(model, components)
    clean_tokens, corrupted_tokens = as_tokens(clean_tokens), as_tokens(corrupted_tokens)
    check_pair(clean_tokens, corrupted_tokens, allow_identical=True)
    names = sorted({c.hook_name for c in comps})
    if clean_cache is None:
        _, clean_cache = model.run_with_cache(check_tokens(model, clean_tokens), names_filter=names)
    replacements = {name: clean_cache[name] for name in names}
    return intervened_probs(model, corrupted_tokens, [comps], replacements, positions=positions)[0]


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False, repr=False)
class PatchingResult(ComponentValues):
    """How much of the clean prediction each patched component restores in the corrupted run.

    `recovery[i]` = 1 - KL(clean || patched) / KL(clean || corrupted) at the measured position, averaged over
    the batch as a ratio of means: 1 when patching component i alone gives back the clean prediction, 0 when
    it changes nothing. `baseline_kl` = KL(clean || corrupted); when it is below 1e-9 nats the context did not
    matter (a model that learned the kernel) and every recovery is NaN.
    """

    components: tuple[Component, ...]
    recovery: tuple[float, ...]
    baseline_kl: float
    position: int
    n_layers: int
    n_heads: int

    def _values(self) -> tuple[float, ...]:  # result[component] and head_grid() give the recovery
        return self.recovery

    def to_dataframe(self) -> Any:
        """One row per patched component (index "L0H1", ...): kind, layer, head and its recovery.

        Returns:
            A pandas DataFrame.
        """
        return self._rows(recovery=self.recovery)

    def summary(self) -> str:
        """The components that restore the clean prediction best."""
        where = f"activation patching of {len(self.components)} components, read at position {self.position}"
        if self.baseline_kl <= _MIN_BASELINE_KL:
            return (f"{where}: the clean and corrupted runs predict the same law (KL {self.baseline_kl:.2g} nats), "
                    "so there is nothing to restore (every recovery is NaN)")
        return f"{where} (KL clean to corrupted {self.baseline_kl:.4f} nats); best recovery: {self._largest(fmt='.3f')}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (NaN recoveries as None)."""
        return json_safe({
            "position": self.position,
            "baseline_kl": self.baseline_kl,
            "recovery": {c.name: r for c, r in zip(self.components, self.recovery)},
        })


@torch.no_grad()
def activation_patching(
    model: HookedModel,
    clean_tokens: TokensOrBatch,
    corrupted_tokens: TokensOrBatch,
    *,
    components: Optional[Sequence[Any]] = None,
    position: int = -1,
) -> PatchingResult:
    """Patch each component (default: every head, attention layer and MLP) from clean into corrupted.

    The effect is read at `position` (default the last), where the two sequences of a `patching_pair` share
    their state; every position is patched. See `PatchingResult`.

    >>> clean, corrupted = patching_pair(tokens)
    >>> grid = activation_patching(model, clean, corrupted).head_grid()
    >>> round(float(grid[1, 0]), 3), bool(grid[0, 0] < 0.2)  # the induction head carries the prediction
    (1.0, True)
    """
    clean_tokens, corrupted_tokens = as_tokens(clean_tokens), as_tokens(corrupted_tokens)
    check_pair(clean_tokens, corrupted_tokens)
    comps = as_components(model, model_components(model) if components is None else components)
    names = sorted({c.hook_name for c in comps})
    logits, cache = model.run_with_cache(check_tokens(model, clean_tokens), names_filter=names)
    clean = torch.softmax(logits.double(), dim=-1)[:, position]
    corrupted = next_state_probs(model, corrupted_tokens)[:, position]
    baseline = float(theory.kl_divergence(clean, corrupted).mean())
    replacements = {name: cache[name] for name in names}
    recovery = []
    for patched in intervened_probs(model, corrupted_tokens, [[c] for c in comps], replacements):
        kl = float(theory.kl_divergence(clean, patched[:, position]).mean())
        recovery.append(1.0 - kl / baseline if baseline > _MIN_BASELINE_KL else float("nan"))
    return PatchingResult(
        components=tuple(comps),
        recovery=tuple(recovery),
        baseline_kl=baseline,
        position=position,
        n_layers=int(model.cfg.n_layers),
        n_heads=int(model.cfg.n_heads),
    )


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False, repr=False)
class PositionPatching(ProbeResult):
    """Recovery of the clean prediction at `position` when the residual stream a layer reads is patched from
    the clean run at one earlier position (`recovery[layer, pos]`, 1 - KL(clean || patched) / KL(clean ||
    corrupted), a ratio of means over the batch): where, and before which layer, the information the prediction
    needs sits. For an induction circuit on a `patching_pair` the positions that followed earlier visits to the
    final state light up before the induction layer, and only the final position after it. NaN everywhere when
    the corruption does not change the prediction (`baseline_kl` below 1e-9 nats: nothing to restore)."""

    recovery: Float[Tensor, "layer pos"]
    baseline_kl: float
    position: int

    def summary(self) -> str:
        n_layers, seq = self.recovery.shape
        if bool(self.recovery.isnan().all()):
            return (f"patching by position: nothing to restore (the corruption moves the prediction at position "
                    f"{self.position} by {self.baseline_kl:.2e} nats)")
        best = ", ".join(f"before L{layer}: position {int(row.nan_to_num(-math.inf).argmax())} "
                         f"{float(row.nan_to_num(-math.inf).max()):.2f}" for layer, row in enumerate(self.recovery))
        return (f"patching by position ({n_layers} layers x {seq} positions, prediction at {self.position}, KL to "
                f"restore {self.baseline_kl:.4f} nats): best recovery {best}")

    def to_dataframe(self) -> Any:
        """One row per patched layer input (index "L0.resid") and one column per position: the recovery.

        Returns:
            A pandas DataFrame.
        """
        return dataframe(({"input": f"L{layer}.resid", **{str(pos): float(v) for pos, v in enumerate(row)}}
                          for layer, row in enumerate(self.recovery)), index="input")

    def to_dict(self) -> dict[str, Any]:
        return json_safe({"recovery": self.recovery, "baseline_kl": self.baseline_kl, "position": self.position})


@torch.no_grad()
def patching_by_position(
    model: HookedModel, clean_tokens: TokensOrBatch, corrupted_tokens: TokensOrBatch, *, position: int = -1
) -> PositionPatching:
    """Activation patching by layer x position: the residual stream before each layer (`L{layer}.resid`) taken
    from the clean run at one position at a time, the rest corrupted (see `PositionPatching`). All positions of a
    layer run in one pass, stacked along the batch.

    Args:
        model: a hooked model.
        clean_tokens, corrupted_tokens: a `patching_pair` (same shape, not identical).
        position: where the prediction is read (default the last).

    Returns:
        A `PositionPatching` with a [layer, pos] grid.

    >>> clean, corrupted = patching_pair(tokens)
    >>> patching_by_position(model, clean, corrupted).recovery.shape  # [layer, position]
    torch.Size([2, 32])
    """
    clean_tokens, corrupted_tokens = as_tokens(clean_tokens), as_tokens(corrupted_tokens)
    check_pair(clean_tokens, corrupted_tokens)
    comps = [Component(kind="resid", layer=layer) for layer in range(int(model.cfg.n_layers))]
    names = [c.hook_name for c in comps]
    logits, clean_cache = model.run_with_cache(check_tokens(model, clean_tokens), names_filter=names)
    corrupted_logits, corrupted_cache = model.run_with_cache(check_tokens(model, corrupted_tokens), names_filter=names)
    clean = torch.softmax(logits.double(), dim=-1)[:, position]
    baseline = float(theory.kl_divergence(clean, torch.softmax(corrupted_logits.double(), -1)[:, position]).mean())
    batch, seq = corrupted_tokens.shape
    grid = torch.full((len(comps), seq), float("nan"))
    if baseline <= _MIN_BASELINE_KL:  # the context does not matter: nothing to restore
        return PositionPatching(recovery=grid, baseline_kl=baseline, position=position)
    chunk = max(1, _PATTERN_ENTRIES // (batch * seq * seq * int(model.cfg.n_heads)))  # positions per pass
    for comp, name in zip(comps, names):
        for start in range(0, seq, chunk):
            idx = torch.arange(start, min(seq, start + chunk))
            stacked = corrupted_cache[name].repeat(len(idx), 1, 1).unflatten(0, (len(idx), batch))
            stacked[torch.arange(len(idx)), :, idx] = clean_cache[name][:, idx].transpose(0, 1)  # copy i: position i
            patched = intervened_probs(model, corrupted_tokens.repeat(len(idx), 1), [[comp]],
                                       {name: stacked.flatten(0, 1)})[0][:, position]
            kl = theory.kl_divergence(clean.repeat(len(idx), 1), patched).unflatten(0, (len(idx), batch)).mean(1)
            grid[comp.layer, idx] = (1.0 - kl / baseline).float().cpu()  # the grid lives on the CPU
    return PositionPatching(recovery=grid, baseline_kl=baseline, position=position)


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False, repr=False)
class CompositionScores(ProbeResult):
    """Q-, K- or V-composition scores (`mode`) from every head to every later head: `scores[src_layer, src_head,
    dst_layer, dst_head]` (0 for pairs that are not src-before-dst); indexing the result indexes `scores`.
    `chance` = 1/sqrt(d_model), about what random matrices score."""

    mode: str
    scores: Float[Tensor, "src_layer src_head dst_layer dst_head"]
    chance: float

    def __getitem__(self, index: Any) -> Tensor:
        return self.scores[index]

    @property
    def shape(self) -> torch.Size:
        return self.scores.shape

    def pairs(self) -> dict[str, float]:
        """{"L0H0->L1H0": score} for every head before a later head, strongest first."""
        n_layers, n_heads = self.scores.shape[:2]
        found = {f"L{a}H{h}->L{b}H{g}": float(self.scores[a, h, b, g]) for a in range(n_layers)
                 for h in range(n_heads) for b in range(a + 1, n_layers) for g in range(n_heads)}
        return dict(sorted(found.items(), key=lambda kv: -kv[1]))

    def summary(self) -> str:
        top = list(self.pairs().items())[:3]
        pairs = ", ".join(f"{k} {v:.2f}" for k, v in top) or "no head before a later head"
        return f"{self.mode}-composition (chance ~{self.chance:.2f}): strongest {pairs}"

    def to_dataframe(self) -> Any:
        """One row per (earlier head, later head) pair (index "L0H0->L1H0"): the score, strongest first.

        Returns:
            A pandas DataFrame.
        """
        return dataframe(({"pair": k, "score": v} for k, v in self.pairs().items()), index="pair")

    def to_dict(self) -> dict[str, Any]:
        return json_safe({"mode": self.mode, "chance": self.chance, "scores": self.scores, "pairs": self.pairs()})


def composition_scores(model: HookedModel, mode: str) -> CompositionScores:
    """Q-, K- or V-composition score from every head (src) to every later head (dst) (Elhage et al. 2021).

    ||W_OV^src W_QK^dst|| / (||W_OV^src|| ||W_QK^dst||) with Frobenius norms (for "K" the key side of the
    destination, for "V" its OV circuit); 0 for pairs that are not src-before-dst. Random matrices score
    about 1/sqrt(d_model); a previous-token head feeding an induction head scores high on "K". Pairs involving
    a head with all-zero weights (0/0) score 0.

    Returns:
        `CompositionScores` (index it as the [src_layer, src_head, dst_layer, dst_head] tensor).
    """
    if mode not in ("Q", "K", "V"):
        raise ValueError(f"composition mode must be 'Q', 'K' or 'V', got {mode!r}")
    scores = model.all_composition_scores(mode)
    values = torch.nan_to_num(torch.as_tensor(getattr(scores, "scores", scores)).detach().float().cpu(), nan=0.0)
    return CompositionScores(mode=mode, scores=values, chance=1 / math.sqrt(int(model.cfg.d_model)))


def head_composition(model: HookedModel, src: tuple[int, int], dst: tuple[int, int]) -> dict[str, float]:
    """{"Q", "K", "V"} composition scores from head src = (layer, head) to a later head dst."""
    if src[0] >= dst[0]:
        raise ValueError(
            f"composition needs the source head in an earlier layer than the destination, got {src} -> {dst}"
        )
    return {mode: float(composition_scores(model, mode)[src[0], src[1], dst[0], dst[1]]) for mode in "QKV"}
