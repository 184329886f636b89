"""The canonical (e, w, b) model: its exact loss, gradient and Hessian, and its critical points.

The single-layer tied transformer on a binary (p, q) chain, reduced under the low-rank canonical init to three
scalars (see `markov_interp.landscape` for the formulas and what they show): `canonical_loss` (float64, torch
autograd flows through), the closed-form `canonical_gradient` / `canonical_hessian`, the untied model's
counterparts, the b-profiled loss, the global (bigram) minima and the unigram points' classification.
Nothing here integrates a flow (`landscape.flow`) or reads a model (`landscape.projection`).
"""

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from markov_interp import theory
from markov_interp._display import displayed
from markov_interp.config import check_probability

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
    return check_probability("p", p, strict=True), check_probability("q", q, strict=True)


def _check_pq_arrays(p: Any, q: Any) -> tuple[np.ndarray, np.ndarray]:
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    for name, value in (("p", p), ("q", q)):
        if not np.all((value > 0.0) & (value < 1.0)):
            raise ValueError(f"{name} must lie strictly between 0 and 1, got values in [{value.min()}, {value.max()}]")
    return p, q


def kernel(p: Real, q: Real) -> Float[np.ndarray, "2 2"]:
    """The binary chain's transition kernel [[1-p, p], [q, 1-q]] (float64), as `sources.BinaryChain` has it."""
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


@displayed(line=lambda m: f"global minima at {len(m.w)} values of w, log-odds {m.log_odds:.4f}")
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


@displayed(line=lambda a: f"unigram point at w = {a.w:.4g} (p {a.p:g}, q {a.q:g}): {a.kind}")
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


@displayed(line=lambda t: f"{len(t.loss) - 1} steps over ({', '.join(t.names)}), loss {float(t.loss[0]):.4f} -> "
                          f"{float(t.loss[-1]):.4f}")
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
