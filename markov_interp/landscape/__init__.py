"""The theory, computed: the loss landscape of the canonical single-layer model on a binary (p, q) chain.

Makkuva et al. ("Attention with Markov", arXiv 2402.04161) show that a single-layer transformer with weight
tying has bad local minima on binary chains with p + q > 1; the follow-up ("Local to Global", arXiv 2406.03072)
reduces the model, under a low-rank "canonical" initialisation, to three scalars (e, w, b):

    f1 = (1/2 + 2 w|w|) e^2 + b     the logit of "next state is 1" after state 1,
    f0 = b - e^2 / 2                the same logit after state 0,
    L  = -pi1 [q log s(-f1) + (1-q) log s(f1)] - pi0 [p log s(f0) + (1-p) log s(-f0)],

with s the logistic function and pi = (q, p) / (p + q) the stationary law. e is the embedding scale (tied to
the output layer), w the signed MLP scale, b the output bias. Write delta(w) = 1 + 2 w|w| (so that
f1 - f0 = delta(w) e^2), c = log((1-p)(1-q) / (p q)) (the log-odds ratio of the kernel) and
kappa = p q (p + q - 1) / (p + q)^2.

What this package computes, and what it found (all derived in its modules and checked in
tests/landscape/test_landscape.py):

- Global minima: delta(w) e^2 = c with b = logit(p) + e^2 / 2; the loss there is the entropy rate. For
  p + q < 1 (c > 0) they need w > -1/sqrt(2); for p + q > 1 (c < 0) they need w < -1/sqrt(2).
- The unigram line e = 0, b = b* = log(pi1 / pi0) = log(p / q): every point is critical, with loss H(pi). The
  Hessian there is diag(2 kappa delta(w), 0, pi0 pi1): the e-curvature is 2 kappa delta(w) (second order, it
  does not vanish except at w = -1/sqrt(2) or p + q = 1), w is exactly flat (the loss does not depend on w at
  e = 0) and b is a minimum direction. Hence, in the (e, w) plane with b at its optimum (the "b-profiled"
  loss), a point is a (non-strict) local minimum where kappa delta(w) > 0 and a local maximum where
  kappa delta(w) < 0: p + q > 1: minimum for w > -1/sqrt(2), maximum below; p + q < 1: the reverse. In the
  full (e, w, b) space the "maxima" are saddles (b curves up). At w = -1/sqrt(2), delta = 0: f1 = f0 for
  every e, the model is context-free along the whole line e = anything, and the point is a saddle of the
  (e, w) landscape (to leading order L - H(pi) = kappa delta(w) e^2, which changes sign across the line).
- p + q = 1: the chain is i.i.d. (both rows equal), c = kappa = 0, unigram loss = entropy rate, and every
  point of the unigram line is a global minimum (classified "local_min"); every outcome is "bigram".
- Gradient flow with b held at its optimum conserves E = e^2 - w^2 - sign(w) log|w| (and w never changes
  sign). With b trained too, dE/dt = 2 e^2 dL/db, so E drifts while b relaxes; `predict_outcome` uses E
  exactly where it applies (b profiled, `b0=None`) and integrates the full flow otherwise.
- Untied model (separate output scalar a, see `untied_loss`): f1 - f0 = delta(w) a e. Its only unigram critical
  points are e = a = 0 (any w), all saddles for p + q != 1 (Hessian block [[0, kd], [kd, 0]] with
  kd = kappa delta(w), eigenvalues +-kd, and a cubic saddle at w = -1/sqrt(2)); gradient flow conserves
  e^2 - a^2, so from any init with |a0| != |e0| it can never reach them: no bad local minimum. But a = e
  (and a = -e) is invariant: from a0 = e0 (what an untied head copied from W_E starts at) the flow is the tied
  one with e at half speed, conserves 2e^2 - w^2 - sign(w) log|w|, and gets stuck like the tied model.
- In this reduced model the unigram points with p + q < 1 and w < -1/sqrt(2) are genuine (non-strict) local
  minima, reached from inits below the separatrix (see `regime_map_init`); "saddles for p + q < 1" is a
  statement about the full model, not about this reduction.

All numerics are float64. `canonical_loss` accepts floats, numpy arrays or torch tensors (autograd flows
through); the other functions work in numpy. The package has three parts: `canonical` (the loss, its exact
derivatives and critical points), `flow` (gradient flow, `predict_outcome`, regime maps) and `projection` (a
model's (e, w, b), the only part that reads model weights). Everything public is re-exported here
(`landscape.X`); nothing here draws: the figures are `report.figures.landscape_figure`,
`regime_map_pq_figure` and `regime_map_init_figure`.
"""

from markov_interp.landscape.canonical import (
    H_STAR,
    W_SADDLE,
    BigramMinima,
    Trajectory,
    UnigramPointAnalysis,
    bigram_log_odds,
    bigram_minima,
    canonical_gradient,
    canonical_hessian,
    canonical_loss,
    classify_unigram_point,
    delta,
    kernel,
    optimal_bias,
    profile_loss,
    reference_losses,
    unigram_bias,
    unigram_curvature_scale,
    unigram_e_curvature,
    unigram_point_analysis,
    untied_gradient,
    untied_hessian,
    untied_loss,
)
from markov_interp.landscape.flow import (
    RegimeMap,
    adam_descent,
    conserved_quantity,
    gradient_descent_outcomes,
    gradient_flow,
    predict_outcome,
    regime_map_init,
    regime_map_pq,
    separatrix,
)
from markov_interp.landscape.projection import (
    CanonicalProjection,
    canonical_coordinates,
    canonical_projection,
    coordinates_trajectory,
)

__all__ = [
    "W_SADDLE", "H_STAR", "kernel", "reference_losses", "bigram_log_odds", "unigram_bias",
    "unigram_curvature_scale", "delta", "canonical_loss", "canonical_gradient", "canonical_hessian",
    "untied_loss", "untied_gradient", "untied_hessian", "optimal_bias", "profile_loss", "BigramMinima",
    "bigram_minima", "unigram_e_curvature", "UnigramPointAnalysis", "unigram_point_analysis",
    "classify_unigram_point", "conserved_quantity", "separatrix", "predict_outcome", "Trajectory",
    "gradient_flow", "gradient_descent_outcomes", "adam_descent", "RegimeMap", "regime_map_pq", "regime_map_init",
    "CanonicalProjection", "canonical_projection", "canonical_coordinates", "coordinates_trajectory",
]
