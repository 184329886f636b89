"""The counter-based stream's cost against one generator per member, for a stack of K members, in one process.

What a training step of a stack draws, two ways, timed interleaved call by call (medians):

- generator loop ("torch-1"): one `torch.Generator` per member, a Python loop filling each member's row with
  `uniform_` (what `sources.stacked_sampler` does each step: the first states' and steps' uniforms), and each
  member's Dirichlet(alpha) Gamma draws by `sources.sampling._gamma_many` (rejection rounds with a host read each);
- counter stream ("counter-1"): `streams.words` for the whole stack in one call (first states and steps),
  converted by `streams.uniform`, and `streams.gamma` (all rejection rounds at once, no host read); and the
  same with --chunk steps drawn in one call (a 1-D step tensor), which spreads a call's fixed cost (about 100
  operations) over the steps: what a CPU sampler can do, where that fixed cost dominates a small stack's draw.

All give [member, batch * seq_len] float64 uniforms and [member, batch, V, V] Gamma draws per step. Prints
milliseconds per step and the ratio to the loop (> 1: costs more) for each K, and the number of torch operations
one call launches (torch.profiler), which the loop grows with K and the counter stream does not.

    python benchmarks/bench_streams.py --clock cpu           # CPU, one thread, K = 1, 16, 256
    python benchmarks/bench_streams.py --device cuda --seq-len 1024
    python benchmarks/bench_streams.py --step --members 1 16  # operations of a whole training step

With --step: the operations a steady-state training step dispatches (sampling, forward, backward, update; counted
with a TorchDispatchMode as tests/models/test_compile.py counts them: on a GPU each is a kernel launch) for each K
in --members, on both streams, for paper-1layer on a binary chain and attn-only-2layer on fresh Dirichlet kernels
over --vocab states (seq 16, batch --batch).
"""

import argparse
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from markov_interp import streams
from markov_interp.sources import sampling


def loop_uniforms(generators: list, batch: int, seq_len: int, device: torch.device) -> torch.Tensor:
    draws = torch.empty(len(generators), batch * seq_len, dtype=torch.float64, device=device)
    for row, g in zip(draws, generators):
        row.uniform_(generator=g)
    return draws


def counter_uniforms(keys: torch.Tensor, step: "int | torch.Tensor", batch: int, seq_len: int) -> torch.Tensor:
    w = streams.words(keys, step, {"first": batch, "steps": batch * (seq_len - 1)})
    return streams.uniform(torch.cat([w["first"], w["steps"]], dim=-1))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


_CLOCK = [time.perf_counter]


def timed(fn, device: torch.device) -> float:
    """Seconds of fn() on the --clock (CPU time of this process with --clock cpu: on a shared machine the wall
    time of a call counts the time other processes held the core)."""
    sync(device)
    start = _CLOCK[0]()
    fn()
    sync(device)
    return _CLOCK[0]() - start


def launches(fn) -> int:
    """torch operations (aten::*) one call of fn launches."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sum(e.count for e in prof.key_averages() if e.key.startswith("aten::"))


def compare(name: str, sides: dict, repeats: int, device: torch.device, chunk: int) -> None:
    """Median seconds per step of each side (the last draws `chunk` steps a call), interleaved, and its ratio to
    the loop's (the first side); the operations one call launches."""
    for fn in sides.values():  # warm-up
        fn()
    times = {side: [] for side in sides}
    for _ in range(repeats):
        for side, fn in sides.items():
            times[side].append(timed(fn, device))
    per_step = {side: statistics.median(t) / (chunk if i == len(sides) - 1 else 1)
                for i, (side, t) in enumerate(times.items())}
    loop = per_step["loop"]
    print(f"  {name}:")
    for side, fn in sides.items():
        print(f"    {side:28s}: {per_step[side] * 1e3:9.3f} ms/step  ({launches(fn):5d} ops a call)  "
              f"/ loop {per_step[side] / loop:6.2f}")


def step_launches(args: argparse.Namespace) -> None:
    """Operations dispatched by one steady-state training step (after a first), per stream, source and K."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from markov_interp.models import preset
    from markov_interp.sources import SourceConfig
    from markov_interp.training import RunConfig, TrainConfig, loop

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n += 1
            return func(*args, **(kwargs or {}))

    random = SourceConfig(kind="random", vocab=args.vocab)
    cases = {"binary chain, paper-1layer": (SourceConfig(kind="binary", p=0.5, q=0.8),
                                            preset("paper-1layer", n_ctx=16)),
             f"Dirichlet kernels on {args.vocab} states, attn-only-2layer": (
                 random, preset("attn-only-2layer", n_ctx=16, d_vocab=args.vocab))}
    for name, (source, model) in cases.items():
        for stream in streams.STREAMS[::-1]:
            counts = []
            for k in args.members:
                runs = [RunConfig(source=source, model=model, train=TrainConfig(
                    steps=4, batch_size=args.batch, seq_len=16, device=args.device, seed=s, stream=stream,
                    n_checkpoints=0)) for s in range(k)]
                group = loop._Group.create(runs, [None] * k, torch.device(args.device))
                lr = torch.full((k,), 1e-3, dtype=torch.float64, device=args.device)
                alive = torch.ones(k, dtype=torch.bool, device=args.device)
                group._step(lr, lr, alive, 0)
                with Count() as count:
                    group._step(lr, lr, alive, 1)
                counts.append(f"K = {k}: {count.n}")
            print(f"  {name}, stream {stream}: {', '.join(counts)} operations a step")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--members", type=int, nargs="+", default=[1, 16, 256])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=257, help="states per sequence (seq_len + 1 of a run)")
    parser.add_argument("--vocab", type=int, default=3, help="states of the Dirichlet kernels")
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--chunk", type=int, default=16, help="steps drawn in one call on the chunked side")
    parser.add_argument("--step", action="store_true", help="count a whole training step's operations instead")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="wall time (default; the GPU's) or this process's CPU time (steadier on a shared CPU)")
    args = parser.parse_args()
    _CLOCK[0] = time.process_time if args.clock == "cpu" else time.perf_counter
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(f"device {args.device} ({name}), threads {torch.get_num_threads()}, batch {args.batch}, "
          f"{args.seq_len} states, kernels {args.vocab} x {args.vocab}, torch {torch.__version__}, medians of "
          f"{args.repeats} interleaved calls, {args.clock} clock")
    if args.step:
        return step_launches(args)
    shape = (args.batch, args.vocab, args.vocab)
    for k in args.members:
        seeds = [1000 + s for s in range(k)]
        gens = [torch.Generator(device=device).manual_seed(s) for s in seeds]
        keys = streams.member_keys(seeds, device=device)
        step = [0]

        def next_step(n: int = 1) -> "int | torch.Tensor":
            step[0] += n
            return step[0] if n == 1 else torch.arange(step[0] - n, step[0], device=device)

        print(f"K = {k}:")
        many = f"counter, {args.chunk} steps a call"
        compare("uniforms (first states and steps)",
                {"loop": lambda: loop_uniforms(gens, args.batch, args.seq_len, device),
                 "counter": lambda: counter_uniforms(keys, next_step(), args.batch, args.seq_len),
                 many: lambda: counter_uniforms(keys, next_step(args.chunk), args.batch, args.seq_len)},
                args.repeats, device, args.chunk)
        for alpha in (1.0, 2.5):
            compare(f"Gamma({alpha}) kernels",
                    {"loop": lambda: sampling._gamma_many(alpha, shape, gens, device),
                     "counter": lambda: streams.gamma(keys, next_step(), alpha, shape),
                     many: lambda: streams.gamma(keys, next_step(args.chunk), alpha, shape)},
                    args.repeats, device, args.chunk)


if __name__ == "__main__":
    main()
