"""`dynamics.modes`: the Engelman-Hartigan test for two clusters on log crossing steps, against synthetic samples
of one mode and of two, and its statistic against a brute-force computation over every cut."""

import itertools

import numpy as np
import pytest

from markov_interp import dynamics
from markov_interp.dynamics import StepInterval


def _brute_force(x, min_group):
    """max over cuts of the between-group sum of squares over the total, by plain loops (no cumulative sums)."""
    x = sorted(x)
    n, mean = len(x), sum(x) / len(x)
    total = sum((v - mean) ** 2 for v in x)
    best = max(((sum((v - sum(g) / len(g)) ** 2 for g in (x[:k], x[k:]) for v in g), k)
                for k in range(min_group, n - min_group + 1)), key=lambda t: -t[0])
    return 1 - best[0] / total, best[1]


def test_the_statistic_is_the_best_cut_explained_share_of_the_sum_of_squares():
    rng = np.random.default_rng(3)
    for n, min_group in itertools.product((6, 11, 16), (1, 2, 3)):
        x = rng.lognormal(0, 1, n)
        r, cut = dynamics.cluster_statistic(x, min_group=min_group)
        expected, expected_cut = _brute_force(list(x), min_group)
        assert r == pytest.approx(expected, rel=1e-9) and cut == expected_cut
    many, cuts = dynamics.cluster_statistic(rng.normal(size=(5, 9)))
    assert many.shape == cuts.shape == (5,)
    with pytest.raises(ValueError, match="two groups"):
        dynamics.cluster_statistic([1.0, 2.0, 3.0])


def _crossings(steps, censored_at=None):
    return [StepInterval(int(s) - 10, int(s)) if s != censored_at else StepInterval(int(s), None) for s in steps]


def test_two_separated_groups_are_two_modes_and_one_lognormal_spread_is_one():
    rng = np.random.default_rng(0)
    two = np.concatenate([rng.lognormal(np.log(60), 0.25, 8), rng.lognormal(np.log(500), 0.3, 8)])
    found = dynamics.modes(_crossings(np.round(two / 10).astype(int) * 10 + 10))
    assert found.bimodal and found.p_value < 0.01
    assert sum(s <= found.split[0][1] for s in found.steps) == 8  # the cut falls between the groups
    one = dynamics.modes(_crossings(np.round(rng.lognormal(np.log(200), 0.4, 16) / 10).astype(int) * 10 + 10))
    assert not one.bimodal and one.p_value > 0.05
    assert "one mode" in one.describe() and "two modes" in found.describe()


def test_one_late_seed_is_not_a_mode_and_censored_seeds_count_at_their_bound():
    outlier = dynamics.modes(_crossings([100, 110, 120, 130, 140, 150, 160, 170, 180, 190, 200, 210, 220, 230, 240,
                                         2000]))
    assert outlier.split[1][0] >= 230  # the late seed alone cannot be a group: at least MIN_GROUP each side
    stuck = dynamics.modes(_crossings([50, 60, 60, 70, 70, 80, 80, 90, 1490, 1490, 1490, 1490, 1490, 1490, 1490,
                                       1490], censored_at=1490))
    assert stuck.bimodal and stuck.censored == 8 and stuck.split == ((50, 90), (1490, 1490))


def test_the_false_alarm_rate_on_one_mode_is_about_alpha():
    """Lognormal samples of 16 (one mode, the test's null in logs): the share flagged is near ALPHA (1000 samples:
    a binomial SE of 0.007); and the same seed gives the same p-value."""
    rng = np.random.default_rng(1)
    flagged = [dynamics.modes(_crossings(rng.lognormal(5, 0.5, 16).astype(int) + 20), n_null=400, seed=k).bimodal
               for k in range(300)]
    assert 0.01 <= np.mean(flagged) <= 0.10
    sample = _crossings([40, 50, 60, 300, 400, 500, 600, 700])
    assert dynamics.modes(sample, seed=5).p_value == dynamics.modes(sample, seed=5).p_value
