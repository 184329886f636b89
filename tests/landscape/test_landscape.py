"""Tests of markov_interp.landscape: the canonical (e, w, b) model against independent computations."""

import math

import numpy as np
import pytest
import torch

from markov_interp import landscape as L
from markov_interp import theory
from markov_interp.landscape import canonical as LC
from markov_interp.landscape import flow as LF
from markov_interp.report import figures
from markov_interp.sources import BinaryChain

CHAINS = [(0.5, 0.8), (0.2, 0.3), (0.9, 0.7), (0.1, 0.6), (0.7, 0.4)]


def _independent_loss(e: float, w: float, b: float, p: float, q: float) -> float:
    """Expected cross-entropy of the model's predictions over the chain, from the kernel and pi via `theory`."""
    chain = BinaryChain(p, q)
    pi = theory.stationary_distribution(chain.kernel)
    f = torch.tensor([b - e * e / 2, (0.5 + 2 * w * abs(w)) * e * e + b], dtype=torch.float64)  # after 0, 1
    p_one = torch.sigmoid(f)
    pred = torch.stack([1 - p_one, p_one], dim=1)  # [state, next_state]
    return float((pi * theory.cross_entropy(pred, chain.kernel)).sum())


# ----------------------------------------------------------------------------------------------- the loss


@pytest.mark.parametrize("p,q", CHAINS)
def test_loss_matches_the_expected_cross_entropy_over_the_chain(p, q):
    rng = np.random.default_rng(0)
    for e, w, b in rng.normal(0, 0.8, size=(20, 3)):  # moderate logits: the reference takes log of probabilities
        assert L.canonical_loss(e, w, b, p=p, q=q) == pytest.approx(_independent_loss(e, w, b, p, q), rel=1e-10)


def test_loss_broadcasts_and_keeps_autograd():
    e = torch.linspace(-1, 1, 5, dtype=torch.float64, requires_grad=True)
    loss = L.canonical_loss(e[:, None], torch.tensor([0.3, -0.9]), 0.1, p=0.5, q=0.8)
    assert isinstance(loss, torch.Tensor) and loss.shape == (5, 2) and loss.dtype == torch.float64
    loss.sum().backward()
    assert e.grad is not None and torch.isfinite(e.grad).all()
    grid = L.canonical_loss(np.zeros((3, 4)), np.ones(4), 0.0, p=0.5, q=0.8)
    assert isinstance(grid, np.ndarray) and grid.shape == (3, 4)
    assert isinstance(L.canonical_loss(0.1, 0.2, 0.3, p=0.5, q=0.8), float)


@pytest.mark.parametrize("p,q", CHAINS[:3])
def test_gradient_matches_autograd(p, q):
    rng = np.random.default_rng(1)
    for point in rng.normal(0, 1.0, size=(10, 3)):
        x = torch.tensor(point, requires_grad=True)
        L.canonical_loss(x[0], x[1], x[2], p=p, q=q).backward()
        np.testing.assert_allclose(L.canonical_gradient(*point, p=p, q=q), x.grad.numpy(), rtol=1e-10, atol=1e-13)
    for point in rng.normal(0, 1.0, size=(10, 4)):
        x = torch.tensor(point, requires_grad=True)
        L.untied_loss(*x, p=p, q=q).backward()
        np.testing.assert_allclose(L.untied_gradient(*point, p=p, q=q), x.grad.numpy(), rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("p,q", CHAINS[:3])
def test_hessian_matches_finite_differences_and_autograd(p, q):
    rng = np.random.default_rng(2)
    h = 1e-6
    for point in np.vstack([rng.normal(0, 1.0, size=(8, 3)), [[0.0, 0.4, L.unigram_bias(p, q)]]]):
        hess = L.canonical_hessian(*point, p=p, q=q)
        assert hess.shape == (3, 3)
        np.testing.assert_allclose(hess, hess.T, atol=1e-14)
        fd = np.stack([(L.canonical_gradient(*(point + h * np.eye(3)[i]), p=p, q=q)
                        - L.canonical_gradient(*(point - h * np.eye(3)[i]), p=p, q=q)) / (2 * h) for i in range(3)])
        np.testing.assert_allclose(hess, fd, atol=1e-7)
        auto = torch.autograd.functional.hessian(
            lambda x: L.canonical_loss(x[0], x[1], x[2], p=p, q=q), torch.tensor(point)).numpy()
        np.testing.assert_allclose(hess, auto, atol=1e-12)
    for point in rng.normal(0, 1.0, size=(5, 4)):
        auto = torch.autograd.functional.hessian(lambda x: L.untied_loss(*x, p=p, q=q), torch.tensor(point)).numpy()
        np.testing.assert_allclose(L.untied_hessian(*point, p=p, q=q), auto, atol=1e-12)


# ------------------------------------------------------------------------------------- reference losses


@pytest.mark.parametrize("p,q", CHAINS + [(0.5, 0.5)])
def test_unigram_line_sits_at_the_unigram_loss(p, q):
    b_star = L.unigram_bias(p, q)
    assert b_star == pytest.approx(math.log(p / q))
    h_pi = theory.unigram_loss(BinaryChain(p, q).kernel)
    for w in (-2.0, -0.5, 0.0, 0.7):
        assert L.canonical_loss(0.0, w, b_star, p=p, q=q) == pytest.approx(h_pi, rel=1e-12)
        assert L.optimal_bias(0.0, w, p=p, q=q) == pytest.approx(b_star, abs=1e-12)
        np.testing.assert_allclose(L.canonical_gradient(0.0, w, b_star, p=p, q=q), 0.0, atol=1e-15)
    assert L.canonical_loss(0.0, 0.3, b_star + 0.2, p=p, q=q) > h_pi


@pytest.mark.parametrize("p,q", CHAINS)
def test_global_minima_reach_the_entropy_rate(p, q):
    rate = theory.entropy_rate(BinaryChain(p, q).kernel)
    ws = np.linspace(-2.5, 2.5, 41)
    minima = L.bigram_minima(ws, p=p, q=q)
    assert minima.loss == pytest.approx(rate)
    ok = ~np.isnan(minima.e)
    # p + q < 1 needs w > -1/sqrt(2), p + q > 1 needs w < -1/sqrt(2)
    np.testing.assert_array_equal(ok, (ws > L.W_SADDLE) if p + q < 1 else (ws < L.W_SADDLE))
    np.testing.assert_allclose(L.canonical_loss(minima.e[ok], ws[ok], minima.b[ok], p=p, q=q), rate, rtol=1e-12)
    for e, w, b in zip(minima.e[ok][::5], ws[ok][::5], minima.b[ok][::5]):
        np.testing.assert_allclose(L.canonical_gradient(e, w, b, p=p, q=q), 0.0, atol=1e-12)
        assert np.linalg.eigvalsh(L.canonical_hessian(e, w, b, p=p, q=q)).min() > -1e-12
    # nothing beats the entropy rate
    rng = np.random.default_rng(3)
    pts = rng.normal(0, 2, size=(2000, 3))
    assert L.canonical_loss(pts[:, 0], pts[:, 1], pts[:, 2], p=p, q=q).min() >= rate - 1e-12


def test_reference_losses_come_from_theory_and_match_the_closed_forms():
    for p, q in CHAINS:
        refs = L.reference_losses(p, q)
        kernel = BinaryChain(p, q).kernel
        assert refs["entropy_rate"] == pytest.approx(theory.entropy_rate(kernel), rel=1e-14)
        assert refs["unigram_loss"] == pytest.approx(theory.unigram_loss(kernel), rel=1e-14)
        rate, h_pi = LC._losses_closed_form(np.float64(p), np.float64(q))
        assert rate == pytest.approx(refs["entropy_rate"], rel=1e-12)
        assert h_pi == pytest.approx(refs["unigram_loss"], rel=1e-12)
    assert L.reference_losses(0.2, 0.3)["entropy_rate"] == pytest.approx(0.5446, abs=1e-4)
    assert L.reference_losses(0.5, 0.8)["unigram_loss"] == pytest.approx(0.6663, abs=1e-4)


# ---------------------------------------------------------------------------------- the unigram points


@pytest.mark.parametrize("p,q", CHAINS)
def test_unigram_point_curvature_has_the_papers_sign(p, q):
    kappa = p * q * (p + q - 1) / (p + q) ** 2
    for w in (-2.0, -1.0, -0.6, 0.0, 0.5, 1.5):
        analysis = L.unigram_point_analysis(w, p=p, q=q)
        curv = 2 * kappa * (1 + 2 * w * abs(w))
        assert analysis.e_curvature == pytest.approx(curv)
        assert analysis.hessian[0, 0] == pytest.approx(curv, abs=1e-14)
        pi0, pi1 = q / (p + q), p / (p + q)
        np.testing.assert_allclose(analysis.eigenvalues, sorted([curv, 0.0, pi0 * pi1]), atol=1e-13)
        # the sign the notes state: p + q > 1: minimum for w > -1/sqrt(2), maximum below; p + q < 1: reverse
        above = w > L.W_SADDLE
        expected = "local_min" if (p + q > 1) == above else "local_max"
        assert analysis.kind == expected == L.classify_unigram_point(w, p=p, q=q)
        assert np.sign(curv) == (1 if expected == "local_min" else -1)
        # loss values along e (b optimal): H(pi) + kappa delta(w) e^2 to leading order; b fixed at b*: curv e^2/2
        eps = 1e-2
        assert analysis.profile_offsets[1] == pytest.approx(curv / 2 * eps**2, rel=0.05)
        assert np.all(np.sign(analysis.profile_offsets) == np.sign(curv))
        np.testing.assert_allclose(analysis.loss_along_e, curv / 2 * eps**2, rtol=0.05)


@pytest.mark.parametrize("p,q", [(0.5, 0.8), (0.2, 0.3)])
def test_unigram_point_is_a_saddle_at_minus_one_over_root_two(p, q):
    analysis = L.unigram_point_analysis(L.W_SADDLE, p=p, q=q)
    assert analysis.kind == "saddle"
    assert abs(analysis.e_curvature) < 1e-14
    # the loss along e is flat at optimal b (f1 = f0 for every e), and changes sign across w = -1/sqrt(2)
    assert abs(analysis.profile_offsets[1]) < 1e-13
    assert analysis.profile_offsets[0] * analysis.profile_offsets[2] < 0
    assert abs(L.profile_loss(1.5, L.W_SADDLE, p=p, q=q) - L.reference_losses(p, q)["unigram_loss"]) < 1e-12


def test_iid_chain_unigram_points_are_global_minima():
    p, q = 0.3, 0.7
    refs = L.reference_losses(p, q)
    assert refs["unigram_loss"] == pytest.approx(refs["entropy_rate"])
    for w in (-1.0, 0.0, 1.0):
        assert L.classify_unigram_point(w, p=p, q=q) == "local_min"
        assert L.unigram_e_curvature(w, p=p, q=q) == 0.0
    assert L.predict_outcome(0.1, 0.1, p=p, q=q) == "bigram"


# --------------------------------------------------------------------------- flow and predicted outcomes


def _profiled_descent(e, w, p, q, *, lr, steps):
    """Gradient descent in (e, w) with b put back at its optimum after every step (warm-started Newton)."""
    e, w = np.array(e, dtype=np.float64), np.array(w, dtype=np.float64)
    b = L.optimal_bias(e, w, p=p, q=q)
    for _ in range(steps):
        x = np.stack(np.broadcast_arrays(e, w, b), axis=-1)
        g = LC._tied_grad_np(x, p, q)
        e, w = e - lr * g[..., 0], w - lr * g[..., 1]
        for _ in range(2):
            f1, f0 = LC._tied_logits(np.stack(np.broadcast_arrays(e, w, b), axis=-1))
            g1, g0, g11, g00 = LC._logit_derivatives(f1, f0, p, q)
            b = b - (g1 + g0) / (g11 + g00)
    return e, w, b


def test_conserved_quantity_is_conserved_with_b_profiled_and_drifts_with_b_trained():
    p, q = 0.5, 0.8
    start = L.conserved_quantity(0.6, -0.4)
    e, w, b = _profiled_descent(0.6, -0.4, p, q, lr=2e-3, steps=3000)
    assert abs(L.canonical_gradient(e, w, b, p=p, q=q)[2]) < 1e-10
    assert abs(e - 0.6) > 0.05  # it moved
    assert L.conserved_quantity(e, w) == pytest.approx(start, abs=5e-3)
    trained = L.gradient_flow(0.6, -0.4, 2.0, p=p, q=q, steps=3000, lr=2e-3)
    assert abs(L.conserved_quantity(trained.e[-1], trained.w[-1]) - start) > 0.05


def test_gradient_flow_trajectory():
    traj = L.gradient_flow(0.1, -1.0, p=0.5, q=0.8, steps=3000, lr=0.5)
    assert traj.points.shape == (3001, 3) and traj.names == ("e", "w", "b")
    assert np.all(np.diff(traj.loss) <= 1e-15)
    assert traj.loss[-1] == pytest.approx(L.reference_losses(0.5, 0.8)["entropy_rate"], abs=1e-6)
    assert traj.e[0] == 0.1 and traj.w[0] == -1.0
    stuck = L.gradient_flow(0.1, 0.1, p=0.5, q=0.8, steps=3000, lr=0.5)
    assert stuck.loss[-1] == pytest.approx(L.reference_losses(0.5, 0.8)["unigram_loss"], abs=1e-6)


def test_hand_written_integrator_matches_solve_ivp():
    """The vectorised Dormand-Prince integrator (each trajectory its own step) against scipy's, to fixed times."""
    solve_ivp = pytest.importorskip("scipy.integrate").solve_ivp
    inits = np.array([[0.6, -0.4, 2.0], [0.1, -1.0, 0.0], [1.5, 0.3, -0.5], [0.3, -0.9, 1.0]])
    chains = np.array([[0.5, 0.8], [0.5, 0.8], [0.2, 0.3], [0.9, 0.7]])
    t_end = np.array([5.0, 40.0, 12.0, 80.0])  # different horizons: each row stops at its own time

    def field(idx):
        return lambda y: -LC._tied_grad_np(y, chains[idx, 0], chains[idx, 1])

    x, t = LF._dormand_prince(field, inits, t_end, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(t, t_end, rtol=0, atol=1e-12)
    for i in range(len(inits)):
        p, q = chains[i]
        ref = solve_ivp(lambda _, y: -LC._tied_grad_np(y, p, q), (0.0, t_end[i]), inits[i], method="DOP853",
                        rtol=1e-11, atol=1e-13)
        assert ref.success
        np.testing.assert_allclose(x[i], ref.y[:, -1], rtol=1e-7, atol=1e-8)
    # the state moved (the comparison is not between two unchanged inits)
    assert np.all(np.abs(x - inits).max(axis=1) > 1e-2)


def test_integrator_stops_rows_that_are_decided():
    """`stop` freezes a row where it is decided, while the others keep integrating."""
    inits = np.array([[0.6, -0.4, 2.0], [0.6, -0.4, 2.0]])

    def field(idx):
        return lambda y: -LC._tied_grad_np(y, 0.5, 0.8)

    def stop(idx, xs):
        return (idx == 0) & (xs[:, 2] < 1.5)  # row 0 stops once b has fallen below 1.5

    x, t = LF._dormand_prince(field, inits, 50.0, stop=stop)
    assert t[1] == pytest.approx(50.0) and 0 < t[0] < 50.0
    assert x[0, 2] < 1.5 and x[0, 2] > x[1, 2]


def _borderline(e, w, b0, p, q, step=0.03):
    """Whether the predicted outcome flips within +-step of (e, w): GD with a finite lr may differ there."""
    here = LF._predict_many(e, w, b0, p, q, tied=True, a0=None, method="auto", t_max=1e6, max_iter=200_000)
    flips = np.zeros(e.shape, bool)
    for de, dw in ((step, 0), (-step, 0), (0, step), (0, -step)):
        other = LF._predict_many(np.maximum(e + de, 1e-3), w + dw, b0, p, q, tied=True, a0=None, method="auto",
                                t_max=1e6, max_iter=200_000)
        flips |= other != here
    return flips


@pytest.mark.slow  # thousands of gradient-descent steps on a grid of inits
def test_predicted_outcome_agrees_with_gradient_descent_on_a_grid():
    ee, ww = np.meshgrid(np.linspace(0.1, 2.0, 7), np.linspace(-2.3, 0.9, 10))
    cases = [(0.5, 0.8, 0.0), (0.2, 0.3, 0.0), (0.9, 0.7, -1.0), (0.1, 0.6, 1.0)]
    e = np.concatenate([ee.ravel()] * len(cases))
    w = np.concatenate([ww.ravel()] * len(cases))
    p, q, b0 = (np.repeat([c[i] for c in cases], ee.size) for i in range(3))
    predicted = np.concatenate([LF._predict_many(ee.ravel(), ww.ravel(), c[2], c[0], c[1], tied=True, a0=None,
                                                method="auto", t_max=1e6, max_iter=200_000) for c in cases])
    descended = L.gradient_descent_outcomes(e, w, b0, p=p, q=q, steps=12_000, lr=0.05)
    assert 0.3 < predicted.mean() < 0.9  # both outcomes occur
    differ = np.nonzero(predicted != descended)[0]
    assert differ.size <= 0.05 * e.size
    for i in differ:  # finite-lr descent may only differ where the outcome flips within +-0.03 of the init
        assert _borderline(e[i:i + 1], w[i:i + 1], b0[i], p[i], q[i])[0], (e[i], w[i], b0[i], p[i], q[i])
    # the public scalar function says the same
    i = 5
    assert L.predict_outcome(e[i], w[i], b0[i], p=p[i], q=q[i]) == ("bigram" if predicted[i] else "unigram")


@pytest.mark.parametrize("p,q", [(0.5, 0.8), (0.2, 0.3)])
def test_conserved_rule_matches_descent_with_b_profiled(p, q):
    ee, ww = np.meshgrid(np.linspace(0.1, 1.9, 6), np.linspace(-2.0, 0.5, 9))
    rule = LF._predict_many(ee, ww, None, p, q, tied=True, a0=None, method="auto", t_max=1e6, max_iter=1)
    e, w, b = _profiled_descent(ee, ww, p, q, lr=0.1, steps=3000)
    refs = L.reference_losses(p, q)
    loss = L.canonical_loss(e, w, b, p=p, q=q)
    reached = loss < refs["unigram_loss"] - 1e-3 * (refs["unigram_loss"] - refs["entropy_rate"])
    margin = np.abs(L.conserved_quantity(ee, ww) + L.H_STAR)
    assert np.all((rule == reached) | (margin < 0.05))
    assert 0.2 < rule.mean() < 0.9


def test_small_inits_follow_p_plus_q():
    for p, q in CHAINS:
        expected = "unigram" if p + q > 1 else "bigram"
        assert L.predict_outcome(0.05, 0.05, p=p, q=q) == expected
        assert L.predict_outcome(0.05, 0.05, None, p=p, q=q) == expected
    # w0 < -1/sqrt(2) starts in the global basin when p + q > 1
    assert L.predict_outcome(0.05, -1.0, p=0.5, q=0.8) == "bigram"


# ------------------------------------------------------------------------------------------------- untied


@pytest.mark.parametrize("p,q", CHAINS)
def test_untied_unigram_points_are_saddles(p, q):
    b_star = L.unigram_bias(p, q)
    kappa = p * q * (p + q - 1) / (p + q) ** 2
    for w in np.linspace(-2.5, 2.5, 21):
        np.testing.assert_allclose(L.untied_gradient(0.0, 0.0, w, b_star, p=p, q=q), 0.0, atol=1e-15)
        eig = np.linalg.eigvalsh(L.untied_hessian(0.0, 0.0, w, b_star, p=p, q=q))
        kd = abs(kappa * (1 + 2 * w * abs(w)))
        assert eig.min() == pytest.approx(-kd, abs=1e-12) and eig.min() < 0
    # cubic saddle at w = -1/sqrt(2): the loss goes below H(pi) nearby
    h_pi = L.reference_losses(p, q)["unigram_loss"]
    offsets = [L.untied_loss(s * 0.05, 0.05, L.W_SADDLE + t * 0.05, b_star, p=p, q=q) - h_pi
               for s in (-1, 1) for t in (-1, 1)]
    assert min(offsets) < 0 < max(offsets)


@pytest.mark.slow  # thousands of gradient-descent steps on a grid of inits
def test_untied_has_no_bad_local_minimum_from_random_inits():
    rng = np.random.default_rng(4)
    n = 60
    cases = [(0.5, 0.8), (0.2, 0.3), (0.9, 0.9)]
    p, q = (np.repeat([c[i] for c in cases], n) for i in range(2))
    e0, a0, w0 = rng.normal(0, 1, size=(3, p.size))
    w0 = 1.5 * w0
    assert L.gradient_descent_outcomes(e0, w0, 0.0, p=p, q=q, steps=8_000, lr=0.2, tied=False, a0=a0).all()
    # the same inits with tying get stuck in a good fraction of the p + q > 1 runs
    tied = L.gradient_descent_outcomes(np.abs(e0[:n]), w0[:n], 0.0, p=p[:n], q=q[:n], steps=8_000, lr=0.2)
    assert tied.mean() < 0.8
    for i in range(5):
        assert L.predict_outcome(e0[i], w0[i], p=p[i], q=q[i], tied=False, a0=a0[i]) == "bigram"


@pytest.mark.slow  # thousands of gradient-descent steps on a grid of inits
def test_untied_conserves_balance_and_symmetric_inits_match_descent():
    traj = L.gradient_flow(0.3, -0.5, 0.0, p=0.5, q=0.8, steps=2000, lr=1e-3, tied=False, a0=0.1)
    assert traj.points.shape == (2001, 4)
    np.testing.assert_allclose(traj.e**2 - traj.a**2, 0.3**2 - 0.1**2, rtol=1e-5)
    ee, ww = np.meshgrid(np.linspace(0.2, 1.8, 5), np.linspace(-2.0, 0.6, 6))
    for sign in (1.0, -1.0):
        pred = LF._predict_many(ee, ww, 0.0, 0.2, 0.3, tied=False, a0=sign * ee, method="auto", t_max=1e6,
                               max_iter=200_000)
        gd = L.gradient_descent_outcomes(ee, ww, 0.0, p=0.2, q=0.3, steps=8_000, lr=0.05, tied=False, a0=sign * ee)
        assert (pred == gd).mean() >= 0.95


# -------------------------------------------------------------------------------------------- regime maps


def test_regime_map_pq_follows_the_diagonal():
    tied = L.regime_map_pq(e0=0.1, w0=0.1, n=12)
    pp, qq = np.meshgrid(tied.x, tied.y)
    assert tied.bigram.shape == (12, 12) and tied.kind == "pq"
    off = np.abs(pp + qq - 1) > 1e-9
    np.testing.assert_array_equal(tied.bigram[off], (pp + qq < 1)[off])
    untied = L.regime_map_pq(e0=0.1, w0=0.1, n=12, tied=False)
    assert untied.bigram.all()
    fig = figures.regime_map_pq_figure(tied)
    ax = fig.axes[0]
    assert any(np.allclose(line.get_xdata(), [0, 1]) and np.allclose(line.get_ydata(), [1, 0]) for line in ax.lines)
    assert tied.to_dict()["bigram"][0][0] is True


def test_regime_map_init_and_figures():
    rmap = L.regime_map_init(p=0.5, q=0.8, n_w=21, n_e=12)
    assert rmap.bigram.shape == (12, 21)
    ww, ee = np.meshgrid(rmap.x, rmap.y)
    rule = LF._predict_many(ee, ww, None, 0.5, 0.8, tied=True, a0=None, method="auto", t_max=1e6, max_iter=1)
    assert (rule == rmap.bigram).mean() > 0.9  # b trained from 0 moves the boundary only a little
    assert not rmap.bigram[ww > 0].any()  # w0 > 0 with p + q > 1: never learns the kernel
    assert rmap.bigram[ww < -1].all()
    untied = L.regime_map_init(p=0.5, q=0.8, n_w=9, n_e=5, tied=False)
    assert untied.bigram.all()
    for fig in (figures.regime_map_init_figure(rmap), figures.regime_map_init_figure(untied),
                figures.landscape_figure(p=0.5, q=0.8, n=30,
                                 trajectory=L.gradient_flow(0.3, -0.6, p=0.5, q=0.8, steps=50, lr=0.3))):
        assert len(fig.axes) >= 1
    with pytest.raises(ValueError, match="kind"):
        figures.regime_map_pq_figure(rmap)


def test_invalid_arguments_raise():
    with pytest.raises(ValueError, match="p must be"):
        L.canonical_loss(0.1, 0.1, 0.0, p=1.0, q=0.5)
    with pytest.raises(ValueError, match="q must be"):
        L.predict_outcome(0.1, 0.1, p=0.5, q=0.0)
    with pytest.raises(ValueError, match="method"):
        L.predict_outcome(0.1, 0.1, p=0.5, q=0.5, method="magic")
    with pytest.raises(ValueError, match="b0"):
        L.predict_outcome(0.1, 0.1, None, p=0.5, q=0.8, method="flow")
    with pytest.raises(ValueError, match="steps"):
        L.gradient_flow(0.1, 0.1, p=0.5, q=0.8, steps=-1, lr=0.1)
    with pytest.raises(ValueError, match="n must be"):
        L.regime_map_pq(n=1)


# ------------------------------------------------------------------------------------ the bridge to models


@pytest.mark.parametrize("e,w,b", [(0.1, 0.1, 0.0), (0.7, -0.4, 0.2), (1.3, -1.2, -0.5)])
def test_canonical_coordinates_recover_the_canonical_init(e, w, b):
    models = pytest.importorskip("markov_interp.models")
    cfg = models.ModelConfig(init="canonical", canonical_e=e, canonical_w=w, canonical_b=b, act_fn="relu",
                             normalization=None)
    model = models.build(cfg, seed=3)
    got = L.canonical_coordinates(model)
    np.testing.assert_allclose(got, (e, w, b), atol=1e-6)
    np.testing.assert_allclose(L.canonical_coordinates(models.state_dict_for_save(model)), got)
    # the model's logits are the reduced model's at every position
    tokens = torch.tensor([[0, 1, 1, 0, 1, 0, 0, 1, 1, 1]])
    with torch.no_grad():
        logits = model(tokens)
    gap = (logits[0, :, 1] - logits[0, :, 0]).double().numpy()
    f1 = (0.5 + 2 * w * abs(w)) * e * e + b
    f0 = b - e * e / 2
    np.testing.assert_allclose(gap, np.where(tokens[0].numpy() == 1, f1, f0), atol=1e-5)


def test_canonical_projection_reads_hooked_names_and_untied_models():
    models = pytest.importorskip("markov_interp.models")
    cfg = models.ModelConfig(init="canonical", canonical_e=0.5, canonical_w=-0.3, canonical_b=0.1,
                             tie_weights=False)
    state = models.state_dict_for_save(models.build(cfg, seed=0))  # bridge names, whatever TL is installed
    state["unembed.weight"][1] *= -2.0  # W_U[0] = 0, so W_U[1] - W_U[0] = -2 e u: a = -2 e
    proj = L.canonical_projection(state)
    assert not proj.tied and proj.a == pytest.approx(-2 * proj.e, rel=1e-6)
    assert proj.e == pytest.approx(0.5, rel=1e-6) and proj.w == pytest.approx(-0.3, rel=1e-6)
    hooked = {"embed.W_E": state["embed.weight"], "unembed.W_U": state["unembed.weight"].T,
              "unembed.b_U": state["unembed.bias"], "blocks.0.mlp.W_in": state["blocks.0.mlp.in.weight"].T,
              "blocks.0.mlp.W_out": state["blocks.0.mlp.out.weight"].T}
    again = L.canonical_projection(hooked)
    assert (again.e, again.w, again.b, again.a) == pytest.approx((proj.e, proj.w, proj.b, proj.a))
    traj = L.coordinates_trajectory([state, state], p=0.5, q=0.8)
    assert traj.points.shape == (2, 3) and np.isfinite(traj.loss).all()
    with pytest.raises(ValueError, match="single-layer"):
        L.canonical_projection({**state, "blocks.1.mlp.in.weight": state["blocks.0.mlp.in.weight"]})
    with pytest.raises(ValueError, match="binary"):
        L.canonical_projection({**state, "embed.weight": torch.randn(3, 8)})


# ----------------------------------------------------------------------------------------- the package


def test_public_api_is_reexported_and_nothing_draws():
    import markov_interp.landscape.canonical as canonical
    import markov_interp.landscape.flow as flow
    import markov_interp.landscape.projection as projection

    for name in L.__all__:
        assert hasattr(L, name), name
    defined = {n for m in (canonical, flow, projection) for n in dir(m) if not n.startswith("_")
               and getattr(getattr(m, n), "__module__", m.__name__) == m.__name__ and callable(getattr(m, n))}
    assert defined <= set(L.__all__), defined - set(L.__all__)
    assert not [n for n in L.__all__ if n.startswith("plot")]  # figures live in report.figures


def test_only_projection_may_read_models():
    import ast
    from pathlib import Path

    folder = Path(L.__file__).parent
    for path in folder.glob("*.py"):
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                imported.add(node.module or "")
        assert not any(m.startswith(("matplotlib", "markov_interp.report")) for m in imported), path.name
        if path.name != "projection.py":
            assert not any(m.startswith(("transformer_lens", "markov_interp.models")) for m in imported), path.name

