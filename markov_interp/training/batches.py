"""A run's random streams: the seeds of its training and evaluation data, and batches drawn for a stack.

Every run draws its training batches from a generator seeded with `derive_seed(seed, "train-data")` and its
evaluation batches from `derive_seed(seed, "eval-data")` (the model's init uses `seed` itself,
`models.initial_state`). A stack member draws exactly what it would alone (`member_sampler`), so a run's
batches do not depend on the runs it is stacked with.
"""

import hashlib
from collections.abc import Callable, Sequence

import torch
from jaxtyping import Int
from torch import Tensor

from markov_interp import data
from markov_interp.data import Source

__all__ = ["derive_seed", "member_sampler"]


def derive_seed(seed: int, stream: str) -> int:
    """The seed of a run's data stream.

    Args:
        seed: the run's seed (`TrainConfig.seed`).
        stream: "train-data" or "eval-data".

    Returns:
        A 63-bit hash of both (sha256), the seed of that stream's `torch.Generator`.
    """
    digest = hashlib.sha256(f"markov-interp:{seed}:{stream}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def member_sampler(sources: Sequence[Source], generators: Sequence[torch.Generator], batch: int,
                   length: int) -> Callable[[], Int[Tensor, "member batch pos"]]:
    """A function drawing one batch per member, `[member, batch, length]`: member k's rows are what
    `sources[k].sample(batch, length, generator=generators[k])` draws (bit for bit on the CPU; see below), and
    each generator draws what it would alone.

    For fixed-kernel chains of one vocab and order every member's uniforms come from one draw of its own
    generator (into one [member, ...] tensor) and the chains of all members are built at once (one pass instead
    of K: on a GPU, K small samplers cost as much as the stacked model's step); other sources are sampled member
    by member. On the CPU one draw gives the bits of `MarkovChain.sample`'s two (its first states, then its
    steps: the CPU generator fills in order); a CUDA generator's stream depends on how a draw is split, so there
    a member's training batches are this sampler's own (still the same alone and in any stack).
    """
    batched = _batched_chain_sampler(sources, generators, batch, length)
    if batched is not None:
        return batched
    return lambda: torch.stack([s.sample(batch, length, generator=g) for s, g in zip(sources, generators)])


def _batched_chain_sampler(sources: Sequence[Source], generators: Sequence[torch.Generator], batch: int,
                           length: int) -> Callable[[], Int[Tensor, "member batch pos"]] | None:
    """`MarkovChain.sample` for K chains at once (same arithmetic, per-member draws), or None if not applicable."""
    if not all(isinstance(s, data.MarkovChain) for s in sources):
        return None
    vocab, order = sources[0].vocab, sources[0].order
    steps = length - order
    if steps < 1 or any(s.vocab != vocab or s.order != order for s in sources):
        return None
    device = generators[0].device
    try:  # the sampler's internals (data.MarkovChain.sample); any change there falls back to the plain path
        # [member, context] and [member, context, vocab], each moved to the device in one copy
        init_cdf = torch.stack([s._initial for s in sources]).to(device).cumsum(-1)
        cdf = torch.stack([s._cdf for s in sources]).to(device)
        apply_binary, compose = data._apply_binary_maps, data._compose_prefix
    except AttributeError:
        return None
    n_members, n_ctx = init_cdf.shape
    digits = vocab ** torch.arange(order - 1, -1, -1, device=device)
    context_ids = torch.arange(n_ctx, device=device)

    def sample() -> Int[Tensor, "member batch pos"]:
        draws = torch.empty(n_members, batch * (steps + 1), device=device, dtype=torch.float64)
        for row, g in zip(draws, generators):  # the one per-member operation: a draw from member k's generator
            row.uniform_(generator=g)  # its first states, then its step uniforms (solo order, one call)
        u0 = draws[:, :batch, None]  # [member, batch, 1]
        u = draws[:, batch:].reshape(n_members * batch, steps, 1, 1)
        first = (init_cdf[:, None, :] <= u0).sum(-1).clamp_(max=n_ctx - 1).reshape(-1)
        per_seq = cdf[:, None].expand(-1, batch, -1, -1).reshape(n_members * batch, n_ctx, vocab)
        nxt = (per_seq[:, None, :, :] <= u).sum(-1).clamp_(max=vocab - 1)
        if n_ctx == 2:
            later = apply_binary(nxt, first)
        else:
            step_maps = nxt if order == 1 else (context_ids * vocab + nxt) % n_ctx
            contexts = torch.gather(compose(step_maps), -1, first[:, None, None].expand(-1, steps, 1))
            later = contexts[..., 0] if order == 1 else contexts[..., 0] % vocab
        head = (first[:, None] // digits) % vocab
        tokens = torch.cat([head, later], dim=1)[:, :length]
        return tokens.reshape(n_members, batch, length)

    return sample
