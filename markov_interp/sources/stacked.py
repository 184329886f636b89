"""The stacked samplers: one batch per member of a stack of runs, each member drawing exactly what it would draw
alone (`training.batches`). `stacked_sampler` draws from one `torch.Generator` per member (stream "torch-1", what
runs were first trained on), `stream_sampler` from the counter stream (stream "counter-1", `markov_interp.streams`:
a function of each member's key and the step, for the whole stack in one pass)."""

from collections.abc import Callable, Sequence

import torch
from jaxtyping import Int
from torch import Tensor

from markov_interp import streams
from markov_interp.sources.base import KernelSource, Source, StreamSource
from markov_interp.sources.dirichlet import RandomMarkov
from markov_interp.sources.fixed import MarkovChain
from markov_interp.sources.hmm import HiddenMarkov
from markov_interp.sources.sampling import StackTokens, _check_sizes, _gamma_many, _sample_chain, kernel_stream_sampler


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
    same for a member alone and in any stack). Hidden Markov sources draw their uniforms member by member
    (`HiddenMarkov.uniforms`, what `sample` draws) and the members of one source object become tokens at once.

    Args:
        sources: one source per member.
        batch, seq_len: sequences per member and their length.
        generators: one per member, all on the device the tokens are drawn on.

    Returns:
        The sampler: each call draws the next batch of every member (int64 tokens).

    >>> from markov_interp.sources import BinaryChain
    >>> sample = stacked_sampler([BinaryChain(0.2, 0.3), BinaryChain(0.5, 0.8)], 4, 10,
    ...                          [torch.Generator().manual_seed(s) for s in (0, 1)])
    >>> sample().shape
    torch.Size([2, 4, 10])
    """
    if not sources or len(sources) != len(generators):
        raise ValueError(f"need one generator per source and at least one source, got {len(sources)} sources and "
                         f"{len(generators)} generators")
    _check_sizes(batch, seq_len, sources[0], generators[0].device, members=len(sources))
    if all(isinstance(s, HiddenMarkov) for s in sources):
        return _stacked_hidden(sources, batch, seq_len, generators)
    chains = all(isinstance(s, (MarkovChain, RandomMarkov)) for s in sources)
    if not chains or len({(isinstance(s, RandomMarkov), s.vocab, s.order) for s in sources}) != 1:
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


def _stacked_hidden(sources: Sequence[HiddenMarkov], batch: int, seq_len: int,
                    generators: Sequence[torch.Generator]) -> Callable[[], Int[Tensor, "member batch pos"]]:
    """The stacked sampler of hidden Markov members: each member's uniforms from its own generator, then one
    mapping to tokens per source object (a stack of seeds is one), row by row what `sample` computes."""
    groups: dict[int, list[int]] = {}
    for k, source in enumerate(sources):
        groups.setdefault(id(source), []).append(k)
    device = generators[0].device

    def sample() -> Int[Tensor, "member batch pos"]:
        draws = [s.uniforms(batch, seq_len, g, device) for s, g in zip(sources, generators)]
        out = torch.empty(len(sources), batch, seq_len, dtype=torch.int64, device=device)
        for members in groups.values():
            tokens = sources[members[0]]._from_uniforms(torch.cat([draws[k] for k in members]))[0]
            out[members] = tokens.view(len(members), batch, seq_len)
        return out

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


def stream_sampler(sources: Sequence[Source], batch: int, seq_len: int,
                   keys: Int[Tensor, "member 2"]) -> Callable[[streams.Step], StackTokens]:
    """A function of the step drawing one batch per source from the counter stream (stream "counter-1"),
    `[member, batch, seq_len]`, member k's from its key `keys[k]`: what a stack trains on
    (`training.batches.DataStreams`).

    Kernel sources of one vocab and order (fixed chains, random kernels, pools) are drawn in one pass for all members
    (`sampling.kernel_stream_sampler`: the same operations whatever the number of members, no host read). Other
    sources are drawn per distinct source object with their `sample_stream` (`StreamSource`), and a source without
    one per member from a `torch.Generator` seeded at each step by the member's "generator" words (see
    `StreamSource`). Either way member k's rows depend on its source, key and the step only: the same alone and in
    any stack (bit for bit on one device), and a resumed run needs only its step.

    Args:
        sources: one source per member.
        batch, seq_len: sequences per member and their length.
        keys: one key per member (`streams.member_keys`), on the device the tokens are drawn on.

    Returns:
        `sample(step)`: each call draws the batch of `step` (an int, or a 0-dim int64 tensor on the keys' device).

    >>> from markov_interp.sources import BinaryChain
    >>> sample = stream_sampler([BinaryChain(0.2, 0.3), BinaryChain(0.5, 0.8)], 4, 10, streams.member_keys([0, 1]))
    >>> sample(0).shape, torch.equal(sample(3), sample(3)), torch.equal(sample(3), sample(4))
    (torch.Size([2, 4, 10]), True, False)
    """
    if not sources or tuple(keys.shape) != (len(sources), 2):
        raise ValueError(f"need one [2] key per source and at least one source, got {len(sources)} sources and "
                         f"keys of shape {tuple(keys.shape)}")
    _check_sizes(batch, seq_len, sources[0], keys.device, members=len(sources))
    if all(isinstance(s, KernelSource) for s in sources) and len({(s.vocab, s.order) for s in sources}) == 1:
        return kernel_stream_sampler(sources, batch, seq_len, keys)
    groups: dict[int, list[int]] = {}
    for k, source in enumerate(sources):
        groups.setdefault(id(source), []).append(k)
    at = [(sources[members[0]], torch.tensor(members, device=keys.device)) for members in groups.values()]

    def sample(step: streams.Step) -> StackTokens:
        out = torch.empty(len(sources), batch, seq_len, dtype=torch.long, device=keys.device)
        for source, members in at:
            out[members] = _source_stream(source, batch, seq_len, keys[members], step)
        return out

    return sample


def _source_stream(source: Source, batch: int, seq_len: int, keys: Tensor, step: streams.Step) -> StackTokens:
    """One source's draws for its members at `step`: its `sample_stream`, or `sample` from a generator per member
    seeded by the member's "generator" words at that step."""
    if isinstance(source, StreamSource):
        return source.sample_stream(batch, seq_len, keys, step)
    words = streams.words(keys, step, {"generator": 2})["generator"].tolist()
    generators = [torch.Generator(device=keys.device).manual_seed(low | high << 32) for low, high in words]
    return torch.stack([source.sample(batch, seq_len, generator=g) for g in generators])
