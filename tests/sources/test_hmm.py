"""Hidden Markov sources (`sources.HiddenMarkov`): validation, the presets, beliefs and Bayes predictions, the sampler.

Independent computations: a forward algorithm written here with explicit loops over Python floats (unnormalised
for short sequences, rescaled by hand for long ones), Mess3 from the formula of Shai et al. by loops, a Markov
chain written as an HMM against the chain's own predictor (its `predictive`), and chi-square tests of
the sampler's counts against the matrices.
"""

import math

import pytest
import torch
from scipy import stats

from markov_interp import theory
from markov_interp.sources import MarkovChain, SourceConfig, stacked_sampler
from markov_interp.sources.hmm import PRESETS, HiddenMarkov, HiddenMarkovConfig, hmm_preset, validate_hmm
from tests.handbuilt import chain_hmm

P_THRESHOLD = 1e-3  # a chi-square test fails below this p-value (fixed seeds: the outcome is deterministic)


def gen(seed):
    return torch.Generator().manual_seed(seed)


def every_hmm():
    """Every preset at its defaults, and random HMMs of several shapes (one hidden state: an i.i.d. source)."""
    hmms = [hmm_preset(name) for name in PRESETS]
    shapes = [(1, 3, 1.0, 3), (2, 2, 0.5, 4), (4, 3, 1.0, 5), (6, 2, 2.0, 6)]
    hmms += [hmm_preset("random", hidden=h, vocab=v, concentration=c, seed=s) for h, v, c, s in shapes]
    return hmms


def loop_forward(hmm, tokens, *, rescale=False):
    """(beliefs, predictions) by the forward algorithm in Python floats: alpha_t(j) = P(x_0..x_t, S_{t+1} = j),
    unnormalised (or rescaled to sum 1 after each token when `rescale`, for long sequences)."""
    t = hmm.transition_matrices.tolist()
    pi = hmm.stationary.tolist()
    n_hidden, vocab = hmm.hidden, hmm.vocab
    beliefs, predictions = [], []
    for seq in tokens.tolist():
        alpha = list(pi)
        b_seq, p_seq = [], []
        for x in seq:
            alpha = [sum(alpha[i] * t[x][i][j] for i in range(n_hidden)) for j in range(n_hidden)]
            total = sum(alpha)
            b_seq.append([a / total for a in alpha])
            joint = [sum(alpha[i] * t[y][i][j] for i in range(n_hidden) for j in range(n_hidden)) for y in range(vocab)]
            p_seq.append([p / total for p in joint])  # P(x_0..x_t, x_{t+1} = y) / P(x_0..x_t)
            if rescale:
                alpha = [a / total for a in alpha]
        beliefs.append(b_seq)
        predictions.append(p_seq)
    return torch.tensor(beliefs, dtype=torch.float64), torch.tensor(predictions, dtype=torch.float64)


# ----------------------------------------------------------------------------------------------- validation
@pytest.mark.parametrize("matrices, message", [
    ([[[0.5, 0.6], [0.5, 0.5]], [[0.0, -0.1], [0.0, 0.0]]], r"negative entries: T\[1, 0, 1\] = -0.1"),
    ([[[0.5, 0.1], [0.2, 0.2]], [[0.1, 0.1], [0.3, 0.3]]], "row 0 sums to 0.8"),
    ([[0.5, 0.5], [0.5, 0.5]], r"shape \[vocab, hidden, hidden\], got \(2, 2\)"),
    ([[[0.5, 0.5, 0.0]], [[0.0, 0.0, 0.0]]], r"got \(2, 1, 3\)"),
    ([[[1.0]]], "at least 2 tokens"),
    ([[[float("nan")]], [[1.0]]], "NaN or infinite"),
    ("abc", "numeric array"),
])
def test_bad_matrices_raise_a_clear_error(matrices, message):
    with pytest.raises(ValueError, match=message):
        HiddenMarkov(matrices)


def test_a_hidden_chain_without_a_unique_stationary_law_is_refused():
    two_closed_classes = [[[1.0, 0.0], [0.0, 0.0]], [[0.0, 0.0], [0.0, 1.0]]]  # each state emits its token forever
    with pytest.raises(ValueError, match="no unique stationary law"):
        HiddenMarkov(two_closed_classes)


def test_validate_returns_a_float64_copy():
    given = torch.tensor([[[0.5, 0.0], [0.0, 0.5]], [[0.0, 0.5], [0.5, 0.0]]])
    checked = validate_hmm(given)
    assert checked.dtype == torch.float64 and torch.equal(checked, given.double())
    checked[0, 0, 0] = 7.0
    assert given[0, 0, 0] == 0.5


# -------------------------------------------------------------------------------------------------- presets
def test_mess3_follows_the_formula_of_shai_et_al():
    for x, alpha in [(0.05, 0.85), (0.15, 0.6)]:
        hmm = hmm_preset("mess3") if (x, alpha) == (0.05, 0.85) else hmm_preset("mess3", x=x, alpha=alpha)
        y, beta = 1 - 2 * x, (1 - alpha) / 2
        expected = [[[(y if i == j else x) * (alpha if j == s else beta) for j in range(3)] for i in range(3)]
                    for s in range(3)]
        assert torch.allclose(hmm.transition_matrices, torch.tensor(expected, dtype=torch.float64), atol=1e-15)
        assert hmm.params == {"x": x, "alpha": alpha} and hmm.process == "mess3"
    assert not hmm_preset("mess3").unifilar


def test_rrxor_and_z1r_are_the_standard_unifilar_presentations():
    rrxor, z1r = hmm_preset("rrxor"), hmm_preset("z1r")
    assert rrxor.unifilar and z1r.unifilar
    assert (rrxor.vocab, rrxor.hidden, z1r.vocab, z1r.hidden) == (2, 5, 2, 3)
    # RRXOR: a token emitted from T or F (states 3, 4) is the XOR of the two before it
    tokens, states = rrxor.sample(64, 90, generator=gen(0), return_states=True)
    xor_steps = (states[:, 2:] >= 3)
    assert xor_steps.float().mean() > 0.3
    assert torch.equal(tokens[:, 2:][xor_steps], (tokens[:, 1:-1] ^ tokens[:, :-2])[xor_steps])
    assert torch.allclose(rrxor.stationary, torch.tensor([2, 1, 1, 1, 1], dtype=torch.float64) / 6)
    # Z1R: the deterministic part 0, 1 recurs every 3 tokens
    tokens, states = z1r.sample(16, 30, generator=gen(1), return_states=True)
    assert ((states == 0) <= (tokens == 0)).all() and ((states == 1) <= (tokens == 1)).all()


def test_random_preset_is_seeded_and_dirichlet_shaped():
    a, b = hmm_preset("random", seed=3), hmm_preset("random", seed=3)
    assert torch.equal(a.transition_matrices, b.transition_matrices)
    assert not torch.equal(a.transition_matrices, hmm_preset("random", seed=4).transition_matrices)
    big = hmm_preset("random", hidden=5, vocab=4, concentration=0.3, seed=1)
    assert big.transition_matrices.shape == (4, 5, 5) and big.params["concentration"] == 0.3
    # emission from the current state, independent of the move: T[x, i, j] = P(x | i) P(j | i)
    t = big.transition_matrices
    outer = t.sum(2).T[:, :, None] * t.sum(0)[:, None, :]  # [i, x, j]
    assert torch.allclose(t.permute(1, 0, 2), outer, atol=1e-12)


@pytest.mark.parametrize("process, params, message", [
    ("mess4", {}, "unknown HMM process 'mess4'"),
    ("z1r", {"x": 0.1}, "takes no parameters"),
    ("mess3", {"y": 0.1}, r"takes \['alpha', 'x'\]"),
    ("mess3", {"x": 0.6}, "0 <= x <= 0.5"),
    ("random", {"hidden": 0}, "hidden must be"),
    ("random", {"concentration": -1.0}, "concentration must be"),
])
def test_bad_presets_raise_a_clear_error(process, params, message):
    with pytest.raises(ValueError, match=message):
        hmm_preset(process, **params)


# ---------------------------------------------------------------------------------- beliefs and predictions
@pytest.mark.parametrize("hmm", every_hmm(), ids=repr)
def test_beliefs_and_bayes_predictions_match_a_loop_forward_algorithm(hmm):
    tokens = hmm.sample(6, 30, generator=gen(2))
    beliefs, predictions = loop_forward(hmm, tokens)
    assert torch.allclose(hmm.belief_states(tokens), beliefs, atol=1e-12, rtol=0)
    assert torch.allclose(hmm.bayes_predictions(tokens), predictions, atol=1e-12, rtol=0)
    assert hmm.predictive(tokens).shape == (6, 30, hmm.vocab)


@pytest.mark.parametrize("name", ["mess3", "rrxor"])
def test_beliefs_stay_exact_on_long_sequences(name):
    hmm = hmm_preset(name)
    tokens = hmm.sample(2, 3000, generator=gen(3))
    beliefs = hmm.belief_states(tokens)
    assert torch.isfinite(beliefs).all() and torch.allclose(beliefs.sum(-1), torch.ones(2, 3000, dtype=torch.float64))
    expected, _ = loop_forward(hmm, tokens, rescale=True)
    assert torch.allclose(beliefs, expected, atol=1e-10, rtol=0)


def test_a_markov_chain_as_an_hmm_predicts_with_its_kernel():
    kernel = [[0.7, 0.2, 0.1], [0.1, 0.1, 0.8], [0.3, 0.3, 0.4]]
    hmm = chain_hmm(kernel)
    tokens = MarkovChain(kernel).sample(8, 40, generator=gen(4))
    assert torch.allclose(hmm.belief_states(tokens), torch.nn.functional.one_hot(tokens, 3).double())
    assert torch.allclose(hmm.bayes_predictions(tokens), MarkovChain(kernel).predictive(tokens))


def test_the_filter_from_a_given_first_state():
    z1r = hmm_preset("z1r")
    tokens = torch.tensor([[1, 0], [1, 1]])
    in_b = torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64)  # B emits 1 and moves to C
    beliefs = z1r.belief_states(tokens, initial=in_b)
    assert torch.equal(beliefs, torch.tensor([[[0.0, 0, 1], [1, 0, 0]]] * 2, dtype=torch.float64))
    per_sequence = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64)  # B; C
    with pytest.raises(ValueError, match="sequence 1 has probability 0"):  # from C: 1 leads to A, which emits 0
        z1r.belief_states(tokens, initial=per_sequence)


def test_impossible_and_out_of_range_tokens_are_refused():
    z1r = hmm_preset("z1r")
    with pytest.raises(ValueError, match="sequence 1 has probability 0 under the HMM .*token 2"):
        z1r.belief_states(torch.tensor([[0, 1, 0], [0, 0, 0]]))  # 0, 0 puts it in B, which must emit 1
    with pytest.raises(ValueError, match=r"tokens must lie in 0..1, got values 0..2"):
        z1r.bayes_predictions(torch.tensor([[0, 2]]))


# -------------------------------------------------------------------------------------------------- sampler
def test_same_seed_same_samples():
    hmm = hmm_preset("mess3")
    a = hmm.sample(5, 50, generator=gen(7), return_states=True)
    b = hmm.sample(5, 50, generator=gen(7), return_states=True)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], hmm.sample(5, 50, generator=gen(8)))
    assert a[0].dtype == torch.int64 and a[0].shape == (5, 50) and a[1].shape == (5, 50)
    assert hmm.sample(3, 1, generator=gen(0)).shape == (3, 1)
    assert torch.equal(hmm.sample(5, 50, generator=gen(7)), a[0])  # return_states draws nothing more


def test_sampler_arguments_are_checked():
    hmm = hmm_preset("z1r")
    for batch, seq_len in [(0, 5), (2, 0)]:
        with pytest.raises(ValueError):
            hmm.sample(batch, seq_len, generator=gen(0))
    with pytest.raises(ValueError, match="differs from the generator"):
        hmm.sample(2, 5, generator=gen(0), device="meta")


def _chi_square(observed, expected):
    """(statistic, degrees of freedom) over the cells of positive expectation; observed counts in cells of zero
    expectation are an outright failure."""
    assert (observed[expected == 0] == 0).all(), "the sampler made a transition of probability 0"
    mask = expected > 0
    return float(((observed[mask] - expected[mask]) ** 2 / expected[mask]).sum()), int(mask.sum())


@pytest.mark.parametrize("hmm", every_hmm(), ids=repr)
def test_sampled_emissions_and_moves_follow_the_matrices(hmm):
    """For each hidden state i the counts of (token emitted, next state) against n_i T[:, i, :] (a chi-square
    over the states together, df = sum of the states' outcomes - 1), and the first states against the stationary
    law; p-value above 1e-3 with a fixed seed."""
    tokens, states = hmm.sample(400, 101, generator=gen(11), return_states=True)
    cells = (states[:, :-1] * hmm.vocab + tokens[:, :-1]) * hmm.hidden + states[:, 1:]  # (i, x, j)
    observed = torch.bincount(cells.flatten(), minlength=hmm.hidden * hmm.vocab * hmm.hidden).double()
    observed = observed.reshape(hmm.hidden, hmm.vocab * hmm.hidden)
    expected = observed.sum(1, keepdim=True) * hmm.transition_matrices.permute(1, 0, 2).reshape(hmm.hidden, -1)
    statistic, cells_used = _chi_square(observed, expected)
    df = cells_used - int((observed.sum(1) > 0).sum())
    if df:
        assert stats.chi2.sf(statistic, df) > P_THRESHOLD
    first = torch.bincount(states[:, 0], minlength=hmm.hidden).double()
    statistic, cells_used = _chi_square(first, 400 * hmm.stationary)
    if cells_used > 1:
        assert stats.chi2.sf(statistic, cells_used - 1) > P_THRESHOLD
    hmm.belief_states(tokens)  # every sampled sequence is possible


def test_sampled_tokens_have_the_stationary_token_law():
    """Token frequencies over many short independent sequences against pi E (positions of one sequence are
    dependent, so one position per sequence enters the chi-square)."""
    hmm = hmm_preset("rrxor")
    tokens = hmm.sample(20000, 7, generator=gen(12))
    law = hmm.stationary @ hmm.emission_law
    for position in (0, 6):
        observed = torch.bincount(tokens[:, position], minlength=2).double()
        statistic, cells_used = _chi_square(observed, 20000 * law)
        assert stats.chi2.sf(statistic, cells_used - 1) > P_THRESHOLD
    assert math.isclose(float(law[0]), 0.5)


def test_stacked_sampling_gives_each_member_what_it_draws_alone():
    mess3, rrxor = hmm_preset("mess3"), hmm_preset("rrxor")
    for members in ([mess3, mess3, mess3], [mess3, rrxor]):  # a stack of seeds (one object), and two processes
        sample = stacked_sampler(members, 4, 33, [gen(k) for k in range(len(members))])
        first, second = sample(), sample()
        for k, source in enumerate(members):
            alone = gen(k)
            assert torch.equal(first[k], source.sample(4, 33, generator=alone))
            assert torch.equal(second[k], source.sample(4, 33, generator=alone))


# --------------------------------------------------------------------------------------------------- kind
def test_the_hmm_kind_builds_presets_and_given_matrices():
    cfg = SourceConfig(kind="hmm", process="mess3", params={"x": 0.1})
    assert type(cfg) is HiddenMarkovConfig and not cfg.in_context and cfg.vocab_size == 3
    assert cfg.to_dict() == {"kind": "hmm", "process": "mess3", "params": {"alpha": 0.85, "x": 0.1}}
    assert SourceConfig.from_json(cfg.to_json()) == cfg and hash(cfg) == hash(SourceConfig.from_json(cfg.to_json()))
    assert torch.equal(cfg.build().transition_matrices, hmm_preset("mess3", x=0.1).transition_matrices)
    assert SourceConfig(kind="hmm", process="mess3") == SourceConfig(kind="hmm", process="mess3",
                                                                     params={"x": 0.05, "alpha": 0.85})
    assert cfg.replace(params={"alpha": 0.5}).build().params == {"x": 0.05, "alpha": 0.5}
    matrices = hmm_preset("z1r").transition_matrices
    custom = SourceConfig(kind="hmm", process="custom", matrices=matrices.tolist())
    assert custom.to_dict() == {"kind": "hmm", "process": "custom", "matrices": matrices.tolist()}
    assert torch.equal(custom.build().transition_matrices, matrices) and custom.vocab_size == 2
    for preset in ("rrxor", "random"):  # a source gives back the config that builds it
        source = SourceConfig(kind="hmm", process=preset).build()
        assert source.config.build().process == preset and torch.equal(
            source.config.build().transition_matrices, source.transition_matrices)
    assert custom.build().config == custom


@pytest.mark.parametrize("options, message", [
    (dict(process="mess4"), r"unknown HMM process 'mess4'; the presets are \['mess3', 'random', 'rrxor', 'z1r'\]"),
    (dict(process="rrxor", params={"x": 0.1}), r"the 'rrxor' process takes no parameters, got \['x'\]"),
    (dict(process="mess3", params={"x": 0.7}), "mess3 needs 0 <= x <= 0.5"),
    (dict(process="mess3", params=[1, 2]), "params must be a table"),
    (dict(process="custom"), "matrices go with process='custom'"),
    (dict(process="z1r", matrices=[[[1.0]]]), "matrices go with process='custom'"),
    (dict(process="custom", matrices=[[[0.5, 0.6]], [[0.0, 0.0]]]), "must have shape"),
    (dict(process="custom", matrices=[[[0.5, -0.1], [0.5, 0.0]], [[0.6, 0.0], [0.0, 0.5]]]), "negative entries"),
    (dict(process="custom", matrices=[[[0.5, 0.1], [0.5, 0.0]], [[0.0, 0.0], [0.0, 0.5]]]), "row 0 sums to 0.6"),
    (dict(process="mess3", vocab=3), r"a hmm source does not use \['vocab'\]"),
])
def test_bad_hmm_configs_raise_a_clear_error(options, message):
    with pytest.raises(ValueError, match=message):
        SourceConfig(kind="hmm", **options)


def test_an_hmm_run_trains_from_the_cli_and_python_beside_its_references(tmp_path, capsys):
    """`markov-interp train --source hmm --process rrxor` and `training.train` train the same run, and the hidden
    references (Bayes loss, entropy rate with its method, last-k-token losses) stand beside its loss in the
    output, the metrics rows and the result."""
    from markov_interp import probes, theory, training
    from markov_interp.cli import _train_run, build_parser, main

    argv = ["train", "--source", "hmm", "--process", "rrxor", "--steps", "3", "--seq-len", "8", "--layers", "1",
            "--d-model", "8"]
    run = _train_run(build_parser().parse_args([*argv, "--out", "x"]))
    assert run.source == SourceConfig(kind="hmm", process="rrxor") and run.model.d_vocab == 2
    assert run == training.default_run(kind="hmm", process="rrxor", steps=3, seq_len=8, n_layers=1, d_model=8)
    assert main([*argv, "--out", str(tmp_path / "cli")]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    refs = theory.reference_losses(run.source.build(), 9)
    assert "entropy rate 0.4621 (exact)" in line and f"Bayes loss {refs.bayes_loss:.4f}" in line
    assert "last-token loss 0.6931" in line and f"last-2-token loss {refs.trigram_loss:.4f}" in line
    result = training.train(run, tmp_path / "api", progress=False)
    assert result.final.references.hidden and result.final.optimum == pytest.approx(refs.bayes_loss)
    assert result.final.references.entropy_rate_method == "exact"
    rows = [r for r in result.metrics if "eval_loss" in r]
    assert rows[-1]["eval_true_loss"] < rows[-1]["eval_plateau_loss"] == pytest.approx(math.log(2))
    cli_rows = [r for r in training.load_metrics(tmp_path / "cli") if "eval_loss" in r]
    assert cli_rows[-1]["eval_loss"] == rows[-1]["eval_loss"]  # the same run, the same numbers
    batch = probes.sample_batch(run.source.build(), n_sequences=4, seq_len=6, seed=0)
    assert batch.kernels is None and torch.equal(batch.tokens, run.source.build().sample(4, 6, gen(0)))
    with pytest.raises(ValueError, match="compares the model with each sequence's kernel"):
        probes._common.kernel_probs(batch)
