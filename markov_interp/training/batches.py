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

from markov_interp.sources import Source, stacked_sampler

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
    """A function drawing one batch per member, `[member, batch, length]` (`sources.stacked_sampler`): member k's
    rows are what `sources[k].sample(batch, length, generator=generators[k])` draws (bit for bit on the CPU), and
    each generator draws what it would alone. Fixed chains and random kernels of one vocab and order are drawn
    in one pass for all members (on a GPU, K small samplers would cost as much as the stacked model's step), the
    only per-member operations being each member's draws from its own generator.
    """
    return stacked_sampler(sources, batch, length, generators)
