"""Contexts and the chain on them: what the sources (sampling, their laws given a prefix) and `theory` (reference
losses) both need, so that `theory` builds on the sources and never the other way round.

An order-k kernel is handled through the chain on contexts (the last k states, base-V index, oldest first):
`context_index` reads the context at every position of a sequence, `context_kernel` flattens a kernel to [V**k, V],
`context_transition_matrix` turns that into a V**k x V**k transition matrix, and `solve_stationary` finds its
stationary law, batched over any leading axes.
"""

import torch
from jaxtyping import Float, Int
from torch import Tensor

from markov_interp._plan import power
from markov_interp.config import check_int


def context_index(tokens: Int[Tensor, "batch pos"], vocab: int, order: int) -> Int[Tensor, "batch pos"]:
    """Base-V index of the last `order` states ending at each position (oldest first); -1 where too short.

    >>> context_index(torch.tensor([[0, 1, 1, 0]]), 2, 2)
    tensor([[-1,  1,  3,  2]])
    """
    check_int("vocab", vocab, minimum=1)
    check_int("order", order, minimum=0)
    if power(vocab, order) >= 2**63:  # the index is an int64 (and the loop below runs `order` times)
        raise ValueError(f"{vocab}**{order} contexts do not fit a 64-bit index; lower order")
    index = torch.zeros_like(tokens)
    for lag in range(order):  # order is tiny (1..4): a loop over lags, not positions
        shifted = torch.roll(tokens, lag, dims=1)
        index = index + shifted * vocab ** lag
    index[:, : order - 1] = -1
    return index


def order_of(n_ctx: int, vocab: int) -> int:
    """The order k of kernels with `n_ctx` = V**k context rows; ValueError when `n_ctx` is not a power of V."""
    order = 1
    while vocab**order < n_ctx:
        order += 1
    if vocab**order != n_ctx:
        raise ValueError(f"kernels have {n_ctx} context rows, not a power of the {vocab} states (V**order)")
    return order


def check_tokens(tokens: Tensor, vocab: int) -> None:
    """Refuse states outside 0..vocab-1 with a ValueError naming the range found."""
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab):
        raise ValueError(f"tokens must lie in 0..{vocab - 1}, got values {int(tokens.min())}..{int(tokens.max())}")


def context_kernel(kernel: Tensor) -> Float[Tensor, "context vocab"]:
    """An order-k kernel [V]*k + [V] flattened to [V**k, V] (rows indexed by the context)."""
    return kernel.reshape(-1, kernel.shape[-1])


def context_transition_matrix(flat: Float[Tensor, "*batch context vocab"]) -> Float[Tensor, "*batch context context"]:
    """The chain on contexts (last k states) as an ordinary V**k x V**k transition matrix (batched)."""
    n_ctx, vocab = flat.shape[-2:]
    rows = torch.arange(n_ctx, device=flat.device)[:, None]
    targets = (rows * vocab + torch.arange(vocab, device=flat.device)) % n_ctx
    matrix = torch.zeros(*flat.shape[:-1], n_ctx, dtype=flat.dtype, device=flat.device)
    return matrix.scatter_add_(-1, targets.expand(flat.shape), flat)


# Batched work over many kernels or sequences (sampling, stationary laws, Monte Carlo references) runs in blocks
# whose largest float64 array stays near this size, so memory is bounded whatever the vocab and batch; each item
# is computed alone, so blocks change no bit of any result (docs/faults.md).
BLOCK_BYTES = 1 << 25


def block_sizes(total: int, item_bytes: int) -> list[int]:
    """`total` items cut into consecutive blocks of at most `BLOCK_BYTES // item_bytes` items (at least 1 each).

    Args:
        total: how many items (kernels, sequences, posterior draws).
        item_bytes: bytes of the largest array one item needs.

    Returns:
        The block sizes, in order; they sum to `total`.
    """
    size = max(1, BLOCK_BYTES // max(item_bytes, 1))
    return [min(size, total - start) for start in range(0, total, size)]


def kernel_bytes(n_ctx: int, vocab: int) -> int:
    """Bytes of the largest float64 array per kernel of a stationary-law solve: the [context, context] system
    (or the [context, vocab] kernel, whichever is larger)."""
    return 8 * n_ctx * max(n_ctx, vocab)


def solve_stationary(flat: Float[Tensor, "*batch context vocab"]) -> Float[Tensor, "*batch context"]:
    """Stationary laws of context chains (kernels flattened to [V**k, V]), batched over leading axes.

    Solves pi (P - I) = 0 with one equation swapped for sum(pi) = 1: a square system, non-singular exactly when
    the law is unique. A direct solve, unlike least squares, gives the same bits on every call. No uniqueness
    check here (`stationary_context_law` makes it); Dirichlet-drawn rows are strictly positive almost surely,
    so those chains are irreducible. Many kernels are solved in blocks (`block_sizes`): each solve is per
    kernel, so the result is the one-block result bit for bit.
    """
    if flat.dim() < 3:
        return _solve_stationary_block(flat)
    many = flat.reshape(-1, *flat.shape[-2:])
    sizes = block_sizes(len(many), kernel_bytes(*flat.shape[-2:]))
    if len(sizes) == 1:
        return _solve_stationary_block(flat)
    return torch.cat([_solve_stationary_block(part) for part in many.split(sizes)]).reshape(flat.shape[:-1])


def _solve_stationary_block(flat: Float[Tensor, "*batch context vocab"]) -> Float[Tensor, "*batch context"]:
    n = flat.shape[-2]
    eye = torch.eye(n, dtype=flat.dtype, device=flat.device)
    system = context_transition_matrix(flat).transpose(-1, -2) - eye
    system[..., -1, :] = 1.0
    rhs = torch.zeros(*flat.shape[:-1], 1, dtype=flat.dtype, device=flat.device)
    rhs[..., -1, :] = 1.0
    # solve_ex: the same solve without its error check, which reads a device value (a sampling step on a GPU never
    # waits for the device; a singular system, which a kernel with a unique stationary law never gives, is NaN)
    pi = torch.linalg.solve_ex(system, rhs).result[..., 0].clamp_min(0)
    return pi / pi.sum(-1, keepdim=True)


def stationary_context_law(kernel: Tensor) -> Float[Tensor, " context"]:
    """Stationary law over contexts of one validated kernel ([V]*k + [V] or flat), refusing a chain without a
    unique one: unique iff P - I has rank n - 1 (one closed class)."""
    flat = context_kernel(kernel.to(torch.float64))
    n = flat.shape[0]
    rank = torch.linalg.matrix_rank(context_transition_matrix(flat) - torch.eye(n, dtype=flat.dtype), atol=1e-10)
    if rank < n - 1:
        raise ValueError(f"the chain has no unique stationary law (the kernel has {n - int(rank)} closed classes)")
    return solve_stationary(flat)
