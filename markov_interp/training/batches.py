"""A run's random streams: the seeds of its training and evaluation data, and the batches a stack draws from them.

Every run draws its training batches from the stream of `derive_seed(seed, "train-data")` and its evaluation
batches from that of `derive_seed(seed, "eval-data")` (the model's init uses `seed` itself, `models.initial_state`).
How a seed becomes numbers is the run's `TrainConfig.stream` (`markov_interp.streams`):

- "counter-1" (new runs): the seed is the member's Philox key, and the batch of update t -> t + 1 is a function of
  (key, t) (`sources.stream_sampler`), the evaluation batches of (key, n) for the n-th evaluation batch of the run.
  A stack draws every member's batch in one pass, and a checkpoint holds no stream state: the step and the count of
  evaluation batches drawn say where both streams are.
- "torch-1" (runs trained before counter streams; kept so that their folders resume bit for bit): one
  `torch.Generator` per member and stream, seeded with the seed (`sources.stacked_sampler`), whose states the
  checkpoints hold.

Either way a member draws exactly what it would alone, so a run's batches do not depend on the runs it is stacked
with (`DataStreams`).
"""

import hashlib
from collections.abc import Callable, Sequence
from typing import Optional

import torch
from jaxtyping import Int
from torch import Tensor

from markov_interp import streams
from markov_interp.sources import Source, stacked_sampler, stream_sampler

__all__ = ["derive_seed", "member_sampler", "DataStreams", "data_streams"]

_STREAMS = ("train-data", "eval-data")


def derive_seed(seed: int, stream: str) -> int:
    """The seed of a run's data stream.

    Args:
        seed: the run's seed (`TrainConfig.seed`).
        stream: "train-data" or "eval-data".

    Returns:
        A 63-bit hash of both (sha256): the seed of that stream's `torch.Generator` ("torch-1"), or its key
        (`streams.member_keys`, "counter-1").
    """
    digest = hashlib.sha256(f"markov-interp:{seed}:{stream}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def member_sampler(sources: Sequence[Source], generators: Sequence[torch.Generator], batch: int,
                   length: int) -> Callable[[], Int[Tensor, "member batch pos"]]:
    """A function drawing one batch per member from its generator ("torch-1"), `[member, batch, length]`
    (`sources.stacked_sampler`): member k's rows are what `sources[k].sample(batch, length,
    generator=generators[k])` draws (bit for bit on the CPU), and each generator draws what it would alone."""
    return stacked_sampler(sources, batch, length, generators)


class DataStreams:
    """A stack's training and evaluation batches on its stream ("counter-1" or "torch-1"), and what a checkpoint
    holds of them.

    - `train(t)`: every member's batch of update t -> t + 1, [member, batch, length];
    - `evaluation()`: the next evaluation batch;
    - `member_state(k)` / `load_member(k, state)`: member k's place in both streams, in a checkpoint's training
      state ("torch-1": its generators' states; "counter-1": the stream's name and the evaluation batches drawn);
    - `capturable`: the training sampler as a function of a step tensor that reads no device value and has a
      `signature` (kernel sources on "counter-1"), which a compiled step draws inside its graph
      (`models.stack.compiled_losses`) with `step(t)` as input; None otherwise.
    """

    stream: str
    capturable: Optional[Callable[[Tensor], Tensor]] = None

    def step(self, t: int) -> Int[Tensor, ""]:
        """The step tensor `capturable` reads, set to t (in place: a captured graph reads the same tensor)."""
        raise NotImplementedError

    def train(self, t: int) -> Int[Tensor, "member batch pos"]:
        raise NotImplementedError

    def evaluation(self) -> Int[Tensor, "member batch pos"]:
        raise NotImplementedError

    def member_state(self, k: int) -> dict:
        raise NotImplementedError

    def load_member(self, k: int, state: dict) -> None:
        raise NotImplementedError


class _CounterStreams(DataStreams):
    """"counter-1": one key per member and stream; the step and evaluation count in device tensors updated in place
    (what a captured step reads)."""

    stream = streams.COUNTER_STREAM

    def __init__(self, sources: Sequence[Source], seeds: Sequence[int], batch: int, length: int,
                 device: torch.device):
        train, evaluation = ([derive_seed(s, name) for s in seeds] for name in _STREAMS)
        self._train = stream_sampler(sources, batch, length, streams.member_keys(train, device=device))
        self._eval = stream_sampler(sources, batch, length, streams.member_keys(evaluation, device=device))
        self._step = torch.zeros((), dtype=torch.long, device=device)
        self._eval_step = torch.zeros((), dtype=torch.long, device=device)
        self.eval_batches = 0  # evaluation batches drawn so far
        self.capturable = self._train if hasattr(self._train, "signature") else None

    def step(self, t: int) -> Int[Tensor, ""]:
        return self._step.fill_(t)

    def train(self, t: int) -> Int[Tensor, "member batch pos"]:
        return self._train(self.step(t))

    def evaluation(self) -> Int[Tensor, "member batch pos"]:
        tokens = self._eval(self._eval_step.fill_(self.eval_batches))
        self.eval_batches += 1
        return tokens

    def member_state(self, k: int) -> dict:
        return {"stream": self.stream, "eval_batches": self.eval_batches}

    def load_member(self, k: int, state: dict) -> None:
        if state.get("stream") != self.stream:
            raise ValueError(f"a checkpoint of stream {state.get('stream', streams.LEGACY_STREAM)!r} cannot resume a "
                             f"run on stream {self.stream!r}")
        # members share the evaluation schedule, so they drew as many evaluation batches by one step
        assert k == 0 or state["eval_batches"] == self.eval_batches, "members resumed at one step drew alike"
        self.eval_batches = int(state["eval_batches"])


class _GeneratorStreams(DataStreams):
    """"torch-1": a `torch.Generator` per member and stream (the code runs were first trained with)."""

    stream = streams.LEGACY_STREAM

    def __init__(self, sources: Sequence[Source], seeds: Sequence[int], batch: int, length: int,
                 device: torch.device):
        self.generators = [[torch.Generator(device=device).manual_seed(derive_seed(s, name)) for s in seeds]
                           for name in _STREAMS]
        self._train, self._eval = (member_sampler(sources, gens, batch, length) for gens in self.generators)

    def train(self, t: int) -> Int[Tensor, "member batch pos"]:
        return self._train()

    def evaluation(self) -> Int[Tensor, "member batch pos"]:
        return self._eval()

    def member_state(self, k: int) -> dict:
        return {"train_generator": self.generators[0][k].get_state(),
                "eval_generator": self.generators[1][k].get_state()}

    def load_member(self, k: int, state: dict) -> None:
        if "train_generator" not in state:
            raise ValueError(f"a checkpoint of stream {state.get('stream')!r} cannot resume a run on stream "
                             f"{self.stream!r}")
        self.generators[0][k].set_state(state["train_generator"])
        self.generators[1][k].set_state(state["eval_generator"])


def data_streams(stream: str, sources: Sequence[Source], seeds: Sequence[int], batch: int, length: int,
                 device: torch.device) -> DataStreams:
    """A stack's data streams on `stream` (`TrainConfig.stream`).

    Args:
        stream: "counter-1" or "torch-1" (`streams.STREAMS`).
        sources: one source per member.
        seeds: the members' seeds (`TrainConfig.seed`).
        batch, length: sequences per batch and their length (seq_len + 1 states).
        device: where the batches are drawn.

    Returns:
        The `DataStreams`.

    >>> from markov_interp.sources import BinaryChain
    >>> data = data_streams("counter-1", [BinaryChain(0.2, 0.3)] * 2, [0, 1], 4, 9, torch.device("cpu"))
    >>> data.train(0).shape, torch.equal(data.train(5), data.train(5)), data.member_state(1)
    (torch.Size([2, 4, 9]), True, {'stream': 'counter-1', 'eval_batches': 0})
    """
    kind = {streams.COUNTER_STREAM: _CounterStreams, streams.LEGACY_STREAM: _GeneratorStreams}[stream]
    return kind(sources, seeds, batch, length, device)
