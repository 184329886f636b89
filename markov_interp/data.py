"""Markov sources: the data a model is trained and probed on.

Three sources, one interface (`.sample(batch, seq_len, generator=...)` -> `Int[Tensor, "batch pos"]`):

- `BinaryChain(p, q)`: the two-state chain of Makkuva et al. with P(0 -> 1) = p and P(1 -> 0) = q.
- `MarkovChain(kernel, order=k)`: any number of states; for order k the kernel is indexed by the last k states.
- `RandomMarkov(vocab, order, alpha)`: a fresh kernel per sequence, rows ~ Dirichlet(alpha): the in-context
  learning task of the induction-head literature (Edelman et al. 2024).

Sampling is vectorised over positions as well as sequences. A chain step is a map from states to states,
`x_t = F_t(x_{t-1})`, where `F_t` is drawn up front for every possible current state from one uniform per
position. The states along the sequence are then prefix compositions `F_t o ... o F_1` applied to the first
state, computed with a two-level Hillis-Steele scan in a few batched gathers instead of seq_len Python steps;
for two states, where a map is a reset, the identity or a flip, with a cumulative max and sum instead.
"""

import dataclasses
import math
from typing import Any, Union

import torch
from jaxtyping import Float, Int
from torch import Tensor

from markov_interp.config import Config, check_choice, check_int, check_number, check_probability
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
) -> Tokens:
    """Sample order-k chains given per-sequence cumulative kernels and the first context index.

    The chain state is the context c = base-V number of the last k tokens (oldest first); the next context is
    (c * V + x) mod V**k. `first` is the context made of the first k tokens.
    """
    batch, n_ctx, _ = cdf.shape
    steps = max(seq_len - order, 0)
    if steps:
        u = torch.rand(batch, steps, 1, 1, generator=generator, device=device, dtype=torch.float64)
        # the comparison below sums steps * contexts * V int64 per sequence: a block of sequences at a time
        # bounds the memory (chains.block_sizes); each sequence is computed alone, so the tokens are the same
        sizes = block_sizes(batch, 8 * steps * n_ctx * vocab)
        later = torch.cat([_chain_block(c, x, f, vocab=vocab, order=order)
                           for c, x, f in zip(cdf.split(sizes), u.split(sizes), first.split(sizes))])
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


def _draw(law: Tensor, batch: int, generator: torch.Generator | None, device: torch.device) -> Tensor:
    cdf = law.to(device).cumsum(-1)
    u = torch.rand(batch, 1, generator=generator, device=device, dtype=torch.float64)
    return (cdf <= u).sum(-1).clamp_(max=law.shape[-1] - 1)


# ---------------------------------------------------------------------------------------------- sources
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

    def __init__(self, kernel: Any, order: int = 1, *, initial: InitialLaw = "stationary"):
        self.kernel: Tensor = validate_kernel(kernel, order=order)
        self.order = order
        self.vocab = int(self.kernel.shape[-1])
        self._initial = _initial_context_law(initial, self.kernel, self.vocab, order)
        self._cdf = _context_kernel(self.kernel).cumsum(-1)

    @property
    def initial_context_law(self) -> Tensor:
        """The law of the first `order` states, over contexts (base-V index, oldest state most significant)."""
        return self._initial

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab={self.vocab}, order={self.order})"

    def sample(
        self, batch: int, seq_len: int, generator: torch.Generator | None = None, *, device: Any = None
    ) -> Tokens:
        """Draw `batch` independent sequences of `seq_len` states (int64) on the generator's device."""
        _check_sizes(batch, seq_len)
        dev = _resolve_device(generator, device)
        first = _draw(self._initial, batch, generator, dev)
        cdf = self._cdf.to(dev).expand(batch, -1, -1)
        return _sample_chain(
            cdf, first, vocab=self.vocab, order=self.order, seq_len=seq_len, generator=generator, device=dev
        )


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


class RandomMarkov:
    """The in-context task: every sequence has its own kernel, each row drawn from Dirichlet(alpha).

    A model cannot learn this kernel in its weights; it must estimate it from the sequence, which an
    induction-head circuit does. The Bayes-optimal predictor is the add-alpha count estimator
    (`theory.add_beta_predictions` with beta = alpha) when the first states are uniform; with the default
    stationary first state the first token also says something about the kernel, which the Bayes predictor
    uses (about 0.003 nats per target over 32 targets on 3 states, 0.0005 over 256 on 2; `theory.reference_losses`
    reports both losses).

    >>> tokens, kernels = RandomMarkov(3).sample(4, 10, generator=torch.Generator().manual_seed(0),
    ...                                          return_kernels=True)
    >>> tokens.shape, kernels.shape
    (torch.Size([4, 10]), torch.Size([4, 3, 3]))
    """

    def __init__(self, vocab: int, order: int = 1, alpha: float | int = 1.0, *, initial: InitialLaw = "stationary"):
        check_int("vocab", vocab, minimum=2)
        check_int("order", order, minimum=1)
        check_number("alpha", alpha, positive=True)
        self.vocab, self.order, self.alpha = vocab, order, float(alpha)
        self._initial = _initial_context_law(initial, None, vocab, order)

    def __repr__(self) -> str:
        return f"RandomMarkov(vocab={self.vocab}, order={self.order}, alpha={self.alpha})"

    def sample_kernels(
        self, batch: int, generator: torch.Generator | None = None, *, device: Any = None
    ) -> Float[Tensor, "batch context vocab"]:
        """Draw `batch` kernels (rows ~ Dirichlet(alpha)) as [batch, V**order, V] float64."""
        dev = _resolve_device(generator, device)
        # Dirichlet via normalised Gamma draws; torch's Gamma sampler has no generator argument, so use
        # Marsaglia-Tsang on generator-driven normals and uniforms (exact for shape >= 1; boost for < 1).
        shape = (batch, self.vocab**self.order, self.vocab)
        gamma = _gamma(self.alpha, shape, generator, dev)
        return gamma / gamma.sum(-1, keepdim=True)

    def sample(
        self,
        batch: int,
        seq_len: int,
        generator: torch.Generator | None = None,
        *,
        device: Any = None,
        return_kernels: bool = False,
    ) -> Tokens | tuple[Tokens, Float[Tensor, "batch context vocab"]]:
        """Draw sequences, each from its own random kernel; with `return_kernels` also those kernels."""
        _check_sizes(batch, seq_len)
        dev = _resolve_device(generator, device)
        kernels = self.sample_kernels(batch, generator, device=dev)
        if isinstance(self._initial, str):  # stationary law of each sequence's own kernel
            first = _draw(_solve_stationary(kernels), batch, generator, dev)
        else:
            first = _draw(self._initial, batch, generator, dev)
        tokens = _sample_chain(
            kernels.cumsum(-1), first, vocab=self.vocab, order=self.order, seq_len=seq_len,
            generator=generator, device=dev,
        )
        return (tokens, kernels) if return_kernels else tokens


def _gamma(alpha: float, shape: tuple, generator: torch.Generator | None, device: torch.device) -> Tensor:
    """Gamma(alpha, 1) draws from an explicit generator (Marsaglia & Tsang 2000, with rejection)."""
    boost = alpha < 1
    a = alpha + 1 if boost else alpha
    d = a - 1.0 / 3
    c = 1.0 / math.sqrt(9 * d)
    out = torch.empty(shape, dtype=torch.float64, device=device)
    todo = torch.ones(shape, dtype=torch.bool, device=device)
    while todo.any():
        n = int(todo.sum())
        z = torch.randn(n, generator=generator, device=device, dtype=torch.float64)
        u = torch.rand(n, generator=generator, device=device, dtype=torch.float64)
        v = (1 + c * z) ** 3
        ok = (v > 0) & (torch.log(u.clamp_min(1e-300)) < 0.5 * z**2 + d - d * v + d * torch.log(v.clamp_min(1e-300)))
        idx = todo.nonzero(as_tuple=True)
        accepted = tuple(i[ok] for i in idx)
        out[accepted] = (d * v)[ok]
        todo[accepted] = False
    if boost:
        u = torch.rand(shape, generator=generator, device=device, dtype=torch.float64)
        out = out * u.clamp_min(1e-300) ** (1.0 / alpha)
    return out.clamp_min(1e-300)


Source = Union[MarkovChain, RandomMarkov]


# ---------------------------------------------------------------------------------------------- config
_KINDS = ("binary", "markov", "random")
_KIND_FIELDS = {"binary": ("p", "q"), "markov": ("kernel",), "random": ("vocab", "alpha")}  # besides order, initial


@dataclasses.dataclass(frozen=True, kw_only=True)
class SourceConfig(Config):
    """A serialisable description of a source: what a run folder records and `build()` turns into a source.

    kind "binary" uses p, q; "markov" uses kernel (nested lists) and order; "random" uses vocab, order, alpha.
    Serialisation, unknown-key refusal and `replace` come from `config.Config`.
    """

    kind: str = "binary"  # "binary", "markov" or "random"
    p: float | int | None = None  # binary: P(0 -> 1)
    q: float | int | None = None  # binary: P(1 -> 0)
    kernel: tuple | list | None = None  # markov: nested tuples, shape [V]*order + [V]
    order: int = 1
    vocab: int | None = None  # random: number of states
    alpha: float | int = 1.0  # random: Dirichlet concentration of each kernel row
    initial: str | tuple | list = "stationary"  # "stationary", "uniform" or a law over the V**order first contexts

    def __post_init__(self) -> None:
        if self.kernel is not None and not isinstance(self.kernel, tuple):
            object.__setattr__(self, "kernel", _to_tuple(self.kernel))
        if isinstance(self.initial, (list, Tensor)):
            object.__setattr__(self, "initial", _to_tuple(self.initial))
        check_choice("source kind", self.kind, _KINDS)
        foreign = [name for name in ("p", "q", "kernel", "vocab") if getattr(self, name) is not None]
        foreign += ["alpha"] if self.alpha != 1.0 else []
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
        elif self.kind == "random" and self.vocab is None:
            raise ValueError("a random source needs vocab")
        self.build()  # validates every value once, with the sources' own messages

    def build(self) -> Source:
        """The source object this config describes."""
        initial = self.initial if isinstance(self.initial, str) else list(self.initial)
        if self.kind == "binary":
            return BinaryChain(self.p, self.q, initial=initial)
        if self.kind == "markov":
            return MarkovChain(self.kernel, self.order, initial=initial)
        return RandomMarkov(self.vocab, self.order, self.alpha, initial=initial)

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
