"""Representation probes: what an activation holds, read back by a linear probe on held-out sequences.

Path patching says where information flows; a probe says what an activation carries. A linear map is fitted from
the activation at a site (the residual stream before, between or after the blocks; a head's output `hook_z` or
its write into the residual stream `hook_result`; a head's query, key or value input) to a target at every
position (`probes.targets`: the state at lag l, counts, the add-beta row, the posterior, the position, or a tensor
of one's own), and scored on other sequences:

- **Disjoint sequences.** The sequences are split at random (`seed`) into a training part and a held-out part;
  positions of one sequence never fall on both sides. The score is the held-out accuracy (classes) or R^2 (real
  outputs, pooled: 1 - the summed squared error over the summed variance of every output).
- **A control, and selectivity** (Hewitt & Liang 2019). The same probe, fitted and scored on control labels: by
  default (`control="sequences"`) each sequence gets the target of another sequence of its own part, at the same
  positions, so the control keeps what the position alone tells and loses what belongs to the sequence; with
  `control="shuffle"` the labels are permuted over all positions of a part. Selectivity = score - control: how
  much of the score is about this sequence's content.
- **Intervals.** Positions within a sequence are correlated, so the 95% intervals resample held-out *sequences*
  (bootstrap, paired between the probe and its control). They cover the sampling of the held-out sequences, not a
  refit on other training sequences.
- **The fit.** Features are standardised on the training part. Real targets: closed-form ridge (multi-output,
  penalty `penalty` x n_rows on the standardised weights). Classes: multinomial logistic regression (`method=
  "logistic"`, the default: L-BFGS, at most `max_iter` iterations, L2 penalty `penalty` / 2 on the standardised
  weights), whose likelihood is the closest smooth stand-in for accuracy; `method="ridge"` regresses the one-hot
  labels in closed form and takes the argmax (about 10 times cheaper). Everything runs in float64 on the
  activations' device, deterministic for a seed.

`fit_probe(activations, target)` is the engine on any activations; `linear_probe(model, tokens, where, target)`
reads one site with one `run_with_cache`; `probe_layers(model, tokens, target)` probes every residual-stream site
(or the given sites) from one forward pass and returns a `ProbeTable`.
"""

import dataclasses
import inspect
import re
from collections.abc import Sequence
from typing import Any, Optional

import torch
from jaxtyping import Float
from torch import Tensor

from markov_interp.config import check_int
from markov_interp.models import HookedModel, heads_per_layer
from markov_interp.models.hooks import KINDS, PER_HEAD, act_name, parse_name
from markov_interp.probes._common import TokensOrBatch, check_tokens, has_mlp
from markov_interp.probes._display import ProbeResult, dataframe
from markov_interp.probes.interventions import Component
from markov_interp.probes.linear import ProbeFit, _ci, fit_probe
from markov_interp.probes.targets import Target, probe_target

__all__ = ["ProbeTable", "linear_probe", "probe_layers"]

RESULT = "result"  # TransformerLens's kind (hook_result) of a head's write into the residual stream: z_h W_O[h]
_KINDS = (*(k for k in KINDS if k != "pattern"), RESULT)  # what a site may read: every per-position activation
_SITE = re.compile(r"^L(\d+)(?:H(\d+))?\.(\w+)$")
_OF_COMPONENT = {"head": "z", "attn": "attn_out", "mlp": "mlp_out", "embed": "embed", "pos": "pos_embed",
                 "resid": "resid_pre", "q": "q", "k": "k", "v": "v"}


# -------------------------------------------------------------------------------------------------- sites
@dataclasses.dataclass(frozen=True)
class ProbeSite:
    """Where a probe reads: an activation kind of `models.hooks` (or "result", a head's write into the residual
    stream, z_h W_O[h], computed from `hook_z` since these models do not form TransformerLens's `hook_result`), its
    layer (None for "embed" / "pos_embed") and a head for the per-head kinds (None: all heads together).

    >>> ProbeSite("resid_post", 0).name, ProbeSite("k", 1, 0).hook
    ('L0.resid_post', 'blocks.1.attn.hook_k')
    """

    kind: str
    layer: Optional[int] = None
    head: Optional[int] = None

    @property
    def hook(self) -> str:
        """The hook whose value the probe reads (`models.hooks.act_name`)."""
        return act_name("z" if self.kind == RESULT else self.kind, self.layer)

    @property
    def name(self) -> str:
        if self.layer is None:
            return self.kind
        return f"L{self.layer}" + ("" if self.head is None else f"H{self.head}") + f".{self.kind}"

    def __str__(self) -> str:
        return self.name

    def read(self, model: HookedModel, cache: Any) -> Float[Tensor, "batch pos feature"]:
        """The site's activation from a cache holding `self.hook`, features flattened."""
        act = cache[self.hook]
        if self.kind == RESULT:
            return torch.einsum("bpd,de->bpe", act[:, :, self.head], model.W_O[self.layer, self.head].to(act))
        if self.head is not None:
            act = act[:, :, self.head]
        return act.reshape(*act.shape[:2], -1)


def _from_component(component: Component) -> ProbeSite:
    layer = None if component.kind in ("embed", "pos") else component.layer
    return ProbeSite(_OF_COMPONENT[component.kind], layer, component.head)


def _parse_site(where: Any) -> ProbeSite:
    if isinstance(where, ProbeSite):
        return where
    if isinstance(where, Component):
        return _from_component(where)
    if isinstance(where, tuple) and 1 <= len(where) <= 3 and isinstance(where[0], str):
        return ProbeSite(*where)
    if not isinstance(where, str):
        raise ValueError(f"a probe site must be a hook name, a (kind, layer[, head]) tuple, a component or its "
                         f"name, got {type(where).__name__} {where!r}")
    match = _SITE.match(where)
    if match and match.group(3) in _KINDS:
        layer, head, kind = match.groups()
        return ProbeSite(kind, int(layer), None if head is None else int(head))
    if where in ("embed", "pos_embed"):
        return ProbeSite(where)
    result = re.match(r"^blocks\.(\d+)\.attn\.hook_result$", where)
    if result:
        raise ValueError(f"{where!r} holds every head's write; name one head: ('result', {result.group(1)}, head)")
    try:
        return _from_component(Component.parse(where))
    except ValueError:
        pass
    try:
        return ProbeSite(*parse_name(where))
    except ValueError:
        raise ValueError(f"unknown probe site {where!r}: give a hook name ('blocks.0.hook_resid_post'), a (kind, "
                         f"layer[, head]) tuple (('resid_post', 0), ('z', 1, 0), ('result', 1, 0)), a site name "
                         f"('L0.resid_post', 'L1H0.k') or a component name ('L0H1', 'L1H0.q', 'L1.resid', 'embed')") \
            from None


def probe_site(model: HookedModel, where: Any) -> ProbeSite:
    """The site `where` names, checked against the model.

    Args:
        model: a TransformerLens hooked model.
        where: a hook name ("blocks.0.hook_resid_post", "blocks.1.attn.hook_z": all heads), a (kind, layer[, head])
            tuple as TransformerLens's cache takes it (("resid_post", 0), ("z", 1, 0): one head's output before W_O,
            ("result", 1, 0): its write into the residual stream, ("k", 1, 0): its key input), a site name
            ("L0.resid_post", "L1H0.k"), a `Component` or its name ("L0H1": hook_z of that head, "L1H0.q",
            "L1.resid": the stream block 1 reads, "embed", "pos"), or a `ProbeSite`.

    Returns:
        The `ProbeSite`; ValueError for a site the model does not have.
    """
    site = _parse_site(where)
    if site.kind not in _KINDS:
        raise ValueError(f"unknown activation kind {site.kind!r} for a probe (the pattern has no per-position "
                         f"features); the kinds are {list(_KINDS)}")
    per_head = site.kind in PER_HEAD or site.kind == RESULT
    if site.layer is not None:
        check_int("the probe site's layer", site.layer, minimum=0)
        if site.layer >= model.cfg.n_layers:
            raise ValueError(f"{site.name}: the model has only {model.cfg.n_layers} layers")
    if site.head is not None:
        check_int("the probe site's head", site.head, minimum=0)
        if not per_head:
            raise ValueError(f"{site.name}: a {site.kind!r} activation has no head axis; give no head")
        if site.head >= heads_per_layer(model)[site.layer]:
            raise ValueError(f"{site.name}: layer {site.layer} has only {heads_per_layer(model)[site.layer]} heads")
    elif site.kind == RESULT:
        raise ValueError("a 'result' site is one head's write: give ('result', layer, head)")
    if site.hook not in model.hook_dict:
        raise ValueError(f"{site.name}: the model has no hook {site.hook!r} (an attention-only model has no MLP "
                         f"hooks; a rotary model no pos_embed)")
    return site


def residual_sites(model: HookedModel) -> tuple[ProbeSite, ...]:
    """Every place on the residual stream, in forward order: what block 0 reads (`resid_pre` 0: the embeddings),
    then after each block's attention (`resid_mid`, where the block has an MLP) and after each block."""
    sites = [ProbeSite("resid_pre", 0)]
    for layer in range(model.cfg.n_layers):
        if has_mlp(model, layer):
            sites.append(ProbeSite("resid_mid", layer))
        sites.append(ProbeSite("resid_post", layer))
    return tuple(sites)


# ----------------------------------------------------------------------------------------------- results
@dataclasses.dataclass(frozen=True, kw_only=True, eq=False, repr=False)
class ProbeTable(ProbeResult):
    """One target probed at several sites on the same split (`probe_layers`): a `ProbeFit` per site, in order.

    `table["L0.resid_post"]` is a site's fit; `to_dataframe()` one row per site (score, control, selectivity and
    their intervals, chance, features).
    """

    target: str
    metric: str
    fits: tuple[ProbeFit, ...]

    @property
    def sites(self) -> tuple[str, ...]:
        return tuple(fit.site for fit in self.fits)

    def __getitem__(self, site: str) -> ProbeFit:
        """The fit at `site` (its name, as in `sites`)."""
        if site not in self.sites:
            raise KeyError(f"no site {site!r}; have {list(self.sites)}")
        return self.fits[self.sites.index(site)]

    def __len__(self) -> int:
        return len(self.fits)

    @property
    def best(self) -> ProbeFit:
        """The fit of largest selectivity."""
        return max(self.fits, key=lambda fit: fit.selectivity)

    def _headline(self) -> str:
        best = self.best
        return (f"{self.target} at {len(self)} sites: {self.metric} from {min(f.score for f in self.fits):.3f} to "
                f"{max(f.score for f in self.fits):.3f}; most selective {best.site} ({best.score:.3f}, control "
                f"{best.control:.3f})")

    def summary(self) -> str:
        """The headline, then one line per site."""
        lines = [self._headline()]
        for fit in self.fits:
            lines.append(f"  {fit.site}: {fit.score:.3f} {_ci(fit.score_ci)}, control {fit.control:.3f}, "
                         f"selectivity {fit.selectivity:+.3f} {_ci(fit.selectivity_ci)}")
        return "\n".join(lines)

    def to_dataframe(self) -> Any:
        """One row per site (index: the site's name)."""
        return dataframe((fit.row() for fit in self.fits), index="site")


# ------------------------------------------------------------------------------------------ model-facing
def _target_on(model: HookedModel, tokens: Any, target: Any) -> Target:
    """`target` as a `Target` on `tokens`: a name of `probes.targets.TARGETS` with its default options (the
    model's vocabulary), a tensor of one's own (`Target.from_tensor`), or a `Target`."""
    if isinstance(target, str):
        return probe_target(target, tokens, vocab=int(model.cfg.d_vocab))
    if isinstance(target, Tensor):
        return Target.from_tensor(target)
    if not isinstance(target, Target):
        raise ValueError(f"target must be a Target (probes.probe_target(...)), a target's name or a tensor "
                         f"[batch, pos, ...], got {type(target).__name__}")
    return target


@torch.no_grad()
def site_activations(model: HookedModel, tokens: TokensOrBatch, sites: Sequence[ProbeSite], *,
                     cache: Optional[Any] = None) -> dict[ProbeSite, Tensor]:
    """The activation [batch, pos, feature] at every site, from `cache` where it holds the hooks, else from one
    `run_with_cache` over exactly the hooks the sites read.

    Args:
        model: a TransformerLens hooked model.
        tokens: the states [batch, pos] or a `ProbeBatch`.
        sites: checked sites (`probe_site`).
        cache: a `run_with_cache` of the same tokens (only read).

    Returns:
        {site: activation}.
    """
    names = list(dict.fromkeys(site.hook for site in sites))
    if cache is None or any(name not in cache for name in names):
        _, cache = model.run_with_cache(check_tokens(model, tokens), names_filter=names)
    return {site: site.read(model, cache) for site in sites}


def probe_layers(model: HookedModel, tokens: TokensOrBatch, target: Any, *, sites: Optional[Sequence[Any]] = None,
                 cache: Optional[Any] = None, **options: Any) -> ProbeTable:
    """One target probed at several sites (default: every place on the residual stream, `residual_sites`), all on
    the same split of the sequences and from one forward pass: where along the depth a quantity becomes linearly
    readable.

    In the paper's terms: the lag-1 state that a previous-token head writes is readable after its layer and not
    before (from the embeddings only as much as the current state and the position predict it); a model that counts
    in context holds the counts after its counting layer.

    Args:
        model: a TransformerLens hooked model.
        tokens: the states [batch, pos] or a `ProbeBatch` (at least 4 sequences).
        target: a `Target` on these tokens (`probe_target`), a target's name (default options) or a tensor.
        sites: the sites (anything `probe_site` takes), default `residual_sites(model)`.
        cache: a `run_with_cache` of the same tokens holding the sites' hooks (only read).
        options: `fit_probe`'s options (positions, method, control, penalty, test_fraction, n_bootstrap, max_iter,
            seed).

    Returns:
        A `ProbeTable`, one `ProbeFit` per site in order.

    >>> table = probe_layers(model, batch, probe_target("state", batch, lag=1), n_bootstrap=20)
    >>> table.sites, [round(fit.score, 2) for fit in table.fits]  # the previous state: written by layer 0
    (('L0.resid_pre', 'L0.resid_post', 'L1.resid_post'), [0.37, 1.0, 1.0])
    """
    try:
        inspect.signature(fit_probe).bind(None, None, **options)
    except TypeError as err:
        raise TypeError(f"probe_layers: {err} (the options are fit_probe's)") from None
    chosen = residual_sites(model) if sites is None else [probe_site(model, where) for where in sites]
    if not chosen:
        raise ValueError("sites is empty: give at least one site")
    tokens_only = check_tokens(model, tokens)
    goal = _target_on(model, tokens, target)
    acts = site_activations(model, tokens_only, chosen, cache=cache)
    fits = tuple(fit_probe(acts[site], goal, site=site.name, **options) for site in chosen)
    return ProbeTable(target=goal.name, metric=fits[0].metric, fits=fits)


def linear_probe(model: HookedModel, tokens: TokensOrBatch, where: Any, target: Any, *,
                 cache: Optional[Any] = None, **options: Any) -> ProbeFit:
    """A linear probe of `target` at one site, fitted on some sequences and scored on the others, with a control,
    the selectivity and bootstrap intervals (module docstring).

    Args:
        model: a TransformerLens hooked model.
        tokens: the states [batch, pos] or a `ProbeBatch` (at least 4 sequences).
        where: the site (`probe_site`: a hook name, ("resid_post", 0), ("z", 1, 0), ("result", 1, 0), "L1H0.k", ...).
        target: a `Target` on these tokens (`probe_target`), a target's name (default options) or a tensor.
        cache: a `run_with_cache` of the same tokens holding the site's hook (only read).
        options: `fit_probe`'s options (positions, method, control, penalty, test_fraction, n_bootstrap, max_iter,
            seed).

    Returns:
        A `ProbeFit`.

    >>> linear_probe(model, batch, ("resid_post", 0), probe_target("state", batch, lag=1), n_bootstrap=20).score
    1.0
    """
    return probe_layers(model, tokens, target, sites=[where], cache=cache, **options).fits[0]
