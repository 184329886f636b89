"""dynamics: crossings at several lines with interval censoring, survival over seeds (Kaplan-Meier on a grid,
Turnbull's NPMLE otherwise), median curves and comparisons, checked against scipy, hand computations, brute
force and simulation."""

import math
import random
import warnings

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from markov_interp import dynamics
from markov_interp.dynamics import ExcessCurve, StepInterval, crossing, crossings, survival

stats = pytest.importorskip("scipy.stats")
Z95 = 1.959963984540054


def curve(steps, left, plateau=0.05):
    """An excess curve whose fraction left is `left` (plateau excess `plateau` at every evaluation)."""
    return ExcessCurve(tuple(steps), tuple(float(x) * plateau for x in left), (plateau,) * len(steps))


# ------------------------------------------------------------------------------------------------ one run
def test_step_interval_reads_as_what_is_known():
    assert (str(StepInterval(170, 180)), str(StepInterval(179, 180)), str(StepInterval(490, None))) == (
        "(170, 180]", "180", "> 490")
    seen, censored = StepInterval(20, 30), StepInterval(40, None)
    assert (seen.step, seen.censored, seen.escaped) == (30, False, True)
    assert (censored.step, censored.censored, censored.escaped) == (40, True, False)
    with pytest.raises(ValueError, match="by > after"):
        StepInterval(30, 30)


STEPS = (10, 20, 30, 40, 50, 60)


def test_a_clean_drop_crosses_every_line_in_turn():
    c = curve(STEPS, [1.0, 0.95, 0.8, 0.6, 0.3, 0.1])
    got = crossings(c, dwell=1)
    assert got == {0.9: StepInterval(20, 30), 0.75: StepInterval(30, 40), 0.5: StepInterval(40, 50),
                   0.25: StepInterval(50, 60)}
    # with a dwell of 2 the crossing at the last evaluation cannot be confirmed: censored after the 5th
    assert crossings(c, dwell=2)[0.25] == StepInterval(50, None)
    assert crossings(c, dwell=2)[0.5] == StepInterval(40, 50)


def test_a_dip_is_not_a_crossing_under_a_dwell_and_nan_is_above_every_line():
    c = curve(STEPS, [1.0, 0.4, 0.9, 0.4, 0.3, 0.2])
    assert crossing(c, 0.5, dwell=1) == StepInterval(10, 20)  # first passage
    assert crossing(c, 0.5, dwell=2) == StepInterval(30, 40)  # the dip at 20 comes back up at 30
    assert crossing(c, 0.5, dwell=3) == StepInterval(30, 40)
    assert crossing(c, 0.5, dwell=4) == StepInterval(30, None)  # the last window starting at 30 fails
    nan = curve(STEPS, [1.0, 0.4, float("nan"), 0.4, 0.4, 0.4])
    assert crossing(nan, 0.5, dwell=2) == StepInterval(30, 40)
    assert crossing(curve((10, 20), [0.1, 0.1]), 0.5, dwell=3) == StepInterval(0, None)  # too short to tell


def test_the_first_evaluation_below_the_line_crossed_after_step_zero():
    assert crossing(curve((5, 10), [0.1, 0.1]), 0.5, dwell=2) == StepInterval(0, 5)


def test_the_line_is_relative_to_the_paired_plateau_of_each_evaluation():
    big = ExcessCurve((1, 2), (0.01, 0.01), (0.05, 0.05))
    small = ExcessCurve((1, 2), (0.01, 0.01), (0.015, 0.015))
    assert not crossing(big, 0.5, dwell=1).censored and crossing(small, 0.5, dwell=1).censored


@pytest.mark.parametrize("args, match", [
    (((1, 2), (0.1,), (0.1, 0.1)), "one length"),
    (((2, 1), (0.1, 0.1), (0.1, 0.1)), "increase"),
    (((1, 2), (0.1, 0.1), (0.1, 0.0)), "positive"),
    (((1, 2), (0.1, 0.1), (0.1, math.nan)), "positive"),
    (((), (), ()), "non-empty"),
])
def test_excess_curves_refuse_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        ExcessCurve(*args)


@pytest.mark.parametrize("kwargs, match", [({"fraction": 1.0}, "fraction"), ({"fraction": 0.0}, "fraction"),
                                           ({"fraction": 0.5, "dwell": 0}, "dwell"),
                                           ({"fraction": 0.5, "dwell": True}, "dwell")])
def test_crossing_refuses_bad_lines_and_dwells(kwargs, match):
    with pytest.raises(ValueError, match=match):
        crossing(curve(STEPS, [1.0] * 6), **kwargs)


lefts = st.lists(st.one_of(st.floats(0.0, 1.2), st.just(math.nan)), min_size=1, max_size=30)


@given(lefts, st.integers(1, 4), st.data())
@settings(max_examples=150, deadline=None)
def test_a_shorter_budget_never_sees_a_crossing_the_longer_one_does_not(left, dwell, data):
    # the rule gets no easier near the end of a budget: a prefix either finds the full run's crossing or is
    # censored before it
    steps = [10 * (i + 1) for i in range(len(left))]
    full = crossing(curve(steps, left), 0.5, dwell=dwell)
    cut = data.draw(st.integers(1, len(left)))
    short = crossing(curve(steps[:cut], left[:cut]), 0.5, dwell=dwell)
    if short.escaped:
        assert short == full
    else:
        assert full.censored or full.by > short.after
        assert full.step >= short.after


@given(lefts, st.integers(1, 4))
@settings(max_examples=150, deadline=None)
def test_lower_lines_and_longer_dwells_are_crossed_no_earlier(left, dwell):
    c = curve([10 * (i + 1) for i in range(len(left))], left)

    def when(x):
        return math.inf if x.censored else x.by

    found = crossings(c, dwell=dwell)
    assert [when(found[f]) for f in dynamics.FRACTIONS] == sorted(when(found[f]) for f in dynamics.FRACTIONS)
    assert when(crossing(c, 0.5, dwell=dwell)) <= when(crossing(c, 0.5, dwell=dwell + 1))
    for x in found.values():  # an interval between consecutive evaluations, or censored at one
        assert x.after in (0, *c.steps) and (x.by is None or c.steps.index(x.by) == (
            0 if x.after == 0 else c.steps.index(x.after) + 1))


def test_metrics_rows_give_the_curve_and_its_crossings():
    rows = [{"step": s, "train_loss": 0.7, "eval_loss": 0.62 + d, "eval_true_loss": 0.62, "eval_plateau_loss": 0.67}
            for s, d in ((10, 0.05), (20, 0.04), (30, 0.001), (40, 0.0))]
    run = dynamics.from_metrics(rows + [{"step": 40, "train_loss": 0.6}])
    assert run.curve.steps == (10, 20, 30, 40) and run.curve.left[1] == pytest.approx(0.8)
    assert run.escape == StepInterval(20, 30) == dynamics.escape_from_metrics(rows)
    assert run.crossings[0.9] == StepInterval(10, 20) and run.dwell == dynamics.DWELL
    assert dynamics.from_metrics([{k: v for k, v in r.items() if k != "eval_true_loss"} for r in rows]) is None
    same = [{**r, "eval_plateau_loss": r["eval_true_loss"]} for r in rows]  # p + q = 1: nothing to escape from
    assert dynamics.from_metrics(same) is None
    with pytest.raises(ValueError, match="escape line"):
        dynamics.run_dynamics(run.curve, fractions=(0.9,))


def test_crossings_round_trip_through_json():
    run = dynamics.run_dynamics(curve(STEPS, [1.0, 0.8, 0.6, 0.4, 0.2, 0.2]), dwell=2)
    data = run.to_json()
    assert data["dwell"] == 2 and data["0.5"] == [30, 40] and data["0.25"] == [40, 50]
    assert dynamics.crossings_from_json(data) == (run.crossings, 2)
    with pytest.raises(ValueError, match="crossings record"):
        dynamics.crossings_from_json({"0.5": [10, 20]})


def test_a_recorded_escape_step_reads_as_its_grid_interval():
    grid = [1, 2, 4, 13, 20, 31, 40, 60]  # log-spaced early evaluations, then a cadence (as `evaluation_steps`)
    assert dynamics.recorded_escape(31, False, grid) == StepInterval(20, 31)
    assert dynamics.recorded_escape(1, False, grid) == StepInterval(0, 1)
    assert dynamics.recorded_escape(60, True, grid) == StepInterval(60, None)
    assert dynamics.recorded_escape(31, False) == StepInterval(30, 31)  # no grid: the exact step
    with pytest.raises(ValueError, match="must be one of the run's evaluations, got 30"):
        dynamics.recorded_escape(30, False, grid)
    # a rule's escape on a grid, recorded as its step: the reading gives back the crossing it was
    run = dynamics.run_dynamics(curve(STEPS, [1.0, 0.8, 0.6, 0.4, 0.2, 0.2]), dwell=2)
    assert dynamics.recorded_escape(run.escape.by, False, STEPS) == run.escape


# --------------------------------------------------------------------------------------------- over seeds
def _grid_sample(rng, n, grid=10, budget=150, scale=60.0):
    """Exponential crossing times seen on an evaluation grid, censored at the budget."""
    out = []
    for _ in range(n):
        t = rng.expovariate(1 / scale)
        by = grid * math.ceil(t / grid)
        out.append(StepInterval(budget, None) if by > budget else StepInterval(by - grid, by))
    return out


def _scipy_sf(found):
    data = stats.CensoredData(uncensored=[x.by for x in found if x.escaped],
                              right=[x.after for x in found if x.censored])
    return stats.ecdf(data).sf


def test_kaplan_meier_hand_computed_case():
    # exact steps 1, 2, 2+, 3, 4+: S = 4/5, then 4/5 * 3/4, then 3/5 * 1/2 (the censored 2 is at risk at 2)
    s = survival([StepInterval(0, 1), StepInterval(1, 2), StepInterval(2, None), StepInterval(2, 3),
                  StepInterval(4, None)])
    assert s.aligned and s.times == (1, 2, 3) and s.survival == pytest.approx((0.8, 0.6, 0.3))
    v = 1 / 20 + 1 / 12 + 1 / 2  # Greenwood's sum at 3
    half = Z95 * math.sqrt(v) / abs(math.log(0.3))
    assert s.lower[-1] == pytest.approx(0.3 ** math.exp(half)) and s.upper[-1] == pytest.approx(0.3 ** math.exp(-half))
    assert s.at(0) == 1.0 and s.at(2.5) == pytest.approx(0.6) and s.at(100) == pytest.approx(0.3)
    assert (s.n, s.n_censored, s.last) == (5, 2, 4)
    assert s.median().estimate == StepInterval(2, 3)


@pytest.mark.parametrize("trial", range(6))
def test_survival_on_a_grid_is_scipys_kaplan_meier_with_its_log_log_band(trial):
    found = _grid_sample(random.Random(trial), 12 + trial)
    s = survival(found)
    sf = _scipy_sf(found)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # scipy: the band is undefined where S = 0
        band = sf.confidence_interval(method="log-log")
    events = np.isin(sf.quantiles, s.times)
    assert s.aligned and list(sf.quantiles[events]) == list(s.times)
    assert s.survival == pytest.approx(tuple(sf.probabilities[events]), abs=1e-12)
    assert s.lower == pytest.approx(tuple(band.low.probabilities[events]), abs=1e-9, nan_ok=True)
    assert s.upper == pytest.approx(tuple(band.high.probabilities[events]), abs=1e-9, nan_ok=True)
    # the median and its interval read off scipy's curve and band: first step at or below 1/2
    q = s.median()
    times, sv, lo, hi = sf.quantiles[events], sf.probabilities[events], band.low.probabilities[events], \
        band.high.probabilities[events]
    first = (lambda mask: next((int(t) for t, m in zip(times, mask) if m), None))
    assert q.by == first(sv <= 0.5)
    assert q.interval.by == first(hi <= 0.5)  # nan (S = 0) is not at or below: "not reached"
    lo_by = first(~(lo > 0.5))
    assert q.interval.after == (s.last if lo_by is None else lo_by - 10)


def test_a_curve_that_reaches_zero_leaves_the_upper_bound_not_reached():
    # every run escapes, at 10, 20, ..., 60: S reaches 0, where the band is undefined (nan, as scipy's), so the
    # median's upper bound is not the last observation
    s = survival([StepInterval(t - 10, t) for t in (10, 20, 30, 40, 50, 60)])
    assert s.survival[-1] == 0.0 and math.isnan(s.upper[-1]) and math.isnan(s.lower[-1])
    q = s.median()
    assert q.estimate == StepInterval(20, 30)
    assert max(s.upper[:-1]) > 0.5 and q.interval.by is None and q.interval.after == 0
    assert q.describe() == "(20, 30], 95% CI (0, not reached)"


def test_no_interval_from_fewer_than_five_runs():
    few = [StepInterval(170, 180), StepInterval(200, 210), StepInterval(230, 240)]
    s = survival(few)
    q = s.median()
    assert s.lower is None and q.interval is None and q.estimate == StepInterval(200, 210)
    assert "3 runs" in q.note and q.describe() == "(200, 210] (no interval: 3 runs: no interval from fewer than 5)"
    assert survival(few + few[:2]).median().interval is not None  # five runs: an interval


def test_a_median_beyond_the_budget_is_censored_at_the_last_known_step():
    s = survival([StepInterval(40, 50)] + [StepInterval(100, None)] * 5)
    q = s.median()
    assert q.estimate == StepInterval(100, None) and q.by is None and str(q.estimate) == "> 100"
    # one escape in six: the lower band falls below 1/2 at it, the upper never does
    assert q.interval == StepInterval(40, None) and s.lower[0] < 0.5 < s.upper[0]


def test_median_interval_covers_the_true_median_in_simulation():
    # exponential crossing times (median 60 ln 2) seen on a grid of 10 steps, censored at 150, 20 seeds
    rng = random.Random(0)
    true_median = 60 * math.log(2)
    covered, trials = 0, 400
    for _ in range(trials):
        q = survival(_grid_sample(rng, 20)).median()
        covered += q.interval.after < true_median <= (math.inf if q.interval.by is None else q.interval.by)
    assert 0.9 <= covered / trials <= 0.995


def _log_likelihood(found, inner, mass):
    covers = np.array([[x.after <= j.after and (math.inf if j.by is None else j.by) <= (
        math.inf if x.by is None else x.by) for j in inner] for x in found], dtype=float)
    return float(np.sum(np.log(covers @ mass)))


@pytest.mark.parametrize("trial", range(4))
def test_turnbull_maximises_the_interval_censored_likelihood(trial):
    # runs on different evaluation grids (10, 15, 25 steps): intervals overlap, no common grid
    optimize = pytest.importorskip("scipy.optimize")
    rng = random.Random(trial)
    found = []
    for i in range(15):
        grid = (10, 15, 25)[i % 3]
        found += _grid_sample(rng, 1, grid=grid, budget=grid * 6)
    inner, mass = dynamics.turnbull(found)
    assert mass.sum() == pytest.approx(1.0) and np.all(mass >= 0)

    def negative(theta):  # the likelihood over the simplex, by a softmax: an independent maximisation
        p = np.exp(theta - theta.max())
        return -_log_likelihood(found, inner, p / p.sum())

    best = min((optimize.minimize(negative, np.random.default_rng(k).normal(size=len(inner)), method="Nelder-Mead",
                                  options={"maxiter": 40_000, "xatol": 1e-10, "fatol": 1e-12})
                for k in range(3)), key=lambda r: r.fun)
    assert _log_likelihood(found, inner, mass) >= -best.fun - 1e-6
    assert not survival(found).aligned and survival(found).lower is None


@given(st.lists(st.tuples(st.integers(1, 12), st.booleans()), min_size=1, max_size=20))
@settings(max_examples=60, deadline=None)
def test_turnbull_on_a_common_grid_is_kaplan_meier(data):
    found = [StepInterval(10 * k, None) if cens else StepInterval(10 * (k - 1), 10 * k) for k, cens in data]
    inner, mass = dynamics.turnbull(found, tol=1e-13)
    s = survival(found)
    cumulative = 1.0 - np.cumsum(mass)
    for x, value in zip(s.intervals, s.survival):
        k = next(i for i, j in enumerate(inner) if j.by == x.by)
        assert cumulative[k] == pytest.approx(value, abs=1e-5)
    for value, lo, hi in zip(s.survival, s.lower or s.survival, s.upper or s.survival):
        assert math.isnan(lo) or lo <= value + 1e-12 <= hi + 2e-12
    assert list(s.survival) == sorted(s.survival, reverse=True)


def _wilson_by_bisection(k, n, z):
    # the Wilson bounds are the p with |k/n - p| = z sqrt(p (1 - p) / n): solve each side independently
    def gap(p):
        return abs(k / n - p) - z * math.sqrt(p * (1 - p) / n)

    def root(a, b):
        for _ in range(200):
            m = (a + b) / 2
            if (gap(a) > 0) == (gap(m) > 0):
                a = m
            else:
                b = m
        return (a + b) / 2

    return (0.0 if k == 0 else root(0.0, k / n)), (1.0 if k == n else root(k / n, 1.0))


@pytest.mark.parametrize("k, n", [(0, 10), (1, 10), (5, 20), (6, 8), (8, 8), (3, 16)])
def test_wilson_interval_solves_its_defining_equation(k, n):
    assert dynamics.wilson_interval(k, n) == pytest.approx(_wilson_by_bisection(k, n, Z95), abs=1e-9)


def test_wilson_interval_bad_input():
    with pytest.raises(ValueError, match="successes"):
        dynamics.wilson_interval(11, 10)
    with pytest.raises(ValueError, match="confidence"):
        dynamics.wilson_interval(1, 10, confidence=1.5)


# ------------------------------------------------------------------------------------------- median curves
def test_median_curve_on_shared_steps_with_a_band_and_nan_above_every_line():
    runs = [curve((10, 20, 30), [1.0, 0.5, 0.1]), curve((10, 20, 30, 40), [1.0, 0.7, float("nan"), 0.0]),
            curve((10, 20, 30), [0.9, 0.6, 0.3])]
    m = dynamics.median_curve(runs, band=(0.0, 1.0))
    assert m.steps == (10, 20, 30) and m.n == 3
    assert m.median == pytest.approx((1.0, 0.6, 0.3))
    assert m.lower == pytest.approx((0.9, 0.5, 0.1)) and m.upper[:2] == pytest.approx((1.0, 0.7))
    assert m.upper[2] == math.inf  # the non-finite evaluation is above every line
    with pytest.raises(ValueError, match="share no evaluation step"):
        dynamics.median_curve([curve((10,), [1.0]), curve((20,), [1.0])])
    with pytest.raises(ValueError, match="band"):
        dynamics.median_curve(runs, band=(0.6, 0.9))


def test_condition_gathers_every_line_and_refuses_mixed_dwells():
    runs = [dynamics.run_dynamics(curve(STEPS, [1.0, 0.8, 0.6, 0.4, 0.2, 0.1]))] * 5
    cond = dynamics.condition(runs)
    assert set(cond.survival) == set(dynamics.FRACTIONS) and cond.n == 5
    assert cond.escape.median().estimate == StepInterval(30, 40)
    assert "0.25 of the plateau excess left" in cond.describe()
    with pytest.raises(ValueError, match="dwell"):
        dynamics.condition(runs + [dynamics.run_dynamics(runs[0].curve, dwell=1)])


# --------------------------------------------------------------------------------------- two conditions
def test_logrank_hand_computed_case():
    # a: events at 1 and 3; b: an event at 2, censored at 3. At t=1: n1=2, n2=2, d=1 -> O-E = 1 - 1/2,
    # V = 1/4. At t=2: n1=1, n2=2, d=1 (in b) -> O-E = -1/3, V = 2/9. At t=3: n1=1, n2=1, d=1 -> 1/2, 1/4.
    a = [StepInterval(0, 1), StepInterval(2, 3)]
    b = [StepInterval(1, 2), StepInterval(3, None)]
    chi2, p = dynamics.logrank_test(a, b)
    o_minus_e, var = 0.5 - 1 / 3 + 0.5, 0.25 + 2 / 9 + 0.25
    assert chi2 == pytest.approx(o_minus_e ** 2 / var, rel=1e-12)
    assert p == pytest.approx(math.erfc(math.sqrt(chi2 / 2)), rel=1e-12)


@pytest.mark.parametrize("trial", range(4))
def test_logrank_matches_scipy_on_a_grid_with_ties_and_censoring(trial):
    rng = random.Random(trial)
    a, b = _grid_sample(rng, 12, scale=50), _grid_sample(rng, 15, scale=90)

    def data(x):
        return stats.CensoredData(uncensored=[e.by for e in x if e.escaped], right=[e.after for e in x if e.censored])

    ref = stats.logrank(data(a), data(b))
    chi2, p = dynamics.logrank_test(a, b)
    assert chi2 == pytest.approx(ref.statistic ** 2, rel=1e-9) and p == pytest.approx(ref.pvalue, rel=1e-9)


def test_logrank_needs_both_groups_and_a_common_grid():
    never = [StepInterval(100, None)] * 4
    assert dynamics.logrank_test(never, never) == (0.0, 1.0)
    with pytest.raises(ValueError, match="both groups"):
        dynamics.logrank_test(never, [])
    with pytest.raises(ValueError, match="one evaluation grid"):
        dynamics.logrank_test([StepInterval(0, 10)], [StepInterval(5, 15)])
    assert dynamics.compare_crossings([StepInterval(0, 10)], [StepInterval(5, 15)]).p_value is None


def test_compare_separates_shifted_conditions_and_not_equal_ones():
    rng = random.Random(1)
    early, late = _grid_sample(rng, 16, scale=30, budget=400), _grid_sample(rng, 16, scale=200, budget=400)
    shifted = dynamics.compare_crossings(early, late, n_boot=400)
    assert shifted.p_value < 1e-3
    lo, hi = shifted.difference_interval
    assert lo is not None and 0 < lo <= shifted.difference and (hi is None or shifted.difference <= hi)
    assert shifted.ratio == shifted.b.by / shifted.a.by and shifted.ratio_interval[0] > 1
    same = dynamics.compare_crossings(early, list(reversed(early)), n_boot=400)
    assert same.p_value == pytest.approx(1.0) and same.difference == 0 and same.ratio == 1
    assert same.difference_interval[0] <= 0 <= same.difference_interval[1]
    assert "log-rank p" in shifted.describe(("free", "clamped"))


def test_compare_bootstrap_is_seeded_and_matches_a_recomputation_with_scipy_medians():
    rng = random.Random(2)
    a, b = _grid_sample(rng, 8, scale=50), _grid_sample(rng, 10, scale=80)
    n_boot, seed = 300, 7
    got = dynamics.compare_crossings(a, b, n_boot=n_boot, seed=seed)
    assert got == dynamics.compare_crossings(a, b, n_boot=n_boot, seed=seed)
    draws = np.random.default_rng(seed)
    ia, ib = draws.integers(0, len(a), (n_boot, len(a))), draws.integers(0, len(b), (n_boot, len(b)))

    def median(found):  # scipy's Kaplan-Meier: first step at which S <= 1/2 (S at exactly 1/2 counts)
        sf = _scipy_sf(found)
        return next((float(t) for t, s in zip(sf.quantiles, sf.probabilities) if s <= 0.5 + 1e-12), math.inf)

    diffs, undefined = [], 0
    for ra, rb in zip(ia, ib):
        ma, mb = median([a[i] for i in ra]), median([b[i] for i in rb])
        if math.isinf(ma) and math.isinf(mb):
            undefined += 1
        else:
            diffs.append(mb - ma if not math.isinf(ma) else -math.inf)
    diffs.sort()
    if undefined <= 0.025 * n_boot:
        lo, hi = diffs[math.floor(0.025 * len(diffs))], diffs[math.floor(0.975 * len(diffs))]
        expected = tuple(None if math.isinf(x) else x for x in (lo, hi))
    else:
        expected = (None, None)
    assert got.difference_interval == expected


def test_compare_gives_no_interval_from_fewer_than_five_runs_and_open_bounds_beyond_the_budget():
    few = dynamics.compare_crossings([StepInterval(0, 10)] * 4, [StepInterval(10, 20)] * 6, n_boot=50)
    assert few.difference == 10 and few.difference_interval is None and few.ratio_interval is None
    escaped = [StepInterval(t - 10, t) for t in (10, 20, 30, 40, 50)]
    stuck = [StepInterval(100, None)] * 5
    c = dynamics.compare_crossings(escaped, stuck, n_boot=200)
    assert c.difference is None and c.difference_interval[1] is None and c.p_value < 0.05
    assert c.ratio_text().startswith(">3.3x") and c.difference_text().startswith(">+70")  # 100 / 30, 100 - 30
    neither = dynamics.compare_crossings(stuck, stuck, n_boot=50)
    assert neither.difference_text() == "? (neither median reached) [?, ?]"
    faster = dynamics.compare_crossings(stuck, escaped, n_boot=200)  # b reached, a censored: a bound, never "0x"
    assert faster.ratio is None and faster.ratio_text().startswith("<0.3x") and "0x" not in faster.ratio_text()
    assert faster.ratio_interval[0] is None and faster.difference_text().startswith("<-70")  # 30 - 100


def test_area_between_median_curves_by_hand_and_antisymmetric():
    fast = [dynamics.run_dynamics(curve(STEPS, [1.0, 0.5, 0.2, 0.1, 0.1, 0.1]))] * 5
    slow = [dynamics.run_dynamics(curve(STEPS, [1.0, 0.9, 0.7, 0.5, 0.3, 0.1]))] * 6
    c = dynamics.compare(fast, slow, n_boot=100)
    gaps = np.array([0.0, 0.4, 0.5, 0.4, 0.2, 0.0])
    expected = float(np.sum((gaps[1:] + gaps[:-1]) / 2 * 10))  # trapezoids of width 10
    assert c.area.area == pytest.approx(expected) and c.area.span == (10, 60)
    assert c.area.interval == pytest.approx((expected, expected))  # identical seeds: no spread
    assert c.area.mean_gap == pytest.approx(expected / 50)
    assert dynamics.compare(slow, fast, n_boot=100).area.area == pytest.approx(-expected)
    assert set(c.fractions) == set(dynamics.FRACTIONS) and c.escape.difference == 20
    assert "area between median curves" in c.describe(("fast", "slow"))


def test_conditions_on_different_grids_get_bootstrap_intervals_but_no_log_rank():
    rng = random.Random(3)
    a = _grid_sample(rng, 8, grid=10, scale=40)
    b = _grid_sample(rng, 8, grid=15, budget=150, scale=120)
    c = dynamics.compare_crossings(a, b, n_boot=200)
    assert c.p_value is None and c.logrank_chi2 is None and "not valid" in c.describe()
    assert c.difference_interval is not None and c.difference_interval[0] is not None
