"""The vectorised chain sampler every kernel source draws with: first states by inverse CDF, then the chain.

Sampling is vectorised over positions as well as sequences. A chain step is a map from states to states,
`x_t = F_t(x_{t-1})`, where `F_t` is drawn up front for every possible current state from one uniform per
position. The states along the sequence are then prefix compositions `F_t o ... o F_1` applied to the first
state, computed with a two-level Hillis-Steele scan in a few batched gathers instead of seq_len Python steps;
for two states, where a map is a reset, the identity or a flip, with a cumulative max and sum instead.

Also here: Gamma draws from an explicit generator (`_gamma`, `_gamma_many`: Dirichlet kernels are normalised
Gamma draws), shared by one source and by a stack of sources (`sources.stacked`); the same chains drawn from
the counter stream (`kernel_stream_sampler`, stream "counter-1": `markov_interp.streams`), every member's kernels,
pool indices, first states and steps at a step in one pass whatever the number of members; and the samplers' memory
bound (`sampler_bytes`, `check_sample_plan`), checked before any draw and planned with by `training.plan` and the
probes.
"""

import math
from collections.abc import Callable, Sequence
from typing import Any, Optional

import torch
from jaxtyping import Float, Int
from torch import Tensor

from markov_interp import streams
from markov_interp._plan import Need, check_needs, memory_limit
from markov_interp.config import check_int
from markov_interp.sources import contexts
from markov_interp.sources.base import KernelSource, Tokens
from markov_interp.sources.contexts import block_sizes, solve_stationary


# ---------------------------------------------------------------------------------------------- arguments
def _check_sizes(batch: int, seq_len: int, source: Any, device: Any = None, members: int = 1) -> None:
    """A sampler's sizes: integers >= 1 within the memory plan (`check_sample_plan`; a source without an order
    or a prior is planned as a fixed first-order chain over its states)."""
    check_sample_plan(batch, seq_len, vocab=source.vocab, order=getattr(source, "order", 1),
                      random=getattr(source, "alpha", None) is not None,
                      device=device if device is not None else "cpu", members=members)


def sampler_bytes(*, vocab: int, order: int, batch: int, length: int, random: bool, members: int = 1) -> int:
    """Memory a sampler holds at once for `members` x `batch` sequences of `length` states (a lower bound): the
    tokens; with random kernels a kernel per sequence (Gamma draws and their sums) and the chain's blocks; with a
    fixed kernel the batched comparisons [member, batch, seq, context, vocab]. What `training.plan` plans for a
    run's batches and `check_sample_plan` for any draw."""
    n_ctx = vocab**order
    tokens = members * batch * length * 8
    if random:  # the chain runs in blocks (`block_sizes`): one block, at least one sequence, at most them all
        per_sequence = 8 * length * n_ctx * vocab
        chain = min(members * batch * per_sequence, max(contexts.BLOCK_BYTES, per_sequence))
        return tokens + members * batch * n_ctx * vocab * 8 * 4 + chain
    return tokens + members * batch * length * n_ctx * (vocab + 8)


def check_sample_plan(batch: int, seq_len: int, *, vocab: int, order: int, random: bool, device: Any,
                      members: int = 1) -> None:
    """The samplers' bound (every kernel source's `sample` and `stacked_sampler` check it; one small function):
    `batch` and `seq_len` integers >= 1, and a draw whose arrays (`sampler_bytes`) exceed the device's memory
    refused before any is allocated (`_plan.PlanTooLarge` naming the size behind it and the estimate;
    `RandomMarkov(2).sample(10**9, 10)` used to be killed by the out-of-memory killer or give a raw torch
    allocation error).

    Args:
        batch, seq_len: the draw's size.
        vocab, order: the source's.
        random: a kernel per sequence (a source with a prior).
        device: where the sequences are drawn.
        members: sources drawn at once (a stack).
    """
    check_int("batch", batch, minimum=1)
    check_int("seq_len", seq_len, minimum=1)
    fields = [("batch", batch), ("seq_len", seq_len)] + ([("members", members)] if members > 1 else [])
    need = Need.of("the sampled sequences", sampler_bytes(vocab=vocab, order=order, batch=batch, length=seq_len,
                                                          random=random, members=members), fields)
    check_needs([need], memory_limit(device), where="sample", before="anything was allocated")


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
        # bounds the memory (contexts.block_sizes); each sequence is computed alone, so the tokens are the same
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


def _draw(law: Tensor, batch: int, generator: torch.Generator | None, device: torch.device,
          u: Optional[Float[Tensor, "batch 1"]] = None) -> Tensor:
    """Indices drawn from `law` (one law, or one per row), by inverse CDF of the uniforms `u` (drawn here if
    None)."""
    cdf = law.to(device).cumsum(-1)
    if u is None:
        u = torch.rand(batch, 1, generator=generator, device=device, dtype=torch.float64)
    return (cdf <= u).sum(-1).clamp_(max=law.shape[-1] - 1)


# ------------------------------------------------------------------------------------------- Gamma draws
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


# ------------------------------------------------------------------------------- the counter stream ("counter-1")
StackTokens = Int[Tensor, "member batch pos"]


def kernel_stream_sampler(sources: Sequence[KernelSource], batch: int, seq_len: int,
                          keys: Int[Tensor, "member 2"]) -> Callable[[streams.Step], StackTokens]:
    """A function of the step drawing `batch` sequences of `seq_len` states per member from the counter stream
    ("counter-1"): member k's with the key `keys[k]` (`streams.member_keys`), from `sources[k]`, all kernel sources
    of one vocab and order (`KernelSource`: fixed chains, random kernels, pools).

    At step s member k's numbers are `streams.words(keys[k], s, ...)` and `streams.gamma(keys[k], s, ...)`:
    purpose "pool" the index of each sequence's kernel in its pool (a fixed chain is a pool of one and draws
    none), "gamma" a fresh kernel's Dirichlet(alpha) rows (normalised Gamma draws over the `support`), "first"
    the first context by inverting its law (the kernel's stationary law or the given one), "steps" one uniform per
    later position, which `_sample_chain` turns into the chain. Every operation after the draws is elementwise or
    per sequence, so member k's tokens are the same alone and in any stack, bit for bit on one device; the
    operations a call launches do not depend on the number of members (one pass for all; a group per distinct
    (alpha, first-state law kind) of fresh kernels), and nothing reads a device value, so a step can be captured
    (a CUDA graph) with the step held in a device tensor updated in place.

    Args:
        sources: one kernel source per member, all of one vocab and order.
        batch, seq_len: sequences per member and their length.
        keys: [member, 2] stream keys, on the device the tokens are drawn on.

    Returns:
        `sample(step)`: [member, batch, seq_len] int64 tokens; `step` an int or a 0-dim int64 tensor on the keys'
        device (< 2**32). Its `signature` names what its code depends on besides its tensors (the members, shapes
        and the parts' kinds and alphas): two samplers of one signature differ only in tensor values, so a
        compiled step that samples (`models.stack.compiled_losses`) serves both.

    >>> from markov_interp.sources import BinaryChain, RandomMarkov
    >>> keys = streams.member_keys([5, 6])
    >>> sample = kernel_stream_sampler([RandomMarkov(3), RandomMarkov(3)], 4, 10, keys)
    >>> sample(0).shape, torch.equal(sample(0)[1], kernel_stream_sampler([RandomMarkov(3)], 4, 10, keys[1:])(0)[0])
    (torch.Size([2, 4, 10]), True)
    """
    assert keys.shape == (len(sources), 2) and sources, "one [2] key per source"
    _check_sizes(batch, seq_len, sources[0], keys.device, members=len(sources))
    vocab, order = sources[0].vocab, sources[0].order
    assert all(s.vocab == vocab and s.order == order for s in sources), "kernel sources of one vocab and order"
    steps, device = max(seq_len - order, 0), keys.device
    parts, members = _stream_parts(sources, batch, keys)
    inverse = None if members == list(range(len(sources))) else torch.argsort(torch.tensor(members, device=device))
    sizes = {"first": batch, **({"steps": batch * steps} if steps else {})}
    if any(part.draws_pool for part in parts):
        sizes["pool"] = batch

    def sample(step: streams.Step) -> StackTokens:
        drawn = streams.words(keys, step, sizes)
        tables = [part(step, drawn) for part in parts]
        cdf = tables[0][0] if len(tables) == 1 else torch.cat([t[0] for t in tables])
        first_cdf = tables[0][1] if len(tables) == 1 else torch.cat([t[1] for t in tables])
        if inverse is not None:  # the parts' members back in stack order
            cdf, first_cdf = cdf[inverse], first_cdf[inverse]
        first = streams.categorical(first_cdf, drawn["first"]).flatten()
        u = streams.uniform(drawn["steps"]).view(-1, steps, 1, 1) if steps else None
        tokens = _sample_chain(cdf.flatten(0, 1), first, vocab=vocab, order=order, seq_len=seq_len, generator=None,
                               device=device, u=u)
        return tokens.view(len(sources), batch, seq_len)

    sample.signature = ("kernel_stream", len(sources), batch, seq_len, vocab, order, inverse is not None,
                        tuple(part.signature for part in parts))
    return sample


class _PoolPart:
    """Members whose kernels come from a finite set (a pool; a fixed chain is a pool of one): every pool's
    cumulative kernels and first-context laws in one table, a member's sequences indexing its own rows."""

    def __init__(self, sources: Sequence[KernelSource], members: list[int], keys: Tensor, batch: int):
        device = keys.device
        pools, offsets, sizes = {}, [], []
        for k in members:
            source = sources[k]
            if id(source) not in pools:
                pools[id(source)] = (sum(len(p[1]) for p in pools.values()), source.pool.to(device, torch.float64),
                                     source)
            offsets.append(pools[id(source)][0])
            sizes.append(len(pools[id(source)][1]))
        kernels = torch.cat([p[1] for p in pools.values()])
        laws = torch.cat([s.initial_context_laws(p).to(device, torch.float64) for _, p, s in pools.values()])
        self.cdf, self.first_cdf = kernels.cumsum(-1), laws.cumsum(-1)
        self.index = torch.tensor(members, device=device)
        self.offsets = torch.tensor(offsets, device=device)[:, None]  # [member, 1]
        self.sizes = torch.tensor(sizes, device=device)[:, None]
        self.draws_pool = max(sizes) > 1
        self.signature = ("pool", len(members), len(kernels), self.draws_pool)
        if not self.draws_pool:  # fixed chains: the same tables every step, made once
            rows = self.offsets.expand(-1, batch)
            self.fixed = (self.cdf[rows], self.first_cdf[rows])

    def __call__(self, step: streams.Step, drawn: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        if not self.draws_pool:
            return self.fixed
        rows = self.offsets + ((drawn["pool"][self.index] * self.sizes) >> 32)  # `streams.below`, per member's size
        return self.cdf[rows], self.first_cdf[rows]


class _FreshPart:
    """Members drawing a fresh Dirichlet(alpha) kernel per sequence, all of one alpha and one kind of first-state
    law: their Gamma draws in one `streams.gamma` call, normalised over each member's `support`."""

    draws_pool = False

    def __init__(self, sources: Sequence[KernelSource], members: list[int], keys: Tensor, batch: int):
        device, first = keys.device, sources[members[0]]
        self.alpha, self.keys = first.alpha, keys[members]
        vocab, n_ctx = first.vocab, first.vocab**first.order
        self.shape = (batch, n_ctx, vocab)
        allowed = [torch.ones(n_ctx, vocab) if sources[k].support is None else sources[k].support for k in members]
        self.allowed = torch.stack(allowed).to(device, torch.float64)[:, None]  # [member, 1, context, vocab]
        self.stationary = first.initial == "stationary"
        self.signature = ("fresh", len(members), self.alpha, self.stationary)
        self.laws = None if self.stationary else torch.tensor(
            [sources[k].initial for k in members], dtype=torch.float64, device=device)[:, None].cumsum(-1)

    def __call__(self, step: streams.Step, drawn: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        gamma = streams.gamma(self.keys, step, self.alpha, self.shape) * self.allowed
        kernels = gamma / gamma.sum(-1, keepdim=True)
        first_cdf = solve_stationary(kernels).cumsum(-1) if self.stationary else self.laws.expand(
            -1, self.shape[0], -1)
        return kernels.cumsum(-1), first_cdf


def _stream_parts(sources: Sequence[KernelSource], batch: int,
                  keys: Tensor) -> tuple[list[Any], list[int]]:
    """The parts of a stack's stream sampler (finite kernel sets; fresh kernels by (alpha, stationary first
    state)) and the members they cover, in their order."""
    finite = [k for k, s in enumerate(sources) if s.pool is not None]
    fresh: dict[tuple, list[int]] = {}
    for k, source in enumerate(sources):
        if source.pool is None:
            fresh.setdefault((source.alpha, source.initial == "stationary"), []).append(k)
    parts = [_PoolPart(sources, finite, keys, batch)] if finite else []
    parts += [_FreshPart(sources, members, keys, batch) for members in fresh.values()]
    return parts, finite + [k for members in fresh.values() for k in members]
