"""Markov sources: the data a model is trained and probed on.

Four sources, one interface (`.sample(batch, seq_len, generator=...)` -> `Int[Tensor, "batch pos"]`):

- `BinaryChain(p, q)`: the two-state chain of Makkuva et al. with P(0 -> 1) = p and P(1 -> 0) = q.
- `MarkovChain(kernel, order=k)`: any number of states; for order k the kernel is indexed by the last k states.
- `RandomMarkov(vocab, order, alpha)`: a fresh kernel per sequence, rows ~ Dirichlet(alpha): the in-context
  learning task of the induction-head literature (Edelman et al. 2024). With `pool_size=N` every sequence draws
  one of N kernels fixed once (a finite pool: the task-diversity setting of Raventos et al. 2023). With
  `zero_diagonal=True` no state follows itself: each row is Dirichlet(alpha) over the other V - 1 states.
- `CyclicMarkov(vocab, alpha)`: a fresh cyclic chain per sequence, each state staying with probability
  s_x ~ Beta(alpha, alpha) or moving on to the next state mod V (stationary law, entropy rate and in-context Bayes
  law in closed form).

What theory, probes and training need from a source is the `Source` protocol: vocab, order, the prior's `alpha`
and the transitions it allows (`support`), the finite `pool` of kernels (a fixed chain is a pool of one),
`sample(..., return_kernels=True)` for the kernels of a batch and `initial_context_laws(kernels)` for the law of
each sequence's first states; the sources of this module also say how their first states were given (`initial`)
and which `SourceConfig` builds them (`config`, what theory keys its Monte Carlo references on). A new source kind
is one class that satisfies the protocol plus a builder in `_BUILDERS` (the kinds are `SOURCE_KINDS`).

Sampling is vectorised over positions as well as sequences. A chain step is a map from states to states,
`x_t = F_t(x_{t-1})`, where `F_t` is drawn up front for every possible current state from one uniform per
position. The states along the sequence are then prefix compositions `F_t o ... o F_1` applied to the first
state, computed with a two-level Hillis-Steele scan in a few batched gathers instead of seq_len Python steps;
for two states, where a map is a reset, the identity or a flip, with a cumulative max and sum instead.
"""

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Optional, Protocol, Union, runtime_checkable

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from markov_interp.config import Config, check_bool, check_choice, check_int, check_number, check_probability
from markov_interp.chains import block_sizes
from markov_interp.chains import context_kernel as _context_kernel
from markov_interp.chains import solve_stationary as _solve_stationary
from markov_interp.chains import stationary_context_law as _stationary_contexts

Tokens = Int[Tensor, "batch pos"]
InitialLaw = Union[str, Tensor, list, tuple]  # "stationary", "uniform" or a law over the first contexts

_ROW_SUM_TOL = 1e-6


# --------------------------------------------------------------------------------------------- validation
def validate_kernel(kernel: Any, *, order: int = 1, name: str = "kernel") -> Tensor:
    """Return `kernel` as a float64 tensor of shape [V]*order + [V] after checking it is a transition law.

    Raises ValueError naming the problem: wrong shape, negative or non-finite entries, or a row that does not
    sum to 1 (tolerance 1e-6). An order-k kernel given flat as [V**k, V] is accepted and reshaped.
    """
    check_int("order", order, minimum=1)
    try:
        k = torch.as_tensor(kernel, dtype=torch.float64).detach().cpu().clone()
    except (TypeError, ValueError, RuntimeError) as err:
        raise ValueError(f"{name} must be a numeric array, got {type(kernel).__name__}: {err}") from None
    if k.ndim == 2 and order > 1:
        vocab = k.shape[-1]
        if vocab < 2 or k.shape[0] != vocab**order:
            raise ValueError(
                f"{name} of order {order} given flat must have shape [V**{order}, V], got {tuple(k.shape)}"
            )
        k = k.reshape([vocab] * (order + 1))
    if k.ndim != order + 1 or len(set(k.shape)) != 1:
        raise ValueError(
            f"{name} of order {order} must have shape [V]*{order + 1} (square in every axis), "
            f"got {tuple(k.shape)}"
        )
    vocab = k.shape[0]
    if vocab < 2:
        raise ValueError(f"{name} needs at least 2 states, got {vocab}")
    if not torch.isfinite(k).all():
        raise ValueError(f"{name} has NaN or infinite entries")
    if (k < 0).any():
        raise ValueError(f"{name} has negative entries (min {k.min().item():.3g})")
    sums = k.sum(-1)
    bad = (sums - 1).abs() > _ROW_SUM_TOL
    if bad.any():
        idx = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(f"{name} rows must sum to 1; row {idx} sums to {sums[idx].item():.6g}")
    return k


def _check_sizes(batch: int, seq_len: int) -> None:
    check_int("batch", batch, minimum=1)
    check_int("seq_len", seq_len, minimum=1)


def _resolve_device(generator: torch.Generator | None, device: Any) -> torch.device:
    if generator is not None:
        if device is not None and torch.device(device) != generator.device:
            raise ValueError(f"device {device} differs from the generator's device {generator.device}")
        return generator.device
    return torch.device(device) if device is not None else torch.device("cpu")


# ------------------------------------------------------------------------------------------ the sampler
def _scan(maps: Int[Tensor, "*lead pos state"]) -> Int[Tensor, "*lead pos state"]:
    """Inclusive prefix composition along `pos` (Hillis-Steele): out[t] = maps[t] o ... o maps[0]."""
    shift = 1
    while shift < maps.shape[-2]:
        composed = torch.gather(maps[..., shift:, :], -1, maps[..., :-shift, :])  # later o earlier
        maps = torch.cat([maps[..., :shift, :], composed], dim=-2)
        shift *= 2
    return maps


def _compose_prefix(step_maps: Int[Tensor, "batch pos state"], block: int = 32) -> Int[Tensor, "batch pos state"]:
    """Inclusive prefix composition of state maps, out[t] = F_t o F_{t-1} o ... o F_0, in two levels.

    Scanning blocks of `block` positions and then the block totals does about log2(block) + 1 passes over the
    data instead of log2(seq_len), which halves the cost at seq_len 1024.
    """
    batch, steps, n_states = step_maps.shape
    if steps <= block:
        return _scan(step_maps)
    pad = -steps % block
    if pad:  # identity maps at the end change nothing before them
        identity = torch.arange(n_states, device=step_maps.device).expand(batch, pad, n_states)
        step_maps = torch.cat([step_maps, identity], dim=1)
    within = _scan(step_maps.reshape(batch, -1, block, n_states))  # [batch, blocks, block, state]
    totals = _scan(within[:, :, -1, :])  # prefix over whole blocks
    earlier = totals[:, :-1, None, :].expand(-1, -1, block, -1)  # everything before block j
    later = torch.gather(within[:, 1:], -1, earlier)
    out = torch.cat([within[:, :1], later], dim=1).reshape(batch, -1, n_states)
    return out[:, :steps]


def _apply_binary_maps(step_maps: Int[Tensor, "batch pos 2"], first: Int[Tensor, " batch"]) -> Int[Tensor, "batch pos"]:
    """x_t = F_t(x_{t-1}) for maps on {0, 1}, without a scan.

    A map on two states is a constant (it resets the state), the identity or a flip. So x_t is the value of the
    last reset at or before t (x_0 counts as one) XOR the parity of the flips since: a cumulative max and a
    cumulative sum, linear in the sequence length.
    """
    batch, steps, _ = step_maps.shape
    f0, f1 = step_maps[..., 0], step_maps[..., 1]
    resets = torch.cat([torch.ones(batch, 1, dtype=torch.bool, device=f0.device), f0 == f1], dim=1)
    values = torch.cat([first[:, None], f0], dim=1)  # a reset's value (either entry of a constant map)
    flips = torch.cat([torch.zeros(batch, 1, dtype=torch.long, device=f0.device), (f0 == 1) & (f1 == 0)], dim=1)
    positions = torch.arange(steps + 1, device=f0.device).expand(batch, -1)
    last_reset = torch.where(resets, positions, 0).cummax(dim=1).values
    flip_count = flips.cumsum(dim=1)
    parity = (flip_count - torch.gather(flip_count, 1, last_reset)) % 2
    return (torch.gather(values, 1, last_reset) ^ parity)[:, 1:]


def _sample_chain(
    cdf: Float[Tensor, "batch context vocab"],
    first: Int[Tensor, " batch"],
    *,
    vocab: int,
    order: int,
    seq_len: int,
    generator: torch.Generator | None,
    device: torch.device,
    u: Optional[Float[Tensor, "batch steps 1 1"]] = None,
) -> Tokens:
    """Sample order-k chains given per-sequence cumulative kernels and the first context index.

    The chain state is the context c = base-V number of the last k tokens (oldest first); the next context is
    (c * V + x) mod V**k. `first` is the context made of the first k tokens. `u`: the step uniforms, when drawn
    already (else drawn here from `generator`).
    """
    batch, n_ctx, _ = cdf.shape
    steps = max(seq_len - order, 0)
    if steps:
        if u is None:
            u = torch.rand(batch, steps, 1, 1, generator=generator, device=device, dtype=torch.float64)
        # the comparison below sums steps * contexts * V int64 per sequence: a block of sequences at a time
        # bounds the memory (chains.block_sizes); each sequence is computed alone, so the tokens are the same
        sizes = block_sizes(batch, 8 * steps * n_ctx * vocab)
        parts = [_chain_block(c, x, f, vocab=vocab, order=order)
                 for c, x, f in zip(cdf.split(sizes), u.split(sizes), first.split(sizes))]
        later = parts[0] if len(parts) == 1 else torch.cat(parts)
    else:
        later = torch.empty(batch, 0, dtype=torch.long, device=device)
    digits = vocab ** torch.arange(order - 1, -1, -1, device=device)
    head = (first[:, None] // digits) % vocab
    return torch.cat([head, later], dim=1)[:, :seq_len].contiguous()


def _chain_block(cdf: Float[Tensor, "batch context vocab"], u: Float[Tensor, "batch steps 1 1"],
                 first: Int[Tensor, " batch"], *, vocab: int, order: int) -> Int[Tensor, "batch steps"]:
    """`_sample_chain`'s states after the first context, for one block of sequences and their uniforms `u`."""
    batch, n_ctx, _ = cdf.shape
    steps = u.shape[1]
    # Next token for every possible context, inverse-CDF with one shared uniform per position.
    nxt = (cdf[:, None, :, :] <= u).sum(-1).clamp_(max=vocab - 1)  # [batch, steps, context]
    if n_ctx == 2:  # binary first-order chain: a linear-time path, same maps, same result as the scan
        return _apply_binary_maps(nxt, first)
    # order 1: the context is the state itself, so the step map is `nxt` (skip two costly remainders)
    step_maps = nxt if order == 1 else (torch.arange(n_ctx, device=cdf.device) * vocab + nxt) % n_ctx
    contexts = torch.gather(_compose_prefix(step_maps), -1, first[:, None, None].expand(batch, steps, 1))
    return contexts[..., 0] if order == 1 else contexts[..., 0] % vocab


def _initial_context_law(initial: InitialLaw, kernel: Tensor | None, vocab: int, order: int) -> Tensor | str:
    """Resolve the law of the first `order` tokens, as a law over contexts, or the keyword for per-row laws."""
    n_ctx = vocab**order
    if isinstance(initial, str):
        if initial not in ("stationary", "uniform"):
            raise ValueError(f"initial must be 'stationary', 'uniform' or a probability vector, got {initial!r}")
        if initial == "uniform":
            return torch.full((n_ctx,), 1.0 / n_ctx, dtype=torch.float64)
        return _stationary_contexts(kernel) if kernel is not None else "stationary"
    law = torch.as_tensor(initial, dtype=torch.float64).flatten()
    if law.numel() == vocab and order > 1:
        raise ValueError(f"an initial law for an order-{order} chain must be over the {n_ctx} contexts (V**k)")
    if law.numel() != n_ctx:
        raise ValueError(f"initial law must have {n_ctx} entries, got {law.numel()}")
    if not torch.isfinite(law).all() or (law < 0).any() or abs(law.sum().item() - 1) > _ROW_SUM_TOL:
        raise ValueError(f"initial law must be non-negative and sum to 1, got {law.tolist()}")
    return law


def _draw(law: Tensor, batch: int, generator: torch.Generator | None, device: torch.device,
          u: Optional[Float[Tensor, "batch 1"]] = None) -> Tensor:
    """Indices drawn from `law` (one law, or one per row), by inverse CDF of the uniforms `u` (drawn here if
    None)."""
    cdf = law.to(device).cumsum(-1)
    if u is None:
        u = torch.rand(batch, 1, generator=generator, device=device, dtype=torch.float64)
    return (cdf <= u).sum(-1).clamp_(max=law.shape[-1] - 1)


# ---------------------------------------------------------------------------------------------- sources
Kernels = Float[Tensor, "batch context vocab"]  # one kernel per sequence, flattened to [V**order, V]


@runtime_checkable
class Source(Protocol):
    """What a source owes theory, probes and training; `MarkovChain`, `BinaryChain` and `RandomMarkov` satisfy it.

    - `vocab`, `order`: states 0..vocab-1; the next state depends on the last `order` states.
    - `alpha`: the Dirichlet concentration of the prior each sequence's kernel comes from, None for a fixed chain.
      A source with a prior is a random-kernel source: its plateau and in-context references are add-alpha
      estimators (`theory.plateau_predictions`, `theory.reference_losses`).
    - `support`: for a source with a prior, the transitions it gives positive probability as a boolean
      [V**order, V] (each row's Dirichlet(alpha) is over that row's allowed states); None when every transition
      is allowed, and for fixed chains (their kernel says it). The in-context estimators of `theory` count over it.
    - `pool`: the finite set of kernels a sequence draws from, uniformly, as [N, V**order, V] float64 (a fixed
      chain is a pool of one kernel); None when every sequence draws a fresh kernel from the prior. The exact
      Bayes predictor of a finite pool is `theory.pool_bayes_predictions`.
    - `sample(batch, seq_len, generator, *, device, return_kernels)`: tokens [batch, pos], with
      `return_kernels` also each sequence's kernel [batch, V**order, V].
    - `initial_context_laws(kernels)`: the law of each sequence's first `order` states over contexts, given
      its kernel (the stationary law of that kernel, or a fixed law).

    Optional (every source of this module has them; a source without them is used everywhere except where
    `theory.reference_losses` runs its cached Monte Carlo for random kernels):

    - `initial`: the first-context law as given, "stationary" (each kernel's own stationary law) or a tuple over
      the V**order contexts.
    - `config`: the `SourceConfig` that builds an equal source (references are keyed on its JSON).
    """

    vocab: int
    order: int

    @property
    def alpha(self) -> Optional[float]: ...

    @property
    def support(self) -> Optional[Bool[Tensor, "context vocab"]]: ...

    @property
    def pool(self) -> Optional[Float[Tensor, "kernel context vocab"]]: ...

    def sample(self, batch: int, seq_len: int, generator: Optional[torch.Generator] = None, *,
               device: Any = None, return_kernels: bool = False) -> Any: ...

    def initial_context_laws(self, kernels: Kernels) -> Float[Tensor, "batch context"]: ...


class MarkovChain:
    """A Markov chain of order k on V states with a fixed kernel.

    `kernel[s_1, ..., s_k, x]` = P(next = x | last k states = s_1..s_k, oldest first); order 1 is the usual
    V x V transition matrix. The first k states are drawn from the stationary law of the chain (default),
    uniformly, or from a given law over the V**k contexts, so that every position is a prediction target whose
    optimal loss is the entropy rate.

    >>> chain = MarkovChain([[0.9, 0.1], [0.5, 0.5]])
    >>> chain.sample(2, 5, generator=torch.Generator().manual_seed(0)).shape
    torch.Size([2, 5])
    """

    alpha: Optional[float] = None  # no prior: one known kernel

    def __init__(self, kernel: Any, order: int = 1, *, initial: InitialLaw = "stationary"):
        self.kernel: Tensor = validate_kernel(kernel, order=order)
        self.order = order
        self.vocab = int(self.kernel.shape[-1])
        self._initial = _initial_context_law(initial, self.kernel, self.vocab, order)
        self._stationary_start = isinstance(initial, str) and initial == "stationary"
        self._cdf = _context_kernel(self.kernel).cumsum(-1)  # `kernel_cdf` (the private name stays for callers)

    @property
    def initial_context_law(self) -> Tensor:
        """The law of the first `order` states, over contexts (base-V index, oldest state most significant)."""
        return self._initial

    @property
    def initial(self) -> str | tuple[float, ...]:
        """The first-context law as given: "stationary" (the kernel's) or the law over contexts as a tuple."""
        return "stationary" if self._stationary_start else tuple(self._initial.tolist())

    @property
    def kernel_cdf(self) -> Float[Tensor, "context vocab"]:
        """The cumulative kernel rows [V**order, V] the sampler inverts (float64). Do not modify it in place."""
        return self._cdf

    @property
    def config(self) -> "SourceConfig":
        """The `SourceConfig` that builds this chain (kind "markov")."""
        return SourceConfig(kind="markov", kernel=self.kernel.tolist(), order=self.order, initial=self.initial)

    support = None  # the `Source` protocol: a fixed chain has no prior (its kernel's zeros say what is allowed)

    @property
    def pool(self) -> Float[Tensor, "1 context vocab"]:
        """The kernel as a pool of one, [1, V**order, V] (the `Source` protocol)."""
        return _context_kernel(self.kernel)[None]

    def initial_context_laws(self, kernels: Kernels) -> Float[Tensor, "batch context"]:
        """The chain's initial context law, one row per sequence (the `Source` protocol)."""
        return self._initial.to(kernels.device, torch.float64).expand(kernels.shape[0], -1)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab={self.vocab}, order={self.order})"

    def sample(
        self, batch: int, seq_len: int, generator: torch.Generator | None = None, *, device: Any = None,
        return_kernels: bool = False,
    ) -> Tokens | tuple[Tokens, Kernels]:
        """Draw `batch` independent sequences of `seq_len` states (int64) on the generator's device; with
        `return_kernels` also the kernel of each ([batch, V**order, V], the same for every row)."""
        _check_sizes(batch, seq_len)
        dev = _resolve_device(generator, device)
        first = _draw(self._initial, batch, generator, dev)
        cdf = self._cdf.to(dev).expand(batch, -1, -1)
        tokens = _sample_chain(
            cdf, first, vocab=self.vocab, order=self.order, seq_len=seq_len, generator=generator, device=dev
        )
        return (tokens, self.pool.to(dev).expand(batch, -1, -1)) if return_kernels else tokens


class BinaryChain(MarkovChain):
    """The binary first-order chain of Makkuva et al.: P(0 -> 1) = p, P(1 -> 0) = q.

    Its kernel is [[1-p, p], [q, 1-q]], its stationary law (q, p) / (p + q), and the sum p + q decides the
    single-layer loss landscape (p + q > 1: bad local minima at the unigram loss with weight tying).

    >>> BinaryChain(0.2, 0.3).kernel
    tensor([[0.8000, 0.2000],
            [0.3000, 0.7000]], dtype=torch.float64)
    """

    def __init__(self, p: float | int, q: float | int, *, initial: InitialLaw = "stationary"):
        self.p = check_probability("p", p)
        self.q = check_probability("q", q)
        if initial == "stationary" and self.p + self.q == 0:
            raise ValueError("p = q = 0: the chain never moves and has no unique stationary law")
        super().__init__([[1 - self.p, self.p], [self.q, 1 - self.q]], initial=initial)

    def __repr__(self) -> str:
        return f"BinaryChain(p={self.p}, q={self.q})"

    @property
    def config(self) -> "SourceConfig":
        """The `SourceConfig` that builds this chain (kind "binary")."""
        return SourceConfig(kind="binary", p=self.p, q=self.q, initial=self.initial)


class RandomMarkov:
    """The in-context task: every sequence has its own kernel, each row drawn from Dirichlet(alpha).

    A model cannot learn this kernel in its weights; it must estimate it from the sequence, which an
    induction-head circuit does. The Bayes-optimal predictor is the add-alpha count estimator
    (`theory.add_beta_predictions` with beta = alpha) when the first states are uniform; with the default
    stationary first state the first token also says something about the kernel, which the Bayes predictor
    uses (about 0.003 nats per target over 32 targets on 3 states, 0.0005 over 256 on 2; `theory.reference_losses`
    reports both losses).

    With `pool_size=N` the kernels come from a finite pool instead: N kernels drawn once from the same prior with
    a generator seeded by `pool_seed` (default 0; independent of the sampling generator), and every sequence draws
    one of them uniformly. A model can then memorise the pool (its Bayes predictor is the posterior mixture over
    the N kernels, `theory.pool_bayes_predictions`) or estimate in context; `out_of_pool()` is the source of
    fresh kernels from the same prior, to tell the two apart.

    >>> tokens, kernels = RandomMarkov(3).sample(4, 10, generator=torch.Generator().manual_seed(0),
    ...                                          return_kernels=True)
    >>> tokens.shape, kernels.shape
    (torch.Size([4, 10]), torch.Size([4, 3, 3]))
    >>> RandomMarkov(3, pool_size=2).pool.shape
    torch.Size([2, 3, 3])
    """

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
            check_int("pool_seed", pool_seed, minimum=0)
            if pool_size is None:
                raise ValueError(f"pool_seed={pool_seed!r} is set without pool_size: the pool seed only applies to a "
                                 "finite pool (pool_size=N); leave pool_seed out for a fresh kernel per sequence")
        self.vocab, self.order, self.alpha = vocab, order, float(alpha)
        self.pool_size = pool_size
        self.pool_seed = None if pool_size is None else (pool_seed or 0)
        self._initial = _initial_context_law(initial, None, vocab, order)

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
    def config(self) -> "SourceConfig":
        """The `SourceConfig` that builds this source (kind "random"; a pool's seed as drawn, 0 when not given)."""
        return SourceConfig(kind="random", vocab=self.vocab, order=self.order, alpha=self.alpha, initial=self.initial,
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
        the pool predicts on them is `theory.true_predictions(self, tokens)` (the pool's Bayes predictor), what
        one that estimates in context predicts is `theory.true_predictions(self.out_of_pool(), tokens)`.
        """
        return RandomMarkov(self.vocab, self.order, self.alpha, initial=self._initial, zero_diagonal=self.zero_diagonal)

    def initial_context_laws(self, kernels: Kernels) -> Float[Tensor, "batch context"]:
        """The law of each sequence's first `order` states given its kernel: the kernel's stationary context law
        (default) or the fixed law, one row per kernel (the `Source` protocol)."""
        if isinstance(self._initial, str):
            return _solve_stationary(kernels.to(torch.float64))
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
        _check_sizes(batch, seq_len)
        dev = _resolve_device(generator, device)
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


class CyclicMarkov(RandomMarkov):
    """A random cyclic chain per sequence: from state x the chain stays at x or moves on to x + 1 (mod V), and
    P(stay at x) = s_x ~ Beta(alpha, alpha), independently per state (each row Dirichlet(alpha) over its two allowed
    states, `support`). Its in-context task has one unknown per state, where `RandomMarkov`'s has V - 1.

    Closed forms, checked against theory in tests/sources/test_cyclic.py: the stationary law pi_x is proportional to
    1 / (1 - s_x) (each lap spends a geometric time of mean 1 / (1 - s_x) at x); the entropy rate is
    sum_x pi_x h(s_x) (h the binary entropy); with a uniform first state the Bayes predictor is
    P(stay at x | the sequence so far) = (alpha + n_stay(x)) / (2 alpha + n(x)) over the n(x) steps taken from x
    (`theory.add_beta_predictions` over the support), and the Bayes loss of a sequence is the Beta-Binomial
    marginal likelihood -sum_x log B(alpha + n_stay(x), alpha + n_move(x)) / B(alpha, alpha).

    >>> CyclicMarkov(3).support.int().tolist()
    [[1, 1, 0], [0, 1, 1], [1, 0, 1]]
    >>> tokens = CyclicMarkov(4).sample(2, 12, generator=torch.Generator().manual_seed(0))
    >>> bool((((tokens[:, 1:] - tokens[:, :-1]) % 4) <= 1).all())  # every step stays or moves on by one
    True
    """

    def __init__(self, vocab: int, alpha: float | int = 1.0, *, initial: InitialLaw = "stationary"):
        check_int("vocab", vocab, minimum=3)  # two states would be every transition: RandomMarkov(2)
        super().__init__(vocab, 1, alpha, initial=initial)

    def __repr__(self) -> str:
        return f"CyclicMarkov(vocab={self.vocab}, alpha={self.alpha})"

    @property
    def support(self) -> Bool[Tensor, "context vocab"]:
        """x -> x (stay) and x -> x + 1 mod V (move on), [V, V] booleans (the `Source` protocol)."""
        stay = torch.eye(self.vocab, dtype=torch.bool)
        return stay | stay.roll(1, dims=1)

    @property
    def config(self) -> "SourceConfig":
        """The `SourceConfig` that builds this source (kind "cyclic")."""
        return SourceConfig(kind="cyclic", vocab=self.vocab, alpha=self.alpha, initial=self.initial)

    def out_of_pool(self) -> "CyclicMarkov":
        """This source (it has no pool: every sequence draws a fresh kernel)."""
        return CyclicMarkov(self.vocab, self.alpha, initial=self._initial)


def _gamma(alpha: float, shape: tuple, generator: torch.Generator | None, device: torch.device) -> Tensor:
    """Gamma(alpha, 1) draws from an explicit generator (Marsaglia & Tsang 2000, with rejection)."""
    return _gamma_many(alpha, shape, [generator], device)[0]


def _gamma_many(alpha: float, shape: tuple, generators: Sequence[Optional[torch.Generator]],
                device: torch.device) -> Float[Tensor, "member ..."]:
    """`_gamma(alpha, shape, g)` for every generator g at once, [member, *shape]: member k's numbers are those of
    `generators[k]` alone, bit for bit (each draws its normals and uniforms in the order `_gamma` does; the
    elementwise acceptance runs for all members together, with one host read per rejection round)."""
    boost = alpha < 1
    a = alpha + 1 if boost else alpha
    d = a - 1.0 / 3
    c = 1.0 / math.sqrt(9 * d)
    out = torch.empty((len(generators), *shape), dtype=torch.float64, device=device)
    todo = torch.ones_like(out, dtype=torch.bool)
    counts = [math.prod(shape)] * len(generators)
    while any(counts):
        draws = [(torch.randn(n, generator=g, device=device, dtype=torch.float64),
                  torch.rand(n, generator=g, device=device, dtype=torch.float64))
                 for n, g in zip(counts, generators) if n]
        z, u = (torch.cat(part) for part in zip(*draws))  # members in order: todo.nonzero's order
        v = (1 + c * z) ** 3
        ok = (v > 0) & (torch.log(u.clamp_min(1e-300)) < 0.5 * z**2 + d - d * v + d * torch.log(v.clamp_min(1e-300)))
        idx = todo.nonzero(as_tuple=True)
        accepted = tuple(i[ok] for i in idx)
        out[accepted] = (d * v)[ok]
        todo[accepted] = False
        counts = todo.flatten(1).sum(1).tolist()
    if boost:
        u = torch.stack([torch.rand(shape, generator=g, device=device, dtype=torch.float64) for g in generators])
        out = out * u.clamp_min(1e-300) ** (1.0 / alpha)
    return out.clamp_min(1e-300)


def stacked_sampler(sources: Sequence[Source], batch: int, seq_len: int,
                    generators: Sequence[torch.Generator]) -> Callable[[], Int[Tensor, "member batch pos"]]:
    """A function drawing one batch per source, `[member, batch, seq_len]`, member k's with `generators[k]`: what
    a stack trains on (`training.batches.member_sampler`).

    For fixed chains and random kernels of one vocab and order every member makes its own random draws in
    `sample`'s order -- its kernels (Dirichlet rejection rounds shared by all members of one alpha, or pool
    indices), then its first states' and steps' uniforms in one draw -- and the stationary laws, first states
    and chains of all members are computed at once (fixed chains' tables once for all calls). Other sources are
    sampled one by one. On the CPU member k's rows are `sources[k].sample(batch, seq_len,
    generator=generators[k])` bit for bit (the CPU generator fills in order, so one draw is `sample`'s two); a
    CUDA generator's stream depends on how a draw is split, so there they are this function's own (still the
    same for a member alone and in any stack).

    Args:
        sources: one source per member.
        batch, seq_len: sequences per member and their length.
        generators: one per member, all on the device the tokens are drawn on.

    Returns:
        The sampler: each call draws the next batch of every member (int64 tokens).

    >>> sample = stacked_sampler([BinaryChain(0.2, 0.3), BinaryChain(0.5, 0.8)], 4, 10,
    ...                          [torch.Generator().manual_seed(s) for s in (0, 1)])
    >>> sample().shape
    torch.Size([2, 4, 10])
    """
    _check_sizes(batch, seq_len)
    if not sources or len(sources) != len(generators):
        raise ValueError(f"need one generator per source and at least one source, got {len(sources)} sources and "
                         f"{len(generators)} generators")
    kinds = {(isinstance(s, RandomMarkov), s.vocab, s.order) for s in sources}
    if len(kinds) != 1 or not all(isinstance(s, (MarkovChain, RandomMarkov)) for s in sources):
        return lambda: torch.stack([s.sample(batch, seq_len, generator=g) for s, g in zip(sources, generators)])
    device = generators[0].device
    vocab, order = sources[0].vocab, sources[0].order
    steps = max(seq_len - order, 0)
    fixed = None if isinstance(sources[0], RandomMarkov) else _stacked_tables(sources, batch, generators, device)

    def sample() -> Int[Tensor, "member batch pos"]:
        cdf, first_cdf = fixed if fixed is not None else _stacked_tables(sources, batch, generators, device)
        draws = torch.empty(len(sources), batch * (1 + steps), dtype=torch.float64, device=device)
        for row, g in zip(draws, generators):  # after its kernels, a member's one draw from its own generator
            row.uniform_(generator=g)
        u0 = draws[:, :batch].reshape(-1, 1)
        first = (first_cdf <= u0).sum(-1).clamp_(max=first_cdf.shape[-1] - 1)  # `_draw`, laws given
        u = draws[:, batch:].reshape(len(sources) * batch, steps, 1, 1)
        tokens = _sample_chain(cdf, first, vocab=vocab, order=order, seq_len=seq_len, generator=None,
                               device=device, u=u)
        return tokens.view(len(sources), batch, seq_len)

    return sample


def _stacked_tables(sources: Sequence[Source], batch: int, generators: Sequence[torch.Generator],
                    device: torch.device) -> tuple[Tensor, Tensor]:
    """Every sequence's cumulative kernel [(member batch), context, vocab] and cumulative first-context law
    [(member batch), context], with each member's random draws made as `sample` makes them: fixed chains none;
    pools an index per sequence; fresh kernels the Gamma rounds of `_gamma_many`, shared by the members of one
    alpha. The arithmetic after the draws runs once per source object for all its members (a stack of seeds is
    one source): row by row the same as one member's (`solve_stationary` solves each kernel alone)."""
    groups: dict[int, list[int]] = {}  # members of one source object
    for k, source in enumerate(sources):
        groups.setdefault(id(source), []).append(k)
    n_ctx, vocab = sources[0].vocab ** sources[0].order, sources[0].vocab
    cdf = torch.empty(len(sources), batch, n_ctx, vocab, dtype=torch.float64, device=device)
    laws = torch.empty(len(sources), batch, n_ctx, dtype=torch.float64, device=device)

    def place(members: list[int], kernels_cdf: Tensor, initial: Tensor) -> None:
        at = torch.tensor(members, device=device)
        cdf[at] = kernels_cdf.to(cdf).reshape(len(members), batch, n_ctx, vocab)
        laws[at] = initial.to(laws).reshape(len(members), batch, n_ctx)

    fresh: dict[float, list[int]] = {}
    for members in groups.values():
        source = sources[members[0]]
        if isinstance(source, MarkovChain):
            place(members, source.kernel_cdf.to(device).expand(len(members) * batch, -1, -1),
                  source.initial_context_law.to(device).expand(len(members) * batch, -1))
        elif source.pool is not None:
            index = torch.cat([torch.randint(source.pool_size, (batch,), generator=generators[k], device=device)
                               for k in members])
            place(members, source.pool.to(device)[index].cumsum(-1), source._pool_initial.to(device)[index])
        else:
            fresh.setdefault(source.alpha, []).extend(members)
    for alpha, members in fresh.items():
        gamma = _gamma_many(alpha, sources[members[0]]._kernel_shape(batch), [generators[k] for k in members], device)
        row = {k: i for i, k in enumerate(members)}
        for group in (g for g in groups.values() if g[0] in row):
            source = sources[group[0]]
            kernels = source._normalised(gamma[[row[k] for k in group]].flatten(0, 1))
            place(group, kernels.cumsum(-1), source.initial_context_laws(kernels))
    return cdf.flatten(0, 1), laws.flatten(0, 1).cumsum(-1)


# ---------------------------------------------------------------------------------------------- config
# One builder per kind: (config, initial law) -> source. A new source kind is its class, a builder here and the
# fields it takes in `_KIND_FIELDS` (besides order and initial).
_BUILDERS: dict[str, Callable[[Any, InitialLaw], Source]] = {
    "binary": lambda c, initial: BinaryChain(c.p, c.q, initial=initial),
    "markov": lambda c, initial: MarkovChain(c.kernel, c.order, initial=initial),
    "random": lambda c, initial: RandomMarkov(c.vocab, c.order, c.alpha, initial=initial, pool_size=c.pool_size,
                                              pool_seed=c.pool_seed, zero_diagonal=c.zero_diagonal),
    "cyclic": lambda c, initial: CyclicMarkov(c.vocab, c.alpha, initial=initial),
}
SOURCE_KINDS = tuple(_BUILDERS)  # the source kinds a `SourceConfig` builds (the CLI's --source choices)
_KINDS = SOURCE_KINDS
KIND_HELP = {  # one line per kind, for the CLI's help
    "binary": "fixed two-state chain (--p, --q; default p=0.2, q=0.3)",
    "markov": "any fixed kernel (--kernel, --order)",
    "random": "a fresh Dirichlet kernel per sequence (default 2 states)",
}
_KIND_FIELDS = {"binary": ("p", "q"), "markov": ("kernel",),
                "random": ("vocab", "alpha", "pool_size", "pool_seed", "zero_diagonal"), "cyclic": ("vocab", "alpha")}
_OPTIONAL_FIELDS = ("p", "q", "kernel", "vocab", "pool_size", "pool_seed")  # None unless the kind uses them


@dataclasses.dataclass(frozen=True, kw_only=True)
class SourceConfig(Config):
    """A serialisable description of a source: what a run folder records and `build()` turns into a source.

    kind "binary" uses p, q; "markov" uses kernel (nested lists) and order; "random" uses vocab, order, alpha,
    zero_diagonal (no self-transitions) and, for a finite pool of kernels, pool_size (and pool_seed, default 0);
    "cyclic" (`CyclicMarkov`) uses vocab and alpha.
    Serialisation, unknown-key refusal and `replace` come from `config.Config`; pool_size and pool_seed are left
    out of the JSON while None and zero_diagonal while False, so configs written before they existed (and sweep
    cell ids) are unchanged.
    """

    _LATER_FIELDS: ClassVar[dict] = {"pool_size": None, "pool_seed": None, "zero_diagonal": False}

    kind: str = "binary"  # "binary", "markov", "random" or "cyclic" (SOURCE_KINDS)
    p: float | int | None = None  # binary: P(0 -> 1)
    q: float | int | None = None  # binary: P(1 -> 0)
    kernel: tuple | list | None = None  # markov: nested tuples, shape [V]*order + [V]
    order: int = 1
    vocab: int | None = None  # random: number of states
    alpha: float | int = 1.0  # random: Dirichlet concentration of each kernel row
    initial: str | tuple | list = "stationary"  # "stationary", "uniform" or a law over the V**order first contexts
    pool_size: int | None = None  # random: N kernels drawn once, one per sequence (None: a fresh kernel each)
    pool_seed: int | None = None  # random with pool_size: seed of the pool's draw (None: 0)
    zero_diagonal: bool = False  # random: no state follows itself (rows Dirichlet over the other V - 1 states)

    def __post_init__(self) -> None:
        if self.kernel is not None and not isinstance(self.kernel, tuple):
            object.__setattr__(self, "kernel", _to_tuple(self.kernel))
        if isinstance(self.initial, (list, Tensor)):
            object.__setattr__(self, "initial", _to_tuple(self.initial))
        check_choice("source kind", self.kind, _KINDS)
        foreign = [name for name in _OPTIONAL_FIELDS if getattr(self, name) is not None]
        foreign += ["alpha"] if self.alpha != 1.0 else []
        foreign += ["zero_diagonal"] if self.zero_diagonal is not False else []
        foreign = [name for name in foreign if name not in _KIND_FIELDS[self.kind]]
        if foreign:  # an option of another kind would be stored but never used
            raise ValueError(f"a {self.kind} source does not use {foreign}; it takes {list(_KIND_FIELDS[self.kind])}")
        if self.kind == "binary":
            if self.p is None or self.q is None:
                raise ValueError("a binary source needs p and q")
            if self.order != 1:
                raise ValueError(f"a binary chain has order 1, got order={self.order}")
        elif self.kind == "markov" and self.kernel is None:
            raise ValueError("a markov source needs a kernel")
        elif self.kind in ("random", "cyclic") and self.vocab is None:
            raise ValueError(f"a {self.kind} source needs vocab")
        self.build()  # validates every value once, with the sources' own messages

    def build(self) -> Source:
        """The source object this config describes."""
        initial = self.initial if isinstance(self.initial, str) else list(self.initial)
        return _BUILDERS[self.kind](self, initial)

    @property
    def in_context(self) -> bool:
        """Whether each sequence draws its own kernel from a prior (fresh or from a finite pool): the in-context
        task, whose defaults and references differ from a fixed chain's (the source's `alpha` is set)."""
        return self.build().alpha is not None

    @property
    def vocab_size(self) -> int:
        """Number of states the source emits."""
        if self.kind == "binary":
            return 2
        if self.kind == "random":
            return int(self.vocab)
        return self.build().vocab


def _to_tuple(value: Any) -> Any:
    if isinstance(value, Tensor):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return tuple(_to_tuple(v) for v in value)
    return value
