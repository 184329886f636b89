"""Laws of a finite pool of kernels (`RandomMarkov(pool_size=N)`, or a fixed chain as a pool of one) that theory
adds to the pool's Bayes predictor (`sources.pool_bayes_predictions`, the source's `predictive`): unigram retrieval
from the pool, the oracle's exact loss curve and the Monte Carlo of the pool-Bayes loss.
"""

import math

import torch
from jaxtyping import Float, Int
from torch import Tensor

from markov_interp.sources import KernelSource, PoolKernels, PoolLaws, kernel_predictions
from markov_interp.sources.contexts import check_tokens, context_transition_matrix, order_of
from markov_interp.sources import dirichlet
from markov_interp.theory._stats import MAX_SEQUENCES, _mean_se
from markov_interp.theory.fixed import entropy, kl_divergence, stationary_state_laws


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
    check_tokens(tokens, vocab)
    laws = stationary_state_laws(kernels.cpu().to(torch.float64)).to(tokens.device)  # [kernel, vocab]
    log_laws = torch.where(laws > 0, laws, 1.0).log().T  # [vocab, kernel]
    impossible = (laws <= 0).T.to(torch.float64)
    batch, seq = tokens.shape
    chunk = max(1, dirichlet._CHUNK_ELEMENTS // (max(seq, 1) * max(n_kernels, vocab)))  # the pools' one bound
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
    order = order_of(n_ctx, vocab)
    out = torch.zeros(seq_len - 1, dtype=torch.float64)
    joint_h = [entropy(initial.reshape(n_kernels, vocab ** (t + 1), -1).sum(-1)) for t in range(order)]
    for t in range(min(order - 1, seq_len - 1)):
        out[t] = (joint_h[t + 1] - joint_h[t]).mean()
    rows_h, matrix, law = entropy(pool), context_transition_matrix(pool), initial
    for t in range(order - 1, seq_len - 1):
        out[t] = (law * rows_h).sum(-1).mean()
        law = torch.bmm(law[:, None, :], matrix)[:, 0]
    return out


def _pool_bayes_references(source: KernelSource, seq_len: int, *, seed: int, tol: float,
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
        kl = kl_divergence(true, source.predictive(tokens)[:, :-1])  # [size, target]: KL from the pool's Bayes law
        per_seq = kl.mean(1)
        sums += torch.stack([kl.sum(0), (kl**2).sum(0), per_seq.sum().expand(seq_len - 1),
                             (per_seq**2).sum().expand(seq_len - 1)])
        n += size
        mean, se = _mean_se(sums[2, 0], sums[3, 0], n)
        if (n_sequences is not None and n >= n_sequences) or (
                n_sequences is None and ((n >= 1024 and se < tol) or n >= MAX_SEQUENCES)):
            break
    curve, curve_se = _mean_se(sums[0], sums[1], n)
    return {"pool_bayes_loss": float(oracle.mean() + mean), "pool_bayes_loss_se": float(se),
            "pool_bayes_curve": tuple((oracle + curve).tolist()), "pool_bayes_curve_se": tuple(curve_se.tolist())}
