"""Fixed chains: one known kernel for every sequence (`MarkovChain`, of any order; `BinaryChain`, the two-state
chain of Makkuva et al.), the law of the next state given a known kernel (`kernel_predictions`, also what a
random-kernel sequence's kernel says) and the configs of kinds "binary" and "markov".
"""

import dataclasses
from typing import Any, ClassVar, Optional

import torch
from jaxtyping import Float, Int
from torch import Tensor

from markov_interp._plan import power
from markov_interp.config import check_int, check_probability
from markov_interp.sources.base import (
    ROW_SUM_TOL,
    InitialLaw,
    Kernels,
    Probs,
    SourceConfig,
    Tokens,
    initial_context_law,
    register_source,
)
from markov_interp.sources.contexts import check_tokens, context_index, context_kernel, order_of
from markov_interp.sources.sampling import (_check_sizes, _draw, _resolve_device, _sample_chain,
                                            kernel_stream_sampler)


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
        if vocab < 2 or k.shape[0] != power(vocab, order):  # vocab**order itself: hours for order 2**40
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
    bad = (sums - 1).abs() > ROW_SUM_TOL
    if bad.any():
        idx = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(f"{name} rows must sum to 1; row {idx} sums to {sums[idx].item():.6g}")
    return k




# ------------------------------------------------------------------------------- the law given a known kernel
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
    order = order_of(n_ctx, vocab)
    check_tokens(tokens, vocab)
    batch, seq = tokens.shape
    flat = kernels.to(tokens.device, torch.float64).expand(batch, -1, -1)
    ctx = context_index(tokens, vocab, order)
    probs = torch.gather(flat, 1, ctx.clamp_min(0)[..., None].expand(-1, -1, vocab))  # [batch, pos, vocab]
    _fill_prefix_predictions(probs, initial.to(tokens.device, torch.float64).expand(batch, -1), tokens, order)
    return probs


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


# ------------------------------------------------------------------------------------------------- sources
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
    support = None  # the `KernelSource` protocol: a fixed chain has no prior (its kernel's zeros say what is allowed)
    in_context = False  # the `Source` protocol: one kernel, which a model can learn in its weights

    def __init__(self, kernel: Any, order: int = 1, *, initial: InitialLaw = "stationary"):
        self.kernel: Tensor = validate_kernel(kernel, order=order)
        self.order = order
        self.vocab = int(self.kernel.shape[-1])
        self._initial = initial_context_law(initial, self.kernel, self.vocab, order)
        self._stationary_start = isinstance(initial, str) and initial == "stationary"
        self._cdf = context_kernel(self.kernel).cumsum(-1)  # `kernel_cdf` (the private name stays for callers)

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
    def config(self) -> "MarkovChainConfig":
        """The config that builds this chain (kind "markov")."""
        return MarkovChainConfig(kernel=self.kernel.tolist(), order=self.order, initial=self.initial)

    @property
    def pool(self) -> Float[Tensor, "1 context vocab"]:
        """The kernel as a pool of one, [1, V**order, V] (the `KernelSource` protocol)."""
        return context_kernel(self.kernel)[None]

    def initial_context_laws(self, kernels: Kernels) -> Float[Tensor, "batch context"]:
        """The chain's initial context law, one row per sequence (the `KernelSource` protocol)."""
        return self._initial.to(kernels.device, torch.float64).expand(kernels.shape[0], -1)

    def predictive(self, tokens: Tokens) -> Probs:
        """The law of x_{t+1} given x_0..x_t at every position (the `Source` protocol): the kernel's row of the
        current context, and before an order-k context is full the exact law under the initial context law
        (`kernel_predictions`). Its loss is the entropy rate, the global optimum of Makkuva et al.

        >>> BinaryChain(0.2, 0.3).predictive(torch.tensor([[0, 1]]))[0]
        tensor([[0.8000, 0.2000],
                [0.3000, 0.7000]], dtype=torch.float64)
        """
        return kernel_predictions(self.pool, tokens.cpu(), self._initial[None]).to(tokens.device)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab={self.vocab}, order={self.order})"

    def sample(
        self, batch: int, seq_len: int, generator: torch.Generator | None = None, *, device: Any = None,
        return_kernels: bool = False,
    ) -> Tokens | tuple[Tokens, Kernels]:
        """Draw `batch` independent sequences of `seq_len` states (int64) on the generator's device; with
        `return_kernels` also the kernel of each ([batch, V**order, V], the same for every row)."""
        dev = _resolve_device(generator, device)
        _check_sizes(batch, seq_len, self, dev)
        first = _draw(self._initial, batch, generator, dev)
        cdf = self._cdf.to(dev).expand(batch, -1, -1)
        tokens = _sample_chain(
            cdf, first, vocab=self.vocab, order=self.order, seq_len=seq_len, generator=generator, device=dev
        )
        return (tokens, self.pool.to(dev).expand(batch, -1, -1)) if return_kernels else tokens


    def sample_stream(self, batch: int, seq_len: int, keys: Int[Tensor, "member 2"],
                      step: Any) -> Int[Tensor, "member batch pos"]:
        """`batch` sequences per member from the counter stream at `step` (the `StreamSource` protocol;
        `sampling.kernel_stream_sampler`)."""
        return kernel_stream_sampler([self] * len(keys), batch, seq_len, keys)(step)


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
    def config(self) -> "BinaryChainConfig":
        """The config that builds this chain (kind "binary")."""
        return BinaryChainConfig(p=self.p, q=self.q, initial=self.initial)


# ------------------------------------------------------------------------------------------------- configs
@register_source("binary")
@dataclasses.dataclass(frozen=True, kw_only=True)
class BinaryChainConfig(SourceConfig):
    """fixed two-state chain, P(0 -> 1) = p and P(1 -> 0) = q (--p, --q; default p=0.2, q=0.3)"""

    run_defaults: ClassVar[dict[str, Any]] = {"p": 0.2, "q": 0.3}
    states_option: ClassVar[Optional[str]] = None  # always two states
    order: ClassVar[int] = 1
    _flat_layout: ClassVar[bool] = True

    p: float | int  # P(0 -> 1)
    q: float | int  # P(1 -> 0)
    initial: str | tuple | list = "stationary"  # "stationary", "uniform" or a law over the two first states

    def build(self) -> BinaryChain:
        """The `BinaryChain`."""
        return BinaryChain(self.p, self.q, initial=_initial_arg(self.initial))

    @property
    def vocab_size(self) -> int:
        """Two states."""
        return 2


@register_source("markov")
@dataclasses.dataclass(frozen=True, kw_only=True)
class MarkovChainConfig(SourceConfig):
    """any fixed kernel, of any order (--kernel, --order)"""

    states_option: ClassVar[Optional[str]] = "kernel"
    _flat_layout: ClassVar[bool] = True

    kernel: tuple | list  # nested tuples, shape [V]*order + [V] (or flat [V**order, V])
    order: int = 1
    initial: str | tuple | list = "stationary"  # "stationary", "uniform" or a law over the V**order first contexts

    def build(self) -> MarkovChain:
        """The `MarkovChain`."""
        return MarkovChain(self.kernel, self.order, initial=_initial_arg(self.initial))


def _initial_arg(initial: str | tuple) -> InitialLaw:
    """A config's `initial` as the sources take it (a law as a list)."""
    return initial if isinstance(initial, str) else list(initial)
