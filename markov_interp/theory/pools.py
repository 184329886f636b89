"""Laws of a finite pool of kernels (`RandomMarkov(pool_size=N)`, or a fixed chain as a pool of one): the exact
posterior over the pool given x_0..x_t and the Bayes predictor it gives (the mixture of the pool's kernel rows), in
log space, chunked over the batch; unigram retrieval from the pool; and the Monte Carlo of the pool-Bayes loss.
"""

import math

import torch
from jaxtyping import Float, Int
from torch import Tensor

from markov_interp.chains import context_transition_matrix
from markov_interp.data import Source
from markov_interp.theory._stats import _mean_se
from markov_interp.theory.fixed import (
    _check_tokens,
    _fill_prefix_predictions,
    _order_of,
    context_index,
    entropy,
    kernel_predictions,
    kl_divergence,
    stationary_state_laws,
)

_CHUNK_ELEMENTS = 1 << 22  # float64 entries of the largest temporary an exact pool computation holds (32 MiB)
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
