"""Counter-based random streams: a member's random numbers as a pure function of (key, step, purpose, index).

A training run draws fresh data every step. With one `torch.Generator` per member ("torch-1", the stream runs
were first trained on), a stack of K members makes K draws a step, one launch each, and a generator's state is
host-side: a step that draws per member cannot be one CUDA graph. Here a number is instead a hash of where it
sits in the run, so the whole stack's numbers come from one vectorised call whatever K is ("counter-1"):

    word(key, step, purpose, index, sub) = Philox4x32-10(counter=(index, step, purpose, sub), key=key)

- `key`: the member's 64-bit stream key (two 32-bit words), from its seed (`training.batches.derive_seed`);
- `step`: the batch's number in its stream (the training step; the evaluation batch's count);
- `purpose`: what the numbers are for (`PURPOSES`: first states, chain steps, pool indices, Gamma rounds), so
  the numbers of one purpose do not depend on how many another purpose drew;
- `index`, `sub`: the position within the purpose (the word's block and, for Gamma draws, the rejection round).

Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011; the generator of cuRAND
and of torch's CUDA generator) is a bijection of the 128-bit counter for each key: ten rounds of 32 x 32 -> 64
bit products and xors, the paper's recommended count, a margin over the fewest rounds that pass TestU01's
BigCrush. It is written here in int64 tensor arithmetic (32-bit values, 64-bit products, shifts and masks:
integer operations, exact), so the words are bit-identical on every device and for a member alone or in any
stack, by construction; `tests/streams` checks the published known-answer vectors and a plain-Python Philox.

torch 2.13 has no counter-based API usable for this: `torch.ops.rngprims.philox_rand` (the functionalised RNG
of `torch.compile`) refuses CPU tensors ("cpu does not use Philox/counter-based RNG") and takes one scalar
seed and offset, not one key per row; the CPU generator is a Mersenne twister with hidden state.

Draws derived from the words (`uniform`, `below`, `categorical`, `normal`, `gamma`): integer and comparison
steps are exact everywhere; those that use transcendental functions (`normal`, `gamma`: log, cos, exp, sqrt)
are bit-identical for a member alone and in any stack on one device and may differ across devices in the last
bits of libm's rounding (a sampled state then differs only where a uniform falls within rounding of a boundary).

This module sits beside `config` at the left of the pipeline (it imports only torch and `config`) and knows
nothing of runs: a caller holds each member's key and the step. So the sources' samplers can draw from it and
`training`, which owns a run's streams, can choose it, without an upward import.
"""

import math
from collections.abc import Mapping, Sequence
from typing import Union

import torch
from jaxtyping import Float, Int
from torch import Tensor

from markov_interp.config import check_choice, check_int, check_number

__all__ = [
    "STREAMS",
    "LEGACY_STREAM",
    "COUNTER_STREAM",
    "PURPOSES",
    "GAMMA_ROUNDS",
    "philox",
    "member_keys",
    "words",
    "uniform",
    "below",
    "categorical",
    "normal",
    "gamma",
]

# The names of the random streams: "torch-1" one torch.Generator per member and purpose (what runs were trained on
# before counter streams existed), "counter-1" this module's Philox words with the purposes, layout and derived
# draws below. Anything that changes which numbers a run draws is a new name.
LEGACY_STREAM = "torch-1"
COUNTER_STREAM = "counter-1"
STREAMS = (LEGACY_STREAM, COUNTER_STREAM)

# counter word 2 of each purpose (part of "counter-1": never renumber; add new purposes with new numbers)
PURPOSES: dict[str, int] = {"first": 1, "steps": 2, "pool": 3, "gamma": 4, "generator": 5}
# Gamma draws: rejection rounds computed for every draw (Marsaglia-Tsang accepts >= 95% of proposals; all 16
# rejected has probability <= 1e-21 per draw, see `gamma`)
GAMMA_ROUNDS = 16

_MASK = 0xFFFFFFFF
_MULTIPLIERS = (0xD2511F53, 0xCD9E8D57)  # Philox4x32's round multipliers
_WEYL = (0x9E3779B9, 0xBB67AE85)  # the key schedule's increments
_TWO_PI = 2 * math.pi
Step = Union[int, Int[Tensor, ""], Int[Tensor, " steps"]]


# ------------------------------------------------------------------------------------------------- the hash
def philox(counter: Sequence[Tensor], key: Sequence[Tensor], *, rounds: int = 10) -> Int[Tensor, "*shape 4"]:
    """Philox4x32 of every counter under its key: four 32-bit words per counter, held in int64.

    Every value is a 32-bit unsigned integer held in an int64 tensor. A round's 32 x 32 -> 64-bit products are
    int64 multiplications, whose low 64 bits are the product's (torch's int64 arithmetic wraps modulo 2**64 on
    every backend: the known-answer test, whose products exceed 2**63, checks it on each device); shifts and masks
    take their high and low halves. Counter and key words broadcast against each other (a per-member key
    [member, 1] against a counter range [1, n]).

    Args:
        counter: four int64 tensors, the counter's 32-bit words (c0, c1, c2, c3).
        key: two int64 tensors, the key's 32-bit words (k0, k1).
        rounds: Philox rounds (10: the standard Philox4x32-10).

    Returns:
        [*shape, 4] int64 in [0, 2**32): the four output words of each counter.

    >>> zero = torch.zeros(1, dtype=torch.long)
    >>> [hex(w) for w in philox([zero] * 4, [zero] * 2)[0].tolist()]  # Random123's known answer
    ['0x6627e8d5', '0xe169c58d', '0xbc57ac4c', '0x9b00dbd8']
    """
    check_int("rounds", rounds, minimum=1, maximum=64)
    shape = torch.broadcast_shapes(*(t.shape for t in (*counter, *key)))
    c0, c1, c2, c3 = (t.expand(shape) for t in counter)
    keys = torch.stack(torch.broadcast_tensors(*key))  # [2, *key shape]: the round keys stay that small
    keys = keys.view(2, *[1] * (len(shape) - keys.dim() + 1), *keys.shape[1:])
    lead = [1] * len(shape)
    multipliers, weyl, cross = _constants(c0.device)
    multipliers, weyl = multipliers.view(2, *lead), weyl[:rounds].view(rounds, 2, *lead)
    round_keys = (keys[None] + weyl).bitwise_and_(_MASK).unbind(0)  # per round [2, *key shape]
    # The round's state: the multiplied words (c0, c2) and the previous round's low halves (c3, c1), reversed, so
    # that (c0, c2) <- (hi1 ^ c1 ^ k0, hi0 ^ c3 ^ k1) is hi ^ (c3, c1), crossed, then the key. Four buffers
    # reused by every round (out= and in place): on a CPU, fresh ones cost more than the arithmetic.
    even, low = torch.stack((c0, c2)), torch.stack((c3, c1))
    product, high = torch.empty_like(even), torch.empty_like(even)
    for round_key in round_keys:
        torch.mul(even, multipliers, out=product)  # the low 64 bits of M * x
        torch.bitwise_right_shift(product, 32, out=high).bitwise_and_(_MASK).bitwise_xor_(low)
        torch.index_select(high, 0, cross, out=even).bitwise_xor_(round_key)
        low, product = product.bitwise_and_(_MASK), low  # (lo0, lo1): the next (c3, c1)
    return torch.stack((even[0], low[1], even[1], low[0]), dim=-1)


_CONSTANTS: dict[tuple[torch.device, int], tuple[Tensor, Tensor, Tensor]] = {}


def _constants(device: torch.device, rounds: int = 64) -> tuple[Tensor, Tensor, Tensor]:
    """Philox's multipliers [2], the key schedule's increments of rounds 0..rounds-1 [rounds, 2] and the lane swap,
    made once per device: a step on a GPU copies nothing from the host (a CUDA graph could not capture a copy)."""
    if (device, rounds) not in _CONSTANTS:
        weyl = torch.arange(rounds, dtype=torch.long)[:, None] * torch.tensor(_WEYL, dtype=torch.long)
        _CONSTANTS[device, rounds] = (torch.tensor(_MULTIPLIERS, dtype=torch.long, device=device),
                                      weyl.to(device), torch.tensor([1, 0], device=device))
    return _CONSTANTS[device, rounds]


def member_keys(seeds: Sequence[int], *, device: "torch.device | str | None" = None) -> Int[Tensor, "member 2"]:
    """The Philox keys of a stack's members: each 64-bit seed as its two 32-bit words (low, high).

    Args:
        seeds: one stream seed per member, in [0, 2**64) (`training.batches.derive_seed` gives 63-bit ones).
        device: where the keys live (the device the numbers are drawn on).

    Returns:
        [member, 2] int64 words.

    >>> member_keys([1, 2**32 + 5]).tolist()
    [[1, 0], [5, 1]]
    """
    for seed in seeds:
        check_int("stream seed", seed, minimum=0, maximum=2**64 - 1)
    return torch.tensor([[s & _MASK, s >> 32] for s in seeds], dtype=torch.long, device=device).view(-1, 2)


_LAYOUTS: dict[tuple, tuple[Tensor, Tensor]] = {}


def _layout(blocks: tuple[tuple[int, int], ...], device: torch.device) -> tuple[Tensor, Tensor]:
    """The block index within its purpose and the purpose of every block of a `words` call drawing `blocks`
    ((purpose id, blocks), ...), made once per layout and device (a step copies nothing from the host)."""
    if (blocks, device) not in _LAYOUTS:
        index = torch.cat([torch.arange(b, dtype=torch.long) for _, b in blocks])
        purpose_of = torch.cat([torch.full((b,), p, dtype=torch.long) for p, b in blocks])
        _LAYOUTS[blocks, device] = (index.to(device), purpose_of.to(device))
    return _LAYOUTS[blocks, device]


def _counter_step(step: Step, device: torch.device) -> Tensor:
    """The step(s) as an int64 tensor on `device` (a tensor stays one: a captured step updates it in place)."""
    if isinstance(step, Tensor):
        assert step.dtype == torch.long and step.dim() <= 1, "steps are a 0-dim or 1-D int64 tensor"
        return step.to(device)
    check_int("step", step, minimum=0, maximum=_MASK)
    return torch.tensor(step, dtype=torch.long, device=device)


def words(keys: Int[Tensor, "member 2"], step: Step, sizes: Mapping[str, int]) -> dict[str, Int[Tensor, "member ..."]]:
    """Each member's first `n` words of each purpose at `step`, all purposes in one Philox call.

    Word i of a purpose is lane i % 4 of the block at counter (i // 4, step, PURPOSES[purpose], 0), so a
    member's words depend on its key, the step, the purpose and i only: not on the other members, nor on the
    other purposes drawn in the same call, nor on the device, nor on how many steps are drawn at once.

    Args:
        keys: the members' keys (`member_keys`).
        step: the batch's number in the stream, < 2**32: an int or a 0-dim int64 tensor, or a 1-D int64 tensor of
            several steps drawn at once (fewer calls: on a CPU a call's fixed cost is that of ~100 operations).
        sizes: {purpose: number of words per member}, purposes from `PURPOSES`.

    Returns:
        {purpose: [member, n] int64 words in [0, 2**32)}; [member, steps, n] for a 1-D `step`.

    >>> keys = member_keys([7, 8])
    >>> both = words(keys, 3, {"first": 2, "steps": 5})
    >>> both["steps"].shape, bool((words(keys[1:], 3, {"steps": 5})["steps"] == both["steps"][1:]).all())
    (torch.Size([2, 5]), True)
    >>> bool((words(keys, torch.tensor([2, 3]), {"steps": 5})["steps"][:, 1] == both["steps"]).all())
    True
    """
    device = keys.device
    blocks = []
    for purpose, n in sizes.items():
        check_choice("purpose", purpose, tuple(PURPOSES))
        check_int(f"words of {purpose!r}", n, minimum=0)
        blocks.append(-(-n // 4))
    index, purpose_of = _layout(tuple((PURPOSES[p], b) for p, b in zip(sizes, blocks)), device)
    zero = torch.zeros((), dtype=torch.long, device=device)
    steps = _counter_step(step, device)[..., None]  # [1] or [steps, 1]: against the blocks
    pad = [1] * (steps.dim() - 1)
    out = philox((index, steps, purpose_of, zero), (keys.view(-1, *pad, 2)[..., :1], keys.view(-1, *pad, 2)[..., 1:]))
    parts = out.flatten(-2).split([4 * b for b in blocks], dim=-1)
    return {purpose: part[..., :n] for (purpose, n), part in zip(sizes.items(), parts)}


# ------------------------------------------------------------------------------------------------ the draws
def uniform(words: Int[Tensor, "*shape"], *, dtype: torch.dtype = torch.float64) -> Float[Tensor, "*shape"]:
    """Uniform numbers from 32-bit words, exactly (the conversion is exact in the target type).

    float64: (w + 1/2) / 2**32, the 2**32 midpoints of (0, 1) (32 random bits; never 0, so its log is finite,
    nor 1). float32: floor(w / 2**8) / 2**24, the 2**24 values of [0, 1) float32 spaces evenly.

    Args:
        words: int64 words in [0, 2**32).
        dtype: torch.float64 or torch.float32.

    Returns:
        Uniforms of `dtype`, one per word.

    >>> uniform(torch.tensor([0, 2**32 - 1])).tolist()
    [1.1641532182693481e-10, 0.9999999998835847]
    """
    if dtype == torch.float64:
        return words.to(torch.float64).add_(0.5).mul_(2.0**-32)
    if dtype == torch.float32:
        return (words >> 8).to(torch.float32) * 2.0**-24
    raise ValueError(f"uniform draws are float64 or float32, got {dtype}")


def below(words: Int[Tensor, "*shape"], n: int) -> Int[Tensor, "*shape"]:
    """Integers in [0, n) from 32-bit words, floor(w * n / 2**32) (each value has probability within 2**-32 of
    1 / n): a pool index per sequence.

    Args:
        words: int64 words in [0, 2**32).
        n: the number of values, 1 <= n < 2**31.

    Returns:
        int64 indices.

    >>> below(torch.tensor([0, 2**31, 2**32 - 1]), 3).tolist()
    [0, 1, 2]
    """
    check_int("n", n, minimum=1, maximum=2**31 - 1)
    return (words * n) >> 32


def categorical(cdf: Float[Tensor, "*#shape k"], words: Int[Tensor, "*#shape"]) -> Int[Tensor, "..."]:
    """Draws from laws given by their cumulative sums, by inverting each law at `uniform(words)`: the number of
    cumulative values <= u (clamped to the last category against rounding in the sums).

    Args:
        cdf: cumulative laws (float64), one per draw (broadcast against `words`).
        words: one word per draw.

    Returns:
        int64 categories in [0, k).

    >>> categorical(torch.tensor([0.25, 0.75, 1.0], dtype=torch.float64), torch.tensor([0, 2**31, 2**32 - 1]))
    tensor([0, 1, 2])
    """
    u = uniform(words).to(cdf.dtype)
    return (cdf <= u[..., None]).sum(-1).clamp_(max=cdf.shape[-1] - 1)


def normal(first: Int[Tensor, "*shape"], second: Int[Tensor, "*shape"]) -> Float[Tensor, "*shape"]:
    """Standard normal numbers from two words each (Box-Muller: sqrt(-2 log u1) cos(2 pi u2), float64).

    The uniforms are the midpoints of `uniform`, so |z| <= 6.8 (the normal's mass beyond is 1e-11).

    Args:
        first, second: the two words of each draw.

    Returns:
        float64 normal draws.
    """
    return torch.sqrt(-2 * torch.log(uniform(first))) * torch.cos(_TWO_PI * uniform(second))


def gamma(keys: Int[Tensor, "member 2"], step: Step, alpha: float | int, shape: Sequence[int], *,
          rounds: int = GAMMA_ROUNDS) -> Float[Tensor, "member ..."]:
    """Gamma(alpha, 1) draws for every member at `step`, purpose "gamma": what Dirichlet kernels are made of.

    alpha = 1: Exp(1) = -log(u), one word per draw (the exponential tail is cut at 22.9, mass 1e-10). Other
    alpha: Marsaglia & Tsang (2000) with shape a = alpha (alpha >= 1) or a = alpha + 1 times u**(1 / alpha)
    (alpha < 1). Draw i's rejection round r is one Philox block at counter (i, step, gamma, r): a normal from
    its first two words, the acceptance uniform from the third, and round 0's fourth word is the u of
    alpha < 1. The draw is the first accepted round's, as in the sequential algorithm; `rounds` rounds are
    computed for every draw at once (no host read, the same operations whatever the draws), and a draw all of
    whose rounds are rejected (probability below 1e-21 per draw at 16 rounds: each round accepts >= 95%) takes
    a - 1/3, near the median of Gamma(a). The rounds of every draw are held at once: about 130 bytes per draw
    and round (16 rounds: 2 KB per draw).

    Args:
        keys: the members' keys (`member_keys`).
        step: the batch's number in the stream, or a 1-D tensor of several (as in `words`).
        alpha: the shape parameter (> 0).
        shape: the draws per member (e.g. [batch, contexts, vocab] for one kernel per sequence).
        rounds: rejection rounds computed per draw (alpha != 1).

    Returns:
        [member, *shape] float64 draws, [member, steps, *shape] for a 1-D `step` (clamped below at 1e-300, so
        that a row of them can be normalised).

    >>> draws = gamma(member_keys([0, 1]), 0, 2.5, (2000,))
    >>> draws.shape, round(draws.mean().item(), 1)  # mean alpha
    (torch.Size([2, 2000]), 2.5)
    """
    check_number("alpha", alpha, positive=True)
    check_int("rounds", rounds, minimum=1)
    shape, device = tuple(shape), keys.device
    used = 1 if alpha == 1 else rounds
    steps = _counter_step(step, device)[..., None, None]  # [(steps,) 1, 1]: against [round, draw]
    pad = [1] * (steps.dim() - 2)
    counter = (torch.arange(math.prod(shape), dtype=torch.long, device=device), steps,
               torch.full((), PURPOSES["gamma"], dtype=torch.long, device=device),
               torch.arange(used, dtype=torch.long, device=device)[:, None])
    key = keys.view(-1, *pad, 1, 1, 2)
    block = philox(counter, (key[..., 0], key[..., 1]))  # [member, (steps,) round, draw, 4]
    out = _exponential(block) if alpha == 1 else _marsaglia_tsang(block, float(alpha))
    return out.clamp_min_(1e-300).view(*out.shape[:-1], *shape)


def _exponential(block: Int[Tensor, "*lead 1 n 4"]) -> Float[Tensor, "*lead n"]:
    """Exp(1) draws from each draw's first word: -log(u)."""
    return -torch.log(uniform(block[..., 0, :, 0]))


def _marsaglia_tsang(block: Int[Tensor, "*lead round n 4"], alpha: float) -> Float[Tensor, "*lead n"]:
    """Gamma(alpha) from every rejection round's block at once: the first accepted round's proposal d * v (see
    `gamma`), boosted by u**(1 / alpha) (as exp(log(u) / alpha)) for alpha < 1."""
    a = alpha + 1 if alpha < 1 else alpha
    d = a - 1.0 / 3
    c = 1.0 / math.sqrt(9 * d)
    z = normal(block[..., 0], block[..., 1])
    t = 1 + c * z
    v = t * t * t
    log_u = torch.log(uniform(block[..., 2]))
    accept = (v > 0) & (log_u < 0.5 * z * z + d - d * v + d * torch.log(v.clamp_min(1e-300)))
    rounds = block.shape[-3]
    order = torch.arange(rounds, device=block.device)[:, None]
    first = torch.where(accept, order, rounds).amin(dim=-2)  # [*lead, n]: the first accepted round, or rounds
    proposal = torch.gather(d * v, -2, first.clamp(max=rounds - 1).unsqueeze(-2)).squeeze(-2)
    out = torch.where(first < rounds, proposal, d)
    if alpha < 1:
        out = out * torch.exp(torch.log(uniform(block[..., 0, :, 3])) / alpha)
    return out
