"""Circuits read off the weights: per-head OV and QK circuits over the states, direct logit attribution.

With V states the full circuits of a head (Elhage et al. 2021) are V x V matrices, the most legible objects these
models have:

- **OV circuit** W_E W_V W_O W_U [attended state, next state]: the logits a head adds when it attends to a key
  holding that state (an induction head copies: a large diagonal; a previous-token head writes into the
  residual stream for a later head to read, so its own OV circuit may look like nothing);
- **QK circuit** W_E W_Q W_K^T W_E^T / sqrt(d_head) [query state, key state]: how much a query holding one state
  prefers keys holding another, from the token embeddings alone (positions and LayerNorm left out, as in
  TransformerLens's `model.OV` / `model.QK`).

**Direct logit attribution** (`direct_logit_attribution`): the residual stream the unembedding reads is the sum of
what every component wrote (token and position embeddings, each head, each MLP, the biases); with the final
LayerNorm's centring and scale frozen at their values in the run, each component's share of the logits is exact
and the shares add up to the logits. The attribution of a component is its share of the logit of the state that
came next minus its mean share over all states, averaged over every prediction: how much it pushes the model
towards what happened.
"""

import dataclasses
import math
from typing import Any, Optional

import torch
from jaxtyping import Float
from torch import Tensor

from markov_interp.models import HookedModel, heads_per_layer
from markov_interp.models.hooks import act_name
from markov_interp.probes._display import ProbeResult, dataframe
from markov_interp.probes._common import (
    TokensOrBatch,
    as_tokens,
    check_tokens,
    has_mlp,
    json_safe,
    mlp_out_hook,
    z_hook,
)

__all__ = ["LogitAttribution", "WeightCircuits", "direct_logit_attribution", "ov_circuits", "qk_circuits"]

Circuits = Float[Tensor, "layer head vocab vocab"]
_AXES = {"OV": ("attended state", "next state"), "QK": ("query state", "key state")}


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False, repr=False)
class WeightCircuits(ProbeResult):
    """Every head's OV or QK circuit (module docstring) as a V x V matrix: `values[layer, head]` (NaN for heads a
    layer does not have); indexing the result indexes `values` (`ov[1, 0]` is head L1H0's matrix).

    `kind` "OV": rows the attended state, columns the next state (the logits the head adds: a large diagonal
    copies); "QK": rows the query state, columns the key state (the attention bias from the states alone). The
    `diagonal` of a head is the mean of its diagonal minus the mean of its off-diagonal entries: how much it
    favours the same state (copying for OV, attending to keys holding the query's state for QK).
    """

    kind: str
    values: Circuits

    def __getitem__(self, index: Any) -> Tensor:
        return self.values[index]

    @property
    def shape(self) -> torch.Size:
        return torch.Size(self.values.shape)

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        return self.values.numpy() if dtype is None else self.values.numpy().astype(dtype)

    def heads(self) -> dict[str, Tensor]:
        """{head name ("L1H0"): its V x V matrix} for the heads the model has."""
        return {f"L{layer}H{head}": self.values[layer, head] for layer in range(self.values.shape[0])
                for head in range(self.values.shape[1]) if not torch.isnan(self.values[layer, head]).any()}

    def diagonal(self) -> dict[str, float]:
        """{head: mean diagonal minus mean off-diagonal entry} (class docstring)."""
        out = {}
        for name, m in self.heads().items():
            v = m.shape[0]
            off = (m.sum() - m.diagonal().sum()) / (v * v - v) if v > 1 else torch.tensor(0.0)
            out[name] = float(m.diagonal().mean() - off)
        return out

    def summary(self) -> str:
        rows, cols = _AXES[self.kind]
        diag = self.diagonal()
        top = sorted(diag.items(), key=lambda kv: -abs(kv[1]))[:3]
        biggest = max(((n, float(m.abs().max())) for n, m in self.heads().items()), key=lambda kv: kv[1],
                      default=("none", 0.0))
        return (f"{self.kind} circuits of {len(diag)} heads over {self.values.shape[-1]} states ({rows} x {cols}): "
                f"largest |entry| {biggest[1]:.2f} ({biggest[0]}); diagonal minus off-diagonal "
                + ", ".join(f"{n} {d:+.2f}" for n, d in top))

    def to_dataframe(self) -> Any:
        """One row per head (index its name): the diagonal score, the largest |entry|, the matrix's entries.

        Returns:
            A pandas DataFrame.
        """
        diag = self.diagonal()
        return dataframe(({"head": n, "diagonal": diag[n], "max_abs": float(m.abs().max()),
                           "matrix": m.tolist()} for n, m in self.heads().items()), index="head")

    def to_dict(self) -> dict[str, Any]:
        rows, cols = _AXES[self.kind]
        return json_safe({"kind": self.kind, "rows": rows, "columns": cols, "values": self.values,
                          "diagonal": self.diagonal()})


def _absent(model: HookedModel, grid: Tensor) -> Tensor:
    """`grid` [layer, head, ...] with the heads a layer does not have set to NaN."""
    for layer, n in enumerate(heads_per_layer(model)):
        grid[layer, n:] = math.nan
    return grid


@torch.no_grad()
def ov_circuits(model: HookedModel) -> WeightCircuits:
    """W_E W_V W_O W_U per head, [layer, head, attended state, next state] (NaN for absent heads): a
    `WeightCircuits` of kind "OV" (index it as the tensor).

    >>> ov_circuits(model)[1, 0].diagonal()  # large for an induction head that copies the attended state
    tensor([2., 2., 2.])
    """
    w_e, w_u = model.W_E.detach().float(), model.W_U.detach().float()
    ov = torch.einsum("vd,lhde,lhef,fw->lhvw", w_e, model.W_V.detach().float(), model.W_O.detach().float(), w_u)
    return WeightCircuits(kind="OV", values=_absent(model, ov.cpu()))


@torch.no_grad()
def qk_circuits(model: HookedModel) -> WeightCircuits:
    """W_E W_Q W_K^T W_E^T / sqrt(d_head) per head, [layer, head, query state, key state] (NaN for absent heads):
    a `WeightCircuits` of kind "QK" (index it as the tensor).

    >>> qk_circuits(model)[1, 0].abs().max().item()  # this induction head finds its keys through layer 0, not states
    0.0
    """
    w_e = model.W_E.detach().float()
    q = torch.einsum("vd,lhde->lhve", w_e, model.W_Q.detach().float())
    k = torch.einsum("vd,lhde->lhve", w_e, model.W_K.detach().float())
    qk = torch.einsum("lhve,lhwe->lhvw", q, k) / math.sqrt(int(model.cfg.d_head))
    return WeightCircuits(kind="QK", values=_absent(model, qk.cpu()))


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False, repr=False)
class LogitAttribution(ProbeResult):
    """Direct logit attribution (module docstring), in logits (nats of log-odds) averaged over predictions.

    `heads[layer, head]` (NaN for heads a layer does not have), `mlps[layer]` (None for a model without MLPs),
    `embed` (token embedding), `rest` (positions and biases); `total` = their sum = the mean logit of the next
    state minus the mean logit.
    """

    heads: Float[Tensor, "layer head"]
    mlps: Optional[Float[Tensor, " layer"]]
    embed: float
    rest: float
    total: float

    def components(self) -> dict[str, float]:
        """{component: attribution} for the parts the model has: "embed", each head ("L0H1"), each MLP ("L0.mlp"),
        "rest"; they add up to `total`."""
        out = {"embed": self.embed}
        for layer in range(self.heads.shape[0]):
            for head in range(self.heads.shape[1]):
                if not math.isnan(float(self.heads[layer, head])):
                    out[f"L{layer}H{head}"] = float(self.heads[layer, head])
            if self.mlps is not None:
                out[f"L{layer}.mlp"] = float(self.mlps[layer])
        out["rest"] = self.rest
        return out

    def summary(self) -> str:
        parts = sorted(((k, v) for k, v in self.components().items() if k != "rest"), key=lambda kv: -abs(kv[1]))
        top = ", ".join(f"{k} {v:+.3f}" for k, v in parts[:4])
        return f"direct logit attribution, total {self.total:+.3f}: {top}; rest {self.rest:+.3f}"

    def to_dataframe(self) -> Any:
        """One row per component the model has (index its name): its attribution in logits.

        Returns:
            A pandas DataFrame.
        """
        return dataframe(({"component": k, "attribution": v} for k, v in self.components().items()),
                         index="component")

    def to_dict(self) -> dict[str, Any]:
        return json_safe({"heads": self.heads, "mlps": self.mlps, "embed": self.embed, "rest": self.rest,
                          "total": self.total, "components": self.components()})


def _unembed_share(model: HookedModel, values: Tensor, scale: Tensor, targets: Tensor) -> Tensor:
    """Each prediction's share of (logit of the next state - mean logit) from residual contributions `values`
    [..., batch, pos, d_model], through the final LayerNorm frozen at `scale` (centring and weight kept)."""
    if getattr(model.cfg, "normalization_type", None) in ("LN", "LNPre"):
        values = values - values.mean(-1, keepdim=True)
    values = values / scale
    weight = getattr(getattr(model, "ln_final", None), "w", None)
    if weight is not None and getattr(model.cfg, "normalization_type", None) == "LN":
        values = values * weight.detach()
    w_u = model.W_U.detach()
    logits = values @ w_u  # [..., batch, pos, vocab]
    centred = logits - logits.mean(-1, keepdim=True)
    return torch.gather(centred[..., :-1, :], -1, targets.expand(*centred.shape[:-2], -1, -1)).squeeze(-1)


@torch.no_grad()
def direct_logit_attribution(model: HookedModel, tokens: TokensOrBatch) -> LogitAttribution:
    """How much each head, MLP and the embedding push the logits towards the next state (module docstring).

    Args:
        model: a hooked model.
        tokens: the sequences ([batch, pos] states, or a `ProbeBatch`).

    Returns:
        A `LogitAttribution`; its parts add up to `total`, the mean centred logit of the next state.

    >>> heads = direct_logit_attribution(model, batch).heads  # large for the head that writes the prediction
    >>> bool(heads[1, 0] > 0.2 and heads[0, 0].abs() < 1e-6)  # the induction head; layer 0 writes only to it
    True
    """
    tokens = check_tokens(model, as_tokens(tokens))
    n_layers = int(model.cfg.n_layers)
    names = [act_name("embed"), "ln_final.hook_scale"] + [z_hook(layer) for layer in range(n_layers)]
    names += [mlp_out_hook(layer) for layer in range(n_layers) if has_mlp(model, layer)]
    logits, cache = model.run_with_cache(tokens, names_filter=names)
    scale = cache["ln_final.hook_scale"] if "ln_final.hook_scale" in cache else torch.ones(1, device=tokens.device)
    targets = tokens[:, 1:, None]
    share = lambda values: float(_unembed_share(model, values.float(), scale, targets).mean())  # noqa: E731
    heads = torch.full((n_layers, int(model.cfg.n_heads)), math.nan)
    for layer, n in enumerate(heads_per_layer(model)):
        out = torch.einsum("bphd,hde->hbpe", cache[z_hook(layer)][:, :, :n], model.W_O[layer, :n].detach())
        heads[layer, :n] = _unembed_share(model, out, scale, targets).mean((-1, -2)).cpu()
    mlps = torch.tensor([share(cache[mlp_out_hook(layer)]) if has_mlp(model, layer) else 0.0
                         for layer in range(n_layers)]) if any(has_mlp(model, i) for i in range(n_layers)) else None
    centred = logits - logits.mean(-1, keepdim=True)
    total = float(torch.gather(centred[:, :-1], -1, targets).mean())
    embed = share(cache[act_name("embed")])
    rest = total - embed - float(heads.nansum()) - (float(mlps.sum()) if mlps is not None else 0.0)
    return LogitAttribution(heads=heads, mlps=mlps, embed=embed, rest=rest, total=total)

