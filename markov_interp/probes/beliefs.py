"""Belief probes: does a model trained on a hidden Markov source hold the Bayesian belief over the hidden states
linearly in its residual stream, and does it use it?

Shai et al. 2024 ("Transformers represent belief state geometry in their residual stream") regress the belief
states of the forward filter (`sources.HiddenSource.belief_states`: P(hidden state after x_t | x_0..x_t)) on the
residual stream and find them linearly, fractal simplex included: for Mess3 in the final layer, for RRXOR only
across the layers together. Here, on the package's representation probes (`probes.linear.fit_probe`: ridge on
standardised features, held-out sequences, bootstrap intervals over sequences, a control):

- `belief_target(source, tokens)`: the beliefs as a real-valued `Target`, one output per hidden state.
- `probe_beliefs(activations, target)`: the engine on any activations: one probe per site and one on every site
  concatenated ("all layers"), all on one split, scored by held-out R^2 (pooled over the hidden states) against
  the shuffled control (the same probe fitted and scored on beliefs permuted over positions), as a `ProbeTable`.
- `belief_probes(model, tokens, source)`: the residual stream entering the first block (the embeddings) and after
  every block, read from one forward pass, then `probe_beliefs`.
- `simplex_projection(beliefs)`: 2-D coordinates for the belief-simplex picture: barycentric (exact) for 2 or 3
  hidden states; for more, the first two principal axes of the true beliefs (`method` says which, `explained` how
  much of their variance the plane holds), applied alike to the probe's predictions.
- `belief_patch(model, tokens, source, fit)`: the causal test. At the probe's site the residual stream's
  component in the probe's subspace (`probe_subspace`: by default the span of its activation pattern Cov(x) W,
  where the activations move with the belief it reads) is replaced by that of a counterfactual sequence (another sequence of the batch, at the same positions), through the package's one
  activation writer, and the next-token law's move is compared with the move of the Bayes prediction from the
  sequence's to the counterfactual's: effect = sum <p_patched - p, q_cf - q> / sum |q_cf - q|^2 over positions
  and sequences (1: the law moves exactly as the Bayes prediction does; 0: not at all), with a bootstrap interval
  over sequences, beside the same patch of a random subspace of the same dimension (the control).
"""

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, Optional

import torch
from jaxtyping import Float
from torch import Tensor

from markov_interp.config import check_choice, check_int
from markov_interp.models import HookedModel
from markov_interp.models.hooks import write
from markov_interp.probes._common import TokensOrBatch, check_tokens
from markov_interp.probes._display import ProbeResult
from markov_interp.probes.ablation import derangement
from markov_interp.probes.interventions import intervened_run
from markov_interp.probes.linear import ProbeFit, _ci, _paired, _resamples, fit_probe
from markov_interp.probes.representation import ProbeSite, ProbeTable, probe_site, site_activations
from markov_interp.probes.targets import Target
from markov_interp.sources import HiddenSource

__all__ = ["ALL_LAYERS", "SUBSPACES", "BeliefPatch", "SimplexProjection", "belief_patch", "belief_probes",
           "belief_target", "held_out_beliefs", "layer_sites", "probe_beliefs", "probe_subspace", "simplex_points",
           "simplex_projection"]

ALL_LAYERS = "all layers"  # the site name of the probe on every site concatenated
SUBSPACES = ("pattern", "weights")  # what `probe_subspace` spans: the probe's activation pattern or its weights
# singular values below this fraction of the largest do not span the probe's subspace: the beliefs sum to 1, so the
# probe's weight columns sum to 0 up to rounding (which an ill-conditioned fit lifts to ~1e-7 of the largest)
_RANK_TOL = 1e-4


# ------------------------------------------------------------------------------------------------ the probes
def belief_target(source: HiddenSource, tokens: TokensOrBatch) -> Target:
    """The belief after each token, P(hidden state after x_t | x_0..x_t) from the stationary start, as a real target
    with one output per hidden state ("s0", "s1", ...).

    Args:
        source: the hidden Markov source the tokens come from.
        tokens: [batch, pos] tokens or a `ProbeBatch` of that source.

    Returns:
        A `Target` named "belief".

    >>> from markov_interp.sources import hmm_preset
    >>> belief_target(hmm_preset("z1r"), torch.tensor([[0, 0, 1]])).outputs
    ('s0', 's1', 's2')
    """
    beliefs = source.belief_states(getattr(tokens, "tokens", tokens))
    target = Target.from_tensor(beliefs, name="belief")
    return dataclasses.replace(target, outputs=tuple(f"s{i}" for i in range(beliefs.shape[-1])))


def probe_beliefs(activations: Mapping[str, Float[Tensor, "batch pos feature"]], target: Target, *,
                  concatenate: bool = True, control: str = "shuffle", **options: Any) -> ProbeTable:
    """The belief read back from each site's activations and from all of them concatenated, on one split.

    Args:
        activations: {site name: activations [batch, pos, feature]}, in depth order.
        target: the beliefs on the same [batch, pos] (`belief_target`).
        concatenate: add the probe on every site's features side by side (site "all layers").
        control: "shuffle" (beliefs permuted over the positions of each part; the default) or "sequences".
        options: `fit_probe`'s other options (positions, penalty, test_fraction, n_bootstrap, seed).

    Returns:
        A `ProbeTable` of R^2 fits, one per site in order, then "all layers".
    """
    if not activations:
        raise ValueError("activations is empty: give at least one site")
    fits = [fit_probe(acts, target, site=name, control=control, **options) for name, acts in activations.items()]
    if concatenate and len(activations) > 1:
        joined = torch.cat([acts.to(torch.float64) for acts in activations.values()], dim=-1)
        fits.append(fit_probe(joined, target, site=ALL_LAYERS, control=control, **options))
    return ProbeTable(target=target.name, metric=fits[0].metric, fits=tuple(fits))


def layer_sites(model: HookedModel) -> tuple[ProbeSite, ...]:
    """The residual stream entering the first block (the embeddings) and after each block, in depth order: the
    "layers" of Shai et al.'s per-layer probes."""
    return (ProbeSite("resid_pre", 0), *(ProbeSite("resid_post", layer) for layer in range(model.cfg.n_layers)))


def belief_probes(model: HookedModel, tokens: TokensOrBatch, source: HiddenSource, *,
                  sites: Optional[Sequence[Any]] = None, cache: Optional[Any] = None, **options: Any) -> ProbeTable:
    """Belief-state probes of a model at every layer and across the layers together (module docstring).

    In Shai et al.'s terms: a score near 1 at the last layer is the belief (its simplex geometry included) written
    linearly in the final residual stream; a score that only the concatenation reaches is a belief spread over the
    layers.

    Args:
        model: a TransformerLens hooked model trained on `source`.
        tokens: [batch, pos] tokens of the source or a `ProbeBatch` (at least 4 sequences).
        source: the hidden Markov source (its `belief_states` are the target).
        sites: the sites (anything `probes.probe_site` takes), default `layer_sites(model)`.
        cache: a `run_with_cache` of the same tokens holding the sites' hooks (only read).
        options: `probe_beliefs`' options (concatenate, control, penalty, test_fraction, n_bootstrap, seed, ...).

    Returns:
        A `ProbeTable` (R^2 per site, then "all layers").

    >>> # belief_probes(model, hmm_preset("mess3").sample(256, 10), hmm_preset("mess3")).to_dataframe()
    """
    chosen = layer_sites(model) if sites is None else [probe_site(model, where) for where in sites]
    tokens = check_tokens(model, tokens)
    acts = site_activations(model, tokens, chosen, cache=cache)
    return probe_beliefs({site.name: acts[site] for site in chosen}, belief_target(source, tokens), **options)


def held_out_beliefs(fit: ProbeFit, activations: Float[Tensor, "batch pos feature"],
                     target: Target) -> tuple[Float[Tensor, "row hidden"], Float[Tensor, "row hidden"]]:
    """(true beliefs, the probe's predictions) at every position of the fit's held-out sequences where the target
    is defined: the points of the belief-simplex picture.

    Args:
        fit: a belief probe (`probe_beliefs`, `belief_probes`).
        activations: the activations it was fitted on.
        target: its target.

    Returns:
        Two float64 tensors [row, hidden] on the CPU.
    """
    test = torch.tensor(fit.test_sequences, dtype=torch.long)
    valid = target.valid[test].cpu()
    predicted = fit.predict(activations[test.to(activations.device)].detach().to(torch.float64)).cpu()
    return target.values[test].cpu()[valid], predicted[valid]


def simplex_points(model: HookedModel, tokens: TokensOrBatch, source: HiddenSource, table: ProbeTable, *,
                   sites: Sequence[str] = (), limit: int = 1500) -> dict[str, dict[str, list]]:
    """The belief-simplex picture's points: per probe of `table` (default its final layer and "all layers"), the
    held-out (true, predicted) beliefs, as lists rounded to 4 decimals (JSON-ready: what
    `report.beliefs.belief_simplex_figure` draws).

    Args:
        model: the model `table` was fitted on.
        tokens: the tokens it was fitted on.
        source: the hidden Markov source.
        table: `belief_probes(model, tokens, source)` (with "all layers" unless `sites` names others).
        sites: the probes to keep, by site name.
        limit: at most this many points per probe (the first held-out positions).

    Returns:
        {site: {"true": [[...]], "predicted": [[...]]}}.
    """
    check_int("limit", limit, minimum=1)
    layers = layer_sites(model)
    chosen = tuple(sites) or (layers[-1].name, ALL_LAYERS)
    tokens = check_tokens(model, tokens)
    acts = site_activations(model, tokens, layers)
    by_name = {site.name: acts[site].to(torch.float64) for site in layers}
    by_name[ALL_LAYERS] = torch.cat(list(by_name.values()), dim=-1)
    target, out = belief_target(source, tokens), {}
    for name in chosen:
        true, predicted = held_out_beliefs(table[name], by_name[name], target)
        out[name] = {"true": true[:limit].round(decimals=4).tolist(),
                     "predicted": predicted[:limit].round(decimals=4).tolist()}
    return out


# ------------------------------------------------------------------------------------------------ the simplex
@dataclasses.dataclass(frozen=True, kw_only=True, eq=False, repr=False)
class SimplexProjection(ProbeResult):
    """A linear map from beliefs [..., hidden] to the plane: x -> (x - origin) @ axes.

    `method` "barycentric": the simplex's corners at the corners of an equilateral triangle (3 states) or of a
    unit segment (2 states), exact; "pca": the first two principal axes of the beliefs it was fitted on (`origin`
    their mean), holding the share `explained` of their variance.
    """

    method: str
    origin: Float[Tensor, " hidden"]
    axes: Float[Tensor, "hidden 2"]
    explained: float

    def __call__(self, beliefs: Float[Tensor, "*rows hidden"]) -> Float[Tensor, "*rows 2"]:
        return (beliefs.to(torch.float64).cpu() - self.origin) @ self.axes

    def _headline(self) -> str:
        return f"{self.method} projection of {self.axes.shape[0]} hidden states ({self.explained:.0%} of the variance)"


def simplex_projection(beliefs: Float[Tensor, "row hidden"]) -> SimplexProjection:
    """The plane the belief simplex is drawn in: barycentric for 2 or 3 hidden states, else the first two
    principal axes of `beliefs` (the true beliefs; the probe's predictions are then drawn through the same map).

    Args:
        beliefs: true beliefs, one per row.

    Returns:
        A `SimplexProjection`.

    >>> centre = torch.full((3,), 1 / 3, dtype=torch.float64)
    >>> simplex_projection(torch.eye(3, dtype=torch.float64))(centre).tolist()  # the triangle's centre
    [0.5, 0.28867513459481287]
    """
    beliefs = beliefs.detach().to(torch.float64).cpu()
    if beliefs.ndim != 2 or beliefs.shape[0] < 2:
        raise ValueError(f"beliefs must be [row, hidden] with at least 2 rows, got shape {tuple(beliefs.shape)}")
    hidden = beliefs.shape[1]
    if hidden <= 3:
        corners = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.5, math.sqrt(3) / 2]], dtype=torch.float64)[:hidden]
        return SimplexProjection(method="barycentric", origin=torch.zeros(hidden, dtype=torch.float64), axes=corners,
                                 explained=1.0)
    origin = beliefs.mean(0)
    _, values, vectors = torch.linalg.svd(beliefs - origin, full_matrices=False)
    spread = (values**2).sum()
    explained = float((values[:2] ** 2).sum() / spread) if spread > 0 else 1.0
    return SimplexProjection(method="pca", origin=origin, axes=vectors[:2].T.contiguous(), explained=explained)


# -------------------------------------------------------------------------------------------- the causal test
@dataclasses.dataclass(frozen=True, kw_only=True, eq=False, repr=False)
class BeliefPatch(ProbeResult):
    """The causal test of a belief probe (`belief_patch`): how far the next-token law moves towards the
    counterfactual's Bayes prediction when the probe's subspace at `site` is taken from the counterfactual.

    `effect` = sum <p_patched - p, q_cf - q> / sum |q_cf - q|^2 over every position of every sequence (p the
    model's law, q the Bayes prediction), patching the `subspace` of `probe_subspace` ("pattern" or "weights"),
    `control` the same for a random subspace of the same `dimension`,
    `difference` = effect - control; 95% intervals over `n_sequences` sequences (bootstrap, paired for the
    difference). `bayes_move` is the mean |q_cf - q| per position (the size of the move asked for).
    """

    site: str
    subspace: str
    dimension: int
    effect: float
    effect_ci: tuple[float, float]
    control: float
    control_ci: tuple[float, float]
    difference: float
    difference_ci: tuple[float, float]
    bayes_move: float
    n_sequences: int
    seed: int

    def _headline(self) -> str:
        return (f"{self.site}: patching the belief subspace ({self.subspace}, {self.dimension} dims) moves the law "
                f"{self.effect:.3f} {_ci(self.effect_ci)} of the Bayes move, a random subspace {self.control:.3f} "
                f"{_ci(self.control_ci)}")

    def summary(self) -> str:
        """The headline, then the difference and the scale of the move."""
        return "\n".join([self._headline(), f"  difference {self.difference:+.3f} {_ci(self.difference_ci)} over "
                          f"{self.n_sequences} sequences; mean Bayes move |q_cf - q| {self.bayes_move:.3f}"])


def probe_subspace(fit: ProbeFit, activations: Optional[Float[Tensor, "batch pos feature"]] = None, *,
                   kind: str = "pattern") -> Float[Tensor, "feature dim"]:
    """An orthonormal basis of the subspace a linear probe's reading lives in, at most hidden - 1 dimensions for a
    belief probe (the beliefs sum to 1); singular values below 1e-4 of the largest are left out.

    - "pattern" (the default): the span of the probe's activation pattern Cov(x) W, the directions along which the
      activations move with what the probe reads (Haufe et al. 2014, "On the interpretation of weight vectors of
      linear models in multivariate neuroimaging"), from `activations` at the probe's site. Where the belief is
      spread over many directions this is where it is written.
    - "weights": the span of the weight columns W themselves (the decoder). Replacing an activation's component
      there replaces the probe's output, but a ridge decoder leans on low-variance directions, and a model need
      not read those: on a trained Mess3 model (4 layers, d_model 64) patching this span moved the law by 0.001 of
      the Bayes move against 0.99 for the pattern's.

    Args:
        fit: a linear probe.
        activations: the site's activations (any batch of the probe's source); needed for "pattern".
        kind: "pattern" or "weights".

    Returns:
        float64 [feature, dim], orthonormal columns.

    >>> acts = torch.randn(8, 5, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    >>> read = acts[..., :2] @ torch.tensor([[1.0, -1.0], [2.0, -2.0]], dtype=torch.float64)  # one direction, twice
    >>> probe_subspace(fit_probe(acts, Target.from_tensor(read), n_bootstrap=0), acts).shape
    torch.Size([4, 1])
    """
    check_choice("kind", kind, SUBSPACES)
    weights = fit.weights.to(torch.float64)
    if kind == "pattern":
        if activations is None:
            raise ValueError("the probe's activation pattern needs the site's activations")
        flat = activations.detach().to(torch.float64).cpu().reshape(-1, activations.shape[-1])
        if flat.shape[-1] != fit.n_features:
            raise ValueError(f"the probe reads {fit.n_features} features, the activations have {flat.shape[-1]}")
        centred = flat - flat.mean(0)
        weights = centred.T @ (centred @ weights) / max(len(flat) - 1, 1)
    left, values, _ = torch.linalg.svd(weights, full_matrices=False)
    rank = int((values > _RANK_TOL * values.max()).sum()) if values.numel() and values.max() > 0 else 0
    if rank == 0:
        raise ValueError(f"the probe at {fit.site} has zero weights: it reads no subspace")
    return left[:, :rank].contiguous()


def _patched_probs(model: HookedModel, tokens: Tensor, site: ProbeSite, clean: Tensor, counterfactual: Tensor,
                   basis: Tensor) -> Tensor:
    """The next-token laws with the component of the stream at `site` in span(`basis`) taken from `counterfactual`
    (`models.hooks.write` inside one `intervened_run`)."""
    basis = basis.to(clean.device)
    replacement = clean + ((counterfactual - clean) @ basis) @ basis.T

    def edit(activation: Tensor, hook: Any = None) -> Tensor:
        return write(activation, replacement, site.kind)

    logits, _ = intervened_run(model, tokens, (), {}, edits=[(site.hook, edit)])
    return torch.softmax(logits.to(torch.float64), dim=-1)


def _move_ratio(num: Tensor, den: Tensor, draws: Tensor) -> tuple[float, Tensor]:
    return float(num.sum() / den.sum()), (draws @ num) / (draws @ den)


@torch.no_grad()
def belief_patch(model: HookedModel, tokens: TokensOrBatch, source: HiddenSource, fit: ProbeFit, *,
                 subspace: str = "pattern", n_bootstrap: int = 1000, seed: int = 0) -> BeliefPatch:
    """The causal test of a belief probe: patch its subspace at its site from a counterfactual sequence and measure
    how far the next-token law moves towards the counterfactual's Bayes prediction (module docstring).

    In Shai et al.'s terms: a probe that finds the belief but whose subspace the model does not read gives an
    effect near the control; a model that predicts from the belief it holds there moves by about 1 (its own
    predictions' distance from Bayes aside).

    Args:
        model: the model the probe was fitted on.
        tokens: [batch, pos] tokens of `source` or a `ProbeBatch` (at least 2 sequences; fresh ones, not those the
            probe was fitted on, for a held-out test); each sequence's counterfactual is another of them (a
            derangement seeded by `seed`), at the same positions.
        source: the hidden Markov source (its `predictive` is the Bayes prediction).
        fit: a belief probe at one site of `model` (a layer of `belief_probes`, not "all layers").
        subspace: what is patched (`probe_subspace`): "pattern", the probe's activation pattern at the site
            (its covariance from these tokens' activations), or "weights", the span of its weights.
        n_bootstrap: resamples of the sequences for the intervals (0: NaN intervals).
        seed: the counterfactual pairing, the random subspace and the resamples.

    Returns:
        A `BeliefPatch`.
    """
    if fit.site == ALL_LAYERS:
        raise ValueError("the causal test patches one site; give the probe of one layer, not 'all layers'")
    check_int("n_bootstrap", n_bootstrap, minimum=0)
    check_int("seed", seed)
    site = probe_site(model, fit.site)
    tokens = check_tokens(model, tokens)
    clean = site_activations(model, tokens, [site])[site].to(torch.float64)
    if clean.shape[-1] != fit.n_features:
        raise ValueError(f"the probe reads {fit.n_features} features, {site.name} has {clean.shape[-1]}")
    partner = derangement(tokens.shape[0], seed=seed).to(tokens.device)
    basis = probe_subspace(fit, clean, kind=subspace)
    generator = torch.Generator().manual_seed(seed)
    random_basis = torch.linalg.qr(torch.randn(basis.shape, generator=generator, dtype=torch.float64))[0]
    p = torch.softmax(model(tokens).to(torch.float64), dim=-1)
    q = source.predictive(tokens).to(p.device)
    bayes_move = q[partner] - q
    den = (bayes_move**2).sum((1, 2))
    draws = _resamples(tokens.shape[0], n_bootstrap, seed, p.device)
    ratios = []
    for span in (basis, random_basis):
        moved = _patched_probs(model, tokens, site, clean, clean[partner], span) - p
        ratios.append(_move_ratio((moved * bayes_move).sum((1, 2)), den, draws))
    (effect, boot), (control, boot_control) = ratios
    names = ("effect", "effect_ci", "control", "control_ci", "difference", "difference_ci")
    return BeliefPatch(site=site.name, subspace=subspace, dimension=int(basis.shape[1]),
                       **dict(zip(names, _paired(effect, boot, control, boot_control))),
                       bayes_move=float(bayes_move.norm(dim=-1).mean()), n_sequences=int(tokens.shape[0]),
                       seed=seed)
