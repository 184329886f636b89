"""The exact references of hidden Markov sources (`theory.hidden`).

Independent computations: word probabilities pi T[x_0] ... T[x_n] 1 by loops over Python floats and itertools,
block entropies from them (H(X_{t+1} | X_0..X_t) = H(X_0..X_{t+1}) - H(X_0..X_t) is the Bayes loss at position
t), a Markov chain written as an HMM against the chain's own references (`theory.entropy_rate`,
`theory.unigram_loss`), the entropy rates of RRXOR (2/3 bit) and Z1R (1/3 bit) from the literature (Crutchfield
& Feldman 2003, "Regularities unseen, randomness observed"), and Monte Carlo of the plain log-loss.
"""

import itertools
import math

import pytest
import torch

from markov_interp import theory
from markov_interp.sources import MarkovChain
from markov_interp.sources.hmm import PRESETS, HiddenMarkov, hmm_preset
from markov_interp.theory import hidden
from tests.handbuilt import chain_hmm  # a first-order chain as an HMM (hidden state = last token)

LN2 = math.log(2)


def gen(seed):
    return torch.Generator().manual_seed(seed)


def split_state_hmm(kernel, share=0.3):
    """The same chain with state 0 split into two hidden copies (0a entered with probability `share`): the same
    process in a presentation that is not unifilar (emitting 0 can lead to either copy)."""
    k = torch.as_tensor(kernel, dtype=torch.float64)
    v = len(k)
    rows = torch.cat([k[:1], k])  # hidden 0, 1 are copies of state 0; hidden s + 1 is state s
    t = torch.zeros(v, v + 1, v + 1, dtype=torch.float64)
    for x in range(v):
        if x == 0:
            t[0, :, 0], t[0, :, 1] = share * rows[:, 0], (1 - share) * rows[:, 0]
        else:
            t[x, :, x + 1] = rows[:, x]
    return HiddenMarkov(t)


def loop_word_probability(hmm, word, start=None):
    """P(word) from the stationary start, or given the first hidden state `start`."""
    t, pi = hmm.transition_matrices.tolist(), hmm.stationary.tolist()
    forward = list(pi) if start is None else [float(i == start) for i in range(hmm.hidden)]
    for x in word:
        forward = [sum(forward[i] * t[x][i][j] for i in range(hmm.hidden)) for j in range(hmm.hidden)]
    return sum(forward)


def loop_block_entropy(hmm, length, start=None):
    probs = [loop_word_probability(hmm, w, start) for w in itertools.product(range(hmm.vocab), repeat=length)]
    return -sum(p * math.log(p) for p in probs if p > 0)


def test_word_law_matches_loops():
    for hmm in [hmm_preset(name) for name in PRESETS]:
        for length in range(4):
            words = list(itertools.product(range(hmm.vocab), repeat=length))
            expected = torch.tensor([loop_word_probability(hmm, w) for w in words], dtype=torch.float64)
            assert torch.allclose(hidden.word_law(hmm, length), expected, atol=1e-15)


@pytest.mark.parametrize("hmm", [hmm_preset(n) for n in PRESETS] + [hmm_preset("random", hidden=4, vocab=2, seed=9)],
                         ids=repr)
def test_context_losses_and_early_bayes_losses_are_block_entropy_differences(hmm):
    blocks = [0.0] + [loop_block_entropy(hmm, n) for n in range(1, 7)]
    for k in range(3):
        assert hidden.context_loss(hmm, k) == pytest.approx(blocks[k + 1] - blocks[k], abs=1e-12)
    curve = hidden.bayes_loss_curve(hmm, 5)  # Z1R has synchronised after 3 tokens: the rest is its entropy rate
    assert curve.method == "exact" and curve.errors == (0.0,) * 5
    for t in range(5):  # position t: H(X_{t+1} | X_0..X_t)
        assert curve.values[t] == pytest.approx(blocks[t + 2] - blocks[t + 1], abs=1e-11)


@pytest.mark.parametrize("hmm", [hmm_preset("mess3"), hmm_preset("random", hidden=4, vocab=2, seed=9)], ids=repr)
def test_both_enumerations_are_block_entropy_differences(hmm):
    """`entropy_rate_bounds`' two enumerations position by position, as deep as max_states = 30 lets them go: from
    the stationary start H(X_{d+1} | X_0..X_d), and from a known first hidden state H(X_{d+1} | X_0..X_d, S_0) =
    sum_s pi_s (H(X_0..X_{d+1} | S_0 = s) - H(X_0..X_d | S_0 = s)), both from word probabilities by loops."""
    enumeration = hidden._enumerate(hidden._hmm_key(hmm), 30)
    assert 2 <= len(enumeration.lower) <= len(enumeration.upper) < 6  # max_states stops both early
    pi = hmm.stationary.tolist()

    def known_start(length):
        return sum(pi[s] * loop_block_entropy(hmm, length, s) for s in range(hmm.hidden) if pi[s] > 0)

    blocks = [0.0] + [loop_block_entropy(hmm, n) for n in range(1, len(enumeration.upper) + 2)]
    known = [0.0] + [known_start(n) for n in range(1, len(enumeration.lower) + 2)]
    for d, value in enumerate(enumeration.upper):
        assert value == pytest.approx(blocks[d + 2] - blocks[d + 1], abs=1e-12)
    for d, value in enumerate(enumeration.lower):
        assert value == pytest.approx(known[d + 2] - known[d + 1], abs=1e-12)


def test_a_markov_chain_as_an_hmm_gives_the_chains_references():
    kernel = [[0.7, 0.2, 0.1], [0.1, 0.1, 0.8], [0.3, 0.3, 0.4]]
    for hmm in (chain_hmm(kernel), split_state_hmm(kernel)):
        rate = theory.entropy_rate(kernel)
        value, error, method = hidden.hidden_entropy_rate(hmm)
        assert value == pytest.approx(rate, abs=1e-12) and error == 0.0 and method == "exact"
        assert hidden.context_loss(hmm, 0) == pytest.approx(theory.unigram_loss(kernel), abs=1e-12)
        assert hidden.context_loss(hmm, 1) == pytest.approx(rate, abs=1e-12)
        assert hidden.context_loss(hmm, 2) == pytest.approx(rate, abs=1e-12)
        curve = hidden.bayes_loss_curve(hmm, 40)  # the first state is stationary: the entropy rate everywhere
        assert max(abs(v - rate) for v in curve.values) < 1e-12 and curve.method == "exact"
    assert chain_hmm(kernel).unifilar and not split_state_hmm(kernel).unifilar


def test_entropy_rates_of_rrxor_and_z1r_are_the_literatures():
    for name, bits in [("rrxor", 2 / 3), ("z1r", 1 / 3)]:
        hmm = hmm_preset(name)
        value, error, method = hidden.hidden_entropy_rate(hmm)
        assert value == pytest.approx(bits * LN2, abs=1e-14) and (error, method) == (0.0, "exact")
        lower, upper = hidden.entropy_rate_bounds(hmm)  # the enumeration reaches the same value by itself
        assert lower == pytest.approx(bits * LN2, abs=1e-12) and upper - lower <= 1e-12
        curve = hidden.bayes_loss_curve(hmm, 200)
        assert curve.method == "exact" and curve.values[-1] == pytest.approx(bits * LN2, abs=1e-12)
    # Z1R synchronises by the third token; RRXOR only in probability (a run of equal bits keeps the phase open)
    z1r = hidden.bayes_loss_curve(hmm_preset("z1r"), 5).values
    assert z1r[0] == pytest.approx(math.log(3) - 2 / 3 * LN2, abs=1e-12)  # H(X_1 | X_0) = H(X_0 X_1) - H(X_0)
    assert z1r[2:] == pytest.approx([LN2 / 3] * 3, abs=1e-14)


def test_mess3_is_bracketed_tightly_and_its_curve_falls():
    mess3 = hmm_preset("mess3")
    lower, upper = hidden.entropy_rate_bounds(mess3)
    assert 0 < upper - lower < 3e-7
    value, error, method = hidden.hidden_entropy_rate(mess3)
    assert method == "bracket" and lower <= value <= upper and error == pytest.approx((upper - lower) / 2)
    curve = hidden.bayes_loss_curve(mess3, 63)
    assert curve.exact_positions == 11 and curve.method == "bracket"
    assert all(a >= b for a, b in zip(curve.values[:11], curve.values[1:11]))  # falling as the belief synchronises
    # a deeper enumeration's exact values lie within the bracketed ones' errors
    deeper = hidden.bayes_loss_curve(mess3, 13, max_states=1 << 20)
    assert deeper.exact_positions == 12
    assert abs(deeper.values[11] - curve.values[11]) <= curve.errors[11]
    assert hidden.context_loss(mess3, 1) == pytest.approx(curve.values[0], abs=1e-12)


def test_exact_curve_agrees_with_monte_carlo_of_the_plain_log_loss():
    """E[-log P(x_{t+1} | x_0..x_t)] over sampled Mess3 sequences (not the Rao-Blackwellised entropy the module's
    Monte Carlo uses) within 4.5 standard errors at every exact position."""
    mess3 = hmm_preset("mess3")
    tokens = mess3.sample(20000, 12, generator=gen(5))
    losses = theory.target_log_loss(mess3.bayes_predictions(tokens), tokens)  # [batch, 11]
    means, ses = losses.mean(0), losses.std(0) / math.sqrt(len(losses))
    exact = torch.tensor(hidden.bayes_loss_curve(mess3, 11).values, dtype=torch.float64)
    assert ((means - exact).abs() < 4.5 * ses).all()


def _slow():
    """A Mess3 that synchronises slowly (weak emissions): its bracket stays wide where beliefs are few."""
    return hmm_preset("mess3", x=0.02, alpha=0.5)


def test_monte_carlo_beyond_the_enumeration_agrees_with_exact_values():
    slow = _slow()
    curve = hidden.bayes_loss_curve(slow, 10, max_states=27, tol=2e-3, seed=1)
    exact = hidden.bayes_loss_curve(slow, 10)
    assert curve.method == "monte carlo" and curve.exact_positions == 3 and exact.exact_positions == 10
    assert curve.values[:3] == exact.values[:3] and max(curve.errors) < 2e-3 and min(curve.errors[3:]) > 0
    z = [(a - b) / e for a, b, e in zip(curve.values[3:], exact.values[3:], curve.errors[3:])]
    assert max(abs(v) for v in z) < 4.5
    assert abs(curve.mean - exact.mean) < 4.5 * curve.mean_error
    again = hidden.bayes_loss_curve(slow, 10, max_states=27, tol=2e-3, seed=1)
    assert again == curve  # same seed, same numbers
    fixed = hidden.bayes_loss_curve(slow, 10, max_states=27, n_sequences=300)
    assert max(fixed.errors) > max(curve.errors)


def test_monte_carlo_entropy_rate_lies_in_the_bracket():
    slow = _slow()
    lower, upper = hidden.entropy_rate_bounds(slow)  # 6e-3 wide
    assert upper - lower > 1e-3
    value, error, method = hidden.hidden_entropy_rate(slow, tol=1e-3)
    assert method == "monte carlo" and 0 < error < 1e-3
    assert lower - 4 * error <= value <= upper + 4 * error


def test_mixed_states_are_laws_whose_mean_is_stationary():
    for name in PRESETS:
        hmm = hmm_preset(name)
        beliefs, probs = hidden.mixed_states(hmm, 4)
        assert probs.sum().item() == pytest.approx(1.0, abs=1e-12)
        assert torch.allclose(beliefs.sum(-1), torch.ones(len(beliefs), dtype=torch.float64))
        assert torch.allclose(probs @ beliefs, hmm.stationary, atol=1e-12)  # E[P(S | x_0..x_3)] = P(S) = pi
    mess3_beliefs, _ = hidden.mixed_states(hmm_preset("mess3"), 4)
    assert len(mess3_beliefs) == 3**4  # no two words of Mess3 give the same belief
    # every word's belief (from the filter) is among the mixed states, with the word's probability summed
    z1r = hmm_preset("z1r")
    words = torch.tensor(list(itertools.product(range(2), repeat=3)))
    law = hidden.word_law(z1r, 3)
    possible = words[law > 0]
    filtered = z1r.belief_states(possible)[:, -1]
    beliefs, probs = hidden.mixed_states(z1r, 3)
    for belief, p in zip(beliefs, probs):
        same = (filtered - belief).abs().sum(-1) < 1e-9
        assert law[law > 0][same].sum().item() == pytest.approx(p.item(), abs=1e-12)


def test_hidden_references_collect_the_values_and_are_cached():
    mess3 = hmm_preset("mess3")
    refs = hidden.hidden_references(mess3, 64)
    assert refs is hidden.hidden_references(hmm_preset("mess3"), 64)
    assert refs is theory.reference_losses(mess3, 64)  # the hidden family of every source's references
    ks = tuple(hidden.context_loss(mess3, k) for k in range(3))
    assert (refs.unigram_loss, refs.bigram_loss, refs.trigram_loss) == ks and refs.unigram_loss == pytest.approx(
        math.log(3))
    curve = hidden.bayes_loss_curve(mess3, 63)
    assert refs.bayes_curve == curve.values and len(refs.bayes_curve) == 63 and refs.bayes_loss == curve.mean
    assert refs.bayes_loss == pytest.approx(sum(refs.bayes_curve) / 63) and refs.optimum == refs.bayes_loss
    assert (refs.entropy_rate, refs.entropy_rate_se, refs.entropy_rate_method) == hidden.hidden_entropy_rate(mess3)
    assert refs.entropy_rate < refs.bayes_loss < refs.trigram_loss < refs.bigram_loss < refs.unigram_loss
    assert refs.hidden and not refs.in_context and refs.in_context_unigram_loss is None
    assert "entropy rate 0.7935 (bracket)" in refs.describe() and "Bayes loss 0.7949" in refs.describe()


def test_hidden_references_survive_a_metrics_row():
    """What training logs (`as_row`, rounded) reads back (`from_row`) with the method and the k-token losses."""
    refs = theory.reference_losses(hmm_preset("rrxor"), 16)
    row = refs.as_row(digits=12)
    assert row["entropy_rate_method"] == "exact" and row["bigram_loss"] == pytest.approx(LN2)
    back = theory.ReferenceLosses.from_row(row)
    assert back.hidden and back.entropy_rate_method == "exact" and back.trigram_loss == pytest.approx(refs.trigram_loss)
    assert back.optimum == pytest.approx(refs.bayes_loss) and back.describe() == refs.describe()


def test_the_plateau_of_a_hidden_source_is_the_stationary_token_law():
    z1r, tokens = hmm_preset("z1r"), hmm_preset("z1r").sample(4, 6, generator=gen(0))
    law = theory.plateau_predictions(z1r, tokens)
    assert law.shape == (4, 6, 2) and torch.allclose(law, torch.tensor([0.5, 0.5], dtype=torch.float64))
    rrxor = hmm_preset("rrxor")  # T emits 1, F emits 0, the random bits are fair: P(1) = (2 * 1/2 + 1/2) / 3
    assert torch.allclose(theory.plateau_predictions(rrxor, tokens)[0, 0],
                          torch.tensor([0.5, 0.5], dtype=torch.float64))
    assert theory.reference_family(rrxor).name == "hidden" and theory.reference_family(MarkovChain([[0.5, 0.5], [0.5, 0.5]])).name \
        == "kernel"
    with pytest.raises(ValueError, match="unknown source type str: theory knows the references of"):
        theory.reference_losses("mess3", 8)


@pytest.mark.parametrize("call, message", [
    (lambda: hidden.context_loss(hmm_preset("z1r"), -1), "k must be"),
    (lambda: hidden.word_law(hmm_preset("mess3"), 30), "exceed"),
    (lambda: hidden.bayes_loss_curve(hmm_preset("z1r"), 0), "n_positions must be"),
    (lambda: hidden._as_hmm(theory.entropy), "expected a hidden Markov source"),  # what the type hints refuse
    (lambda: hidden.mixed_states(hmm_preset("mess3"), 5, max_states=100), "more than max_states=100"),
    (lambda: hidden.hidden_references(hmm_preset("z1r"), 1), "seq_len must be"),
    (lambda: hidden.hidden_entropy_rate(hmm_preset("mess3"), tol=0.0), "tol must be"),
])
def test_bad_arguments_raise_a_clear_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()
