"""Gradient flow on the canonical (e, w, b) landscape: the conserved quantity, `predict_outcome`, regime maps.

Where a tied single-layer model ends from its canonical initialisation: "bigram" (the global minimum, loss =
entropy rate) or "unigram" (stuck at H(pi)). With b held at its optimum the flow conserves
E = e^2 - w^2 - sign(w) log|w|, which decides the basin in closed form; with b trained too the full flow is
integrated (many initialisations at once, each with its own adaptive Dormand-Prince step) until the outcome is
certified. `gradient_flow` is plain gradient descent, the empirical check of both.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from markov_interp._display import displayed
from markov_interp._plan import Need, planned, size
from markov_interp.config import check_int
from markov_interp.landscape.canonical import (
    _IID_TOL,
    H_STAR,
    W_SADDLE,
    ArrayLike,
    Outcome,
    Real,
    Trajectory,
    _check_pq,
    _check_pq_arrays,
    _logit_derivatives,
    _losses_closed_form,
    _tied_grad_np,
    _tied_logits,
    _tied_loss_np,
    _untied_grad_np,
    _untied_loss_np,
    canonical_loss,
    delta,
)

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


def _dp_step(f: Callable[[np.ndarray], np.ndarray], xs: np.ndarray, h: np.ndarray, rtol: float,
             atol: float) -> tuple[np.ndarray, np.ndarray]:
    """One Dormand-Prince 5(4) step of size h[i] for each row of xs: the 5th-order state and its error norm."""
    hh = h[:, None]
    ks = [f(xs)]
    for row in _DP_A[1:]:
        ks.append(f(xs + hh * sum(a * k for a, k in zip(row, ks) if a != 0.0)))
    stack = np.stack(ks)  # [7, m, dim]
    x5 = xs + hh * np.tensordot(_DP_B5, stack, axes=1)
    err = hh * np.tensordot(_DP_B5 - _DP_B4, stack, axes=1)
    scale = atol + rtol * np.maximum(np.abs(xs), np.abs(x5))
    return x5, np.max(np.abs(err) / scale, axis=1)


def _dormand_prince(field: Callable[[np.ndarray], Callable[[np.ndarray], np.ndarray]], x0: np.ndarray,
                    t_end: Any, *, rtol: float = 1e-8, atol: float = 1e-11, max_iter: int = 200_000,
                    stop: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Integrate dx/dt = f(x) for many trajectories (rows of x0) at once, each with its own adaptive step.

    Why not `scipy.integrate.solve_ivp`: a regime map integrates thousands of trajectories whose stiffness and
    decision times differ by orders of magnitude; one vectorised step for all active rows, each with its own
    step size and stopped as soon as `stop` certifies its outcome, is what makes a map take seconds (checked
    against solve_ivp in tests/landscape/test_landscape.py; `python benchmarks/bench_flow.py`: 66-72x faster than
    solve_ivp called per trajectory on 400 trajectories of the (w0, e0) grid, 21x on 100, fixed time 200, same
    tolerances, two runs on the project's shared 2-core CPU machine). `field(idx)` returns f for the rows idx (so per-row
    constants are gathered once per step); `stop(idx, x[idx])` returns the rows that are done. Returns the final
    states [n, dim] and times [n] (t_end, or the time a row was stopped).
    """
    n = x0.shape[0]
    x, t = np.array(x0, dtype=np.float64), np.zeros(n)
    t_end = np.broadcast_to(np.asarray(t_end, dtype=np.float64), (n,))
    dt = np.full(n, 1e-2)
    active = np.ones(n, bool) if stop is None else ~stop(np.arange(n), x)
    for _ in range(max_iter):
        idx = np.nonzero(active)[0]
        if idx.size == 0:
            break
        h = np.minimum(dt[idx], t_end[idx] - t[idx])
        x5, err_norm = _dp_step(field(idx), x[idx], h, rtol, atol)
        ok = err_norm <= 1.0
        acc = idx[ok]
        x[acc] = x5[ok]
        t[acc] += h[ok]
        factor = np.clip(0.9 * np.maximum(err_norm, 1e-10) ** -0.2, 0.2, 5.0)
        dt[idx] = np.minimum(h * factor, 50.0)
        if stop is not None:
            active[acc[stop(acc, x[acc])]] = False
        active[idx[t[idx] >= t_end[idx]]] = False
    return x, t


@dataclass
class _FlowResult:
    bigram: np.ndarray  # bool [n]
    decided: np.ndarray  # bool [n]: certified (False: fallback to the conserved rule at t_max)
    x: np.ndarray  # final states [n, dim]
    t: np.ndarray  # final times [n]


def _certify(xs, p, q, sign, k_eff, e_rate, h_pi, gap_tol):
    """(is_bigram, is_unigram) for states xs [m, 3] of the tied flow; see `_integrate_tied`."""
    e, w = xs[:, 0], xs[:, 1]
    loss = _tied_loss_np(xs, p, q, sign)
    is_bigram = loss < h_pi - gap_tol
    d = delta(w)
    f1, f0 = _tied_logits(xs, sign)
    g1, g0, g11, g00 = _logit_derivatives(f1, f0, p, q)
    db = np.abs(g1 + g0) / (g11 + g00)  # distance of b from its optimum (Newton step)
    big_a = sign * (0.5 + 2 * w * np.abs(w))
    attracting = k_eff * d > 0
    small_e = ((e**2 * (w**2 + 1e-300) < 1e-2 * d**2 * e_rate) & (e**2 < 1e-4)
               & (e**2 * np.abs(d) < 0.1 * np.abs(k_eff)))
    b_ok = db * np.abs(big_a * g11 - 0.5 * sign * g00) * 4 < np.abs(k_eff * d)
    is_unigram = ((k_eff > 0) & (w >= 0) & (np.abs(p + q - 1) >= _IID_TOL)) | (e == 0) | (
        attracting & small_e & b_ok)
    return is_bigram, is_unigram


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
    rate, h_pi = _losses_closed_form(p, q)
    gap_tol = 1e-3 * (h_pi - rate)
    k_eff = sign * p * q * (p + q - 1) / (p + q) ** 2  # the anti-tied model is the tied one with -kappa
    iid = np.abs(p + q - 1) < _IID_TOL
    bigram, decided = iid.copy(), iid.copy()  # i.i.d. chain: both solutions are the global minimum
    speed = np.stack([e_rate, np.ones(n), np.ones(n)], axis=1)

    def flow_field(idx):
        pi_, qi, si, sp = p[idx], q[idx], sign[idx], speed[idx]
        return lambda y: -sp * _tied_grad_np(y, pi_, qi, si)

    def stop(idx, xs):
        is_bigram, is_unigram = _certify(xs, p[idx], q[idx], sign[idx], k_eff[idx], e_rate[idx], h_pi[idx],
                                         gap_tol[idx])
        done = (is_bigram | is_unigram) & ~iid[idx]
        bigram[idx[done]] = is_bigram[done]
        decided[idx[done]] = True
        return done | iid[idx]

    x, t = _dormand_prince(flow_field, x0, t_max, rtol=rtol, atol=atol, max_iter=max_iter, stop=stop)
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


def _count(value: Any) -> int:
    """How many numbers an init argument holds (1 for a scalar or anything np.size cannot read)."""
    try:
        return max(int(np.size(value)), 1)
    except (TypeError, ValueError):
        return 1


def _trajectory_needs(a: Any) -> list[Need]:
    """A descent's trajectory: steps + 1 points of every init's state (float64; the plan of `planned`)."""
    inits = max(_count(a.get(name)) for name in ("e0", "w0", "b0"))
    return [Need.of("the trajectory", (size(a, "steps") + 1) * inits * 4 * 8, [("steps", size(a, "steps"))])]


def _grid_needs(a: Any) -> list[Need]:
    """A regime map's grid: its cells and each cell's state while the flows integrate (about 16 float64 each)."""
    fields = [(name, size(a, name)) for name in ("n", "n_w", "n_e") if name in a]
    cells = size(a, "n") ** 2 if "n" in a else size(a, "n_w") * size(a, "n_e")
    return [Need.of("the grid's flows", cells * 16 * 8, fields)]


def _check_descent(steps: Any, lr: Any) -> None:
    """Refuse a descent's budget unless steps is an integer >= 0 and lr > 0 (ValueError naming the value)."""
    check_int("steps", steps, minimum=0)
    if not float(lr) > 0:
        raise ValueError(f"lr must be > 0, got {lr!r}")


@planned(_trajectory_needs)
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
    _check_descent(steps, lr)
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


@planned(_trajectory_needs)
def adam_descent(e0: ArrayLike, w0: ArrayLike, b0: ArrayLike = 0.0, *, p: Real, q: Real, steps: int, lr: Real,
                 betas: tuple[float, float] = (0.9, 0.95), eps: float = 1e-8) -> Trajectory:
    """Adam on the canonical loss itself, from many (e0, w0, b0) at once (broadcast): the 3-parameter model
    trained by Adam instead of gradient descent.

    Adam's per-coordinate step (about lr whatever the gradient's size) is no reparametrisation of gradient flow,
    so its basins need not be `predict_outcome`'s: the experiment `reduction` compares them. It is torch's
    `torch.optim.Adam` (no weight decay) on `canonical_loss` with autograd, in float64; each init is its own
    run (Adam acts coordinate by coordinate).

    Args:
        e0, w0, b0: the inits (broadcast together).
        p, q: the chain.
        steps: Adam steps.
        lr: its learning rate.
        betas: its betas (the package's AdamW default).
        eps: its epsilon.

    Returns:
        A `Trajectory` with points [steps + 1, *inits, 3] (names e, w, b) and the loss [steps + 1, *inits].
    """
    p, q = _check_pq(p, q)
    _check_descent(steps, lr)
    x = torch.tensor(np.stack(np.broadcast_arrays(*(np.asarray(v, dtype=np.float64) for v in (e0, w0, b0))), -1),
                     requires_grad=True)
    opt = torch.optim.Adam([x], lr=float(lr), betas=tuple(float(b) for b in betas), eps=float(eps))
    points = [x.detach().clone()]
    for _ in range(steps):
        opt.zero_grad()
        canonical_loss(x[..., 0], x[..., 1], x[..., 2], p=p, q=q).sum().backward()
        opt.step()
        points.append(x.detach().clone())
    pts = torch.stack(points).numpy()
    return Trajectory(names=("e", "w", "b"), points=pts, loss=_tied_loss_np(pts, p, q))


# ---------------------------------------------------------------------------------------------------------------
# regime maps
# ---------------------------------------------------------------------------------------------------------------


@displayed(line=lambda r: f"{r.kind} map, {r.bigram.shape[0]} x {r.bigram.shape[1]} settings, "
                          f"{float(r.bigram.mean()):.0%} end at the global minimum")
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
    check_int(name, n, minimum=2)
    return n


@planned(_grid_needs)
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


@planned(_grid_needs)
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
