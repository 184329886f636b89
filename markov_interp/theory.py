"""Exact reference quantities: what loss a model *should* reach, in nats.

- `stationary_distribution`: the law pi the chain settles into.
- `unigram_loss`: H(pi), the loss of the best predictor that ignores the context. A single-layer transformer
  stuck at a bad local minimum sits here (Makkuva et al.).
- `entropy_rate`: sum_s pi(s) H(P(. | s)), the loss of the true kernel, which is the best any predictor can do on
  a fixed chain (exact at every position when the first states are drawn from pi).
- `add_beta_predictions`: the in-context add-beta (Laplace beta = 1, Krichevsky-Trofimov beta = 1/2) estimator of
  the next-state law from transition counts in the sequence so far: Bayes-optimal for `RandomMarkov` with
  alpha = beta when the first state's law does not depend on the kernel, and what an induction-head circuit
  approximates.
- `kernel_predictions` / `stationary_predictions`: the true next-state law (exact before an order-k context is
  full) and pi at every position, given each sequence's kernel: the one computation behind `true_predictions` /
  `plateau_predictions` for fixed chains and the probes' `kernel_probs` / `stationary_probs`.
- `pool_posterior` / `pool_bayes_predictions`: for a finite pool of kernels (`RandomMarkov(pool_size=N)`, or a
  fixed chain as a pool of one) the exact posterior over the pool given x_0..x_t and the Bayes predictor it
  gives (the mixture of the pool's kernel rows), in log space, chunked over the batch.
- `reference_losses`: all of these for a source as a `ReferenceLosses`, each with its standard error. Fixed
  chains: exact. Random kernels: E[entropy rate] and E[H(pi)] by quadrature (two states) or Monte Carlo to 1e-4
  (exact averages over a finite pool); the in-context Bayes, add-alpha and in-context unigram losses by
  Rao-Blackwellised Monte Carlo with control variates to below 1e-3 (checked against exact enumeration of short
  binary sequences), and for a pool the pool-Bayes loss; cached.

Sources are used through the `data.Source` protocol (vocab, order, alpha, pool, sample, initial_context_laws).

Order-k kernels ([V]*k + [V]) are handled through the chain on contexts (the last k states).
"""

import dataclasses
import functools
import hashlib
import json
import math
import os
import stat
import warnings
from pathlib import Path
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from markov_interp._display import displayed
from markov_interp._io import atomic_write, describe_kind
from markov_interp.config import Checked, bounds
from markov_interp.chains import context_kernel as _context_kernel
from markov_interp.chains import block_sizes, context_transition_matrix, kernel_bytes
from markov_interp.chains import solve_stationary as _solve_stationary
from markov_interp.chains import stationary_context_law
from markov_interp.data import Source, SourceConfig, validate_kernel

Kernel = Any  # a [V]*k + [V] array-like or a fixed chain; validated by data.validate_kernel
_CHUNK_ELEMENTS = 1 << 22  # float64 entries of the largest temporary an exact pool computation holds (32 MiB)


def _as_kernel(kernel: Kernel) -> Tensor:
    if isinstance(kernel, Source):
        pool = kernel.pool
        if pool is None or pool.shape[0] != 1:
            raise ValueError(f"{kernel!r} has no single kernel: each of its sequences draws one from a prior or pool")
        return pool[0].reshape([kernel.vocab] * (kernel.order + 1))
    k = torch.as_tensor(kernel, dtype=torch.float64)
    return validate_kernel(k, order=max(k.ndim - 1, 1))


def stationary_context_distribution(kernel: Kernel, *, check: bool = True) -> Float[Tensor, " context"]:
    """Stationary law over contexts (the last k states, base-V index, oldest first) of an order-k kernel.

    For order 1 this is the stationary distribution pi itself. Raises ValueError when the law is not unique
    (a reducible chain with several closed classes).
    """
    if check:
        return stationary_context_law(_as_kernel(kernel))
    return _solve_stationary(_context_kernel(kernel.to(torch.float64)))


def stationary_context_laws(kernels: Float[Tensor, "batch context vocab"]) -> Float[Tensor, "batch context"]:
    """Stationary laws over contexts of many kernels at once (rows flattened to [V**k, V], as `RandomMarkov`
    draws them). No uniqueness check: for irreducible chains such as Dirichlet-drawn ones."""
    return _solve_stationary(kernels.to(torch.float64))


def stationary_distribution(kernel: Kernel) -> Float[Tensor, " vocab"]:
    """The stationary law pi of the chain: the long-run frequency of each state (float64, sums to 1).

    For a binary chain with switching probabilities p, q this is (q, p) / (p + q). For an order-k kernel it is
    the law of a single state under the stationary law of contexts.

    >>> stationary_distribution([[0.8, 0.2], [0.3, 0.7]])
    tensor([0.6000, 0.4000], dtype=torch.float64)
    """
    k = _as_kernel(kernel)
    vocab = k.shape[-1]
    contexts = stationary_context_distribution(k)
    return contexts.reshape(-1, vocab).sum(0)


def entropy(probs: Float[Tensor, "*batch vocab"]) -> Float[Tensor, "*batch"]:
    """Shannon entropy in nats over the last axis, with 0 log 0 = 0."""
    return -torch.special.xlogy(probs, probs).sum(-1)


def entropy_rate(kernel: Kernel) -> float:
    """The entropy rate sum_c pi(c) H(P(. | c)) in nats: the bigram-optimal (k-gram-optimal) loss.

    The loss of predicting with the true kernel, the global minimum of a transformer's training loss. For the
    binary chain it is (q h(p) + p h(q)) / (p + q).

    >>> round(entropy_rate([[0.8, 0.2], [0.3, 0.7]]), 4)
    0.5446
    """
    k = _as_kernel(kernel)
    pi = stationary_context_distribution(k)
    return float((pi * entropy(_context_kernel(k))).sum())


def unigram_loss(kernel: Kernel) -> float:
    """H(pi) in nats: the loss of the best context-free predictor, which always predicts pi.

    The loss at the bad local minima of single-layer transformers (Makkuva et al.).

    >>> round(unigram_loss([[0.8, 0.2], [0.3, 0.7]]), 4)
    0.673
    """
    return float(entropy(stationary_distribution(kernel)))


def cross_entropy(
    predicted: Float[Tensor, "*batch vocab"], true: Float[Tensor, "*batch vocab"]
) -> Float[Tensor, "*batch"]:
    """Expected log-loss -sum_x true(x) log predicted(x) in nats of predicting `predicted` when `true` holds."""
    return -torch.special.xlogy(true, predicted).sum(-1)


def kl_divergence(
    true: Float[Tensor, "*batch vocab"], predicted: Float[Tensor, "*batch vocab"]
) -> Float[Tensor, "*batch"]:
    """KL(true || predicted) in nats: the excess loss of predicting `predicted` over the true law."""
    return cross_entropy(predicted, true) - entropy(true)


def context_index(tokens: Int[Tensor, "batch pos"], vocab: int, order: int) -> Int[Tensor, "batch pos"]:
    """Base-V index of the last `order` states ending at each position (oldest first); -1 where too short."""
    index = torch.zeros_like(tokens)
    for lag in range(order):  # order is tiny (1..4): a loop over lags, not positions
        shifted = torch.roll(tokens, lag, dims=1)
        index = index + shifted * vocab ** lag
    index[:, : order - 1] = -1
    return index


def add_beta_predictions(
    tokens: Int[Tensor, "batch pos"], vocab: int, *, order: int = 1, beta: float | int = 1.0,
    support: Bool[Tensor, "context vocab"] | None = None,
) -> Float[Tensor, "batch pos vocab"]:
    """In-context add-beta estimate of P(x_{t+1} | x_0..x_t) at every position t.

    Counts the transitions c -> x seen inside the sequence up to position t (from the context c of the last
    `order` states to the next state x) and predicts (n(c_t, x) + beta) / (n(c_t) + V beta) for the current
    context c_t. beta = 1 is Laplace's rule, beta = 1/2 Krichevsky-Trofimov. Under `RandomMarkov(alpha=beta)`
    this is the Bayes posterior predictive; positions with fewer than `order` states predict uniformly.
    order = 0 is the in-context unigram estimator (state counts over x_0..x_t): Edelman et al.'s unigram phase.

    `support` (a source's `support`, [V**order, V] booleans; [V, V] with order 0): only the allowed states of
    the current context are counted and predicted, (n(c_t, x) + beta) / (n(c_t) + |allowed(c_t)| beta) for an
    allowed x and 0 otherwise: the posterior predictive when each row is Dirichlet(beta) over its allowed states.
    With order 0 the row of the current state restricts the state counts (the unigram estimator that knows
    which states can follow the current one).

    Args:
        tokens: the states.
        vocab: the number of states V.
        order: the context length k (0: state counts).
        beta: the pseudo-count.
        support: the allowed transitions, or None (all).

    Returns:
        The predicted law of x_{t+1} at every position t (float64).

    >>> add_beta_predictions(torch.tensor([[0, 1, 0]]), 2)[0, 2]  # after 0->1, 1->0 and now in state 0
    tensor([0.3333, 0.6667], dtype=torch.float64)
    >>> add_beta_predictions(torch.tensor([[0, 1, 0]]), 3, support=~torch.eye(3, dtype=torch.bool))[0, 2]
    tensor([0.0000, 0.6667, 0.3333], dtype=torch.float64)
    """
    if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 2:
        raise ValueError(f"vocab must be an integer >= 2, got {vocab!r}")
    if isinstance(order, bool) or not isinstance(order, int) or order < 0:
        raise ValueError(f"order must be an integer >= 0, got {order!r}")
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta!r}")
    if tokens.numel() and (tokens.min() < 0 or tokens.max() >= vocab):
        raise ValueError(f"tokens must lie in 0..{vocab - 1}, got values in {tokens.min()}..{tokens.max()}")
    allowed = _check_support(support, vocab, order, tokens.device)
    if order == 0:  # in-context unigram: state counts over x_0..x_t, whatever the current state
        counts = torch.nn.functional.one_hot(tokens, vocab).to(torch.float64).cumsum(1)
        if allowed is None:
            return (counts + beta) / (counts.sum(-1, keepdim=True) + vocab * beta)
        return _restricted(counts, allowed[tokens], beta)
    batch, seq = tokens.shape
    n_ctx = vocab**order
    ctx = context_index(tokens, vocab, order)
    # transition u -> u+1 has context ctx[u] and next state tokens[u+1]; it is seen from position u+1 on.
    pair = torch.full((batch, seq), -1, dtype=torch.long, device=tokens.device)
    pair[:, 1:] = torch.where(ctx[:, :-1] >= 0, ctx[:, :-1] * vocab + tokens[:, 1:], -1)
    onehot = torch.zeros(batch, seq, n_ctx * vocab + 1, dtype=torch.float64, device=tokens.device)
    onehot.scatter_(2, (pair % (n_ctx * vocab + 1)).unsqueeze(-1), 1.0)  # -1 lands in the spare last slot
    counts = onehot[..., :-1].cumsum(1).reshape(batch, seq, n_ctx, vocab)
    current = torch.gather(counts, 2, ctx.clamp_min(0)[..., None, None].expand(batch, seq, 1, vocab))[:, :, 0]
    if allowed is None:
        probs = (current + beta) / (current.sum(-1, keepdim=True) + vocab * beta)
    else:
        probs = _restricted(current, allowed[ctx.clamp_min(0)], beta)
    probs[ctx < 0] = 1.0 / vocab
    return probs


def _check_support(support: Any, vocab: int, order: int, device: torch.device) -> Tensor | None:
    """`support` as booleans on `device` after checking its shape ([V**order, V]; [V, V] for order 0) and that
    every row allows a state; None stays None."""
    if support is None:
        return None
    rows = vocab ** max(order, 1)
    if not isinstance(support, Tensor) or support.dtype != torch.bool or tuple(support.shape) != (rows, vocab):
        shape = tuple(support.shape) if isinstance(support, Tensor) else type(support).__name__
        raise ValueError(f"support must be a boolean tensor [{rows}, {vocab}] ([V**order, V]), got {shape}")
    if not bool(support.any(-1).all()):
        raise ValueError("support has a row that allows no state")
    return support.to(device)


def _restricted(counts: Float[Tensor, "batch pos vocab"], allowed: Bool[Tensor, "batch pos vocab"],
                beta: float) -> Float[Tensor, "batch pos vocab"]:
    """(counts + beta) over the allowed states, normalised; 0 elsewhere."""
    mask = allowed.to(counts.dtype)
    weights = (counts + beta) * mask
    return weights / weights.sum(-1, keepdim=True)


def target_log_loss(
    probs: Float[Tensor, "batch pos vocab"], tokens: Int[Tensor, "batch pos"]
) -> Float[Tensor, "batch target"]:
    """-log probs[b, t, x_{t+1}] for t = 0..T-2: the log-loss of every next-state prediction on a sequence."""
    nxt = tokens[:, 1:, None].to(probs.device)
    return -torch.log(torch.gather(probs[:, :-1], 2, nxt)[..., 0].clamp_min(1e-300))


def _check_source(source: Any) -> None:
    if not isinstance(source, Source):
        raise ValueError(f"unknown source type {type(source).__name__}: a source has vocab, order, alpha, pool, "
                         "sample and initial_context_laws (data.Source)")


def initial_context_laws(source: Source, kernels: Float[Tensor, "batch context vocab"]) -> Float[Tensor, "batch context"]:
    """The law of the first `order` states (over contexts) each sequence was drawn from, one row per kernel:
    `source.initial_context_laws(kernels)` (a fixed chain's `initial_context_law` for every row; for the default
    "stationary" initial law of random kernels, the stationary context law of each sequence's own kernel, as the
    sampler draws the first context; otherwise the fixed law)."""
    _check_source(source)
    return source.initial_context_laws(kernels)


def _order_of(n_ctx: int, vocab: int) -> int:
    order = 1
    while vocab**order < n_ctx:
        order += 1
    if vocab**order != n_ctx:
        raise ValueError(f"kernels have {n_ctx} context rows, not a power of the {vocab} states (V**order)")
    return order


def kernel_predictions(
    kernels: Float[Tensor, "#batch context vocab"],
    tokens: Int[Tensor, "batch pos"],
    initial: Float[Tensor, "#batch context"],
) -> Float[Tensor, "batch pos vocab"]:
    """The true law of x_{t+1} given x_0..x_t at every position t, for sequences with known kernels.

    `kernels[b]` is sequence b's kernel flattened to [V**k, V] and `initial[b]` the law of its first k states over
    contexts (a batch of 1 serves every sequence: a fixed chain). Once the context is full (t >= k - 1) this is
    the kernel row of the current context; before (order k > 1, t < k - 1) it is the exact marginal
    P(x_{t+1} | x_0..x_t) under the initial context law, which need not equal any kernel row or pi.

    >>> kernel_predictions(torch.tensor([[[0.8, 0.2], [0.3, 0.7]]]), torch.tensor([[0, 1]]),
    ...                    torch.tensor([[0.6, 0.4]]))[0]
    tensor([[0.8000, 0.2000],
            [0.3000, 0.7000]], dtype=torch.float64)
    """
    n_ctx, vocab = kernels.shape[-2:]
    order = _order_of(n_ctx, vocab)
    _check_tokens(tokens, vocab)
    batch, seq = tokens.shape
    flat = kernels.to(tokens.device, torch.float64).expand(batch, -1, -1)
    ctx = context_index(tokens, vocab, order)
    probs = torch.gather(flat, 1, ctx.clamp_min(0)[..., None].expand(-1, -1, vocab))  # [batch, pos, vocab]
    _fill_prefix_predictions(probs, initial.to(tokens.device, torch.float64).expand(batch, -1), tokens, order)
    return probs


def _check_tokens(tokens: Tensor, vocab: int) -> None:
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab):
        raise ValueError(f"tokens must lie in 0..{vocab - 1}, got values {int(tokens.min())}..{int(tokens.max())}")


def _fill_prefix_predictions(probs: Float[Tensor, "batch pos vocab"], law: Float[Tensor, "batch context"],
                             tokens: Int[Tensor, "batch pos"], order: int) -> None:
    """Write into `probs[:, t]`, t < order - 1 (before the first context is full), the exact law of x_{t+1}
    given x_0..x_t when the first `order` states follow `law` (one law per sequence)."""
    batch, seq, vocab = probs.shape
    for t in range(min(order - 1, seq)):
        # P(x_0..x_t, x_{t+1} = v): the initial law summed over the states x_{t+2}..x_{k-1} not yet drawn
        joint = law.reshape(batch, vocab ** (t + 1), vocab, vocab ** (order - t - 2)).sum(-1)
        prefix = context_index(tokens[:, : t + 1], vocab, t + 1)[:, t]
        joint = joint[torch.arange(batch, device=tokens.device), prefix]
        total = joint.sum(-1, keepdim=True)
        if bool((total <= 0).any()):
            raise ValueError(f"the states x_0..x_{t} of some sequence have probability 0 under its initial law")
        probs[:, t] = joint / total


def stationary_state_laws(kernels: Float[Tensor, "batch context vocab"]) -> Float[Tensor, "batch vocab"]:
    """The stationary law pi of one state under each kernel ([V**k, V] rows, one per sequence).

    A single kernel (batch 1: a fixed chain) is checked to have a unique stationary law (ValueError otherwise);
    a batch of Dirichlet-drawn kernels is irreducible and solved at once without the check.
    """
    vocab = kernels.shape[-1]
    if kernels.shape[0] == 1:
        contexts = stationary_context_law(kernels[0])[None]
    else:
        contexts = stationary_context_laws(kernels)
    return contexts.reshape(kernels.shape[0], -1, vocab).sum(1)


def stationary_predictions(
    kernels: Float[Tensor, "#batch context vocab"], tokens: Int[Tensor, "batch pos"]
) -> Float[Tensor, "batch pos vocab"]:
    """Each sequence's stationary law pi at every position: the best predictor that ignores the context (a batch
    of 1 kernel serves every sequence: a fixed chain)."""
    pis = stationary_state_laws(kernels.cpu()).to(tokens.device)
    return pis[:, None, :].expand(tokens.shape[0], tokens.shape[1], -1).contiguous()


# ------------------------------------------------------------------------------------------- finite pools
PoolKernels = Float[Tensor, "kernel context vocab"]  # a pool's kernels, each flattened to [V**order, V]
PoolLaws = Float[Tensor, "kernel context"]  # the law of the first `order` states of each kernel, over contexts
PoolWeights = Float[Tensor, "batch pos kernel"]  # per sequence and position, one value per kernel of the pool


def pool_log_likelihoods(kernels: PoolKernels, initial: PoolLaws, tokens: Int[Tensor, "batch pos"]) -> PoolWeights:
    """log P(x_0..x_t | kernel n) at every position t, for each kernel n of a finite pool.

    `kernels[n]` is a kernel flattened to [V**k, V] and `initial[n]` the law of its first k states over contexts:
    up to t = k - 1 the likelihood is that law's marginal of x_0..x_t, after it the kernel's rows multiply in.
    -inf where the states are impossible under a kernel. Memory: batch x pos x kernel float64.
    """
    n_kernels, n_ctx, vocab = kernels.shape
    order = _order_of(n_ctx, vocab)
    _check_tokens(tokens, vocab)
    batch, seq = tokens.shape
    law = initial.to(tokens.device, torch.float64)
    out = torch.empty(batch, seq, n_kernels, dtype=torch.float64, device=tokens.device)
    for t in range(min(order, seq)):
        marginal = law.reshape(n_kernels, vocab ** (t + 1), -1).sum(-1)  # P_n(x_0..x_t)
        out[:, t] = torch.log(marginal[:, context_index(tokens[:, : t + 1], vocab, t + 1)[:, t]]).T
    if seq > order:
        # transitions (context, next state) seen up to each t, times each kernel's log rows: one matmul instead of
        # a cumulative sum over [batch, pos, kernel] (several times slower on CPU)
        ctx = context_index(tokens, vocab, order)
        pair = ctx[:, order - 1 : -1] * vocab + tokens[:, order:]
        counts = torch.nn.functional.one_hot(pair, n_ctx * vocab).to(torch.float64).cumsum(1)
        rows = kernels.to(tokens.device, torch.float64).reshape(n_kernels, -1)
        out[:, order:] = out[:, order - 1 : order] + counts @ torch.where(rows > 0, rows, 1.0).log().T
        if bool((rows == 0).any()):  # a transition of probability 0 makes the kernel impossible from then on
            out[:, order:].masked_fill_(counts @ (rows == 0).T.to(torch.float64) > 0, -math.inf)
    return out


def pool_posterior(kernels: PoolKernels, initial: PoolLaws, tokens: Int[Tensor, "batch pos"]) -> PoolWeights:
    """P(kernel n | x_0..x_t) at every position t: the exact posterior over a pool drawn from uniformly.

    What a model that memorised the pool can know about which kernel it is in (retrieval); computed in log space
    (`pool_log_likelihoods`), so long sequences do not underflow. Raises ValueError for states impossible under
    every kernel.

    >>> pool = torch.tensor([[[0.9, 0.1], [0.1, 0.9]], [[0.1, 0.9], [0.9, 0.1]]])  # sticky, switching
    >>> pool_posterior(pool, torch.full((2, 2), 0.5), torch.tensor([[0, 0, 0]]))[0, :, 0]  # P(sticky | ...)
    tensor([0.5000, 0.9000, 0.9878], dtype=torch.float64)
    """
    posterior = torch.softmax(pool_log_likelihoods(kernels, initial, tokens), -1)
    if bool(posterior.isnan().any()):  # every log-likelihood -inf
        raise ValueError("some sequence has probability 0 under every kernel of the pool")
    return posterior


def pool_bayes_predictions(kernels: PoolKernels, initial: PoolLaws,
                           tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos vocab"]:
    """The Bayes predictor of a finite pool: P(x_{t+1} | x_0..x_t) when each sequence's kernel is one of
    `kernels` drawn uniformly, its first k states from that kernel's `initial` law.

    Once the context is full this is sum_n P(n | x_0..x_t) kernels[n, c_t] (`pool_posterior`); before it, the
    conditional of the pool's mixture of initial laws. The loss a model reaches by memorising the pool
    (`ReferenceLosses.pool_bayes_loss`); for a pool of one it is `kernel_predictions`. Computed in chunks of
    sequences, so memory stays near 32 MiB whatever the batch.

    >>> pool = torch.tensor([[[0.9, 0.1], [0.1, 0.9]], [[0.1, 0.9], [0.9, 0.1]]])
    >>> pool_bayes_predictions(pool, torch.full((2, 2), 0.5), torch.tensor([[0, 0, 0]]))[0]
    tensor([[0.5000, 0.5000],
            [0.8200, 0.1800],
            [0.8902, 0.1098]], dtype=torch.float64)
    """
    n_kernels, n_ctx, vocab = kernels.shape
    order = _order_of(n_ctx, vocab)
    batch, seq = tokens.shape
    rows = kernels.to(tokens.device, torch.float64).reshape(n_kernels, -1)
    chunk = max(1, _CHUNK_ELEMENTS // (max(seq, 1) * max(n_kernels, n_ctx * vocab)))
    parts = []
    for lo in range(0, batch, chunk):
        part = tokens[lo : lo + chunk]
        mixed = (pool_posterior(kernels, initial, part) @ rows).reshape(*part.shape, n_ctx, vocab)
        ctx = context_index(part, vocab, order).clamp_min(0)
        parts.append(torch.gather(mixed, 2, ctx[..., None, None].expand(-1, -1, 1, vocab))[:, :, 0])
    probs = torch.cat(parts) if parts else torch.empty(0, seq, vocab, dtype=torch.float64, device=tokens.device)
    mixture = initial.to(tokens.device, torch.float64).mean(0, keepdim=True).expand(batch, -1)
    _fill_prefix_predictions(probs, mixture, tokens, order)
    return probs


def pool_unigram_predictions(kernels: PoolKernels, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos vocab"]:
    """Unigram retrieval from a finite pool (Park et al. 2024's "uni-ret"): a predictor that reads only the state
    counts of x_0..x_t, takes each kernel n of the pool as an i.i.d. source with its stationary law pi_n, and
    predicts the posterior mixture of those laws.

        w_n(t) proportional to prod_{s <= t} pi_n(x_s),   prediction = sum_n w_n(t) pi_n

    It is the retrieval counterpart of the in-context unigram estimator, as `pool_bayes_predictions` (bigram
    retrieval) is of the in-context bigram law: what a model that memorised the pool's state frequencies, but not
    its transitions, predicts. Kernels with a state of stationary probability 0 are never chosen once that state
    is seen.

    >>> pool = torch.tensor([[[0.9, 0.1], [0.9, 0.1]], [[0.1, 0.9], [0.1, 0.9]]])  # pi = (0.9, 0.1), (0.1, 0.9)
    >>> pool_unigram_predictions(pool, torch.tensor([[0, 0]]))[0]
    tensor([[0.8200, 0.1800],
            [0.8902, 0.1098]], dtype=torch.float64)
    """
    n_kernels, n_ctx, vocab = kernels.shape
    _check_tokens(tokens, vocab)
    laws = stationary_state_laws(kernels.cpu().to(torch.float64)).to(tokens.device)  # [kernel, vocab]
    log_laws = torch.where(laws > 0, laws, 1.0).log().T  # [vocab, kernel]
    impossible = (laws <= 0).T.to(torch.float64)
    batch, seq = tokens.shape
    chunk = max(1, _CHUNK_ELEMENTS // (max(seq, 1) * max(n_kernels, vocab)))
    parts = []
    for lo in range(0, batch, chunk):
        counts = torch.nn.functional.one_hot(tokens[lo: lo + chunk], vocab).to(torch.float64).cumsum(1)
        log_lik = (counts @ log_laws).masked_fill_(counts @ impossible > 0, -math.inf)
        parts.append(torch.softmax(log_lik, -1) @ laws)
    if not parts:
        return torch.empty(0, seq, vocab, dtype=torch.float64, device=tokens.device)
    probs = torch.cat(parts)
    if bool(probs.isnan().any()):
        raise ValueError("some sequence has a state of stationary probability 0 under every kernel of the pool")
    return probs



def true_predictions(source: Source, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos vocab"]:
    """The best predictor of x_{t+1} from x_0..x_t that the data allow, at every position.

    Fixed chains: `kernel_predictions` with the chain's kernel and initial context law (the kernel row of the
    current context; before the context is full, the exact law of the next state given the states so far).
    A finite pool of kernels: `pool_bayes_predictions`, exact. Fresh Dirichlet kernels: the in-context add-alpha
    estimator over the source's `support` (all states, or the other states for `zero_diagonal`), the Bayes
    posterior predictive up to what the first state reveals about the kernel (about 0.003 nats per target on 3
    states at 32 targets; see `RandomMarkov`).

    >>> from markov_interp.data import BinaryChain
    >>> true_predictions(BinaryChain(0.2, 0.3), torch.tensor([[0, 1]]))[0]
    tensor([[0.8000, 0.2000],
            [0.3000, 0.7000]], dtype=torch.float64)
    """
    _check_source(source)
    pool = source.pool
    if pool is None:  # a fresh kernel per sequence
        return add_beta_predictions(tokens, source.vocab, order=source.order, beta=source.alpha, support=source.support)
    initial = source.initial_context_laws(pool)
    if pool.shape[0] == 1:  # one kernel: its rows (the posterior over a pool of one is that kernel)
        return kernel_predictions(pool, tokens.cpu(), initial).to(tokens.device)
    return pool_bayes_predictions(pool, initial, tokens)


def plateau_predictions(source: Source, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos vocab"]:
    """The plateau a model sits on before it learns the context: the stationary law pi (the unigram solution of
    Makkuva et al.; `stationary_predictions`) for fixed chains; the in-context unigram (add-alpha state count)
    estimator for random kernels (fresh or from a finite pool), the best a model can do without using the current
    state's transitions. Where the prior rules transitions out (`support`, e.g. `zero_diagonal`: no state follows
    itself), the counts are restricted to the states the current state can move to: knowing that costs no
    in-context learning, so the plateau includes it.

    >>> from markov_interp.data import BinaryChain
    >>> plateau_predictions(BinaryChain(0.2, 0.3), torch.tensor([[0, 1]]))[0, 0]
    tensor([0.6000, 0.4000], dtype=torch.float64)
    """
    _check_source(source)
    if source.alpha is not None:  # kernels from a prior
        return add_beta_predictions(tokens, source.vocab, order=0, beta=source.alpha, support=source.support)
    return stationary_predictions(source.pool, tokens)


def paired_losses(source: Source, tokens: Int[Tensor, "batch pos"]) -> tuple[float, float]:
    """(true, plateau): mean log-loss of `true_predictions` and `plateau_predictions` over every target of
    `tokens` (x_1..x_T). Subtracted from a model's loss on the *same* tokens they give its paired excess
    and the plateau's, free of most sampling noise (`dynamics.curve_from_metrics`)."""
    true = target_log_loss(true_predictions(source, tokens), tokens).mean()
    plateau = target_log_loss(plateau_predictions(source, tokens), tokens).mean()
    return float(true), float(plateau)


def in_context_loss_curve(
    source: Source,
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


# --------------------------------------------------------------------------------- reference losses
# the scalar values of a ReferenceLosses, in the order rows list them
_ROW_VALUES = ("entropy_rate", "unigram_loss", "bayes_loss", "add_alpha_loss", "oracle_unigram_loss", "pool_bayes_loss")


@displayed
@dataclasses.dataclass(frozen=True, kw_only=True)
class ReferenceLosses:
    """The losses (nats per prediction, averaged over the targets of a sequence) a model is compared with.

    Every value carries its standard error (`*_se`): 0 when exact, a quadrature error estimate when computed
    by quadrature, the Monte Carlo standard error otherwise.

    - `entropy_rate`: the loss of the true kernel (an oracle that knows each sequence's kernel); for random
      kernels its expectation over kernels.
    - `unigram_loss`: the unigram plateau, the loss of the best predictor that ignores the current state: H(pi)
      for a fixed chain; for random kernels the in-context unigram estimator (add-alpha state counts of the
      sequence so far), what a single-layer model sits at (`in_context_unigram_loss` names it there).
    - random kernels only: `bayes_loss`, the Bayes-optimal in-context loss under the sampler's law (the
      posterior predictive; with a stationary first state it also uses what x_0 says about the kernel);
      `add_alpha_loss`, the loss of the add-alpha count estimator (`add_beta_predictions` with beta = alpha: the
      posterior predictive when the first state's law does not depend on the kernel, what an induction head
      approximates); `oracle_unigram_loss`, E[H(pi)], the loss of an oracle that knows each sequence's pi.
    - a finite pool of kernels (`RandomMarkov(pool_size=N)`) only: `pool_bayes_loss`, the loss of the pool's
      Bayes predictor (`pool_bayes_predictions`), what a model that memorised the pool reaches; the in-context
      values above are then measured on the pool's sequences, and `entropy_rate`, `oracle_unigram_loss` are
      exact averages over the pool.
    - curves: per target position t (predicting x_{t+1}), for random kernels.
    """

    entropy_rate: float
    unigram_loss: float
    bayes_loss: float | None = None
    add_alpha_loss: float | None = None
    oracle_unigram_loss: float | None = None
    entropy_rate_se: float = 0.0
    unigram_loss_se: float = 0.0
    bayes_loss_se: float | None = None
    add_alpha_loss_se: float | None = None
    oracle_unigram_loss_se: float | None = None
    pool_bayes_loss: float | None = None
    pool_bayes_loss_se: float | None = None
    add_alpha_curve: tuple[float, ...] | None = dataclasses.field(default=None, repr=False)
    add_alpha_curve_se: tuple[float, ...] | None = dataclasses.field(default=None, repr=False)
    unigram_curve: tuple[float, ...] | None = dataclasses.field(default=None, repr=False)
    unigram_curve_se: tuple[float, ...] | None = dataclasses.field(default=None, repr=False)
    pool_bayes_curve: tuple[float, ...] | None = dataclasses.field(default=None, repr=False)
    pool_bayes_curve_se: tuple[float, ...] | None = dataclasses.field(default=None, repr=False)

    @property
    def optimum(self) -> float:
        """The best loss any predictor reaches: the pool-Bayes loss for a finite pool, the in-context Bayes loss
        for fresh random kernels, else the entropy rate."""
        return self.pool_bayes_loss if self.pool_bayes_loss is not None else (
            self.bayes_loss if self.bayes_loss is not None else self.entropy_rate)

    @property
    def optimum_se(self) -> float:
        return self.pool_bayes_loss_se if self.pool_bayes_loss is not None else (
            self.bayes_loss_se if self.bayes_loss is not None else self.entropy_rate_se)

    @property
    def in_context(self) -> bool:
        """True for random kernels, where the references are in-context losses."""
        return self.bayes_loss is not None

    @property
    def in_context_unigram_loss(self) -> float | None:
        """The in-context unigram estimator's loss (random kernels; None for a fixed chain)."""
        return self.unigram_loss if self.in_context else None

    def as_row(self, digits: int | None = None) -> dict[str, float]:
        """Flat columns for a metrics row or table: the values that exist, and `<name>_se` where not 0.

        Keys: entropy_rate, unigram_loss (the plateau), for random kernels bayes_loss, add_alpha_loss,
        oracle_unigram_loss, and for a finite pool pool_bayes_loss. `digits` rounds every value (rows that must
        compare exactly across calls)."""
        row: dict[str, float] = {}
        for name in _ROW_VALUES:
            value = getattr(self, name)
            if value is None:
                continue
            row[name] = float(value) if digits is None else round(float(value), digits)
            se = getattr(self, f"{name}_se")
            if se:
                row[f"{name}_se"] = float(se) if digits is None else round(float(se), digits)
        return row

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> "ReferenceLosses":
        """The values (and standard errors) of `as_row` read back from a metrics row or table row; other keys
        are ignored, the curves are not in rows."""
        names = [f.name for f in dataclasses.fields(cls) if "curve" not in f.name]
        missing = [k for k in ("entropy_rate", "unigram_loss") if row.get(k) is None]
        if missing:
            raise ValueError(f"a reference row needs {missing}; it has {sorted(row)}")
        # a missing `<name>_se` stays None (not recorded, e.g. rows of older runs) for the in-context values
        return cls(**{k: float(row[k]) for k in names if row.get(k) is not None})

    def describe(self) -> str:
        """One line for people: every value, with its standard error where that is not negligible (>= 5e-5)."""
        labels = {"entropy_rate": "entropy rate", "unigram_loss": "in-context unigram loss" if self.in_context
                  else "unigram loss", "bayes_loss": "in-context Bayes loss", "add_alpha_loss": "add-alpha loss",
                  "oracle_unigram_loss": "oracle E[H(pi)]", "pool_bayes_loss": "pool Bayes loss"}
        row = self.as_row()
        return ", ".join(f"{label} {format_loss(row[k], row.get(k + '_se'))}" for k, label in labels.items() if k in row)


def format_loss(value: float, se: float | None = None, digits: int = 4) -> str:
    """`value` with '± se' appended when the standard error shows at this precision (>= half the last digit)."""
    text = f"{value:.{digits}f}"
    if se is not None and se >= 0.5 * 10 ** -digits:
        text += f" ± {se:.{digits}f}"
    return text


@displayed(line=lambda k: f"E[entropy rate] {k.entropy_rate:.4f} +- {k.entropy_rate_se:.1e}, E[H(pi)] {k.oracle_unigram_loss:.4f} "
                          f"+- {k.oracle_unigram_loss_se:.1e} ({k.method})")
@dataclasses.dataclass(frozen=True)
class KernelExpectations:
    """E[entropy rate] and E[H(pi)] over random kernels, with their errors (`method`: "quadrature" or
    "monte carlo").

    E[H(pi)] is the loss of an oracle that knows each sequence's pi: `oracle_unigram_loss`, the name it has in
    `ReferenceLosses` too, where `unigram_loss` is the in-context unigram estimator's loss for random kernels.
    (This field was called `unigram_loss` here; that name still reads it, and caches written under it load.)
    """

    entropy_rate: float
    entropy_rate_se: float
    oracle_unigram_loss: float
    oracle_unigram_loss_se: float
    method: str

    @property
    def unigram_loss(self) -> float:
        """Old name of `oracle_unigram_loss` (E[H(pi)], not the in-context unigram loss)."""
        return self.oracle_unigram_loss

    @property
    def unigram_loss_se(self) -> float:
        """Old name of `oracle_unigram_loss_se`."""
        return self.oracle_unigram_loss_se

    def cache_dict(self) -> dict[str, Any]:
        """The values under the names the disk cache has always used (so existing cache entries stay valid)."""
        return {"entropy_rate": self.entropy_rate, "entropy_rate_se": self.entropy_rate_se,
                "unigram_loss": self.oracle_unigram_loss, "unigram_loss_se": self.oracle_unigram_loss_se,
                "method": self.method}

    @classmethod
    def from_cache_dict(cls, data: Mapping[str, Any]) -> "KernelExpectations":
        """Read `cache_dict` back."""
        return cls(entropy_rate=data["entropy_rate"], entropy_rate_se=data["entropy_rate_se"],
                   oracle_unigram_loss=data["unigram_loss"], oracle_unigram_loss_se=data["unigram_loss_se"],
                   method=data["method"])


@functools.lru_cache(maxsize=16)
def _beta_nodes(alpha: float, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Gauss nodes and weights for E[f(p)], p ~ Beta(alpha, alpha), accurate for f with log singularities at
    0 and 1 (entropies). Each half [0, 1/2] is mapped from u in [0, 1] by p = u**m / 2 with m = k / alpha
    (k = max(1, ceil(2 alpha))): the density's p**(alpha - 1) becomes the polynomial u**(k - 1) and m >= 2
    smooths the logs, so Gauss-Legendre in u converges fast."""
    x, w = np.polynomial.legendre.leggauss(n)
    u, w = (x + 1) / 2, w / 2
    k = max(1, math.ceil(2 * alpha))
    m = k / alpha
    p = 0.5 * u**m
    log_beta = 2 * math.lgamma(alpha) - math.lgamma(2 * alpha)
    wp = w * 0.5**alpha * m * u ** (k - 1) * (1 - p) ** (alpha - 1) / math.exp(log_beta)
    return np.concatenate([p, 1 - p[::-1]]), np.concatenate([wp, wp[::-1]])


def _binary_h(x: np.ndarray) -> np.ndarray:
    return -(special_xlogx(x) + special_xlogx(1 - x))


def special_xlogx(x: np.ndarray) -> np.ndarray:
    return np.where(x > 0, x * np.log(np.where(x > 0, x, 1.0)), 0.0)


def _binary_quadrature(alpha: float, n: int) -> tuple[float, float]:
    p, w = _beta_nodes(alpha, n)
    pp, qq = np.meshgrid(p, p, indexing="ij")
    weights = np.outer(w, w)
    rate = (qq * _binary_h(pp) + pp * _binary_h(qq)) / (pp + qq)  # (q h(p) + p h(q)) / (p + q)
    return float((weights * rate).sum()), float((weights * _binary_h(pp / (pp + qq))).sum())


def _binary_kernel_expectations(alpha: float, n: int = 256) -> KernelExpectations:
    """Two states, order 1: E over p, q ~ Beta(alpha, alpha) of the entropy rate and H(pi) by a 2-D Gauss
    rule; the error is estimated as the change from half the nodes (the rule converges much faster)."""
    rate, hpi = _binary_quadrature(alpha, n)
    rate_half, hpi_half = _binary_quadrature(alpha, n // 2)
    eps = 1e-12  # float rounding of the sums
    return KernelExpectations(rate, abs(rate - rate_half) + eps, hpi, abs(hpi - hpi_half) + eps, "quadrature")


def _control_variate_mean(moments: np.ndarray, n: int, known: np.ndarray, n_targets: int) -> tuple:
    """Regression control-variate estimates of E[y_j] from accumulated moments of z = (1, c, y).

    `moments` = sum z z^T over n draws, c the controls (exact means `known`), y the targets (last
    `n_targets` entries). Returns (means, standard errors) of the targets: ybar - b (cbar - E[c]) with b the
    least-squares coefficient, the standard error from the residual variance (O(1/n) bias, negligible here)."""
    mean = moments[0] / n
    cov = moments[1:, 1:] / n - np.outer(mean[1:], mean[1:])
    n_c = cov.shape[0] - n_targets
    scc, scy, syy = cov[:n_c, :n_c], cov[:n_c, n_c:], cov[n_c:, n_c:]
    b = np.linalg.solve(scc, scy)  # [controls, targets]
    est = mean[1 + n_c:] - (mean[1:1 + n_c] - known) @ b
    resid = np.clip(np.diag(syy - scy.T @ b), 0.0, None)
    return est, np.sqrt(resid / (n - n_c - 1))


def _mc_kernel_expectations(vocab: int, order: int, alpha: float, seed: int, tol: float,
                            max_kernels: int = 1 << 24, zero_diagonal: bool = False,
                            support: tuple | None = None) -> KernelExpectations:
    """E[entropy rate] and E[H(pi)] over Dirichlet(alpha) kernels by Monte Carlo, in chunks of 2**18 kernels
    until both standard errors are below `tol`. Two controls with exact means cut the variance about 3x:
    the mean row entropy (E = psi(V alpha + 1) - psi(alpha + 1)) and the spread sum_x (m_x - 1/V)**2 of the
    mean row m (E = (V - 1) / (V (V alpha + 1) V**k)). `zero_diagonal` (order 1): rows Dirichlet(alpha) over
    the other V - 1 states; the means become psi(W alpha + 1) - psi(alpha + 1) and (V - 2) / (V W (W alpha + 1))
    with W = V - 1 (each m_x averages the V - 1 entries P(c, x), c != x, of variance (W - 1) / (W^2 (W alpha + 1)),
    over V rows). Any other `support` ([V**k, V] booleans, W allowed states in every row, `_prior_support`): the
    first mean with that W, the second `_spread_mean`'s."""
    n_ctx = vocab**order
    width = vocab - 1 if zero_diagonal else vocab  # states per row
    spread = ((vocab - 2) / (vocab * width * (width * alpha + 1)) if zero_diagonal
              else (vocab - 1) / (vocab * (vocab * alpha + 1) * n_ctx))
    if support is not None:
        allowed = np.array(support, dtype=np.float64)
        width, spread = int(allowed[0].sum()), _spread_mean(allowed, alpha)
    known = np.array([
        float(torch.special.digamma(torch.tensor(width * alpha + 1.0, dtype=torch.float64))
              - torch.special.digamma(torch.tensor(alpha + 1.0, dtype=torch.float64))),
        spread,
    ])
    mask = 1.0 - np.eye(vocab) if zero_diagonal else 1.0 if support is None else allowed
    rng = np.random.default_rng([seed, 16])
    moments, n, chunk = np.zeros((5, 5)), 0, 1 << 18
    while True:
        # the chunk's kernels are drawn and reduced block by block (memory ~ chains.BLOCK_BYTES, not 2**18 V**(k+1));
        # numpy draws them as one call would, so z and the estimates are the unblocked ones, bit for bit
        sizes = block_sizes(chunk, kernel_bytes(n_ctx, vocab))
        z = torch.cat([_kernel_moment_rows(rng.standard_gamma(alpha, size=(size, n_ctx, vocab)).clip(1e-300) * mask)
                       for size in sizes]).numpy()
        moments += z.T @ z
        n += chunk
        est, se = _control_variate_mean(moments, n, known, 2)
        if se.max() < tol or n >= max_kernels:
            return KernelExpectations(float(est[0]), float(se[0]), float(est[1]), float(se[1]), "monte carlo")


def _spread_mean(allowed: np.ndarray, alpha: float) -> float:
    """E[sum_x (m_x - 1/V)**2], m the mean row of a kernel whose row c is Dirichlet(alpha) over the W states
    `allowed[c]` allows (every row W). Each P(c, x) allowed has mean 1/W and variance (W - 1) / (W**2 (W alpha + 1))
    and the rows are independent, so m_x has mean a_x = n_x / (C W) and variance n_x (W - 1) / (C**2 W**2 (W alpha
    + 1)), with n_x the rows allowing x and C the rows; the expectation is sum_x var(m_x) + (a_x - 1/V)**2. (For
    every state allowed or all but the diagonal this is the closed form `_mc_kernel_expectations` states.)"""
    n_ctx, vocab = allowed.shape
    width = allowed[0].sum()
    n_x = allowed.sum(0)
    var = n_x * (width - 1) / (n_ctx**2 * width**2 * (width * alpha + 1))
    return float((var + (n_x / (n_ctx * width) - 1.0 / vocab) ** 2).sum())


def _kernel_moment_rows(gam: np.ndarray) -> Float[Tensor, "kernel 5"]:
    """Per kernel (normalised Gamma draws `gam` [kernel, context, V], zero where a transition is not allowed) the
    row (1, mean row entropy, spread of the mean row, entropy rate, H(pi)) of `_mc_kernel_expectations`'
    moments."""
    vocab = gam.shape[-1]
    kernels = torch.from_numpy(gam / gam.sum(-1, keepdims=True))
    pi = _solve_stationary(kernels)
    rows_h = entropy(kernels)
    rate = (pi * rows_h).sum(-1)
    hpi = entropy(pi.reshape(len(kernels), -1, vocab).sum(1))  # law of the last state
    spread = ((kernels.mean(-2) - 1.0 / vocab) ** 2).sum(-1)
    return torch.stack([torch.ones_like(rate), rows_h.mean(-1), spread, rate, hpi], 1)


def expected_kernel_references(source: Source, *, seed: int = 0, tol: float = 1e-4) -> KernelExpectations:
    """E[entropy rate] and E[H(pi)] over the kernels of a random-kernel source (`RandomMarkov`): for a finite
    pool the exact averages over its kernels; for fresh Dirichlet kernels by quadrature for two states of order 1
    (error ~1e-9), else by Monte Carlo to a standard error below `tol` (cached)."""
    _check_source(source)
    if source.alpha is None:
        raise ValueError(f"expected a source with random kernels (RandomMarkov), got {type(source).__name__}")
    if not tol > 0:
        raise ValueError(f"tol must be > 0, got {tol!r}")
    if source.pool is not None:
        return _pool_expectations(source.pool)
    support = _prior_support(source)
    return _kernel_expectations_cached(source.vocab, source.order, source.alpha, seed, float(tol),
                                       support is True, None if isinstance(support, bool) else support)


def _prior_support(source: Source) -> bool | tuple:
    """The support of the source's prior, as the kernel expectations are keyed on it: False for every transition
    allowed, True for all but the self-transitions (`RandomMarkov(zero_diagonal=True)`), else the [V**k, V] booleans
    as nested tuples (e.g. `CyclicMarkov`'s). The Monte Carlo's control variate needs every row to allow the same
    number of states; a ValueError for other supports."""
    support = source.support
    if support is None:
        return False
    support = support.cpu()
    if source.order == 1 and torch.equal(support, ~torch.eye(source.vocab, dtype=torch.bool)):
        return True
    widths = support.sum(-1)
    if not (widths == widths[0]).all() or int(widths[0]) < 2:
        raise ValueError("reference losses are computed for priors whose rows each allow the same number (>= 2) of "
                         f"states, not for the support {support.int().tolist()}")
    return tuple(tuple(bool(x) for x in row) for row in support.tolist())


def _pool_expectations(pool: PoolKernels) -> KernelExpectations:
    """The entropy rate and H(pi) averaged over the kernels of a pool (each drawn with probability 1/N): exact."""
    pi = _solve_stationary(pool.to(torch.float64))
    rate = (pi * entropy(pool)).sum(-1)
    hpi = entropy(pi.reshape(pool.shape[0], -1, pool.shape[-1]).sum(1))
    return KernelExpectations(float(rate.mean()), 0.0, float(hpi.mean()), 0.0, "pool")


@functools.lru_cache(maxsize=64)
def _kernel_expectations_cached(vocab: int, order: int, alpha: float, seed: int, tol: float,
                                zero_diagonal: bool = False, support: tuple | None = None) -> KernelExpectations:
    if vocab == 2 and order == 1 and not zero_diagonal and support is None:
        return _binary_kernel_expectations(alpha)
    key = {"what": "kernel-expectations", "vocab": vocab, "order": order, "alpha": alpha, "seed": seed, "tol": tol,
           **({"zero_diagonal": True} if zero_diagonal else {}),  # full support: the keys as before
           **({"support": support} if support is not None else {})}
    cached = _disk_cache_read(key, _KernelEntry)
    if cached is not None:
        return KernelExpectations.from_cache_dict(cached)
    out = _mc_kernel_expectations(vocab, order, alpha, seed, tol, zero_diagonal=zero_diagonal, support=support)
    _disk_cache_write(key, out.cache_dict())
    return out


# ------------------------------------------------------------------------------------------ disk cache
# An entry is a JSON file {"key": ..., "value": ...} named by a hash of its key: the inputs, this version and a
# hash of the code that computes the values. Reading one never trusts it: a file that is not a regular file,
# not JSON, for another key, or whose value is incomplete, not finite or out of the range the quantity can take
# is reported (one warning naming the file) and recomputed, and the fresh value replaces it.
_CACHE_VERSION = 3  # 3: keys hold the code hash; values are validated


def _cache_dir() -> Path | None:
    """$MARKOV_INTERP_CACHE (a folder; "off" or "" disables), else ~/.cache/markov-interp."""
    value = os.environ.get("MARKOV_INTERP_CACHE")
    if value is None:
        return Path.home() / ".cache" / "markov-interp"
    return None if value in ("", "off", "0") else Path(value)


@functools.lru_cache(maxsize=1)
def _code_version() -> str:
    """A hash of the modules that compute the cached values (theory, chains, data): after an edit to any of them
    entries get new keys, so a changed computation never reads an old result."""
    from markov_interp import chains, data

    digest = hashlib.sha256()
    for source in (__file__, chains.__file__, data.__file__):
        try:
            digest.update(Path(source).read_bytes())
        except (OSError, TypeError):  # no source on disk (a frozen install): the installed version decides
            import importlib.metadata

            digest.update(importlib.metadata.version("markov-interp").encode())
    return digest.hexdigest()[:16]


def _full_key(key: dict) -> dict:
    """`key` with the cache version and code hash, as JSON gives it back (tuples become lists)."""
    return json.loads(json.dumps({**key, "version": _CACHE_VERSION, "code": _code_version()}, sort_keys=True))


def _cache_file(key: dict) -> Path | None:
    folder = _cache_dir()
    if folder is None:
        return None
    text = json.dumps(_full_key(key), sort_keys=True)
    return folder / "references" / f"{hashlib.sha256(text.encode()).hexdigest()[:24]}.json"


def _disk_cache_read(key: dict, schema: "type[_KernelEntry] | type[_InContextEntry]") -> dict | None:
    """The cached value of `key`, or None (compute it) when there is none or it is unusable, with a one-line
    warning naming the file. The value must be an entry of `schema` (its fields, types and ranges) whose values
    agree with the entry's own key (`schema.check_key`: the ordering theory's quantities obey, the key's sizes)."""
    path = _cache_file(key)
    if path is None:
        return None
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as err:
        return _bad_entry(path, f"unreadable: {err.strerror}")
    if not stat.S_ISREG(mode):  # a FIFO would hang the read; a link may lead anywhere
        return _bad_entry(path, f"it is {describe_kind(mode)}, not a regular file")
    try:
        entry = json.loads(path.read_bytes())
    except OSError as err:
        return _bad_entry(path, f"unreadable: {err.strerror}")
    except ValueError as err:  # truncated, not JSON, not UTF-8
        return _bad_entry(path, f"not valid JSON: {err}")
    full = _full_key(key)
    if not isinstance(entry, dict) or entry.get("key") != full:
        return _bad_entry(path, "it holds another key")
    value = entry.get("value")
    try:
        schema.from_dict(value).check_key(full)
    except ValueError as err:
        return _bad_entry(path, str(err))
    return value


def _bad_entry(path: Path, reason: str) -> None:
    warnings.warn(f"reference-loss cache entry {path} is unusable ({reason}); recomputing it", stacklevel=4)
    return None


def _disk_cache_write(key: dict, value: dict) -> None:
    path = _cache_file(key)
    if path is None:
        return
    try:
        atomic_write(path, json.dumps({"key": _full_key(key), "value": value}, allow_nan=False))
    except (OSError, ValueError):  # a read-only home (or a link in the cache) is no reason to fail: recomputed
        pass


# The schemas of the two kinds of entry (`config.Checked`: every field typed and finite, standard errors >= 0;
# `check_key`: the values against the entry's own key). Each bound holds up to 6 standard errors.
def _within(name: str, x: float, low: float, high: float) -> None:
    if not low <= x <= high:
        raise ValueError(f"{name} = {x!r} is outside [{low:.6g}, {high:.6g}]")


def _at_most(small: str, x: float, large: str, y: float, se: float) -> None:
    """`small` <= `large` up to 6 standard errors (the order theory's quantities obey)."""
    if x > y + 6 * se + 1e-9:
        raise ValueError(f"{small} = {x!r} exceeds {large} = {y!r} (by more than 6 standard errors, {6 * se:.2g}); "
                         f"the references must obey {small} <= {large}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class _KernelEntry(Checked):
    """A kernel-expectations entry: E[entropy rate] and E[H(pi)] (under its old name `unigram_loss`) by Monte Carlo.
    `check_key`: E[entropy rate] <= E[H(pi)] <= log V, each >= 0, standard errors <= log V."""

    entropy_rate: float = bounds()
    entropy_rate_se: float = bounds(minimum=0)
    unigram_loss: float = bounds()
    unigram_loss_se: float = bounds(minimum=0)
    method: str

    def check(self) -> None:
        if self.method != "monte carlo":  # quadrature and pool averages are not cached
            raise ValueError(f"method is {self.method!r}, expected 'monte carlo'")

    def check_key(self, key: Mapping[str, Any]) -> None:
        top, se = math.log(key["vocab"]), self.entropy_rate_se + self.unigram_loss_se
        for name in ("entropy_rate_se", "unigram_loss_se"):
            _within(name, getattr(self, name), 0.0, top)
        _within("entropy_rate", self.entropy_rate, -6 * se - 1e-9, math.inf)
        _at_most("entropy_rate", self.entropy_rate, "E[H(pi)] (unigram_loss)", self.unigram_loss, se)
        _at_most("E[H(pi)] (unigram_loss)", self.unigram_loss, "log V", top, self.unigram_loss_se)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _InContextEntry(Checked):
    """An in-context entry: the add-alpha, in-context unigram and in-context Bayes losses with their curves over the
    T - 1 targets, and for a finite pool the pool-Bayes loss and curve (present exactly when the key has a pool).

    `check_key`, against the key's vocabulary V, alpha, length T, sequence count and kernel expectations:
    - ranges: every add-beta loss and curve point in [0, log((T + V alpha) / alpha)] (such an estimator gives each
      state at least alpha / (T + V alpha)); standard errors in [0, that]; curves of T - 1 points;
    - the order of the references, where it is a theorem: for fresh kernels the Bayes loss is optimal under the
      sampler's law, so Bayes <= add-alpha, Bayes <= in-context unigram and Bayes <= log V (uniform guessing); for
      a finite pool the pool-Bayes loss is, so pool Bayes <= each of those (and the in-context Bayes loss); with a
      stationary first state the oracle that knows the kernel loses E[entropy rate] (the key's) per target at
      best, so E[entropy rate] <= the optimum (with a uniform or fixed first law the oracle's average over T
      targets is not the stationary rate, so that bound is left out).
    add-alpha <= in-context unigram <= log V is not a theorem and is not checked: with a stationary first state
    add-alpha is not the Bayes predictor, and on nearly i.i.d. chains every estimator pays for its estimate beyond
    log V (V = 3, alpha = 50, T = 16: in-context unigram 1.0987 against log 3 = 1.0986).
    """

    add_alpha_loss: float = bounds()
    add_alpha_loss_se: float = bounds(minimum=0)
    unigram_loss: float = bounds()
    unigram_loss_se: float = bounds(minimum=0)
    bayes_loss: float = bounds()
    bayes_loss_se: float = bounds(minimum=0)
    add_alpha_curve: tuple[float, ...] = bounds()
    add_alpha_curve_se: tuple[float, ...] = bounds(minimum=0)
    unigram_curve: tuple[float, ...] = bounds()
    unigram_curve_se: tuple[float, ...] = bounds(minimum=0)
    n_sequences: int = bounds(minimum=2)
    pool_bayes_loss: float | None = bounds(default=None)
    pool_bayes_loss_se: float | None = bounds(minimum=0, default=None)
    pool_bayes_curve: tuple[float, ...] | None = bounds(default=None)
    pool_bayes_curve_se: tuple[float, ...] | None = bounds(minimum=0, default=None)

    def check_key(self, key: Mapping[str, Any]) -> None:
        vocab, alpha, seq_len, wanted = key["vocab"], key["alpha"], key["seq_len"], key["n_sequences"]
        top, cap = math.log(vocab), math.log((seq_len + vocab * alpha) / alpha)
        pool = [getattr(self, f"pool_bayes_{n}") for n in ("loss", "loss_se", "curve", "curve_se")]
        if any(v is None for v in pool) != ("pool_size" not in key) or len({v is None for v in pool}) > 1:
            raise ValueError("its pool-Bayes values must be present exactly when its key has a pool")
        if wanted is not None and self.n_sequences != wanted:
            raise ValueError(f"n_sequences is {self.n_sequences}, expected {wanted}")
        names = ("add_alpha_loss", "unigram_loss", "bayes_loss") + (("pool_bayes_loss",) if pool[0] is not None else ())
        for name in names:
            se = getattr(self, f"{name}_se")
            _within(f"{name}_se", se, 0.0, cap)
            _within(name, getattr(self, name), -6 * se - 1e-9, cap + 6 * se + 1e-9)
        for curve in [n.replace("_loss", "_curve") for n in names if n != "bayes_loss"]:
            self._check_curve(curve, seq_len, top if curve == "pool_bayes_curve" else cap)
        optimum = "pool_bayes_loss" if pool[0] is not None else "bayes_loss"
        for other in [n for n in names if n != optimum] + ["log V"]:
            y, se = (top, 0.0) if other == "log V" else (getattr(self, other), getattr(self, f"{other}_se"))
            _at_most(optimum, getattr(self, optimum), other, y, getattr(self, f"{optimum}_se") + se)
        if key["initial"] == "stationary":
            kernel = key["kernel"]
            _at_most("E[entropy rate]", kernel["entropy_rate"], optimum, getattr(self, optimum),
                     kernel["entropy_rate_se"] + getattr(self, f"{optimum}_se"))

    def _check_curve(self, curve: str, seq_len: int, high: float) -> None:
        points, ses = getattr(self, curve), getattr(self, f"{curve}_se")
        if len(points) != seq_len - 1 or len(ses) != seq_len - 1:
            raise ValueError(f"{curve} has {len(points)} points, expected {seq_len - 1}")
        for t, (x, se) in enumerate(zip(points, ses)):
            _within(f"{curve}_se[{t}]", se, 0.0, high)
            _within(f"{curve}[{t}]", x, -6 * se - 1e-9, high + 6 * se + 1e-9)


def _first_state_gain(source: Source, tokens: Tensor, rng: np.random.Generator, draws: int) -> Tensor:
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


def _in_context_chunk(source: Source, seq_len: int, batch: int, gen: torch.Generator,
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


def _in_context_block(source: Source, tokens: Int[Tensor, "batch pos"],
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


def _fixed_start_gain(source: Source) -> float:
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


def _control_coefficients(values: Tensor, controls: Tensor) -> Tensor:
    """Per curve and target the variance-minimising coefficient b = Cov(value, control) / Var(control) of
    `value - b (control - E[control])`: about 1 late in the sequence, 0 where the value is exact (t = 0)."""
    v = values - values.mean(1, keepdim=True)
    c = controls - controls.mean(1, keepdim=True)
    var = (c * c).mean(1)
    return torch.where(var > 0, (v * c).mean(1) / var.clamp_min(1e-300), torch.zeros_like(var))


def _in_context_references(source: Source, seq_len: int, kernel: KernelExpectations, *, seed: int,
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
        if n_sequences is None and (seq_se.max() < tol or moments.n >= 2**18):
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


def _pool_oracle_curve(pool: PoolKernels, initial: PoolLaws, seq_len: int) -> Float[Tensor, " target"]:
    """E[H(law of x_{t+1} given x_0..x_t and the kernel)] at t = 0..seq_len-2, averaged over a pool: exact.

    Before the first context is full, the conditional entropies of the initial law (H(x_0..x_{t+1}) -
    H(x_0..x_t)); after, the context law propagated through each kernel's chain on contexts, against its rows'
    entropies."""
    n_kernels, n_ctx, vocab = pool.shape
    order = _order_of(n_ctx, vocab)
    out = torch.zeros(seq_len - 1, dtype=torch.float64)
    joint_h = [entropy(initial.reshape(n_kernels, vocab ** (t + 1), -1).sum(-1)) for t in range(order)]
    for t in range(min(order - 1, seq_len - 1)):
        out[t] = (joint_h[t + 1] - joint_h[t]).mean()
    rows_h, matrix, law = entropy(pool), context_transition_matrix(pool), initial
    for t in range(order - 1, seq_len - 1):
        out[t] = (law * rows_h).sum(-1).mean()
        law = torch.bmm(law[:, None, :], matrix)[:, 0]
    return out


def _pool_bayes_references(source: Source, seq_len: int, *, seed: int, tol: float,
                           n_sequences: int | None) -> dict:
    """Monte Carlo of the pool-Bayes loss, Rao-Blackwellised: at target t the expected loss given the sequence
    and its kernel is H(true law) + KL(true law || pool-Bayes prediction). The first term's mean is exact
    (`_pool_oracle_curve`), so only the KL, small and shrinking as the posterior settles, is sampled: chunks of
    sequences until the standard error is below `tol` (at least 1024 sequences, at most 2**18), or exactly
    `n_sequences`."""
    pool = source.pool
    initial = source.initial_context_laws(pool)
    oracle = _pool_oracle_curve(pool, initial, seq_len)
    gen = torch.Generator().manual_seed(seed)
    chunk = min(max(2**18 // seq_len, 1024), 4096)
    n, sums = 0, torch.zeros(4, seq_len - 1, dtype=torch.float64)  # per target: sum, sum of squares; per sequence
    while True:
        size = chunk if n_sequences is None else min(chunk, n_sequences - n)
        tokens, kernels = source.sample(size, seq_len, gen, return_kernels=True)
        true = kernel_predictions(kernels, tokens, source.initial_context_laws(kernels))[:, :-1]
        kl = kl_divergence(true, pool_bayes_predictions(pool, initial, tokens)[:, :-1])  # [size, target]
        per_seq = kl.mean(1)
        sums += torch.stack([kl.sum(0), (kl**2).sum(0), per_seq.sum().expand(seq_len - 1),
                             (per_seq**2).sum().expand(seq_len - 1)])
        n += size
        mean, se = _mean_se(sums[2, 0], sums[3, 0], n)
        if (n_sequences is not None and n >= n_sequences) or (
                n_sequences is None and ((n >= 1024 and se < tol) or n >= 2**18)):
            break
    curve, curve_se = _mean_se(sums[0], sums[1], n)
    return {"pool_bayes_loss": float(oracle.mean() + mean), "pool_bayes_loss_se": float(se),
            "pool_bayes_curve": tuple((oracle + curve).tolist()), "pool_bayes_curve_se": tuple(curve_se.tolist())}


def _mean_se(total: Tensor, total_sq: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """Mean and its standard error from a sum and a sum of squares over n draws."""
    mean = total / n
    var = (total_sq / n - mean**2).clamp_min(0) * n / max(n - 1, 1)
    return mean, (var / n).sqrt()


# source: Any, not Source: a non-source gets `_check_source`'s ValueError (the test run's type checker would
# answer first with a TypeError)
def reference_losses(source: Any, seq_len: int, *, seed: int = 0, tol: float = 5e-4,
                     n_sequences: int | None = None) -> ReferenceLosses:
    """The losses a model trained on `source` is compared with, averaged over the targets t = 0..seq_len-2.

    Fixed kernels (`MarkovChain`, `BinaryChain`): the exact entropy rate (global optimum) and H(pi) (the
    unigram plateau), standard errors 0. `RandomMarkov` (see `ReferenceLosses` for each value's meaning):
    E[entropy rate] and E[H(pi)] by quadrature (two states) or Monte Carlo to a standard error below 1e-4 (exact
    averages over a finite pool); the in-context losses, and for a finite pool the pool-Bayes loss, by Monte
    Carlo over `seed`'s sequences until each standard error is below `tol` (or over exactly `n_sequences`).
    Results are cached in memory and on disk (`$MARKOV_INTERP_CACHE`, default ~/.cache/markov-interp; "off"
    disables), so sweeps and reports pay once.

    Args:
        source: a `data.Source` (fixed chain or `RandomMarkov`, with or without a pool).
        seq_len: sequence length; the values average the seq_len - 1 targets.
        seed: seed of the Monte Carlo draws (random kernels).
        tol: standard error to reach (random kernels).
        n_sequences: a fixed number of Monte Carlo sequences instead of `tol`.

    Returns:
        A `ReferenceLosses` (with `pool_bayes_loss` for a finite pool).
    """
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 2:
        raise ValueError(f"seq_len must be an integer >= 2 (one target at least), got {seq_len!r}")
    _check_source(source)
    if source.alpha is None:  # one fixed kernel: exact
        return ReferenceLosses(entropy_rate=entropy_rate(source), unigram_loss=unigram_loss(source))
    config = getattr(source, "config", None)
    if not isinstance(config, SourceConfig):  # the Monte Carlo below is cached under the source's config
        raise ValueError(f"reference losses of random kernels are keyed on the source's config: "
                         f"{type(source).__name__} has no `config` property giving its data.SourceConfig")
    if not tol > 0:
        raise ValueError(f"tol must be > 0, got {tol!r}")
    if n_sequences is not None and (isinstance(n_sequences, bool) or not isinstance(n_sequences, int)
                                    or n_sequences < 2):
        raise ValueError(f"n_sequences must be an integer >= 2 or None, got {n_sequences!r}")
    return _random_references(config.to_json(), seq_len, seed, float(tol), n_sequences)


def _source_key(config: SourceConfig) -> dict:
    """The fields of a random-kernel source in a cache key: its config's set fields (kind "random" left out, so
    the keys of Dirichlet sources are what they were when they were keyed on RandomMarkov's parameters)."""
    fields = {k: v for k, v in config.to_dict().items() if v is not None and k != "kind"}
    return fields if config.kind == "random" else {"kind": config.kind, **fields}


@functools.lru_cache(maxsize=64)
def _random_references(config_json: str, seq_len: int, seed: int, tol: float,
                       n_sequences: int | None) -> ReferenceLosses:
    config = SourceConfig.from_json(config_json)
    source = config.build()
    kernel = expected_kernel_references(source, seed=seed)
    pool = source.pool is not None
    key = {"what": "in-context", **_source_key(config), "seq_len": seq_len, "seed": seed, "tol": tol,
           "n_sequences": n_sequences, "kernel": kernel.cache_dict()}
    found = _disk_cache_read(key, _InContextEntry)  # its schema checks the values against this key
    if found is None:
        found = _in_context_references(source, seq_len, kernel, seed=seed, tol=tol, n_sequences=n_sequences)
        if pool:
            found.update(_pool_bayes_references(source, seq_len, seed=seed, tol=tol, n_sequences=n_sequences))
        _disk_cache_write(key, found)
    curves = {k: tuple(v) for k, v in found.items() if k.endswith(("_curve", "_curve_se"))}
    values = {k: v for k, v in found.items() if k not in curves and k != "n_sequences"}
    return ReferenceLosses(entropy_rate=kernel.entropy_rate, entropy_rate_se=kernel.entropy_rate_se,
                           oracle_unigram_loss=kernel.oracle_unigram_loss,
                           oracle_unigram_loss_se=kernel.oracle_unigram_loss_se,
                           **values, **curves)
