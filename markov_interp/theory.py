"""Exact reference quantities: what loss a model *should* reach, in nats.

- `stationary_distribution`: the law pi the chain settles into.
- `unigram_loss`: H(pi), the loss of the best predictor that ignores the context. A single-layer transformer
  stuck at a bad local minimum sits here (Makkuva et al.).
- `entropy_rate`: sum_s pi(s) H(P(. | s)), the loss of the true kernel, which is the best any predictor can do on
  a fixed chain (exact at every position when the first states are drawn from pi).
- `add_beta_predictions`: the in-context add-beta (Laplace beta = 1, Krichevsky-Trofimov beta = 1/2) estimator of
  the next-state law from transition counts in the sequence so far: Bayes-optimal for `RandomMarkov` with
  alpha = beta, and what an induction-head circuit approximates.

Order-k kernels ([V]*k + [V]) are handled through the chain on contexts (the last k states).
"""

from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from markov_interp.data import (
    MarkovChain,
    RandomMarkov,
    _context_kernel,
    _context_transition_matrix,
    _solve_stationary,
    validate_kernel,
)

Kernel = Any  # a [V]*k + [V] array-like; validated by data.validate_kernel


def _as_kernel(kernel: Kernel) -> Tensor:
    if isinstance(kernel, MarkovChain):
        return kernel.kernel
    k = torch.as_tensor(kernel, dtype=torch.float64)
    return validate_kernel(k, order=max(k.ndim - 1, 1))


def stationary_context_distribution(kernel: Kernel, *, check: bool = True) -> Float[Tensor, " context"]:
    """Stationary law over contexts (the last k states, base-V index, oldest first) of an order-k kernel.

    For order 1 this is the stationary distribution pi itself. Raises ValueError when the law is not unique
    (a reducible chain with several closed classes).
    """
    k = _as_kernel(kernel) if check else kernel.to(torch.float64)
    flat = _context_kernel(k)
    if check:  # unique iff P - I has rank n - 1
        n = flat.shape[0]
        rank = torch.linalg.matrix_rank(_context_transition_matrix(flat) - torch.eye(n, dtype=flat.dtype), atol=1e-10)
        if rank < n - 1:
            raise ValueError(
                f"the chain has no unique stationary law (the kernel has {n - int(rank)} closed classes)"
            )
    return _solve_stationary(flat)


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
    tokens: Int[Tensor, "batch pos"], vocab: int, *, order: int = 1, beta: float | int = 1.0
) -> Float[Tensor, "batch pos vocab"]:
    """In-context add-beta estimate of P(x_{t+1} | x_0..x_t) at every position t.

    Counts the transitions c -> x seen inside the sequence up to position t (from the context c of the last
    `order` states to the next state x) and predicts (n(c_t, x) + beta) / (n(c_t) + V beta) for the current
    context c_t. beta = 1 is Laplace's rule, beta = 1/2 Krichevsky-Trofimov. Under `RandomMarkov(alpha=beta)`
    this is the Bayes posterior predictive; positions with fewer than `order` states predict uniformly.
    order = 0 is the in-context unigram estimator (state counts over x_0..x_t): Edelman et al.'s unigram phase.

    >>> add_beta_predictions(torch.tensor([[0, 1, 0]]), 2)[0, 2]  # after 0->1, 1->0 and now in state 0
    tensor([0.3333, 0.6667], dtype=torch.float64)
    """
    if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 2:
        raise ValueError(f"vocab must be an integer >= 2, got {vocab!r}")
    if isinstance(order, bool) or not isinstance(order, int) or order < 0:
        raise ValueError(f"order must be an integer >= 0, got {order!r}")
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta!r}")
    if tokens.numel() and (tokens.min() < 0 or tokens.max() >= vocab):
        raise ValueError(f"tokens must lie in 0..{vocab - 1}, got values in {tokens.min()}..{tokens.max()}")
    if order == 0:  # in-context unigram: state counts over x_0..x_t, whatever the current state
        counts = torch.nn.functional.one_hot(tokens, vocab).to(torch.float64).cumsum(1)
        return (counts + beta) / (counts.sum(-1, keepdim=True) + vocab * beta)
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
    probs = (current + beta) / (current.sum(-1, keepdim=True) + vocab * beta)
    probs[ctx < 0] = 1.0 / vocab
    return probs


def target_log_loss(
    probs: Float[Tensor, "batch pos vocab"], tokens: Int[Tensor, "batch pos"]
) -> Float[Tensor, "batch target"]:
    """-log probs[b, t, x_{t+1}] for t = 0..T-2: the log-loss of every next-state prediction on a sequence."""
    nxt = tokens[:, 1:, None].to(probs.device)
    return -torch.log(torch.gather(probs[:, :-1], 2, nxt)[..., 0].clamp_min(1e-300))


def in_context_loss_curve(
    source: Any,
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
        beta = source.alpha if isinstance(source, RandomMarkov) else 0.5
    generator = generator if generator is not None else torch.Generator().manual_seed(0)
    total = torch.zeros(seq_len - 1, dtype=torch.float64)
    done = 0
    while done < n_sequences:
        chunk = min(512, n_sequences - done)
        tokens = source.sample(chunk, seq_len, generator)
        probs = add_beta_predictions(tokens, source.vocab, order=source.order, beta=beta)
        total += target_log_loss(probs, tokens).sum(0).cpu()
        done += chunk
    return total / n_sequences


def _expected_random_references(source: RandomMarkov, n_kernels: int, generator: torch.Generator) -> dict:
    kernels = source.sample_kernels(n_kernels, generator)  # [n, V**k, V]
    pi = stationary_context_laws(kernels)
    rates = (pi * entropy(kernels)).sum(-1)
    unigrams = entropy(pi.reshape(n_kernels, -1, source.vocab).sum(1))  # law of the last state
    return {"entropy_rate": float(rates.mean()), "unigram_loss": float(unigrams.mean())}


def reference_losses(source: Any, seq_len: int, *, n_sequences: int = 2048, seed: int = 0) -> dict[str, float]:
    """The losses a model trained on `source` is compared with, averaged over positions 0..seq_len-2.

    Fixed kernels (`MarkovChain`, `BinaryChain`): exact "entropy_rate" (global optimum) and "unigram_loss"
    (context-free optimum). `RandomMarkov`: "bayes_loss", the Bayes-optimal in-context (add-alpha) loss averaged
    over the sequence (Monte Carlo, `n_sequences`, `seed`); "entropy_rate", the loss of an oracle that knows
    each sequence's kernel, and "unigram_loss", H(pi) of each kernel, both in expectation over kernels.
    """
    if isinstance(source, RandomMarkov):
        gen = torch.Generator().manual_seed(seed)
        out = _expected_random_references(source, n_sequences, gen)
        curve = in_context_loss_curve(source, seq_len, n_sequences=n_sequences, generator=gen)
        out["bayes_loss"] = float(curve.mean())
        return out
    if isinstance(source, MarkovChain):
        return {"entropy_rate": entropy_rate(source.kernel), "unigram_loss": unigram_loss(source.kernel)}
    raise ValueError(f"unknown source type {type(source).__name__}")
