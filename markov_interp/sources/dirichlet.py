"""Random kernels: a fresh kernel per sequence, rows ~ Dirichlet(alpha) over the states the prior allows
(`RandomMarkov`, the in-context task of the induction-head literature), or one of a finite pool of such kernels
drawn once (`pool_size=N`, the task-diversity setting of Raventos et al. 2023); their Bayes-optimal laws given a
prefix (the add-alpha posterior predictive, `add_beta_predictions`; the pool's exact posterior and Bayes mixture,
`pool_posterior`, `pool_bayes_predictions`) and the config of kind "random".
"""

import dataclasses
import functools
import math
from typing import Any, ClassVar, Optional

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from markov_interp._plan import Need, planned, power, size
from markov_interp.config import check_bool, check_int, check_number, check_seed
from markov_interp.sources.base import (
    InitialLaw,
    Kernels,
    Probs,
    SourceConfig,
    Tokens,
    initial_context_law,
    register_source,
)
from markov_interp.sources.contexts import check_tokens, context_index, order_of, solve_stationary
from markov_interp.sources.fixed import _fill_prefix_predictions, _initial_arg, kernel_predictions
from markov_interp.sources.sampling import (_check_sizes, _draw, _gamma, _resolve_device, _sample_chain,
                                            kernel_stream_sampler)

_CHUNK_ELEMENTS = 1 << 22  # float64 entries of the largest temporary an exact pool computation holds (32 MiB)
PoolKernels = Float[Tensor, "kernel context vocab"]  # a pool's kernels, each flattened to [V**order, V]
PoolLaws = Float[Tensor, "kernel context"]  # the law of the first `order` states of each kernel, over contexts
PoolWeights = Float[Tensor, "batch pos kernel"]  # per sequence and position, one value per kernel of the pool


# ------------------------------------------------------------------------------------------------- source
class RandomMarkov:
    """The in-context task: every sequence has its own kernel, each row drawn from Dirichlet(alpha).

    A model cannot learn this kernel in its weights; it must estimate it from the sequence, which an
    induction-head circuit does. The Bayes-optimal predictor is the add-alpha count estimator
    (`add_beta_predictions` with beta = alpha, `predictive`) when the first states are uniform; with the default
    stationary first state the first token also says something about the kernel, which the Bayes predictor
    uses (about 0.003 nats per target over 32 targets on 3 states, 0.0005 over 256 on 2; `theory.reference_losses`
    reports both losses).

    With `pool_size=N` the kernels come from a finite pool instead: N kernels drawn once from the same prior with
    a generator seeded by `pool_seed` (default 0; independent of the sampling generator), and every sequence draws
    one of them uniformly. A model can then memorise the pool (its Bayes predictor is the posterior mixture over
    the N kernels, `pool_bayes_predictions`, its `predictive`) or estimate in context; `out_of_pool()` is the source of
    fresh kernels from the same prior, to tell the two apart.

    >>> tokens, kernels = RandomMarkov(3).sample(4, 10, generator=torch.Generator().manual_seed(0),
    ...                                          return_kernels=True)
    >>> tokens.shape, kernels.shape
    (torch.Size([4, 10]), torch.Size([4, 3, 3]))
    >>> RandomMarkov(3, pool_size=2).pool.shape
    torch.Size([2, 3, 3])
    """

    in_context = True  # the `Source` protocol: each sequence's kernel must be estimated from the sequence

    def __init__(self, vocab: int, order: int = 1, alpha: float | int = 1.0, *, initial: InitialLaw = "stationary",
                 pool_size: Optional[int] = None, pool_seed: Optional[int] = None, zero_diagonal: bool = False):
        check_int("vocab", vocab, minimum=2)
        check_int("order", order, minimum=1)
        check_number("alpha", alpha, positive=True)
        check_bool("zero_diagonal", zero_diagonal)
        if zero_diagonal and (order != 1 or vocab < 3):
            raise ValueError(f"zero_diagonal=True needs order 1 and vocab >= 3 (got order={order}, vocab={vocab}): "
                             "with 2 states the chain would alternate deterministically")
        self.zero_diagonal = zero_diagonal
        if pool_size is not None:
            check_int("pool_size", pool_size, minimum=1)
        if pool_seed is not None:
            check_seed("pool_seed", pool_seed)
            if pool_size is None:
                raise ValueError(f"pool_seed={pool_seed!r} is set without pool_size: the pool seed only applies to a "
                                 "finite pool (pool_size=N); leave pool_seed out for a fresh kernel per sequence")
        self.vocab, self.order, self.alpha = vocab, order, float(alpha)
        self.pool_size = pool_size
        self.pool_seed = None if pool_size is None else (pool_seed or 0)
        self._initial = initial_context_law(initial, None, vocab, order)

    def __repr__(self) -> str:
        pool = "" if self.pool_size is None else f", pool_size={self.pool_size}, pool_seed={self.pool_seed}"
        diagonal = ", zero_diagonal=True" if self.zero_diagonal else ""
        return f"RandomMarkov(vocab={self.vocab}, order={self.order}, alpha={self.alpha}{pool}{diagonal})"

    @property
    def support(self) -> Optional[Bool[Tensor, "context vocab"]]:
        """The transitions the prior allows, [V**order, V] booleans (the `Source` protocol): with zero_diagonal
        every x != c (no state follows itself), else None (all)."""
        if not self.zero_diagonal:
            return None
        return ~torch.eye(self.vocab, dtype=torch.bool)

    @property
    def initial(self) -> str | tuple[float, ...]:
        """The first-context law as given: "stationary" (each kernel's own) or the law over contexts as a tuple."""
        return self._initial if isinstance(self._initial, str) else tuple(self._initial.tolist())

    @property
    def config(self) -> "RandomMarkovConfig":
        """The config that builds this source (kind "random"; a pool's seed as drawn, 0 when not given)."""
        return RandomMarkovConfig(vocab=self.vocab, order=self.order, alpha=self.alpha, initial=self.initial,
                                  pool_size=self.pool_size, pool_seed=self.pool_seed, zero_diagonal=self.zero_diagonal)

    @functools.cached_property
    def pool(self) -> Optional[Float[Tensor, "kernel context vocab"]]:
        """The pool's kernels [pool_size, V**order, V] (float64, drawn once with `pool_seed`), None without a
        pool. Do not modify it in place."""
        if self.pool_size is None:
            return None
        return self.sample_kernels(self.pool_size, torch.Generator().manual_seed(self.pool_seed))

    @functools.cached_property
    def _pool_initial(self) -> Float[Tensor, "kernel context"]:
        return self.initial_context_laws(self.pool)

    def out_of_pool(self) -> "RandomMarkov":
        """The source of fresh kernels from this source's prior (same vocab, order, alpha and first-state law, no
        pool): its kernels lie outside any finite pool with probability 1.

        Evaluating a model on it against on the pool tells memorisation from in-context estimation. For a kernel
        swap: sequences `out_of_pool().sample(n, T, g, return_kernels=True)`; what a model that retrieves from
        the pool predicts on them is `self.predictive(tokens)` (the pool's Bayes predictor), what one that
        estimates in context predicts is `self.out_of_pool().predictive(tokens)`.
        """
        return RandomMarkov(self.vocab, self.order, self.alpha, initial=self._initial, zero_diagonal=self.zero_diagonal)

    def initial_context_laws(self, kernels: Kernels) -> Float[Tensor, "batch context"]:
        """The law of each sequence's first `order` states given its kernel: the kernel's stationary context law
        (default) or the fixed law, one row per kernel (the `Source` protocol)."""
        if isinstance(self._initial, str):
            return solve_stationary(kernels.to(torch.float64))
        return self._initial.to(kernels.device, torch.float64).expand(kernels.shape[0], -1)

    def sample_kernels(
        self, batch: int, generator: torch.Generator | None = None, *, device: Any = None
    ) -> Float[Tensor, "batch context vocab"]:
        """Draw `batch` kernels from the prior (rows ~ Dirichlet(alpha) over the allowed states, `support`;
        never the pool) as [batch, V**order, V] float64."""
        dev = _resolve_device(generator, device)
        # Dirichlet via normalised Gamma draws; torch's Gamma sampler has no generator argument, so use
        # Marsaglia-Tsang on generator-driven normals and uniforms (exact for shape >= 1; boost for < 1).
        return self._normalised(_gamma(self.alpha, self._kernel_shape(batch), generator, dev))

    def _kernel_shape(self, batch: int) -> tuple[int, int, int]:
        return batch, self.vocab**self.order, self.vocab

    def _normalised(self, gamma: Float[Tensor, "*lead context vocab"]) -> Float[Tensor, "*lead context vocab"]:
        """Kernels from Gamma(alpha) draws: each row normalised over its allowed states (Dirichlet(alpha))."""
        support = self.support
        if support is not None:  # Gamma draws of the allowed states normalised: Dirichlet over them
            gamma = gamma * support.to(gamma.device)
        return gamma / gamma.sum(-1, keepdim=True)

    def sample(
        self,
        batch: int,
        seq_len: int,
        generator: torch.Generator | None = None,
        *,
        device: Any = None,
        return_kernels: bool = False,
    ) -> Tokens | tuple[Tokens, Kernels]:
        """Draw sequences, each from its own random kernel (a fresh Dirichlet draw, or a uniform draw from the
        pool); with `return_kernels` also those kernels."""
        dev = _resolve_device(generator, device)
        _check_sizes(batch, seq_len, self, dev)
        if self.pool is None:
            kernels = self.sample_kernels(batch, generator, device=dev)
            laws = self.initial_context_laws(kernels)
        else:
            index = torch.randint(self.pool_size, (batch,), generator=generator, device=dev)
            kernels, laws = self.pool.to(dev)[index], self._pool_initial.to(dev)[index]
        first = _draw(laws, batch, generator, dev)
        tokens = _sample_chain(
            kernels.cumsum(-1), first, vocab=self.vocab, order=self.order, seq_len=seq_len,
            generator=generator, device=dev,
        )
        return (tokens, kernels) if return_kernels else tokens

    def sample_stream(self, batch: int, seq_len: int, keys: Int[Tensor, "member 2"],
                      step: Any) -> Int[Tensor, "member batch pos"]:
        """`batch` sequences per member from the counter stream at `step`, each from its own kernel (fresh, or
        drawn from the pool) (the `StreamSource` protocol; `sampling.kernel_stream_sampler`)."""
        return kernel_stream_sampler([self] * len(keys), batch, seq_len, keys)(step)

    def predictive(self, tokens: Tokens) -> Probs:
        """The Bayes-optimal law of x_{t+1} given x_0..x_t at every position (the `Source` protocol).

        Fresh kernels: the in-context add-alpha estimator over the prior's `support` (`add_beta_predictions` with
        beta = alpha), the posterior predictive up to what a stationary first state reveals about the kernel
        (see the class). A finite pool: the pool's exact Bayes predictor (`pool_bayes_predictions`; for a pool
        of one, its kernel's rows, `kernel_predictions`).

        >>> RandomMarkov(2).predictive(torch.tensor([[0, 1, 0]]))[0, 2]  # after 0->1, 1->0, now in state 0
        tensor([0.3333, 0.6667], dtype=torch.float64)
        """
        if self.pool is None:  # a fresh kernel per sequence
            return add_beta_predictions(tokens, self.vocab, order=self.order, beta=self.alpha, support=self.support)
        if self.pool_size == 1:  # one kernel: its rows (the posterior over a pool of one is that kernel)
            return kernel_predictions(self.pool, tokens.cpu(), self._pool_initial).to(tokens.device)
        return pool_bayes_predictions(self.pool, self._pool_initial, tokens)


# ------------------------------------------------------------------------ the in-context (add-alpha) law
def _count_needs(a: Any) -> list[Need]:
    """The in-context counts of tokens [batch, pos]: V**order x V per position (float64, the one-hots and their
    running sums; order 0: the state counts)."""
    tokens, vocab, order = a.get("tokens"), size(a, "vocab"), size(a, "order")
    cells = tokens.numel() if isinstance(tokens, Tensor) else 0
    return [Need.of("the in-context counts", 16 * cells * power(vocab, order) * vocab, [("vocab", vocab),
                                                                                       ("order", order)])]


@planned(_count_needs)
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
    check_int("vocab", vocab, minimum=2)
    check_int("order", order, minimum=0)
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta!r}")
    if tokens.numel() and (tokens.min() < 0 or tokens.max() >= vocab):
        raise ValueError(f"tokens must lie in 0..{vocab - 1}, got values in {tokens.min()}..{tokens.max()}")
    allowed = _check_support(support, vocab, order, tokens.device)
    if order == 0:  # in-context unigram: state counts over x_0..x_t, whatever the current state
        return _add_beta(state_counts(tokens, vocab), None if allowed is None else allowed[tokens], beta)
    current, ctx = _current_context_counts(tokens, vocab, order)
    probs = _add_beta(current, None if allowed is None else allowed[ctx.clamp_min(0)], beta)
    probs[ctx < 0] = 1.0 / vocab
    return probs


@planned(_count_needs)
def state_counts(tokens: Int[Tensor, "batch pos"], vocab: int) -> Float[Tensor, "batch pos vocab"]:
    """n_x at every position t: how many of x_0..x_t equal x (float64), the counts of the in-context unigram law.

    Args:
        tokens: the states.
        vocab: the number of states V.

    Returns:
        The counts; they sum to t + 1 at position t.

    >>> state_counts(torch.tensor([[0, 1, 1]]), 2)[0].tolist()
    [[1.0, 0.0], [1.0, 1.0], [1.0, 2.0]]
    """
    check_int("vocab", vocab, minimum=1)
    if tokens.numel() and (tokens.min() < 0 or tokens.max() >= vocab):
        raise ValueError(f"tokens must lie in 0..{vocab - 1}, got values in {tokens.min()}..{tokens.max()}")
    return torch.nn.functional.one_hot(tokens, vocab).to(torch.float64).cumsum(1)


@planned(_count_needs)
def transition_counts(tokens: Int[Tensor, "batch pos"], vocab: int, *,
                      order: int = 1) -> Float[Tensor, "batch pos context vocab"]:
    """n(c, x) at every position t: how many transitions from the context c (the `order` states before, base-V
    index oldest first as `context_index`) to the state x are seen in x_0..x_t (float64).

    These are the sufficient statistics of the in-context add-beta law of that order (`add_beta_predictions` reads
    the row of the current context); for two states and order 1, n(0, 1) and n(1, 0) differ by at most one and
    their sum is the number of switches so far.

    Args:
        tokens: the states.
        vocab: the number of states V.
        order: the context length k >= 1.

    Returns:
        The counts [batch, pos, V**k, V]; they sum to max(t + 1 - k, 0) at position t.

    >>> transition_counts(torch.tensor([[0, 1, 1]]), 2)[0, 2].tolist()  # 0->1 and 1->1 seen by t = 2
    [[0.0, 1.0], [0.0, 1.0]]
    """
    check_int("order", order, minimum=1)
    check_int("vocab", vocab, minimum=1)
    batch, seq = tokens.shape
    n_ctx = vocab**order
    ctx = context_index(tokens, vocab, order)
    # transition u -> u+1 has context ctx[u] and next state tokens[u+1]; it is seen from position u+1 on.
    pair = torch.full((batch, seq), -1, dtype=torch.long, device=tokens.device)
    pair[:, 1:] = torch.where(ctx[:, :-1] >= 0, ctx[:, :-1] * vocab + tokens[:, 1:], -1)
    onehot = torch.zeros(batch, seq, n_ctx * vocab + 1, dtype=torch.float64, device=tokens.device)
    onehot.scatter_(2, (pair % (n_ctx * vocab + 1)).unsqueeze(-1), 1.0)  # -1 lands in the spare last slot
    return onehot[..., :-1].cumsum(1).reshape(batch, seq, n_ctx, vocab)


def _current_context_counts(tokens: Int[Tensor, "batch pos"], vocab: int,
                            order: int) -> tuple[Float[Tensor, "batch pos vocab"], Int[Tensor, "batch pos"]]:
    """Per position t, the counts n(c_t, x) of the transitions c_t -> x seen in x_0..x_t out of the current context
    c_t, and c_t itself (`context_index`: -1 where fewer than `order` states, whose counts are meaningless)."""
    batch, seq = tokens.shape
    ctx = context_index(tokens, vocab, order)
    counts = transition_counts(tokens, vocab, order=order)
    current = torch.gather(counts, 2, ctx.clamp_min(0)[..., None, None].expand(batch, seq, 1, vocab))[:, :, 0]
    return current, ctx


def _add_beta(counts: Float[Tensor, "batch pos vocab"], allowed: Bool[Tensor, "batch pos vocab"] | None,
              beta: float | int) -> Float[Tensor, "batch pos vocab"]:
    """(counts + beta), normalised over every state, or over the `allowed` ones (0 elsewhere) when given."""
    if allowed is None:
        return (counts + beta) / (counts.sum(-1, keepdim=True) + counts.shape[-1] * beta)
    weights = (counts + beta) * allowed.to(counts.dtype)
    return weights / weights.sum(-1, keepdim=True)


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


# ------------------------------------------------------------------------------- a finite pool's laws
def pool_log_likelihoods(kernels: PoolKernels, initial: PoolLaws, tokens: Int[Tensor, "batch pos"]) -> PoolWeights:
    """log P(x_0..x_t | kernel n) at every position t, for each kernel n of a finite pool.

    `kernels[n]` is a kernel flattened to [V**k, V] and `initial[n]` the law of its first k states over contexts:
    up to t = k - 1 the likelihood is that law's marginal of x_0..x_t, after it the kernel's rows multiply in.
    -inf where the states are impossible under a kernel. Memory: batch x pos x kernel float64.
    """
    n_kernels, n_ctx, vocab = kernels.shape
    order = order_of(n_ctx, vocab)
    check_tokens(tokens, vocab)
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
    order = order_of(n_ctx, vocab)
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


# -------------------------------------------------------------------------------------------------- config
@register_source("random")
@dataclasses.dataclass(frozen=True, kw_only=True)
class RandomMarkovConfig(SourceConfig):
    """a fresh Dirichlet(alpha) kernel per sequence, or one of N drawn once (--vocab, --alpha, --pool-size; default 2 states)"""

    run_defaults: ClassVar[dict[str, Any]] = {"vocab": 2}
    _flat_layout: ClassVar[bool] = True
    # added after run folders and sweep ids were first written: left out of the JSON at these values, so earlier
    # files and cell ids are unchanged
    _LATER_FIELDS: ClassVar[dict] = {"pool_size": None, "pool_seed": None, "zero_diagonal": False}

    vocab: int  # number of states
    order: int = 1
    alpha: float | int = 1.0  # Dirichlet concentration of each kernel row
    initial: str | tuple | list = "stationary"  # "stationary", "uniform" or a law over the V**order first contexts
    pool_size: int | None = None  # N kernels drawn once, one per sequence (None: a fresh kernel each)
    pool_seed: int | None = None  # with pool_size: seed of the pool's draw (None: 0)
    zero_diagonal: bool = False  # no state follows itself (rows Dirichlet over the other V - 1 states)

    def build(self) -> RandomMarkov:
        """The `RandomMarkov`."""
        return RandomMarkov(self.vocab, self.order, self.alpha, initial=_initial_arg(self.initial),
                            pool_size=self.pool_size, pool_seed=self.pool_seed, zero_diagonal=self.zero_diagonal)

    @property
    def vocab_size(self) -> int:
        """`vocab`."""
        return int(self.vocab)

    def reference_key(self) -> dict[str, Any]:
        """`SourceConfig.reference_key` without the kind: the keys of Dirichlet sources are what they were when the
        cache was keyed on `RandomMarkov`'s parameters."""
        return {k: v for k, v in super().reference_key().items() if k != "kind"}
