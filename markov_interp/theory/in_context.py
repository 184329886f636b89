"""In-context laws: what can be learned about a sequence's own kernel from the sequence so far.

- `in_context_loss_curve`: the expected loss per position of the in-context add-beta estimator
  (`sources.add_beta_predictions`: Laplace beta = 1, Krichevsky-Trofimov beta = 1/2; the Bayes law of
  `RandomMarkov` with alpha = beta when the first state's law does not depend on the kernel, and what an
  induction-head circuit approximates), by plain Monte Carlo.
- The in-context references of `reference_losses` (add-alpha, in-context unigram and in-context Bayes losses):
  Rao-Blackwellised Monte Carlo with control variates to below 1e-3 (checked against exact enumeration of short
  binary sequences).
"""

import dataclasses
import math
from typing import Any

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from markov_interp._plan import Need, planned, power, size
from markov_interp.config import check_int
from markov_interp.sources import KernelSource, add_beta_predictions, context_index
from markov_interp.sources.contexts import block_sizes, kernel_bytes
from markov_interp.sources.contexts import solve_stationary as _solve_stationary
from markov_interp.theory._stats import MAX_SEQUENCES, _control_coefficients, _mean_se
from markov_interp.theory.expectations import KernelExpectations
from markov_interp.theory.fixed import cross_entropy, entropy, target_log_loss


def _curve_needs(a: Any) -> list[Need]:
    """A chunk of 512 sequences over seq_len positions and its in-context counts (V**order x V per position)."""
    source = a.get("source")
    if not isinstance(source, KernelSource):
        return []
    seq_len = size(a, "seq_len")
    return [Need.of("the in-context counts of a chunk", 512 * seq_len * power(source.vocab, source.order) *
                    source.vocab * 16, [("seq_len", seq_len)])]


@planned(_curve_needs)
def in_context_loss_curve(
    source: KernelSource,
    seq_len: int,
    *,
    beta: float | int | None = None,
    n_sequences: int = 4096,
    generator: torch.Generator | None = None,
) -> Float[Tensor, " pos"]:
    """Monte Carlo estimate of the expected add-beta loss at each position t (predicting x_{t+1}).

    Averaged over `n_sequences` sequences from `source`; beta defaults to the source's alpha for
    `RandomMarkov` (the Bayes-optimal loss curve) and to 1/2 otherwise. No closed form is practical here, hence
    the estimate; its standard error shrinks as 1/sqrt(n_sequences). Entry t is the loss of the prediction made
    after seeing x_0..x_t, so the curve has seq_len - 1 entries.
    """
    check_int("seq_len", seq_len, minimum=2)
    check_int("n_sequences", n_sequences, minimum=1, maximum=MAX_SEQUENCES)
    if beta is None:
        beta = source.alpha if source.alpha is not None else 0.5
    generator = generator if generator is not None else torch.Generator().manual_seed(0)
    total = torch.zeros(seq_len - 1, dtype=torch.float64)
    done = 0
    while done < n_sequences:
        chunk = min(512, n_sequences - done)
        tokens = source.sample(chunk, seq_len, generator)
        probs = add_beta_predictions(tokens, source.vocab, order=source.order, beta=beta, support=source.support)
        total += target_log_loss(probs, tokens).sum(0).cpu()
        done += chunk
    return total / n_sequences


def _first_state_gain(source: KernelSource, tokens: Tensor, rng: np.random.Generator, draws: int) -> Tensor:
    """log(V**k g) per sequence, g = E[pi_{c_0}(P) | transitions]: the log-loss (summed over the sequence)
    the Bayes predictor saves over add-alpha by using what a stationary first context c_0 says about P.

    Under the sampler, P(x) = E_P[pi_{c_0}(P) prod P(c_t, x_{t+1})] while add-alpha is the exact predictive of
    the law with a uniform first context, so the two total log-losses differ by log(V**k g) with g the posterior
    (rows Dirichlet(alpha + counts)) mean of pi_{c_0}. g is estimated from `draws` posterior kernels; the log's
    downward bias s**2 / (2 draws g**2) is added back."""
    vocab, order = source.vocab, source.order
    batch = tokens.shape[0]
    ctx = context_index(tokens, vocab, order)
    counts = torch.zeros(batch, vocab**order * vocab, dtype=torch.float64)
    pair = ctx[:, order - 1:-1] * vocab + tokens[:, order:]
    counts.scatter_add_(1, pair, torch.ones_like(pair, dtype=torch.float64))
    shape = counts.reshape(batch, vocab**order, vocab).numpy() + source.alpha
    allowed = 1.0 if source.support is None else source.support.numpy().astype(np.float64)
    first = []  # [draws, batch], a block of draws at a time: numpy draws them as one call would
    for size in block_sizes(draws, batch * kernel_bytes(vocab**order, vocab)):
        gam = rng.standard_gamma(shape, size=(size, *shape.shape)).clip(1e-300) * allowed  # posterior rows
        pi = _solve_stationary(torch.from_numpy(gam / gam.sum(-1, keepdims=True)))  # [size, batch, contexts]
        first.append(torch.gather(pi, 2, ctx[:, order - 1].expand(size, batch)[..., None])[..., 0])
    first = torch.cat(first)
    g, var = first.mean(0), first.var(0)
    return torch.log(vocab**order * g) + var / (2 * draws * g**2)


def _in_context_chunk(source: KernelSource, seq_len: int, batch: int, gen: torch.Generator,
                      rng: np.random.Generator, gain_draws: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per sequence and target ([2, batch, target]: add-alpha, in-context unigram) the Rao-Blackwellised losses
    and their control variates, and per sequence the first-state gain (0 if the start ignores P).

    Rao-Blackwell: the loss at t is averaged over x_{t+1} ~ P(c_t, .) given the sequence's kernel, instead of
    taken at the sampled x_{t+1}. Controls: with a stationary start H(P(c_t, .)) and sum_x P(c_t, x)(-log pi(x)),
    whose means are E[entropy rate] and E[H(pi)] at every t >= k - 1; otherwise the kernel's entropy rate and
    H(pi), with the same means (0 where t < k - 1: no control there). They remove most of the kernel-to-kernel
    variance."""
    tokens, kernels = source.sample(batch, seq_len, gen, return_kernels=True)
    # the per-sequence losses in blocks of sequences (the transition counts take V**(k+1) floats per position);
    # each sequence's values do not depend on its block, so this is the unblocked result bit for bit
    sizes = block_sizes(batch, 8 * seq_len * (source.vocab ** (source.order + 1) + 1))
    parts = [_in_context_block(source, t, k) for t, k in zip(tokens.split(sizes), kernels.split(sizes))]
    values, controls = (torch.cat(column, 1) for column in zip(*parts))
    stationary = source.initial == "stationary"
    gain = _first_state_gain(source, tokens, rng, gain_draws) if stationary else torch.zeros(batch, dtype=torch.float64)
    return values, controls, gain


def _in_context_block(source: KernelSource, tokens: Int[Tensor, "batch pos"],
                      kernels: Float[Tensor, "batch context vocab"]) -> tuple[Tensor, Tensor]:
    """`_in_context_chunk`'s losses ([2, batch, target]: add-alpha, in-context unigram) and their controls for
    the sequences `tokens` drawn from `kernels`."""
    vocab, order, alpha = source.vocab, source.order, source.alpha
    batch = tokens.shape[0]
    ctx = context_index(tokens, vocab, order)[:, :-1]
    valid = ctx >= 0
    rows = torch.gather(kernels, 1, ctx.clamp_min(0)[..., None].expand(-1, -1, vocab))  # [batch, target, V]
    pi_ctx = _solve_stationary(kernels)
    pi = pi_ctx.reshape(batch, -1, vocab).sum(1)  # law of one state
    support = source.support  # counts over the allowed transitions (zero_diagonal: the other states)
    add_alpha = cross_entropy(add_beta_predictions(tokens, vocab, order=order, beta=alpha, support=support)[:, :-1],
                              rows)
    uni_probs = add_beta_predictions(tokens, vocab, order=0, beta=alpha, support=support)
    unigram = torch.where(valid, cross_entropy(uni_probs[:, :-1], rows), target_log_loss(uni_probs, tokens))
    if source.initial == "stationary":
        # pi is floored: a state of law ~1e-300 (tiny alpha) would make the control infinite
        cv_rate, cv_uni = entropy(rows), cross_entropy(pi.clamp_min(1e-300)[:, None, :].expand_as(rows), rows)
    else:
        cv_rate = (pi_ctx * entropy(kernels)).sum(-1)[:, None].expand_as(add_alpha)
        cv_uni = entropy(pi)[:, None].expand_as(add_alpha)
    zero = torch.zeros((), dtype=torch.float64)
    controls = torch.stack([torch.where(valid, cv_rate, zero), torch.where(valid, cv_uni, zero)])
    return torch.stack([add_alpha, unigram]), controls


def _fixed_start_gain(source: KernelSource) -> float:
    """Total log-loss the Bayes predictor saves over add-alpha inside a fixed first-context law mu (order > 1:
    add-alpha predicts uniformly there, Bayes by mu's conditionals): (k - 1) log V - H(mu) + H(mu's first state)."""
    vocab, order = source.vocab, source.order
    if order == 1:
        return 0.0
    mu = torch.tensor(source.initial, dtype=torch.float64)
    first = mu.reshape(vocab, -1).sum(1)
    return float((order - 1) * math.log(vocab) - entropy(mu) + entropy(first))


@dataclasses.dataclass
class _Moments:
    """Running sums for means and standard errors of per-target and per-sequence values."""

    n: int = 0
    targets: Any = 0.0  # sum over sequences, [2, target]: add-alpha, unigram
    targets_sq: Any = 0.0
    seqs: Any = 0.0  # sum over sequences, [3]: add-alpha, unigram, Bayes (sequence means)
    seqs_sq: Any = 0.0

    def add(self, per_target: Tensor, gain: Tensor) -> None:
        """`per_target` [2, batch, target]: add-alpha and unigram values; `gain` [batch] the first-state gain."""
        add_alpha, unigram = per_target.mean(2)
        per_seq = torch.stack([add_alpha, unigram, add_alpha - gain / per_target.shape[2]], 0)
        self.n += per_target.shape[1]
        self.targets = self.targets + per_target.sum(1)
        self.targets_sq = self.targets_sq + (per_target**2).sum(1)
        self.seqs = self.seqs + per_seq.sum(1)
        self.seqs_sq = self.seqs_sq + (per_seq**2).sum(1)

    def mean_se(self, which: str) -> tuple[Tensor, Tensor]:
        total, sq = (self.targets, self.targets_sq) if which == "targets" else (self.seqs, self.seqs_sq)
        return _mean_se(total, sq, self.n)


def _in_context_references(source: KernelSource, seq_len: int, kernel: KernelExpectations, *, seed: int,
                           tol: float, n_sequences: int | None) -> dict:
    """Monte Carlo (Rao-Blackwellised, with control variates) of the in-context losses: draw chunks of
    sequences until every averaged value's standard error is below `tol` (at least 1024 sequences, at most
    2**18), or exactly `n_sequences` when given."""
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng([seed, 13])
    chunk = min(max(2**18 // seq_len, 1024), 8192)
    moments, coef = _Moments(), None
    means = torch.tensor([kernel.entropy_rate, kernel.oracle_unigram_loss], dtype=torch.float64)[:, None]
    mean_ses = torch.tensor([kernel.entropy_rate_se, kernel.oracle_unigram_loss_se], dtype=torch.float64)[:, None]
    fixed_gain = 0.0 if source.initial == "stationary" else _fixed_start_gain(source) / (seq_len - 1)
    while True:
        size = chunk if n_sequences is None else min(chunk, n_sequences - moments.n)
        values, controls, gain = _in_context_chunk(source, seq_len, size, gen, rng, gain_draws=32)
        if coef is None:  # per-target coefficients from the first chunk (the O(1/n) bias is negligible)
            coef = _control_coefficients(values, controls)
            shift, shift_se = coef * means, coef.abs() * mean_ses  # [2, target]: what the controls' means add back
            seq_shift_se = torch.cat([shift_se.mean(1), shift_se[:1].mean(1)])
        moments.add(values - coef[:, None, :] * controls, gain)
        seq_mean, seq_se = moments.mean_se("seqs")
        seq_se = (seq_se**2 + seq_shift_se**2).sqrt()
        if n_sequences is not None and moments.n >= n_sequences:
            break
        if n_sequences is None and (seq_se.max() < tol or moments.n >= MAX_SEQUENCES):
            break
    curve, curve_se = moments.mean_se("targets")
    curve, curve_se = curve + shift, (curve_se**2 + shift_se**2).sqrt()
    values = seq_mean + torch.cat([shift.mean(1), shift[:1].mean(1)])
    return {
        "add_alpha_loss": float(values[0]), "add_alpha_loss_se": float(seq_se[0]),
        "unigram_loss": float(values[1]), "unigram_loss_se": float(seq_se[1]),
        "bayes_loss": float(values[2]) - fixed_gain, "bayes_loss_se": float(seq_se[2]),
        "add_alpha_curve": tuple(curve[0].tolist()), "add_alpha_curve_se": tuple(curve_se[0].tolist()),
        "unigram_curve": tuple(curve[1].tolist()), "unigram_curve_se": tuple(curve_se[1].tolist()),
        "n_sequences": moments.n,
    }
