"""Paired reference predictors (a source's `predictive`, theory.plateau_predictions / paired_losses) against
independent computations: a per-position Python loop over the kernel, empirical frequencies of the sampler for
short prefixes of an order-2 chain, and the hand-built kernel and unigram models (paired excess zero)."""

import itertools

import pytest
import torch

from markov_interp import sources, theory
from markov_interp.sources import BinaryChain, MarkovChain, RandomMarkov
from handbuilt import kernel_model, unigram_model

KERNEL3 = [[0.8, 0.1, 0.1], [0.2, 0.5, 0.3], [0.05, 0.15, 0.8]]


def test_true_predictions_are_the_kernel_rows_position_by_position():
    chain = MarkovChain(KERNEL3)
    tokens = chain.sample(4, 20, generator=torch.Generator().manual_seed(0))
    probs = chain.predictive(tokens)
    for b, t in itertools.product(range(4), range(20)):
        assert probs[b, t].tolist() == pytest.approx(KERNEL3[int(tokens[b, t])])


def test_order_two_prefix_follows_the_samplers_initial_law():
    # P(x_1 | x_0) of an order-2 chain comes from its stationary context law, not from the kernel: compare with
    # the sampler's own empirical frequencies
    kernel = torch.tensor([[[0.9, 0.1], [0.3, 0.7]], [[0.6, 0.4], [0.05, 0.95]]])
    chain = MarkovChain(kernel, order=2)
    tokens = chain.sample(200_000, 3, generator=torch.Generator().manual_seed(1))
    probs = chain.predictive(tokens[:8])
    for x0 in (0, 1):
        first = tokens[:, 0] == x0
        empirical = (tokens[first, 1] == 1).double().mean().item()
        predicted = probs[:8][tokens[:8, 0] == x0, 0, 1]
        assert predicted.numel() == 0 or predicted[0].item() == pytest.approx(empirical, abs=0.01)
    # from position 1 on the context is full: the kernel row of (x_{t-1}, x_t)
    for b in range(8):
        assert probs[b, 1].tolist() == pytest.approx(kernel[tokens[b, 0], tokens[b, 1]].tolist())


def test_random_kernels_pair_the_add_alpha_and_in_context_unigram_estimators():
    source = RandomMarkov(vocab=3, alpha=0.5)
    tokens = source.sample(2, 12, generator=torch.Generator().manual_seed(2))
    assert torch.equal(source.predictive(tokens),
                       sources.add_beta_predictions(tokens, 3, order=1, beta=0.5))
    plateau = theory.plateau_predictions(source, tokens)
    for b, t in itertools.product(range(2), range(12)):  # state counts so far, plus alpha
        counts = torch.bincount(tokens[b, : t + 1], minlength=3).double()
        assert plateau[b, t].tolist() == pytest.approx(((counts + 0.5) / (counts.sum() + 1.5)).tolist())


def test_paired_losses_average_to_the_exact_references():
    chain = BinaryChain(0.5, 0.8)
    tokens = chain.sample(256, 257, generator=torch.Generator().manual_seed(3))
    true, plateau = theory.paired_losses(chain, tokens)
    assert true == pytest.approx(theory.entropy_rate(chain.kernel), abs=0.005)
    assert plateau == pytest.approx(theory.unigram_loss(chain.kernel), abs=0.005)


def _model_loss(model, tokens):
    logits = model(tokens[:, :-1])
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).double(),
                                             tokens[:, 1:].reshape(-1)).item()


def test_hand_built_kernel_model_has_zero_paired_excess():
    chain = BinaryChain(0.2, 0.3)
    tokens = chain.sample(8, 65, generator=torch.Generator().manual_seed(4))
    true, plateau = theory.paired_losses(chain, tokens)
    excess = _model_loss(kernel_model(chain.kernel), tokens) - true
    assert abs(excess) < 1e-5 and plateau - true > 0.05


def test_hand_built_unigram_model_has_the_plateaus_excess():
    chain = BinaryChain(0.5, 0.8)
    tokens = chain.sample(8, 65, generator=torch.Generator().manual_seed(5))
    true, plateau = theory.paired_losses(chain, tokens)
    loss = _model_loss(unigram_model(theory.stationary_distribution(chain.kernel)), tokens)
    assert loss - true == pytest.approx(plateau - true, abs=1e-5)


def test_evaluate_paired_on_a_hand_built_kernel_model():
    from markov_interp import training

    chain = BinaryChain(0.2, 0.3)
    row = training.evaluate_paired(kernel_model(chain.kernel), chain, seq_len=64, batch_size=8, n_batches=2,
                                   generator=torch.Generator().manual_seed(0))
    assert abs(row["eval_loss"] - row["eval_true_loss"]) < 1e-5  # paired excess zero up to float error
    assert row["eval_plateau_loss"] - row["eval_true_loss"] > 0.05


def test_escape_from_metrics_reads_the_paired_rows():
    from markov_interp.dynamics import StepInterval, escape_from_metrics

    rows = [{"step": s, "train_loss": 0.7, "eval_loss": 0.62 + d, "eval_true_loss": 0.62, "eval_plateau_loss": 0.67}
            for s, d in ((10, 0.05), (20, 0.04), (30, 0.001), (40, 0.0))]
    assert escape_from_metrics(rows) == StepInterval(20, 30)  # below half from 30, for two evaluations
    assert escape_from_metrics([{k: v for k, v in r.items() if k != "eval_true_loss"} for r in rows]) is None
    same = [{**r, "eval_plateau_loss": r["eval_true_loss"]} for r in rows]  # p + q = 1: nothing to escape from
    assert escape_from_metrics(same) is None


def test_a_trained_runs_escape_and_stuck_are_one_definition(tmp_path):
    from markov_interp import sweep

    spec = sweep.SweepSpec(name="tiny", seeds=(0,), grid={"model.tie_weights": [True]},
                           base={"source": {"kind": "binary", "p": 0.5, "q": 0.8},
                                 "model": {"preset": "paper-1layer", "n_ctx": 32},
                                 "train": {"steps": 12, "seq_len": 32, "batch_size": 4, "eval_batches": 1,
                                           "eval_every": 4, "n_checkpoints": 0, "log_every": 4}})
    (row,) = sweep.run(spec, tmp_path, workers=1, progress=False).rows
    res = row.result
    assert res.censored is not None and res.stuck_at_unigram == res.censored
    # evaluations at 4, 8, 12 with a dwell of 2: an escape is seen at 4 or 8, and a run without one is censored
    # after 8 (a crossing at 12 could not be confirmed)
    assert res.escape_step == 8 if res.censored else res.escape_step in (4, 8)
    assert res.crossing().step == res.escape_step and res.crossing().censored == res.censored
    assert res.crossings["dwell"] == 2 and set(res.crossings) == {"dwell", "0.9", "0.75", "0.5", "0.25"}
    back = sweep.read_table(tmp_path / "results.csv")[0].result
    assert (back.censored, back.escape_step, back.crossings) == (res.censored, res.escape_step, res.crossings)


def test_log_spaced_evaluations_are_logged_resumed_and_stacked(tmp_path):
    import dataclasses

    from markov_interp import training
    from markov_interp.sources import SourceConfig
    from markov_interp.models import preset

    tc = training.TrainConfig(steps=30, seq_len=16, batch_size=4, eval_every=0, eval_log_points=5, eval_batches=1,
                              log_every=10, n_checkpoints=3, device="cpu")
    run = training.RunConfig(source=SourceConfig(kind="binary", p=0.5, q=0.8), model=preset("paper-1layer", n_ctx=16),
                             train=tc)
    assert sorted(training.evaluation_steps(tc)) == [1, 2, 5, 13, 30]
    full = training.train(run, tmp_path / "a", progress=False)
    assert [r["step"] for r in full.metrics if "eval_true_loss" in r] == [1, 2, 5, 13, 30]
    assert '"eval_log_points": 5' in (tmp_path / "a" / training.CONFIG_FILE).read_text()
    # the default (0) stays out of config.json: earlier run folders and sweep cell ids are unchanged
    assert "eval_log_points" not in dataclasses.replace(run, train=dataclasses.replace(tc, eval_log_points=0)).to_json()
    # a stack member logs the same evaluations as its solo run; members must agree on the plan
    (member,) = training.train_many([run], progress=False)
    assert [r["step"] for r in member.metrics] == [r["step"] for r in full.metrics]
    other = dataclasses.replace(run, train=dataclasses.replace(tc, eval_log_points=0))
    with pytest.raises(ValueError, match="eval_log_points"):
        training.train_many([run, other], progress=False)
