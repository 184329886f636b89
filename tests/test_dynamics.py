"""dynamics: escape times with censoring, Kaplan–Meier, intervals — against hand computations and simulation."""

import math
import random

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from markov_interp import dynamics
from markov_interp.dynamics import (EscapeTime, escape_time, kaplan_meier, median_escape, summarise,
                                    wilson_interval)

STEPS = [10, 20, 30, 40, 50, 60]
PLATEAU = [0.05] * 6


def test_escape_on_a_clean_drop():
    excess = [0.05, 0.049, 0.03, 0.01, 0.002, 0.0]
    assert escape_time(STEPS, excess, PLATEAU) == EscapeTime(step=40, censored=False)


def test_never_escaping_is_censored_at_the_budget():
    e = escape_time(STEPS, [0.05] * 6, PLATEAU)
    assert e.censored and e.step == 60 and not e.escaped


def test_noisy_crossing_counts_only_the_crossing_that_stays():
    # dips below half the plateau's excess at 20, comes back at 30, leaves for good at 50
    excess = [0.05, 0.02, 0.04, 0.03, 0.01, 0.005]
    assert escape_time(STEPS, excess, PLATEAU) == EscapeTime(step=50, censored=False)


def test_a_dip_at_the_last_evaluation_counts_and_nan_never_does():
    assert escape_time(STEPS, [0.05] * 5 + [0.0], PLATEAU).step == 60
    assert escape_time(STEPS, [0.05] * 5 + [float("nan")], PLATEAU).censored


def test_escape_uses_the_paired_plateau_of_each_evaluation():
    # the same excess is an escape against a large plateau gap and not against a small one
    assert not escape_time([1, 2], [0.01, 0.01], [0.05, 0.05]).censored
    assert escape_time([1, 2], [0.01, 0.01], [0.015, 0.015]).censored


@pytest.mark.parametrize("args, match", [
    (([1, 2], [0.1], [0.1, 0.1]), "one length"),
    (([2, 1], [0.1, 0.1], [0.1, 0.1]), "increase"),
    (([1, 2], [0.1, 0.1], [0.1, 0.0]), "positive"),
    (([], [], []), "non-empty"),
])
def test_escape_time_rejects_bad_curves(args, match):
    with pytest.raises(ValueError, match=match):
        escape_time(*args)


def test_kaplan_meier_hand_computed_case():
    # times 1, 2, 2+, 3, 4+: S = 4/5, then 4/5 * 3/4, then 3/5 * 1/2 (the censored 2 is at risk at 2)
    km = kaplan_meier([EscapeTime(1, False), EscapeTime(2, False), EscapeTime(2, True),
                       EscapeTime(3, False), EscapeTime(4, True)])
    assert km.times == (1, 2, 3)
    assert km.at_risk == (5, 4, 2) and km.events == (1, 1, 1)
    assert km.survival == pytest.approx((0.8, 0.6, 0.3))
    # Greenwood at t = 3: sum d / (n (n - d)) = 1/20 + 1/12 + 1/2; log-log band by hand
    v = 1 / 20 + 1 / 12 + 1 / 2
    half = 1.959963984540054 * math.sqrt(v) / abs(math.log(0.3))
    assert km.lower[-1] == pytest.approx(0.3 ** math.exp(half))
    assert km.upper[-1] == pytest.approx(0.3 ** math.exp(-half))
    assert km.at(0) == 1.0 and km.at(2.5) == pytest.approx(0.6) and km.at(100) == pytest.approx(0.3)
    assert median_escape(km)[0] == 3


@given(st.lists(st.integers(1, 30), min_size=1, max_size=25))
@settings(max_examples=60, deadline=None)
def test_kaplan_meier_without_censoring_is_the_empirical_survival(times):
    km = kaplan_meier([EscapeTime(t, False) for t in times])
    for t in range(0, 32):
        assert km.at(t) == pytest.approx(sum(x > t for x in times) / len(times), abs=1e-12)
    for lo, s, hi in zip(km.lower, km.survival, km.upper):
        assert 0.0 <= lo <= s + 1e-12 and s - 1e-12 <= hi <= 1.0


def _wilson_by_bisection(k: int, n: int, z: float) -> tuple[float, float]:
    # the Wilson bounds are the p with |k/n - p| = z sqrt(p (1 - p) / n): solve each side independently
    def gap(p: float) -> float:
        return abs(k / n - p) - z * math.sqrt(p * (1 - p) / n)

    def root(a: float, b: float) -> float:
        for _ in range(200):
            m = (a + b) / 2
            if (gap(a) > 0) == (gap(m) > 0):
                a = m
            else:
                b = m
        return (a + b) / 2

    phat = k / n
    lo = 0.0 if k == 0 else root(0.0, phat)
    hi = 1.0 if k == n else root(phat, 1.0)
    return lo, hi


@pytest.mark.parametrize("k, n", [(0, 10), (1, 10), (5, 20), (6, 8), (8, 8), (3, 16)])
def test_wilson_interval_solves_its_defining_equation(k, n):
    assert wilson_interval(k, n) == pytest.approx(_wilson_by_bisection(k, n, 1.959963984540054), abs=1e-9)


def test_wilson_interval_known_value_and_bad_input():
    assert wilson_interval(0, 10)[1] == pytest.approx(0.2775, abs=1e-4)
    with pytest.raises(ValueError, match="successes"):
        wilson_interval(11, 10)
    with pytest.raises(ValueError, match="confidence"):
        wilson_interval(1, 10, confidence=1.5)


def test_median_interval_covers_the_true_median_in_simulation():
    # exponential escape times (median 100 * ln 2), censored at a budget of 150, 20 seeds per condition
    rng = random.Random(0)
    true_median = 100 * math.log(2)
    covered, trials = 0, 400
    for _ in range(trials):
        draws = [rng.expovariate(1 / 100) for _ in range(20)]
        escapes = [EscapeTime(150, True) if d > 150 else EscapeTime(math.ceil(d), False) for d in draws]
        _, lo, hi = median_escape(kaplan_meier(escapes))
        covered += (lo is not None and lo <= true_median + 1) and (hi is None or hi >= true_median)
    assert 0.88 <= covered / trials <= 0.995


def test_summarise_states_censoring_and_budget():
    escapes = [EscapeTime(130, False), EscapeTime(90, False), EscapeTime(250, True), EscapeTime(240, False),
               EscapeTime(250, True)]
    s = summarise(escapes)
    assert (s.n, s.n_censored, s.budget) == (5, 2, 250)
    assert s.censored_fraction == pytest.approx(0.4)
    assert s.censored_interval == pytest.approx(wilson_interval(2, 5))
    assert s.median == 240
    assert "censored at 250: 2/5" in s.describe()


# ------------------------------------------------------------------------------------------ two conditions
def _escapes(steps, censored):
    return [dynamics.EscapeTime(int(s), bool(c)) for s, c in zip(steps, censored)]


def test_logrank_hand_computed_case():
    # a: events at 1 and 3; b: an event at 2, censored at 3. At t=1: n1=2, n2=2, d=1 -> O-E = 1 - 1/2,
    # V = 1 * 1/2 * 1/2 * 3/3 = 1/4. At t=2: n1=1, n2=2, d=1 (in b) -> O-E = -1/3, V = 1/3 * 2/3 * 1 = 2/9.
    # At t=3 (b's censored run is still at risk): n1=1, n2=1, d=1 (in a) -> O-E = 1/2, V = 1/2 * 1/2 * 1/1.
    a = _escapes([1, 3], [False, False])
    b = _escapes([2, 3], [False, True])
    chi2, p = dynamics.logrank_test(a, b)
    o_minus_e, var = 0.5 - 1 / 3 + 0.5, 0.25 + 2 / 9 + 0.25
    assert chi2 == pytest.approx(o_minus_e ** 2 / var, rel=1e-12)
    assert p == pytest.approx(math.erfc(math.sqrt(chi2 / 2)), rel=1e-12)


@pytest.mark.parametrize("trial", range(4))
def test_logrank_matches_scipy_with_ties_and_censoring(trial):
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(trial)
    a = _escapes(rng.integers(1, 10, 12), rng.random(12) < 0.3)
    b = _escapes(rng.integers(3, 14, 15), rng.random(15) < 0.3)

    def data(x):
        return stats.CensoredData(uncensored=[e.step for e in x if not e.censored],
                                  right=[e.step for e in x if e.censored])

    ref = stats.logrank(data(a), data(b))
    chi2, p = dynamics.logrank_test(a, b)
    assert chi2 == pytest.approx(ref.statistic ** 2, rel=1e-9)
    assert p == pytest.approx(ref.pvalue, rel=1e-9)


def test_logrank_without_escapes_finds_nothing_and_needs_both_groups():
    never = _escapes([100] * 4, [True] * 4)
    assert dynamics.logrank_test(never, never) == (0.0, 1.0)
    with pytest.raises(ValueError, match="both groups"):
        dynamics.logrank_test(never, [])


def test_compare_separates_shifted_conditions_and_not_equal_ones():
    rng = np.random.default_rng(1)
    early = _escapes(rng.integers(50, 100, 16), [False] * 16)
    late = _escapes(rng.integers(150, 200, 16), [False] * 16)
    shifted = dynamics.compare(early, late, n_boot=400)
    assert shifted.p_value < 1e-4
    lo, hi = shifted.difference_interval
    assert lo is not None and hi is not None and 0 < lo <= shifted.median_difference <= hi
    same = dynamics.compare(early, list(reversed(early)), n_boot=400)
    assert same.p_value == pytest.approx(1.0) and same.median_difference == 0
    assert "log-rank" in shifted.describe(("free", "clamped"))


def test_compare_bounds_are_open_when_a_median_lies_beyond_the_budget():
    escaped = _escapes([10, 20, 30, 40], [False] * 4)
    stuck = _escapes([100] * 4, [True] * 4)
    c = dynamics.compare(escaped, stuck, budget=100, n_boot=200)
    assert c.median_difference is None and c.difference_interval[1] is None
    assert c.p_value < 0.05
