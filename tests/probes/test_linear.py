"""The linear-probe engine on synthetic activations whose answer is known by construction: a planted linear
feature read back exactly, held-out sequences that never leak into the fit, controls at chance, determinism."""

import json
import math

import numpy as np
import pytest
import torch

from markov_interp.probes.linear import fit_probe, split_sequences
from markov_interp.probes.targets import Target


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def test_a_planted_linear_real_feature_is_recovered_exactly():
    x = torch.randn(40, 16, 6, generator=_gen(0))
    mixing = torch.randn(6, 3, generator=_gen(1), dtype=torch.float64)
    y = x.double() @ mixing + torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    fit = fit_probe(x, Target.from_tensor(y, name="planted"), penalty=1e-10)
    assert fit.metric == "r2" and fit.method == "ridge"
    assert fit.score == pytest.approx(1.0, abs=1e-9) and all(v == pytest.approx(1.0, abs=1e-9) for v in fit.per_output)
    assert torch.allclose(fit.weights, mixing, atol=1e-6)
    assert torch.allclose(fit.bias, torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64), atol=1e-6)
    assert torch.allclose(fit.predict(x), y, atol=1e-6)
    assert fit.score_ci[0] == pytest.approx(1.0, abs=1e-9)
    # the control target belongs to other sequences: nothing of it is linear in these activations
    assert abs(fit.control) < 0.1 and fit.selectivity > 0.9 and fit.chance <= 0


def test_ridge_and_its_interval_against_a_closed_form_and_a_bootstrap_by_hand():
    """A noisy linear target: the weights are the closed-form ridge on the training rows' standardised features,
    (Z^T Z + penalty n I) w = Z^T (y - mean y) (numpy), and the score's interval the 2.5 / 97.5% quantiles of the
    pooled R^2 recomputed on each resample of the held-out sequences (the fit's draws: `seed` + 1)."""
    x = torch.randn(30, 8, 5, generator=_gen(6), dtype=torch.float64)
    y = x @ torch.randn(5, 2, generator=_gen(7), dtype=torch.float64) + torch.randn(30, 8, 2, generator=_gen(8),
                                                                                      dtype=torch.float64)
    fit = fit_probe(x, Target.from_tensor(y), penalty=0.05, n_bootstrap=200, seed=3)
    train, test = list(fit.train_sequences), list(fit.test_sequences)
    rows, targets = x[train].reshape(-1, 5).numpy(), y[train].reshape(-1, 2).numpy()
    mean, scale = rows.mean(0), rows.std(0)
    z = (rows - mean) / scale
    w = np.linalg.solve(z.T @ z + 0.05 * len(z) * np.eye(5), z.T @ (targets - targets.mean(0))) / scale[:, None]
    assert np.allclose(fit.weights.numpy(), w, atol=1e-10)
    assert np.allclose(fit.bias.numpy(), targets.mean(0) - mean @ w, atol=1e-10)
    draws = torch.randint(len(test), (200, len(test)), generator=_gen(3 + 1)).numpy()
    predicted, truth = fit.predict(x[test]).numpy(), y[test].numpy()

    def pooled_r2(chosen):
        yy, pp = truth[chosen].reshape(-1, 2), predicted[chosen].reshape(-1, 2)
        return 1 - ((pp - yy) ** 2).sum() / ((yy - yy.mean(0)) ** 2).sum()

    assert fit.score == pytest.approx(pooled_r2(np.arange(len(test))), abs=1e-12)
    boot = np.quantile([pooled_r2(row) for row in draws], [0.025, 0.975])
    assert fit.score_ci == pytest.approx(tuple(boot), abs=1e-12)


@pytest.mark.parametrize("method", ["logistic", "ridge"])
def test_a_planted_class_feature_is_read_with_accuracy_one(method):
    labels = torch.randint(4, (40, 16), generator=_gen(2))
    directions = torch.randn(4, 8, generator=_gen(3)) * 3
    x = directions[labels] + 0.1 * torch.randn(40, 16, 8, generator=_gen(4))
    fit = fit_probe(x, Target.from_tensor(labels), method=method)
    assert fit.metric == "accuracy" and fit.method == method
    assert fit.score == 1.0 and fit.score_ci == (1.0, 1.0) and fit.per_output == (1.0,) * 4
    assert abs(fit.control - 0.25) < 0.05 and abs(fit.chance - 0.25) < 0.05
    assert fit.selectivity == pytest.approx(1.0 - fit.control)
    assert torch.equal(fit.predict(x).argmax(-1), labels)


def test_held_out_sequences_never_reach_the_fit():
    """Each sequence's features are its own one-hot and its label a constant of the sequence: a probe that saw a
    held-out sequence would read its label perfectly. Held out, only the training majority is left."""
    n, pos = 24, 5
    x = torch.eye(n)[:, None, :].expand(n, pos, n).clone()
    labels = torch.randint(2, (n,), generator=_gen(5))[:, None].expand(n, pos).clone()
    fit = fit_probe(x, Target.from_tensor(labels), method="ridge", n_bootstrap=0)
    train, test = set(fit.train_sequences), set(fit.test_sequences)
    assert not train & test and train | test == set(range(n)) and len(test) == 12
    assert fit.score == pytest.approx(fit.chance)  # the bias alone: the majority of the training sequences
    assert fit.n_train == 12 * pos and fit.n_test == 12 * pos
    assert all(math.isnan(v) for v in fit.score_ci)  # no resamples, no interval


def test_the_split():
    train, test = split_sequences(10, test_fraction=0.3, seed=4)
    assert len(test) == 3 and len(train) == 7 and sorted(train.tolist() + test.tolist()) == list(range(10))
    assert torch.equal(split_sequences(10, test_fraction=0.3, seed=4)[1], test)
    assert not torch.equal(split_sequences(10, test_fraction=0.3, seed=5)[1], test)
    assert [len(part) for part in split_sequences(4, test_fraction=0.1)] == [2, 2]  # at least 2 on each side
    with pytest.raises(ValueError, match="at least 4 sequences .* got 3"):
        split_sequences(3)
    with pytest.raises(ValueError, match="test_fraction must lie in"):
        split_sequences(10, test_fraction=1.0)


def test_same_seed_same_numbers_and_another_seed_another_split():
    labels = torch.randint(3, (20, 12), generator=_gen(6))
    x = torch.nn.functional.one_hot(labels, 3).float() + torch.randn(20, 12, 3, generator=_gen(7))
    target = Target.from_tensor(labels)
    first, again = fit_probe(x, target, seed=3), fit_probe(x, target, seed=3)
    assert json.dumps(first.to_dict()) == json.dumps(again.to_dict())
    other = fit_probe(x, target, seed=4)
    assert other.test_sequences != first.test_sequences


def test_the_shuffle_control_and_positions():
    labels = torch.randint(2, (30, 10), generator=_gen(8))
    x = torch.nn.functional.one_hot(labels, 2).float() * 4 + torch.randn(30, 10, 2, generator=_gen(9))
    target = Target.from_tensor(labels)
    shuffled = fit_probe(x, target, control="shuffle")
    assert shuffled.control_kind == "shuffle" and abs(shuffled.control - 0.5) < 0.06 and shuffled.score > 0.95
    late = fit_probe(x, target, positions=range(5, 10))
    assert late.n_train + late.n_test == 30 * 5
    lag = Target.from_tensor(labels, valid=torch.arange(10).expand(30, 10) >= 3)  # undefined before position 3
    assert fit_probe(x, lag).n_train + fit_probe(x, lag).n_test == 30 * 7


def test_bad_input_is_refused():
    x, labels = torch.randn(8, 5, 3), torch.zeros(8, 5, dtype=torch.long)
    target = Target.from_tensor(labels)
    with pytest.raises(ValueError, match=r"given on \(8, 5\) \(batch, pos\) but the activations are \(8, 4\)"):
        fit_probe(x[:, :4], target)
    with pytest.raises(ValueError, match="at least 4 sequences"):
        fit_probe(x[:3], Target.from_tensor(labels[:3]))
    with pytest.raises((ValueError, TypeError)):  # jaxtyping's TypeCheckError under pytest, else ValueError
        fit_probe(x[0], target)
    with pytest.raises(ValueError, match="real-valued: method must be 'ridge'"):
        fit_probe(x, Target.from_tensor(torch.zeros(8, 5)), method="logistic")
    with pytest.raises(ValueError, match="control must be one of"):
        fit_probe(x, target, control="labels")
    with pytest.raises(ValueError, match="method must be one of"):
        fit_probe(x, target, method="svm")
    with pytest.raises(ValueError, match="positions"):
        fit_probe(x, target, positions=[7])
    with pytest.raises(ValueError, match="defined at no position"):
        fit_probe(x, Target.from_tensor(labels, valid=torch.zeros(8, 5, dtype=torch.bool)))
    with pytest.raises(ValueError, match="penalty must be"):
        fit_probe(x, target, penalty=0)
