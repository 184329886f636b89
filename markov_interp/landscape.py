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

What this module computes, and what it found (all derived below and checked in tests/test_landscape.py):

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
through); the other functions work in numpy. This module must not depend on TransformerLens:
`canonical_coordinates` reads TransformerLens state-dict names from plain tensors.
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from markov_interp import theory

__all__ = [
    "W_SADDLE", "H_STAR", "kernel", "reference_losses", "bigram_log_odds", "unigram_bias",
    "unigram_curvature_scale", "delta", "canonical_loss", "canonical_gradient", "canonical_hessian",
    "untied_loss", "untied_gradient", "untied_hessian", "optimal_bias", "profile_loss", "BigramMinima",
    "bigram_minima", "unigram_e_curvature", "UnigramPointAnalysis", "unigram_point_analysis",
    "classify_unigram_point", "conserved_quantity", "separatrix", "predict_outcome", "Trajectory",
    "gradient_flow", "gradient_descent_outcomes", "RegimeMap", "regime_map_pq", "regime_map_init",
    "plot_regime_map_pq", "plot_regime_map_init", "plot_landscape", "CanonicalProjection",
    "canonical_projection", "canonical_coordinates", "coordinates_trajectory",
]

W_SADDLE = -1.0 / math.sqrt(2.0)  # the unigram saddle: delta(w) = 1 + 2 w|w| = 0
# h(w) = w^2 + sign(w) log|w| at its minimum over w < 0 (w = -1/sqrt(2)): the separatrix level of E.
H_STAR = 0.5 + 0.5 * math.log(2.0)

Outcome = Literal["bigram", "unigram"]
Real = float | int
ArrayLike = Any  # float, numpy array or torch tensor (broadcast together)

_IID_TOL = 1e-9  # |p + q - 1| below this: the chain is i.i.d. and unigram = bigram


# ---------------------------------------------------------------------------------------------------------------
# chain constants
# ---------------------------------------------------------------------------------------------------------------


def _check_pq(p: Any, q: Any) -> tuple[float, float]:
    for name, value in (("p", p), ("q", q)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < float(value) < 1.0:
            raise ValueError(f"{name} must be a probability strictly between 0 and 1, got {value!r}")
    return float(p), float(q)


def _check_pq_arrays(p: Any, q: Any) -> tuple[np.ndarray, np.ndarray]:
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    for name, value in (("p", p), ("q", q)):
        if not np.all((value > 0.0) & (value < 1.0)):
            raise ValueError(f"{name} must lie strictly between 0 and 1, got values in [{value.min()}, {value.max()}]")
    return p, q


def kernel(p: Real, q: Real) -> Float[np.ndarray, "2 2"]:
    """The binary chain's transition kernel [[1-p, p], [q, 1-q]] (float64), as `data.BinaryChain` has it."""
    p, q = _check_pq(p, q)
    return np.array([[1.0 - p, p], [q, 1.0 - q]])


def reference_losses(p: Real, q: Real) -> dict[str, float]:
    """The two plateaus of the canonical landscape, from `theory`: "entropy_rate" (the global minima, the bigram
    solution) and "unigram_loss" (H(pi), the unigram line e = 0 at its optimal bias).

    >>> {k: round(v, 4) for k, v in reference_losses(0.2, 0.3).items()}
    {'entropy_rate': 0.5446, 'unigram_loss': 0.673}
    """
    k = kernel(p, q)
    return {"entropy_rate": theory.entropy_rate(k), "unigram_loss": theory.unigram_loss(k)}


def _entropy2(x):
    """Binary entropy in nats, vectorized (0 < x < 1)."""
    return -(x * np.log(x) + (1.0 - x) * np.log1p(-x))


def _losses_closed_form(p, q):
    """(entropy rate, unigram loss) in closed form, vectorized; agrees with `theory` (tested)."""
    rate = (q * _entropy2(p) + p * _entropy2(q)) / (p + q)
    return rate, _entropy2(p / (p + q))


def bigram_log_odds(p: Real, q: Real) -> float:
    """c = log((1-p)(1-q) / (p q)) = logit(1-q) - logit(p): the logit gap f1 - f0 the bigram solution needs.

    Positive for p + q < 1 (the chain tends to stay), negative for p + q > 1 (it tends to switch), zero for the
    i.i.d. chain p + q = 1. The global minima of the canonical model are delta(w) e^2 = c.

    >>> round(bigram_log_odds(0.2, 0.3), 4)
    2.2336
    """
    p, q = _check_pq(p, q)
    return math.log((1 - p) * (1 - q) / (p * q))


def unigram_bias(p: Real, q: Real) -> float:
    """b* = log(pi1 / pi0) = log(p / q): the output bias of the unigram solution (predict pi whatever the state).

    >>> round(unigram_bias(0.5, 0.8), 4)
    -0.47
    """
    p, q = _check_pq(p, q)
    return math.log(p / q)


def unigram_curvature_scale(p: Real, q: Real) -> float:
    """kappa = p q (p + q - 1) / (p + q)^2: dL/df1 at the unigram point (= -dL/df0).

    The e-curvature at the unigram point (0, w, b*) is 2 kappa delta(w); its sign is that of p + q - 1 for
    w > -1/sqrt(2). kappa is also the slope of the b-profiled loss in the logit gap f1 - f0 at zero gap.
    """
    p, q = _check_pq(p, q)
    return p * q * (p + q - 1) / (p + q) ** 2


def delta(w: ArrayLike) -> ArrayLike:
    """delta(w) = 1 + 2 w|w|: the canonical model's logit gap per unit e^2 (f1 - f0 = delta(w) e^2)."""
    return 1.0 + 2.0 * w * abs(w)


# ---------------------------------------------------------------------------------------------------------------
# the loss (torch, autograd) and its closed-form derivatives (numpy)
# ---------------------------------------------------------------------------------------------------------------


def _loss_from_logits_torch(f1, f0, p, q):
    pi1, pi0 = p / (p + q), q / (p + q)
    ls = F.logsigmoid
    return -pi1 * (q * ls(-f1) + (1 - q) * ls(f1)) - pi0 * (p * ls(f0) + (1 - p) * ls(-f0))


def _as_float64(values: tuple) -> tuple[list[Tensor], bool]:
    is_torch = any(isinstance(v, Tensor) for v in values)
    out = [v.to(torch.float64) if isinstance(v, Tensor) else torch.as_tensor(np.asarray(v, dtype=np.float64))
           for v in values]
    return out, is_torch


def _finish(result: Tensor, is_torch: bool) -> Any:
    if is_torch:
        return result
    arr = result.detach().numpy()
    return float(arr) if arr.ndim == 0 else arr


def canonical_loss(e: ArrayLike, w: ArrayLike, b: ArrayLike, *, p: Real, q: Real) -> Any:
    """Expected next-state cross-entropy (nats) of the canonical model (e, w, b) on the stationary (p, q) chain.

    The loss a single-layer tied transformer with the low-rank canonical init has, as a function of its three
    scalars: the entropy rate at the global minima, H(pi) on the unigram line e = 0 with b = log(p/q). Inputs
    broadcast; torch tensors give a float64 tensor (autograd flows through), anything else numpy / a float.

    >>> round(canonical_loss(0.0, 0.3, unigram_bias(0.5, 0.8), p=0.5, q=0.8), 4)  # unigram loss
    0.6663
    """
    p, q = _check_pq(p, q)
    (e, w, b), is_torch = _as_float64((e, w, b))
    f1 = (0.5 + 2.0 * w * w.abs()) * e**2 + b
    f0 = b - 0.5 * e**2
    return _finish(_loss_from_logits_torch(f1, f0, p, q), is_torch)


def untied_loss(e: ArrayLike, a: ArrayLike, w: ArrayLike, b: ArrayLike, *, p: Real, q: Real) -> Any:
    """Loss (nats) of the untied canonical model (e, a, w, b): the output scalar a is free instead of equal to e.

    Derivation: in the canonical model the logit is <output vector, residual stream> + b with the output vector
    e u (tying: the embedding direction u times e) and the residual stream along u equal to
    (1/2 + 2w|w|) e after state 1 and -e/2 after state 0 (the embedding (x - 1/2) e u plus the MLP, which only
    fires after state 1). Untying replaces the output vector by a u with a free scalar a, everything else equal:
    f1 = a e (1/2 + 2w|w|) + b, f0 = b - a e / 2. With a = e it is `canonical_loss`. The loss is symmetric in
    e <-> a, so the flow keeps a = e (and a = -e) when it starts there, but it is then the tied flow with e
    trained at half speed (dL/de = a (...) instead of 2e (...)), so its basins differ from the tied ones.
    """
    p, q = _check_pq(p, q)
    (e, a, w, b), is_torch = _as_float64((e, a, w, b))
    f1 = (0.5 + 2.0 * w * w.abs()) * a * e + b
    f0 = b - 0.5 * a * e
    return _finish(_loss_from_logits_torch(f1, f0, p, q), is_torch)


def _sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _loss_np(f1, f0, p, q):
    pi1, pi0 = p / (p + q), q / (p + q)

    def logsig(x):
        return -np.logaddexp(0.0, -x)

    return -pi1 * (q * logsig(-f1) + (1 - q) * logsig(f1)) - pi0 * (p * logsig(f0) + (1 - p) * logsig(-f0))


def _logit_derivatives(f1, f0, p, q):
    """First and second derivatives of the loss in the two logits: g1, g0, g11, g00 (g10 = 0)."""
    pi1, pi0 = p / (p + q), q / (p + q)
    s1, s0 = _sigmoid(f1), _sigmoid(f0)
    return pi1 * (s1 - (1 - q)), pi0 * (s0 - p), pi1 * s1 * (1 - s1), pi0 * s0 * (1 - s0)


def _tied_logits(x, sign=1.0):
    e, w, b = x[..., 0], x[..., 1], x[..., 2]
    return sign * (0.5 + 2 * w * np.abs(w)) * e**2 + b, b - sign * 0.5 * e**2


def _tied_grad_np(x, p, q, sign=1.0):
    """Closed-form gradient [dL/de, dL/dw, dL/db] of the tied model (sign=-1: the 'anti-tied' a = -e model)."""
    e, w = x[..., 0], x[..., 1]
    f1, f0 = _tied_logits(x, sign)
    g1, g0, _, _ = _logit_derivatives(f1, f0, p, q)
    big_a = 0.5 + 2 * w * np.abs(w)
    return np.stack([sign * (2 * e * big_a * g1 - e * g0), sign * 4 * np.abs(w) * e**2 * g1, g1 + g0], axis=-1)


def _untied_grad_np(x, p, q):
    e, a, w, b = x[..., 0], x[..., 1], x[..., 2], x[..., 3]
    big_a = 0.5 + 2 * w * np.abs(w)
    f1, f0 = big_a * a * e + b, b - 0.5 * a * e
    g1, g0, _, _ = _logit_derivatives(f1, f0, p, q)
    return np.stack([a * (big_a * g1 - 0.5 * g0), e * (big_a * g1 - 0.5 * g0), 4 * np.abs(w) * a * e * g1, g1 + g0],
                    axis=-1)


def _tied_loss_np(x, p, q, sign=1.0):
    return _loss_np(*_tied_logits(x, sign), p, q)


def _untied_loss_np(x, p, q):
    e, a, w, b = x[..., 0], x[..., 1], x[..., 2], x[..., 3]
    big_a = 0.5 + 2 * w * np.abs(w)
    return _loss_np(big_a * a * e + b, b - 0.5 * a * e, p, q)


def canonical_gradient(e: ArrayLike, w: ArrayLike, b: ArrayLike, *, p: Real, q: Real) -> np.ndarray:
    """Exact gradient [dL/de, dL/dw, dL/db] of `canonical_loss` (closed form, float64, last axis of size 3).

    dL/de = e (2 A g1 - g0), dL/dw = 4|w| e^2 g1, dL/db = g1 + g0 with A = 1/2 + 2w|w|, g1 = pi1 (s(f1) - (1-q))
    and g0 = pi0 (s(f0) - p) the loss's slopes in the two logits. Zero on the unigram line and at the global
    minima, the only critical points.
    """
    p, q = _check_pq(p, q)
    x = np.stack(np.broadcast_arrays(*(np.asarray(v, dtype=np.float64) for v in (e, w, b))), axis=-1)
    return _tied_grad_np(x, p, q)


def untied_gradient(e: ArrayLike, a: ArrayLike, w: ArrayLike, b: ArrayLike, *, p: Real, q: Real) -> np.ndarray:
    """Exact gradient [dL/de, dL/da, dL/dw, dL/db] of `untied_loss` (closed form, float64, last axis 4)."""
    p, q = _check_pq(p, q)
    x = np.stack(np.broadcast_arrays(*(np.asarray(v, dtype=np.float64) for v in (e, a, w, b))), axis=-1)
    return _untied_grad_np(x, p, q)


def _hessian(grad1, grad0, hess1, hess0, f1, f0, p, q):
    """Chain rule: H = g11 grad1 grad1^T + g00 grad0 grad0^T + g1 hess1 + g0 hess0 (the logits' derivatives)."""
    g1, g0, g11, g00 = _logit_derivatives(f1, f0, p, q)
    return g11 * np.outer(grad1, grad1) + g00 * np.outer(grad0, grad0) + g1 * hess1 + g0 * hess0


def canonical_hessian(e: Real, w: Real, b: Real, *, p: Real, q: Real) -> Float[np.ndarray, "3 3"]:
    """Exact 3x3 Hessian of `canonical_loss` in (e, w, b) at one point (closed form, float64).

    On the unigram line (0, w, log(p/q)) it is diag(2 kappa delta(w), 0, pi0 pi1): the e-curvature decides
    whether the unigram solution is a trap. At w = 0 the second w-derivative of w|w| jumps (from -2 to 2); the
    value there is the average, 0.
    """
    p, q = _check_pq(p, q)
    e, w, b = float(e), float(w), float(b)
    big_a = 0.5 + 2 * w * abs(w)
    f1, f0 = big_a * e * e + b, b - 0.5 * e * e
    grad1 = np.array([2 * e * big_a, 4 * abs(w) * e * e, 1.0])
    grad0 = np.array([-e, 0.0, 1.0])
    hess1 = np.array([[2 * big_a, 8 * e * abs(w), 0.0], [8 * e * abs(w), 4 * np.sign(w) * e * e, 0.0], [0.0, 0.0, 0.0]])
    hess0 = np.zeros((3, 3))
    hess0[0, 0] = -1.0
    return _hessian(grad1, grad0, hess1, hess0, f1, f0, p, q)


def untied_hessian(e: Real, a: Real, w: Real, b: Real, *, p: Real, q: Real) -> Float[np.ndarray, "4 4"]:
    """Exact 4x4 Hessian of `untied_loss` in (e, a, w, b) at one point (closed form, float64).

    At a unigram critical point (0, 0, w, log(p/q)) its (e, a) block is [[0, k], [k, 0]] with
    k = kappa delta(w): eigenvalues +-k, a saddle whenever p + q != 1 and w != -1/sqrt(2).
    """
    p, q = _check_pq(p, q)
    e, a, w, b = float(e), float(a), float(w), float(b)
    big_a = 0.5 + 2 * w * abs(w)
    f1, f0 = big_a * a * e + b, b - 0.5 * a * e
    grad1 = np.array([big_a * a, big_a * e, 4 * abs(w) * a * e, 1.0])
    grad0 = np.array([-0.5 * a, -0.5 * e, 0.0, 1.0])
    hess1 = np.zeros((4, 4))
    hess1[0, 1] = hess1[1, 0] = big_a
    hess1[0, 2] = hess1[2, 0] = 4 * abs(w) * a
    hess1[1, 2] = hess1[2, 1] = 4 * abs(w) * e
    hess1[2, 2] = 4 * np.sign(w) * a * e
    hess0 = np.zeros((4, 4))
    hess0[0, 1] = hess0[1, 0] = -0.5
    return _hessian(grad1, grad0, hess1, hess0, f1, f0, p, q)


# ---------------------------------------------------------------------------------------------------------------
# the optimal bias and the b-profiled loss
# ---------------------------------------------------------------------------------------------------------------


def _optimal_bias_np(s1, s0, p, q):
    """The b solving dL/db = 0 for logits f1 = s1 + b, f0 = s0 + b: pi1 s(f1) + pi0 s(f0) = pi1 (bisection)."""
    pi1 = p / (p + q)
    target = np.log(pi1 / (1 - pi1))
    lo = target - np.maximum(s1, s0)  # both predictions <= pi1 below, >= pi1 above
    hi = target - np.minimum(s1, s0)
    lo, hi = np.broadcast_arrays(lo, hi)
    lo, hi = lo.astype(np.float64).copy(), hi.astype(np.float64).copy()
    pi0 = 1 - pi1
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        too_high = pi1 * _sigmoid(s1 + mid) + pi0 * _sigmoid(s0 + mid) > pi1
        hi = np.where(too_high, mid, hi)
        lo = np.where(too_high, lo, mid)
    return 0.5 * (lo + hi)


def optimal_bias(e: ArrayLike, w: ArrayLike, *, p: Real, q: Real) -> Any:
    """The output bias b minimizing the canonical loss at fixed (e, w): the model's average prediction matches pi1.

    log(p/q) on the unigram line e = 0, logit(p) + e^2/2 at the global minima. Vectorized (float64 bisection
    to machine precision on pi1 s(f1) + pi0 s(f0) = pi1, the condition dL/db = 0).
    """
    p, q = _check_pq(p, q)
    e, w = np.broadcast_arrays(np.asarray(e, dtype=np.float64), np.asarray(w, dtype=np.float64))
    out = _optimal_bias_np((0.5 + 2 * w * np.abs(w)) * e**2, -0.5 * e**2, p, q)
    return float(out) if out.ndim == 0 else out


def profile_loss(e: ArrayLike, w: ArrayLike, *, p: Real, q: Real) -> Any:
    """The canonical loss with b at its optimum, as a function of (e, w): the landscape the theory draws.

    Equal to H(pi) on the unigram line and along w = -1/sqrt(2) (there f1 = f0 for every e), to the entropy
    rate on the global-minimum curve delta(w) e^2 = c; near e = 0 it is H(pi) + kappa delta(w) e^2 + O(e^4).
    """
    b = optimal_bias(e, w, p=p, q=q)
    e, w, b = np.broadcast_arrays(np.asarray(e, dtype=np.float64), np.asarray(w, dtype=np.float64), b)
    out = _tied_loss_np(np.stack([e, w, b], axis=-1), p, q)
    return float(out) if out.ndim == 0 else out


# ---------------------------------------------------------------------------------------------------------------
# critical points
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BigramMinima:
    """The global minima over given w values: e = +-`e` (NaN where delta(w) e^2 = c has no solution), bias `b`.

    `loss` is the entropy rate (from `theory`). At p + q = 1 (c = 0) the set is e = 0 for every w plus the whole
    line w = -1/sqrt(2); `e` is then 0 for every w.
    """

    w: np.ndarray
    e: np.ndarray
    b: np.ndarray
    log_odds: float
    loss: float


def bigram_minima(w: ArrayLike, *, p: Real, q: Real) -> BigramMinima:
    """The global (bigram) minima of the canonical model: (1 + 2w|w|) e^2 = log((1-p)(1-q)/(pq)), b = logit(p) + e^2/2.

    There the model predicts the true kernel, s(f1) = 1 - q and s(f0) = p, and the loss is the entropy rate.
    For p + q < 1 solutions exist for w > -1/sqrt(2), for p + q > 1 only for w < -1/sqrt(2): a tied model must
    first drive its MLP scale below -1/sqrt(2) to learn a switching chain.

    >>> m = bigram_minima([0.0], p=0.2, q=0.3); round(float(m.e[0]), 4), round(float(m.b[0]), 4)
    (1.4945, -0.2695)
    """
    p, q = _check_pq(p, q)
    w = np.atleast_1d(np.asarray(w, dtype=np.float64))
    c = bigram_log_odds(p, q)
    d = delta(w)
    with np.errstate(divide="ignore", invalid="ignore"):
        e2 = np.where(d != 0, c / d, np.nan)
    if abs(p + q - 1) < _IID_TOL:
        e2 = np.zeros_like(w)
    e2 = np.where(e2 >= 0, e2, np.nan)
    e = np.sqrt(e2)
    b = math.log(p / (1 - p)) + 0.5 * e2
    return BigramMinima(w=w, e=e, b=b, log_odds=c, loss=reference_losses(p, q)["entropy_rate"])


def unigram_e_curvature(w: ArrayLike, *, p: Real, q: Real) -> Any:
    """d^2 L / de^2 at the unigram point (0, w, log(p/q)): 2 kappa (1 + 2 w|w|), kappa = pq(p+q-1)/(p+q)^2.

    Derivation: with u = e^2, L = g(A(w) u + b, b - u/2), so dL/de = 2e (A g1 - g0/2) and at e = 0
    d^2L/de^2 = 2 (A g1 - g0/2). At b = log(p/q) both predictions equal pi1, so g1 = pi1 (pi1 - 1 + q) = kappa
    and g0 = pi0 (pi1 - p) = -kappa, giving 2 kappa (A + 1/2) = 2 kappa delta(w). It is second order (no
    vanishing at first order) except at w = -1/sqrt(2) and at p + q = 1.
    """
    kappa = unigram_curvature_scale(p, q)
    out = 2.0 * kappa * delta(np.asarray(w, dtype=np.float64))
    return float(out) if np.ndim(out) == 0 else out


@dataclass(frozen=True)
class UnigramPointAnalysis:
    """Evidence for the classification of the unigram point (0, w, log(p/q)).

    kind: "local_min" / "saddle" / "local_max" in the (e, w) plane with b at its optimum (see
    `classify_unigram_point`). hessian / eigenvalues (ascending): the full 3x3 Hessian in (e, w, b).
    e_curvature: closed-form 2 kappa delta(w). profile_offsets: profile_loss(eps, w + s eta) - H(pi) for
    s = -1, 0, +1 (eps = 1e-2, eta = 1e-2): all >= 0 at a minimum, all <= 0 at a maximum, both signs at the
    saddle. loss_along_e: canonical_loss(e, w, b*) - H(pi) at e = -eps, +eps with b fixed at b*.
    """

    kind: str
    w: float
    p: float
    q: float
    hessian: np.ndarray
    eigenvalues: np.ndarray
    e_curvature: float
    profile_offsets: np.ndarray
    loss_along_e: np.ndarray


def unigram_point_analysis(w: Real, *, p: Real, q: Real, eps: float = 1e-2, eta: float = 1e-2) -> UnigramPointAnalysis:
    """Classify the unigram point (0, w, log(p/q)) and collect the Hessian and loss values that show it."""
    p, q = _check_pq(p, q)
    w = float(w)
    b_star = unigram_bias(p, q)
    hess = canonical_hessian(0.0, w, b_star, p=p, q=q)
    curv = unigram_e_curvature(w, p=p, q=q)
    h_pi = float(_losses_closed_form(np.float64(p), np.float64(q))[1])
    offsets = np.array([profile_loss(eps, w + s * eta, p=p, q=q) - h_pi for s in (-1, 0, 1)])
    along = np.array([canonical_loss(s * eps, w, b_star, p=p, q=q) - h_pi for s in (-1, 1)])
    kappa = unigram_curvature_scale(p, q)
    if abs(p + q - 1) < _IID_TOL:
        kind = "local_min"  # i.i.d. chain: the unigram line is (part of) the global-minimum set
    elif abs(delta(w)) < 1e-12:
        kind = "saddle"
    else:
        kind = "local_min" if kappa * delta(w) > 0 else "local_max"
    return UnigramPointAnalysis(kind=kind, w=w, p=p, q=q, hessian=hess, eigenvalues=np.linalg.eigvalsh(hess),
                                e_curvature=curv, profile_offsets=offsets, loss_along_e=along)


def classify_unigram_point(w: Real, *, p: Real, q: Real) -> str:
    """What the unigram solution (0, w, log(p/q)) is for training: "local_min", "saddle" or "local_max".

    Classified in the (e, w) plane with b at its optimum, as the papers state it. The e-curvature is
    2 kappa delta(w) with kappa of the sign of p + q - 1: p + q > 1: "local_min" for w > -1/sqrt(2) (the bad
    local minimum that traps tied single-layer models), "local_max" for w < -1/sqrt(2); p + q < 1: the reverse;
    "saddle" at w = -1/sqrt(2) (the loss changes sign across that line). The minima are non-strict (w is flat),
    and the "maxima" are maxima along e only: in the full (e, w, b) space they are saddles, since the loss
    curves up along b (Hessian diag(2 kappa delta, 0, pi0 pi1), see `unigram_point_analysis`). At p + q = 1 the
    chain is i.i.d., the unigram solution is a global minimum and this returns "local_min" for every w.

    >>> classify_unigram_point(0.1, p=0.5, q=0.8), classify_unigram_point(-1.0, p=0.5, q=0.8)
    ('local_min', 'local_max')
    """
    return unigram_point_analysis(w, p=p, q=q).kind


# ---------------------------------------------------------------------------------------------------------------
# gradient flow, the conserved quantity, predicted outcomes
# ---------------------------------------------------------------------------------------------------------------


def conserved_quantity(e: ArrayLike, w: ArrayLike) -> Any:
    """E = e^2 - w^2 - sign(w) log|w|: constant along gradient flow with b at its optimum (+inf at w = 0).

    Derivation: at optimal b, g0 = -g1, so de/dt = -2 e g1 delta(w) and dw/dt = -4|w| e^2 g1; then
    e de = (w + 1/(2|w|)) dw, whose integral is E. With b trained too, dE/dt = 2 e^2 dL/db (small once b has
    relaxed). The separatrix of the (e0, w0) plane is E = -h* with h* = 1/2 + log(2)/2, the minimum of
    h(w) = w^2 + sign(w) log|w| over w < 0 (at w = -1/sqrt(2)).
    """
    e = np.asarray(e, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    with np.errstate(divide="ignore"):
        out = e**2 - w**2 - np.sign(w) * np.log(np.abs(w))
    out = np.where(w == 0, np.inf, out)
    return float(out) if out.ndim == 0 else out


def _conserved_rule(e0, w0, switching):
    """Bigram (True) / unigram (False) for the b-profiled tied flow; `switching` = kappa > 0 (p + q > 1).

    p + q > 1: bigram iff e0 != 0, w0 < 0 and (w0 < -1/sqrt(2) or E + h* > 0): the level set of E must carry
    the flow past w = -1/sqrt(2) without touching e = 0. p + q < 1: unigram iff e0 = 0 or (w0 < -1/sqrt(2)
    and E + h* <= 0): the level set lands on e = 0 at some w < -1/sqrt(2). (w never changes sign.)
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        h = np.where(w0 != 0, w0**2 + np.sign(w0) * np.log(np.abs(w0)), np.inf)
    margin = e0**2 - h + H_STAR  # E + h*
    moving = e0 != 0
    bigram_switching = moving & (w0 < 0) & ((w0 < W_SADDLE) | (margin > 0))
    bigram_staying = moving & ~((w0 < W_SADDLE) & (margin <= 0))
    return np.where(switching, bigram_switching, bigram_staying)


def separatrix(w: ArrayLike) -> Any:
    """e0 >= 0 on the boundary E(e0, w0) = -h* of the b-profiled flow's basins (NaN for w >= 0).

    e0^2 = h(w0) - h* with h(w) = w^2 - log|w| for w < 0; it touches e0 = 0 at the saddle w0 = -1/sqrt(2).
    Between it and e0 = 0 the flow lands on the unigram line; see `predict_outcome` for which side is which.
    """
    w = np.asarray(w, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(w < 0, np.sqrt(np.maximum(w**2 - np.log(np.abs(w)) - H_STAR, 0.0)), np.nan)
    return float(out) if out.ndim == 0 else out


# Dormand-Prince 5(4) tableau
_DP_A = (
    (),
    (1 / 5,),
    (3 / 40, 9 / 40),
    (44 / 45, -56 / 15, 32 / 9),
    (19372 / 6561, -25360 / 2187, 64448 / 6561, -212 / 729),
    (9017 / 3168, -355 / 33, 46732 / 5247, 49 / 176, -5103 / 18656),
    (35 / 384, 0.0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84),
)
_DP_B5 = np.array([35 / 384, 0.0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84, 0.0])
_DP_B4 = np.array([5179 / 57600, 0.0, 7571 / 16695, 393 / 640, -92097 / 339200, 187 / 2100, 1 / 40])


@dataclass
class _FlowResult:
    bigram: np.ndarray  # bool [n]
    decided: np.ndarray  # bool [n]: certified (False: fallback to the conserved rule at t_max)
    x: np.ndarray  # final states [n, dim]
    t: np.ndarray  # final times [n]


def _integrate_tied(x0, p, q, sign, e_rate, *, t_max, max_iter, rtol=1e-8, atol=1e-11):
    """Integrate the full (e, w, b) gradient flow of many inits at once (adaptive Dormand-Prince, float64).

    A point is decided "bigram" once its loss falls below H(pi) - gap/1000 (the flow's loss decreases and the
    unigram line sits at H(pi), so it can no longer end there) and "unigram" once it is certified to converge
    to the unigram line: w >= 0 with kappa sign > 0 (the bigram set is then out of reach: w keeps its sign), or
    it is close to the line where the line is attracting (kappa delta(w) sign > 0, e small against delta and
    b near its optimum). Points undecided at t_max fall back to the conserved-quantity rule at their state.
    `sign` = -1 is the anti-tied model (a = -e), `e_rate` scales e's speed (1/2 for the untied a = +-e flows).
    """
    n = x0.shape[0]
    x = x0.copy()
    rate, h_pi = _losses_closed_form(p, q)
    gap_tol = 1e-3 * (h_pi - rate)
    kappa = p * q * (p + q - 1) / (p + q) ** 2
    k_eff = sign * kappa  # the anti-tied model (sign -1) is the tied one with kappa -> -kappa
    t = np.zeros(n)
    dt = np.full(n, 1e-2)
    bigram = np.zeros(n, bool)
    decided = np.zeros(n, bool)
    active = np.ones(n, bool)

    def check(idx):
        xs = x[idx]
        e, w = xs[:, 0], xs[:, 1]
        pi_, qi, si, ki = p[idx], q[idx], sign[idx], k_eff[idx]
        loss = _tied_loss_np(xs, pi_, qi, si)
        is_bigram = loss < h_pi[idx] - gap_tol[idx]
        d = delta(w)
        f1, f0 = _tied_logits(xs, si)
        g1, g0, g11, g00 = _logit_derivatives(f1, f0, pi_, qi)
        db = np.abs(g1 + g0) / (g11 + g00)  # distance of b from its optimum (Newton step)
        big_a = si * (0.5 + 2 * w * np.abs(w))
        attracting = ki * d > 0
        small_e = ((e**2 * (w**2 + 1e-300) < 1e-2 * d**2 * e_rate[idx]) & (e**2 < 1e-4)
                   & (e**2 * np.abs(d) < 0.1 * np.abs(ki)))
        b_ok = db * np.abs(big_a * g11 - 0.5 * si * g00) * 4 < np.abs(ki * d)
        is_unigram = ((ki > 0) & (w >= 0) & (np.abs(p[idx] + q[idx] - 1) >= _IID_TOL)) | (e == 0) | (
            attracting & small_e & b_ok)
        done = is_bigram | is_unigram
        bigram[idx[done]] = is_bigram[done]
        decided[idx[done]] = True
        active[idx[done]] = False

    check(np.arange(n))
    iid = np.abs(p + q - 1) < _IID_TOL
    bigram[iid], decided[iid], active[iid] = True, True, False
    for _ in range(max_iter):
        idx = np.nonzero(active)[0]
        if idx.size == 0:
            break
        xs, h = x[idx], np.minimum(dt[idx], t_max - t[idx])[:, None]
        pi_, qi, si = p[idx], q[idx], sign[idx]
        speed = np.stack([e_rate[idx], np.ones(idx.size), np.ones(idx.size)], axis=1)

        def field_(y):
            return -speed * _tied_grad_np(y, pi_, qi, si)

        ks = [field_(xs)]
        for row in _DP_A[1:]:
            ks.append(field_(xs + h * sum(a * k for a, k in zip(row, ks) if a != 0.0)))
        stack = np.stack(ks)  # [7, m, 3]
        x5 = xs + h * np.tensordot(_DP_B5, stack, axes=1)
        err = h * np.tensordot(_DP_B5 - _DP_B4, stack, axes=1)
        scale = atol + rtol * np.maximum(np.abs(xs), np.abs(x5))
        err_norm = np.max(np.abs(err) / scale, axis=1)
        ok = err_norm <= 1.0
        acc = idx[ok]
        x[acc] = x5[ok]
        t[acc] += h[ok, 0]
        factor = np.clip(0.9 * np.maximum(err_norm, 1e-10) ** -0.2, 0.2, 5.0)
        dt[idx] = np.minimum(h[:, 0] * factor, 50.0)
        check(acc)
        out_of_time = idx[t[idx] >= t_max]
        active[out_of_time] = False
    rest = ~decided
    if rest.any():
        switching = k_eff[rest] > 0
        bigram[rest] = _conserved_rule(x[rest, 0] / np.sqrt(e_rate[rest]), x[rest, 1], switching)
    return _FlowResult(bigram=bigram, decided=decided, x=x, t=t)


_METHODS = ("auto", "conserved", "flow")


def _predict_many(e0, w0, b0, p, q, *, tied, a0, method, t_max, max_iter):
    """Vectorized core of `predict_outcome`: bool array, True = bigram."""
    if method not in _METHODS:
        raise ValueError(f"method must be one of {_METHODS}, got {method!r}")
    if b0 is None and method == "flow":
        raise ValueError("method='flow' integrates the full (e, w, b) flow and needs a starting bias b0, got None")
    arrays = np.broadcast_arrays(*(np.asarray(v, dtype=np.float64) for v in
                                   (e0, w0, 0.0 if b0 is None else b0, p, q, e0 if a0 is None else a0)))
    e0, w0, b0_, p, q, a0_ = (a.ravel().copy() for a in arrays)
    shape = arrays[0].shape
    p, q = _check_pq_arrays(p, q)
    iid = np.abs(p + q - 1) < _IID_TOL
    sign = np.ones_like(e0)
    e_rate = np.ones_like(e0)
    out = np.zeros(e0.shape, bool)
    todo = np.ones(e0.shape, bool)
    if not tied:
        # e^2 - a^2 is conserved: unless |a0| = |e0| the flow cannot reach the unigram points e = a = 0.
        balanced = np.isclose(np.abs(a0_), np.abs(e0), rtol=1e-12, atol=0.0)
        out[~balanced] = True
        todo &= balanced
        # a = e stays a = e (the tied model), a = -e stays a = -e (the tied model with f1 - f0 -> -(f1 - f0)),
        # both with e trained at half speed.
        sign = np.where((a0_ * e0 < 0), -1.0, 1.0)
        e_rate[:] = 0.5
    out[iid & todo] = True
    todo &= ~iid
    if b0 is None or method == "conserved":
        switching = sign * (p + q - 1) > 0
        out[todo] = _conserved_rule(e0[todo] / np.sqrt(e_rate[todo]), w0[todo], switching[todo])
    elif todo.any():
        idx = np.nonzero(todo)[0]
        x0 = np.stack([e0[idx], w0[idx], b0_[idx]], axis=1)
        res = _integrate_tied(x0, p[idx], q[idx], sign[idx], e_rate[idx], t_max=t_max, max_iter=max_iter)
        out[idx] = res.bigram
    return out.reshape(shape)


def predict_outcome(e0: Real, w0: Real, b0: Real | None = 0.0, *, p: Real, q: Real, tied: bool = True,
                    a0: Real | None = 0.0, method: str = "auto", t_max: float = 1e6) -> Outcome:
    """Where gradient descent on the canonical loss ends from (e0, w0, b0): "bigram" (the global minimum,
    loss = entropy rate) or "unigram" (stuck on the line e = 0, loss = H(pi)).

    From the conserved quantity E = e^2 - w^2 - sign(w) log|w| where it applies exactly, the flow with b held at
    its optimum (`b0=None`, or `method="conserved"` as an approximation): p + q > 1: bigram iff w0 < 0 and
    (w0 < -1/sqrt(2) or E > -h*); p + q < 1: unigram iff w0 < -1/sqrt(2) and E <= -h* (h* = 1/2 + log(2)/2;
    e0 = 0 always stays unigram). Otherwise (`method="auto"` or "flow" with a bias b0) by integrating the full
    (e, w, b) gradient flow in float64 until the outcome is certified, since training b moves E
    (dE/dt = 2 e^2 dL/db). p + q = 1 (i.i.d. chain): "bigram" (both solutions are the global minimum).
    Untied (`tied=False`, output scalar a0, see `untied_loss`): e^2 - a^2 is conserved, so every init with
    |a0| != |e0| ends "bigram"; a0 = +-e0 stays on a = +-e, a tied (anti-tied for -) flow with e at half speed,
    conserving 2e^2 - w^2 - sign(w) log|w|. Tied, small inits with p + q > 1 go "unigram".

    >>> predict_outcome(0.1, 0.1, p=0.5, q=0.8), predict_outcome(0.1, -1.0, p=0.5, q=0.8)
    ('unigram', 'bigram')
    >>> predict_outcome(0.1, 0.1, p=0.5, q=0.8, tied=False)
    'bigram'
    """
    p, q = _check_pq(p, q)
    for name, value in (("e0", e0), ("w0", w0), ("b0", b0), ("a0", a0)):
        if value is not None and not math.isfinite(float(value)):
            raise ValueError(f"{name} must be a finite number, got {value!r}")
    bigram = _predict_many(float(e0), float(w0), b0, p, q, tied=tied, a0=a0, method=method, t_max=t_max,
                           max_iter=200_000)
    return "bigram" if bool(bigram) else "unigram"


@dataclass(frozen=True)
class Trajectory:
    """A gradient-descent run on the canonical loss: `points` [steps + 1, 3] (e, w, b) or [steps + 1, 4]
    (e, a, w, b) untied, and `loss` [steps + 1] in nats."""

    names: tuple[str, ...]
    points: np.ndarray
    loss: np.ndarray

    def __getattr__(self, name):
        names = object.__getattribute__(self, "names")
        if name in names:
            return object.__getattribute__(self, "points")[:, names.index(name)]
        raise AttributeError(name)


def gradient_flow(e0: Real, w0: Real, b0: Real = 0.0, *, p: Real, q: Real, steps: int, lr: Real,
                  tied: bool = True, a0: Real = 0.0) -> Trajectory:
    """Plain gradient descent (the Euler discretisation of gradient flow) on the canonical loss from (e0, w0, b0).

    The trajectory a full-batch, infinite-data training of the canonical model would follow, with learning rate
    `lr`; its end sits near the entropy rate ("bigram") or near H(pi) ("unigram"), as `predict_outcome` says
    for small lr. `tied=False` runs the untied model (e, a, w, b) from output scalar a0.

    >>> traj = gradient_flow(0.1, -1.0, p=0.5, q=0.8, steps=3000, lr=0.5)
    >>> round(float(traj.loss[-1]), 4)  # the entropy rate
    0.619
    """
    p, q = _check_pq(p, q)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps must be an integer >= 0, got {steps!r}")
    if not float(lr) > 0:
        raise ValueError(f"lr must be > 0, got {lr!r}")
    if tied:
        x, names = np.array([e0, w0, b0], dtype=np.float64), ("e", "w", "b")
        grad_fn, loss_fn = _tied_grad_np, _tied_loss_np
    else:
        x, names = np.array([e0, a0, w0, b0], dtype=np.float64), ("e", "a", "w", "b")
        grad_fn, loss_fn = _untied_grad_np, _untied_loss_np
    points = np.empty((steps + 1, x.size))
    points[0] = x
    for i in range(steps):
        x = x - lr * grad_fn(x, p, q)
        points[i + 1] = x
    return Trajectory(names=names, points=points, loss=loss_fn(points, p, q))


def gradient_descent_outcomes(e0: ArrayLike, w0: ArrayLike, b0: ArrayLike = 0.0, *, p: ArrayLike, q: ArrayLike,
                              steps: int, lr: float, tied: bool = True, a0: ArrayLike = 0.0) -> np.ndarray:
    """Run plain gradient descent from many inits at once (broadcast) and say which ended below H(pi).

    Returns a bool array, True where the final loss is below H(pi) - (H(pi) - entropy rate) / 1000, i.e. where
    descent has left the unigram plateau for the bigram basin within `steps` steps: the empirical counterpart
    of `predict_outcome`, used to check it.
    """
    arrays = np.broadcast_arrays(*(np.asarray(v, dtype=np.float64) for v in (e0, w0, b0, p, q, a0)))
    e0, w0, b0, p, q, a0 = arrays
    p, q = _check_pq_arrays(p, q)
    if tied:
        x, grad_fn, loss_fn = np.stack([e0, w0, b0], -1), _tied_grad_np, _tied_loss_np
    else:
        x, grad_fn, loss_fn = np.stack([e0, a0, w0, b0], -1), _untied_grad_np, _untied_loss_np
    for _ in range(steps):
        x = x - lr * grad_fn(x, p, q)
    rate, h_pi = _losses_closed_form(p, q)
    return loss_fn(x, p, q) < h_pi - 1e-3 * (h_pi - rate)


# ---------------------------------------------------------------------------------------------------------------
# regime maps
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RegimeMap:
    """Predicted outcomes over a grid: `bigram[i, j]` is True where training from the setting (y[i], x[j]) ends
    at the global minimum, False where it sticks at the unigram solution.

    kind "pq": x = p, y = q (a fixed init in `settings`); kind "init": x = w0, y = e0 (a fixed chain).
    """

    kind: str
    x: np.ndarray
    y: np.ndarray
    x_label: str
    y_label: str
    bigram: np.ndarray
    tied: bool
    settings: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """Plain lists and numbers (JSON-ready)."""
        return {"kind": self.kind, "x": self.x.tolist(), "y": self.y.tolist(), "x_label": self.x_label,
                "y_label": self.y_label, "bigram": self.bigram.astype(bool).tolist(), "tied": self.tied,
                "settings": dict(self.settings)}


def _check_grid(n: Any, name: str) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ValueError(f"{name} must be an integer >= 2, got {n!r}")
    return n


def regime_map_pq(*, e0: Real = 0.1, w0: Real = 0.1, b0: Real | None = 0.0, tied: bool = True, a0: Real = 0.0,
                  n: int = 41, method: str = "auto") -> RegimeMap:
    """Predicted outcome over the (p, q) square (cell centres (i + 1/2) / n) from one init (e0, w0, b0).

    The theory's boundary is p + q = 1: with tying and a small init with w0 > -1/sqrt(2) the canonical model
    learns the kernel below the diagonal and sticks at the unigram solution above it; untied (a0 != e0) it
    learns everywhere. Cells on the diagonal itself (an i.i.d. chain) count as "bigram".
    """
    n = _check_grid(n, "n")
    axis = (np.arange(n) + 0.5) / n
    pp, qq = np.meshgrid(axis, axis)
    big = _predict_many(float(e0), float(w0), b0, pp, qq, tied=tied, a0=float(a0), method=method, t_max=1e6,
                        max_iter=200_000)
    settings = {"e0": float(e0), "w0": float(w0), "b0": None if b0 is None else float(b0), "method": method}
    if not tied:
        settings["a0"] = float(a0)
    return RegimeMap(kind="pq", x=axis, y=axis, x_label="p = P(1 | 0)", y_label="q = P(0 | 1)", bigram=big,
                     tied=tied, settings=settings)


def regime_map_init(*, p: Real, q: Real, w_range: tuple[Real, Real] = (-2.5, 1.5),
                    e_range: tuple[Real, Real] = (0.02, 2.5), n_w: int = 81, n_e: int = 50,
                    b0: Real | None = 0.0, tied: bool = True, a0: Real | None = 0.0,
                    method: str = "auto") -> RegimeMap:
    """Predicted outcome over the initialisation plane (w0, e0) for the (p, q) chain, from bias b0.

    Tied, the b-profiled theory draws the boundary: the separatrix e0^2 = h(w0) - h* (see `separatrix`) and
    the line w0 = -1/sqrt(2); with b trained from b0 the boundary moves a little (E drifts while b relaxes).
    Untied, the output scalar starts at a0 (default 0, independent of e0; None: a0 = e0, which keeps a = e):
    e^2 - a^2 is conserved and every init with |a0| != |e0| ends "bigram".
    """
    p, q = _check_pq(p, q)
    n_w, n_e = _check_grid(n_w, "n_w"), _check_grid(n_e, "n_e")
    for name, rng in (("w_range", w_range), ("e_range", e_range)):
        if len(rng) != 2 or not float(rng[0]) < float(rng[1]):
            raise ValueError(f"{name} must be (low, high) with low < high, got {rng!r}")
    ws = np.linspace(float(w_range[0]), float(w_range[1]), n_w)
    es = np.linspace(float(e_range[0]), float(e_range[1]), n_e)
    ww, ee = np.meshgrid(ws, es)
    big = _predict_many(ee, ww, b0, p, q, tied=tied, a0=None if a0 is None else float(a0), method=method,
                        t_max=1e6, max_iter=200_000)
    settings = {"p": p, "q": q, "b0": None if b0 is None else float(b0), "method": method}
    if not tied:
        settings["a0"] = None if a0 is None else float(a0)
    return RegimeMap(kind="init", x=ws, y=es, x_label="w0 (MLP scale)", y_label="e0 (embedding scale)",
                     bigram=big, tied=tied, settings=settings)


# ---------------------------------------------------------------------------------------------------------------
# figures (returned, never saved)
# ---------------------------------------------------------------------------------------------------------------

_COLORS = ("#d9a441", "#3b7dbf")  # unigram, bigram


def _new_axes(ax: Any, figsize: tuple[float, float]) -> tuple[Any, Any]:
    from matplotlib.figure import Figure

    if ax is not None:
        return ax.figure, ax
    fig = Figure(figsize=figsize, layout="constrained")
    return fig, fig.add_subplot()


def _draw_outcomes(ax: Any, rmap: RegimeMap) -> None:
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    ax.pcolormesh(rmap.x, rmap.y, rmap.bigram.astype(float), cmap=ListedColormap(_COLORS), vmin=0, vmax=1,
                  shading="nearest", rasterized=True)  # a raster: the grid as vector art is megabytes
    ax.set_xlabel(rmap.x_label)
    ax.set_ylabel(rmap.y_label)
    handles = [Patch(color=_COLORS[1], label="bigram (learns the kernel)"),
               Patch(color=_COLORS[0], label="unigram (stuck at H(pi))")]
    ax.legend(handles=handles, loc="upper right", fontsize="small", framealpha=0.9)


def plot_regime_map_pq(rmap: RegimeMap, *, ax: Any = None) -> Any:
    """Figure of a (p, q) regime map with the theory's boundary p + q = 1 drawn dashed."""
    if rmap.kind != "pq":
        raise ValueError(f"expected a regime map of kind 'pq', got kind {rmap.kind!r}")
    fig, ax = _new_axes(ax, (5.2, 4.6))
    _draw_outcomes(ax, rmap)
    ax.plot([0, 1], [1, 0], "k--", lw=1.2, label="p + q = 1")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_aspect("equal")
    s = rmap.settings
    ax.set_title(f"{'tied' if rmap.tied else 'untied'}: init e0={s['e0']:g}, w0={s['w0']:g}", fontsize="medium")
    return fig


def plot_regime_map_init(rmap: RegimeMap, *, ax: Any = None) -> Any:
    """Figure of an init-plane regime map with the b-profiled theory's separatrix and w0 = -1/sqrt(2) (tied)."""
    if rmap.kind != "init":
        raise ValueError(f"expected a regime map of kind 'init', got kind {rmap.kind!r}")
    fig, ax = _new_axes(ax, (6.0, 4.2))
    _draw_outcomes(ax, rmap)
    if rmap.tied:
        ws = np.linspace(rmap.x.min(), min(rmap.x.max(), -1e-3), 400)
        ax.plot(ws, separatrix(ws), "k--", lw=1.2, label="separatrix E = -h*")
        ax.axvline(W_SADDLE, color="k", lw=0.8, ls=":")
        ax.set_ylim(rmap.y.min(), rmap.y.max())
    s = rmap.settings
    ax.set_title(f"{'tied' if rmap.tied else 'untied'}: p={s['p']:g}, q={s['q']:g}, b0={s['b0']}",
                 fontsize="medium")
    return fig


def plot_landscape(*, p: Real, q: Real, w_range: tuple[Real, Real] = (-2.5, 1.5),
                   e_range: tuple[Real, Real] = (0.0, 2.5), n: int = 161, trajectory: Trajectory | None = None,
                   ax: Any = None) -> Any:
    """Figure of the b-profiled loss minus the entropy rate over (w, e), with the global-minimum curve, the
    unigram line, the saddle at w = -1/sqrt(2) and optionally a trajectory (e.g. a real run's
    `canonical_coordinates` over checkpoints, or `gradient_flow`) drawn on it."""
    p, q = _check_pq(p, q)
    n = _check_grid(n, "n")
    ws = np.linspace(float(w_range[0]), float(w_range[1]), n)
    es = np.linspace(float(e_range[0]), float(e_range[1]), n)
    ww, ee = np.meshgrid(ws, es)
    refs = reference_losses(p, q)
    excess = np.maximum(profile_loss(ee, ww, p=p, q=q) - refs["entropy_rate"], 1e-12)
    fig, ax = _new_axes(ax, (6.0, 4.2))
    mesh = ax.pcolormesh(ws, es, np.log10(excess), shading="nearest", cmap="viridis", rasterized=True)
    fig.colorbar(mesh, ax=ax, label="log10(loss - entropy rate), b optimal")
    unigram_excess = refs["unigram_loss"] - refs["entropy_rate"]
    if unigram_excess > 0:
        ax.contour(ws, es, excess, levels=[unigram_excess], colors="w", linewidths=0.8, linestyles=":")
    minima = bigram_minima(ws, p=p, q=q)
    ax.plot(ws, minima.e, color="r", lw=1.5, label="global minima")
    ax.axhline(0.0, color="orange", lw=2, label="unigram line")
    ax.plot([W_SADDLE], [0.0], "kx", ms=8, label="saddle w = -1/sqrt(2)")
    if trajectory is not None:
        ax.plot(trajectory.w, np.abs(trajectory.e), "w-", lw=1.2, label="trajectory")
        ax.plot(trajectory.w[:1], np.abs(trajectory.e[:1]), "wo", ms=4)
    ax.set_xlim(ws[0], ws[-1])
    ax.set_ylim(es[0], es[-1])
    ax.set_xlabel("w (MLP scale)")
    ax.set_ylabel("|e| (embedding scale)")
    ax.set_title(f"canonical landscape, p={p:g}, q={q:g}", fontsize="medium")
    ax.legend(loc="upper right", fontsize="small")
    return fig


# ---------------------------------------------------------------------------------------------------------------
# the bridge to real models
# ---------------------------------------------------------------------------------------------------------------

# TransformerLens names of the tensors read, as (bridge / nn.Linear layout name, HookedTransformer name).
_NAMES = {
    "embed": ("embed.weight", "embed.W_E"),  # [vocab, d_model] in both
    "unembed": ("unembed.weight", "unembed.W_U"),  # [vocab, d_model] / [d_model, vocab]
    "unembed_bias": ("unembed.bias", "unembed.b_U"),
    "mlp_in": ("blocks.0.mlp.in.weight", "blocks.0.mlp.W_in"),  # [d_mlp, d_model] / [d_model, d_mlp]
    "mlp_out": ("blocks.0.mlp.out.weight", "blocks.0.mlp.W_out"),  # [d_model, d_mlp] / [d_mlp, d_model]
}


def _read_tensor(state: Mapping[str, Any], key: str) -> tuple[np.ndarray, bool] | None:
    """The tensor under either name of `key` as float64 numpy in the bridge's layout, or None if absent."""
    bridge_name, hooked_name = _NAMES[key]
    for name, transpose in ((bridge_name, False), (hooked_name, key in ("unembed", "mlp_in", "mlp_out"))):
        if name in state:
            value = state[name]
            arr = value.detach().to("cpu", torch.float64).numpy() if isinstance(value, Tensor) else np.asarray(
                value, dtype=np.float64)
            return (arr.T if transpose else arr), True
    return None


@dataclass(frozen=True)
class CanonicalProjection:
    """A model's weights projected onto the canonical (e, w, b) coordinates along the unit direction u.

    e = (W_E[1] - W_E[0]) . u (embedding scale), a = (W_U[1] - W_U[0]) . u (output scale; a = e when tied),
    coupling = u^T W_out W_in u (the MLP's linear coupling along u, 4 w|w| at the canonical init), w the signed
    root of w|w| = coupling / 4, b = b_U[1] - b_U[0]. embedding_alignment = |e| / |W_E[1] - W_E[0]| (1 when the
    embedding difference lies along u).
    """

    e: float
    w: float
    b: float
    a: float
    coupling: float
    tied: bool
    direction: np.ndarray
    embedding_alignment: float


def canonical_projection(model_or_state: Any, *, direction: ArrayLike | None = None) -> CanonicalProjection:
    """Project a single-layer binary-chain model of the package onto the canonical coordinates (see
    `CanonicalProjection` for the formulas); exact for the canonical init of `models.build`.

    Reads tensors by TransformerLens state-dict names (the bridge's `embed.weight`, `blocks.0.mlp.in.weight`,
    ..., or HookedTransformer's `embed.W_E`, `blocks.0.mlp.W_in`, ...) from a state dict or anything with a
    `state_dict()` method. `direction` is the unit vector u to project on; by default the embedding difference
    W_E[1] - W_E[0], normalised (pass the init's direction to follow a run's checkpoints consistently).

    Why these formulas: without LayerNorm and attention, with a residual stream +-(e/2) u after the embedding,
    the model's logit gap between the two states is e a (1 + coupling / 2) for ReLU and GELU alike
    (phi(x) - phi(-x) = x for both), which is the canonical delta(w) e^2 with coupling = 4 w|w|. For trained
    models with LayerNorm the projection is a best-effort summary, not a reduction.
    """
    state = model_or_state.state_dict() if callable(getattr(model_or_state, "state_dict", None)) else model_or_state
    if not isinstance(state, Mapping):
        raise ValueError(f"expected a model or a state dict, got {type(model_or_state).__name__}")
    if any(str(k).startswith("blocks.1.") for k in state):
        raise ValueError("canonical coordinates are defined for single-layer models; this state has blocks.1.*")
    found = {key: _read_tensor(state, key) for key in _NAMES}
    for key in ("embed", "mlp_in", "mlp_out"):
        if found[key] is None:
            raise ValueError(f"the state has no {_NAMES[key][0]!r} (or {_NAMES[key][1]!r}) tensor")
    w_e = found["embed"][0]
    if w_e.shape[0] != 2:
        raise ValueError(f"canonical coordinates are defined for binary chains (d_vocab=2), got d_vocab={w_e.shape[0]}")
    diff = w_e[1] - w_e[0]
    if direction is None:
        norm = np.linalg.norm(diff)
        if norm == 0:
            raise ValueError("the embedding rows are equal (e = 0): pass the direction to project on")
        u = diff / norm
    else:
        u = np.asarray(direction, dtype=np.float64).ravel()
        if u.shape != diff.shape or not np.linalg.norm(u) > 0:
            raise ValueError(f"direction must be a nonzero vector of length d_model={diff.size}, got shape {u.shape}")
        u = u / np.linalg.norm(u)
    e = float(diff @ u)
    w_in, w_out = found["mlp_in"][0], found["mlp_out"][0]
    coupling = float(u @ w_out @ w_in @ u)
    w = math.copysign(math.sqrt(abs(coupling) / 4.0), coupling)
    tied = found["unembed"] is None or np.array_equal(found["unembed"][0], w_e)
    a = e if tied else float((found["unembed"][0][1] - found["unembed"][0][0]) @ u)
    bias = found["unembed_bias"]
    b = 0.0 if bias is None else float(bias[0][1] - bias[0][0])
    alignment = abs(e) / float(np.linalg.norm(diff)) if np.linalg.norm(diff) > 0 else 0.0
    return CanonicalProjection(e=e, w=w, b=b, a=a, coupling=coupling, tied=tied, direction=u,
                               embedding_alignment=alignment)


def canonical_coordinates(model_or_state: Any, *, direction: ArrayLike | None = None) -> tuple[float, float, float]:
    """(e, w, b) of a single-layer tied binary-chain model: where it sits on the canonical landscape.

    Exact for the low-rank canonical init of `models.build` (`ModelConfig(init="canonical")` gives back its
    canonical_e, canonical_w, canonical_b); a best-effort projection along the embedding direction for trained
    models (see `canonical_projection`, which also gives the untied output scale a).
    """
    proj = canonical_projection(model_or_state, direction=direction)
    return proj.e, proj.w, proj.b


def coordinates_trajectory(states: list, *, p: Real, q: Real, direction: ArrayLike | None = None) -> Trajectory:
    """Project a run's checkpoints (state dicts or models, in order) onto (e, w, b) along one direction (the
    first checkpoint's embedding direction unless given), with the canonical loss at each: a `Trajectory` to
    draw with `plot_landscape(trajectory=...)` next to `gradient_flow`."""
    if not states:
        raise ValueError("states is empty: pass at least one checkpoint")
    first = canonical_projection(states[0], direction=direction)
    points = np.array([canonical_coordinates(s, direction=first.direction) for s in states])
    loss = np.asarray(canonical_loss(points[:, 0], points[:, 1], points[:, 2], p=p, q=q))
    return Trajectory(names=("e", "w", "b"), points=points, loss=loss)
