"""Stacked training speed: K runs as one stacked model (`training.train_many`) against the same K runs trained
one after another with `training.train` (each a stack of one), both in this process, on the same shapes, and
the same ratio for a plain hand-written stacked loop (../shared/anchors/stacked_loop.py, imported from that
folder: what stacking can give on these shapes).

Two modes:

  full runs (default; the issue's CPU check): one torch thread, the paper's one-layer model, seq 128, batch 16,
      100 steps, K = 8 runs differing in seed and (p, q). Times `train_many(runs)` and the loop
      `for run in runs: train(run)` end to end (building, sampling, evaluation, reference losses: everything a
      run does, no run folders) and prints the ratio. Then, per step (marginal: two run lengths, so what a run
      costs besides its steps cancels; the same --clock for all), a stack of one and a stack of K of the package
      and of the anchor (`time_stacked`: its batches drawn before its steps, no evaluation), interleaved: the
      speed-up of stacking in each and the stacked throughput of the package against the anchor's. Issue 20 asks
      the package's stacked throughput to be >= 0.9x the hand-written loop's.

  marginal (`--marginal`, the GPU check: `--device cuda --members 64 --seq-len 1024`): the cost of one more
      step, which leaves out fixed costs (building, reference losses, CUDA start-up) that would otherwise
      flatter neither side honestly at a few dozen steps. For the solo side one run is trained twice, for
      `--short` and `--long` steps, and (t_long - t_short) / (long - short) is its seconds per step; K solo runs
      need K times that per step of all K. The stack is measured the same way. Prints model-steps/s of
      both and their ratio (the issue asks >= 5x at K = 64, seq 1024, batch 16 on a GPU).

    python benchmarks/bench_many.py                        # CPU, one thread, 8 runs x 100 steps
    python benchmarks/bench_many.py --device cuda --marginal --members 64 --seq-len 1024
    python benchmarks/bench_many.py --device cpu --marginal --members 4 --seq-len 64 --short 5 --long 15
    python benchmarks/bench_many.py --device cuda --sweep --members 64 --seq-len 1024 --steps 300 --workers 8

  sweep (`--sweep`): the issue's "sweep throughput before and after": K seeds as a sweep of solo cells on a
      process pool against the same sweep with all K cells in one stack.

  engine (`--engine`, issue 29's CPU check): per step (marginal), a stack of K of the package eager and with
      `TrainConfig.compile="default"` against the anchor eager and `time_stacked(..., compile=True)`, interleaved
      (compile time is paid in a warm-up and cancels in the marginal; `--eager-only` leaves the compiled sides
      out); with `--baseline CHECKOUT` also the eager step of another checkout's package (imported under another
      name in this process), so what this code's eager path gains over it is a ratio in one process. Issue 29's
      CPU target: compiled >= 0.95x eager. This code's runs draw from `--stream` (default "counter-1"); a
      baseline from before counter streams draws from its generators ("torch-1"), so the ratio is the counter
      stream's step against the old one.

  layernorm (`--layernorm`): LayerNorm over rows of d_model values, forward and backward, on the stack's
      activation shape [K, batch, seq, d_model]: `F.layer_norm` against the two-reduction formulation
      (`mean`, then `rsqrt(mean(square))`) and `torch.var_mean`, with their largest difference.

  host (`--host --baseline CHECKOUT`): this code's host-side work against another checkout's, in one process,
      calls interleaved one by one (medians of --repeats x 10): a stack's sampling step for random kernels
      (3 states; order 2; a pool of 64) and a binary chain (attn-only-2layer shapes: seq 64, batch 64), an
      evaluation of a stack of seeds (paper-1layer, --seq-len, 4 batches), a training step (paper-1layer,
      --seq-len, batch --batch-size) and the set-up of a stack of 256 (one source; 256 distinct); each also checks
      that both give the same numbers.

  setup (`--setup`): host time to set up a stack (`training.loop._Group.create`: sources, reference losses, the
      stacked initial weights, generators, samplers) of --members paper-1layer members at --seq-len, all of one
      source (a stack of seeds) and of as many distinct (p, q); issue 29 asks < 5 s for 256 members.

    python benchmarks/bench_many.py --engine --clock cpu --repeats 5 [--baseline /work/main] [--eager-only]
    python benchmarks/bench_many.py --setup --members 256 --seq-len 1024 --clock cpu
    python benchmarks/bench_many.py --host --baseline /tmp/main-checkout --clock cpu
    python benchmarks/bench_many.py --layernorm [--device cuda --members 256 --seq-len 1024]
"""

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

import torch

from markov_interp import training
from markov_interp.sources import SourceConfig
from markov_interp.models import preset
from markov_interp.training import RunConfig, TrainConfig

_PQ = [(0.2, 0.3), (0.5, 0.8), (0.3, 0.6), (0.7, 0.4)]


def make_runs(members: int, steps: int, seq_len: int, batch: int, device: str, eval_every: int) -> list:
    """K runs of the paper's one-layer model, differing in seed and (p, q), on the random stream --stream."""
    model = preset("paper-1layer", n_ctx=max(seq_len, 8))
    runs = []
    for k in range(members):
        p, q = _PQ[k % len(_PQ)]
        runs.append(RunConfig(source=SourceConfig(kind="binary", p=p, q=q), model=model,
                              train=TrainConfig(steps=steps, batch_size=batch, seq_len=seq_len, seed=k,
                                                device=device, eval_every=eval_every, eval_batches=4,
                                                n_checkpoints=0, stream=_STREAM[0])))
    return runs


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, device: str) -> float:
    """Wall seconds of fn() (CPU seconds of this process with --clock cpu, steadier on a shared machine)."""
    sync(device)
    start = _CLOCK[0]()
    fn()
    sync(device)
    return _CLOCK[0]() - start


_CLOCK = [time.perf_counter]
_STREAM = ["counter-1"]  # TrainConfig.stream of the runs made here (--stream)


def for_baseline(baseline, run):
    """`run` as a --baseline checkout's RunConfig: without `train.stream` when that code predates streams (it
    then draws from generators, "torch-1", whatever this run's stream)."""
    data = run.to_dict()
    if "stream" not in {f.name for f in dataclasses.fields(baseline.TrainConfig)}:
        data["train"].pop("stream", None)
    return baseline.RunConfig.from_dict(data)


def with_steps(runs: list, steps: int) -> list:
    return [dataclasses.replace(r, train=dataclasses.replace(r.train, steps=steps)) for r in runs]


def full_runs(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(Path(args.anchor_dir)))
    from stacked_loop import time_stacked  # the hand-written reference loop (not project code)

    runs = make_runs(args.members, args.steps, args.seq_len, args.batch_size, args.device, eval_every=100)
    training.train_many(with_steps(runs[:2], 2), progress=False)  # warm-up (lazy imports, allocator)
    training.train(with_steps(runs[:1], 2)[0], progress=False)
    k, n = args.members, args.steps
    short, long = n // 5, n
    shape = dict(seq_len=args.seq_len, batch=args.batch_size, device=args.device)
    solos, stacks, per_step = [], [], {"package 1": [], f"package {k}": [], "anchor 1": [], f"anchor {k}": []}
    for _ in range(args.repeats):  # alternating, so a change in the machine's load hits every side alike
        solos.append(timed(lambda: [training.train(r, progress=False) for r in runs], args.device))
        stacks.append(timed(lambda: training.train_many(runs, progress=False), args.device))
        for members in (1, k):
            per_step[f"package {members}"].append(_marginal(
                lambda steps: training.train_many(with_steps(_no_eval(runs[:members]), steps), progress=False),
                short, long, args.device))
            per_step[f"anchor {members}"].append(_marginal(
                lambda steps: time_stacked(members, steps=steps, **shape), short, long, args.device))
    ratios = sorted(a / b for a, b in zip(solos, stacks))
    solo, stack = _median(solos), _median(stacks)
    print(f"{k} runs one after another with train : median {solo:6.2f} s  {k * n / solo:8.1f} model-steps/s  "
          f"(runs: {', '.join(f'{t:.2f}' for t in solos)} s)")
    print(f"the same {k} runs stacked (train_many)  : median {stack:6.2f} s  {k * n / stack:8.1f} model-steps/s  "
          f"(runs: {', '.join(f'{t:.2f}' for t in stacks)} s)")
    print(f"speed-up of the stack, whole runs: median {_median(ratios):.2f}x, range {ratios[0]:.2f}-{ratios[-1]:.2f}x "
          f"over {args.repeats} alternating pairs")
    t = {name: _median(values) for name, values in per_step.items()}
    print(f"per step (marginal: steps {short} and {long}, fixed costs cancel), medians of {args.repeats}:")
    for name, seconds in t.items():
        members = int(name.split()[1])
        print(f"  {name:12s}: {seconds * 1e3:8.2f} ms/step  {members / seconds:8.1f} model-steps/s")
    package, anchor = k * t["package 1"] / t[f"package {k}"], k * t["anchor 1"] / t[f"anchor {k}"]
    print(f"  speed-up of a stack of {k} over {k} stacks of one: package {package:.2f}x, anchor {anchor:.2f}x; "
          f"package / anchor {package / anchor:.2f}  (issue 20: >= 0.9)")
    print(f"  stacked throughput, package / anchor: {t[f'anchor {k}'] / t[f'package {k}']:.2f}  (issue 20: >= 0.9)")


def _no_eval(runs: list) -> list:
    return [dataclasses.replace(r, train=dataclasses.replace(r.train, eval_every=0)) for r in runs]


def _median(values: list) -> float:
    return sorted(values)[len(values) // 2]


def _marginal(fn, short: int, long: int, device: str) -> float:
    """Seconds per step of fn(steps) from two run lengths (whatever fn costs besides its steps cancels)."""
    t_short, t_long = timed(lambda: fn(short), device), timed(lambda: fn(long), device)
    return (t_long - t_short) / (long - short)


def marginal(args: argparse.Namespace) -> None:
    runs = make_runs(args.members, args.long, args.seq_len, args.batch_size, args.device, eval_every=0)
    training.train(with_steps(runs[:1], 3)[0], progress=False)  # warm-up: CUDA context, kernels
    training.train_many(with_steps(runs, 3), progress=False)

    def per_step(fn) -> tuple[float, float, float]:
        short = timed(lambda: fn(args.short), args.device)
        long = timed(lambda: fn(args.long), args.device)
        return (long - short) / (args.long - args.short), short, long

    solo, s_short, s_long = per_step(lambda n: training.train(with_steps(runs[:1], n)[0], progress=False))
    stack, k_short, k_long = per_step(lambda n: training.train_many(with_steps(runs, n), progress=False))
    k = args.members
    print(f"solo run : {solo * 1e3:8.2f} ms/step  ({args.short} steps {s_short:.2f} s, {args.long} steps "
          f"{s_long:.2f} s)  {1 / solo:9.1f} model-steps/s")
    print(f"stack x{k}: {stack * 1e3:8.2f} ms/step  ({args.short} steps {k_short:.2f} s, {args.long} steps "
          f"{k_long:.2f} s)  {k / stack:9.1f} model-steps/s")
    print(f"K solo runs one after another: {1 / solo:.1f} model-steps/s; the stack: {k / stack:.1f}; "
          f"ratio {k * solo / stack:.2f}x (issue: >= 5x at K = 64, seq 1024, batch 16 on a GPU)")


def sweep_mode(args: argparse.Namespace) -> None:
    """The sweep's throughput before and after: K seeds as K solo cells on a process pool (`--workers`,
    group 1) against the same cells as one stack (group K, in this process), whole `sweep.run` calls timed
    (worker start-up, building, evaluation included; no probes, no checkpoints)."""
    import tempfile
    from pathlib import Path

    from markov_interp import sweep

    k, n = args.members, args.steps
    spec = sweep.SweepSpec(name="bench", base={
        "source": {"kind": "binary", "p": 0.5, "q": 0.8}, "model": {"preset": "paper-1layer", "n_ctx": args.seq_len},
        "train": {"steps": n, "seq_len": args.seq_len, "batch_size": args.batch_size, "device": args.device,
                  "eval_every": 0, "n_checkpoints": 0}}, seeds=tuple(range(k)), probe=False)
    with tempfile.TemporaryDirectory() as tmp:
        # the pool first: its workers fork, which CUDA allows only before this process initialises it
        start = time.perf_counter()
        solo = sweep.run(spec, Path(tmp) / "solo", workers=args.workers, group=1, progress=False)
        t_solo = time.perf_counter() - start
        start = time.perf_counter()
        stack = sweep.run(spec, Path(tmp) / "stack", workers=1, group=k, progress=False)
        t_stack = time.perf_counter() - start
    assert solo.n_failed == 0 and stack.n_failed == 0, (solo.failed, stack.failed)
    print(f"sweep, {k} cells as solo runs on {args.workers} workers: {t_solo:7.2f} s  {k * n / t_solo:8.1f} "
          f"model-steps/s")
    print(f"sweep, the same {k} cells as one stack         : {t_stack:7.2f} s  {k * n / t_stack:8.1f} model-steps/s")
    print(f"sweep speed-up: {t_solo / t_stack:.2f}x")


def engine_mode(args: argparse.Namespace) -> None:
    """Per-step time of a stack of K: package eager / compiled, anchor eager / compiled (and a baseline checkout's
    eager package), interleaved, marginal over --short and --long steps."""
    sys.path.insert(0, str(Path(args.anchor_dir)))
    from stacked_loop import time_stacked  # the hand-written reference loop (not project code)

    k, shape = args.members, dict(seq_len=args.seq_len, batch=args.batch_size, device=args.device)
    runs = _no_eval(make_runs(k, args.long, args.seq_len, args.batch_size, args.device, eval_every=0))
    sides = {
        "package eager": lambda n: training.train_many(with_steps(runs, n), progress=False, models_out=False),
        "package compiled": lambda n: training.train_many(with_compile(with_steps(runs, n)), progress=False,
                                                          models_out=False),
        "anchor eager": lambda n: time_stacked(k, steps=n, **shape),
        "anchor compiled": lambda n: time_stacked(k, steps=n, compile=True, **shape),
    }
    if args.eager_only:
        del sides["package compiled"], sides["anchor compiled"]
    if args.baseline:
        baseline = _renamed_training(Path(args.baseline))
        base_runs = [for_baseline(baseline, r) for r in runs]
        sides["baseline eager"] = lambda n: baseline.train_many(
            [r.replace(train=r.train.replace(steps=n)) for r in base_runs], progress=False, models_out=False)
    for fn in sides.values():  # warm-up: compiling, lazy imports, the allocator
        fn(args.short)
    per_step = {name: [] for name in sides}
    for _ in range(args.repeats):
        for name, fn in sides.items():
            per_step[name].append(_marginal(fn, args.short, args.long, args.device))
    t = {name: _median(values) for name, values in per_step.items()}
    print(f"per step, stack of {k} (marginal: steps {args.short} and {args.long}), medians of {args.repeats}:")
    for name, seconds in t.items():
        spread = ", ".join(f"{v * 1e3:.2f}" for v in per_step[name])
        print(f"  {name:17s}: {seconds * 1e3:8.2f} ms/step  {k / seconds:8.1f} model-steps/s  ({spread})")
    if "package compiled" in t:
        ratios = sorted(a / b for a, b in zip(per_step["package eager"], per_step["package compiled"]))
        print(f"  package compiled / eager speed: {t['package eager'] / t['package compiled']:.2f}x (pairs "
              f"{ratios[0]:.2f}-{ratios[-1]:.2f}x; issue 29 CPU target >= 0.95x)")
        print(f"  anchor compiled / eager speed: {t['anchor eager'] / t['anchor compiled']:.2f}x")
        print(f"  package / anchor, eager: {t['anchor eager'] / t['package eager']:.2f}; compiled: "
              f"{t['anchor compiled'] / t['package compiled']:.2f}")
    else:
        print(f"  package / anchor, eager: {t['anchor eager'] / t['package eager']:.2f}")
    if "baseline eager" in t:
        pairs = sorted(b / a for a, b in zip(per_step["package eager"], per_step["baseline eager"]))
        print(f"  package eager ({args.stream}) / baseline eager speed: {t['baseline eager'] / t['package eager']:.3f}x"
              f" (pairs {pairs[0]:.3f}-{pairs[-1]:.3f}x; target >= 0.95x)")


def with_compile(runs: list, mode: str = "default") -> list:
    return [r.replace(train=r.train.replace(compile=mode)) for r in runs]


def _renamed_training(checkout: Path):
    """Another checkout's `markov_interp.training`: its package copied to a temporary folder as
    `markov_interp_baseline` (absolute imports rewritten) and imported beside this one."""
    import importlib
    import re
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="bench-baseline-"))
    target = folder / "markov_interp_baseline"
    shutil.copytree(checkout / "markov_interp", target)
    for path in target.rglob("*.py"):
        path.write_text(re.sub(r"\bmarkov_interp\b", "markov_interp_baseline", path.read_text()))
    sys.path.insert(0, str(folder))
    return importlib.import_module("markov_interp_baseline.training")


def host_mode(args: argparse.Namespace) -> None:
    """Sampling, evaluation, a step and set-up of this code against --baseline's, interleaved call by call."""
    import importlib

    from markov_interp.training import loop

    baseline = _renamed_training(Path(args.baseline))
    base_loop = importlib.import_module("markov_interp_baseline.training.loop")
    k, device = args.members, torch.device(args.device)

    def groups(runs: list) -> tuple:
        ours = loop._Group.create(runs, [None] * len(runs), device)
        theirs = base_loop._Group.create([for_baseline(baseline, r) for r in runs],
                                         [None] * len(runs), device)
        return ours, theirs

    def compare(name: str, ours, theirs) -> None:
        times = ([], [])
        for _ in range(10 * args.repeats):
            for side, fn in enumerate((ours, theirs)):
                times[side].append(timed(fn, args.device))
        same = _same_output(ours(), theirs())
        a, b = _median(times[0]), _median(times[1])
        print(f"  {name:58s}: {b * 1e3:9.2f} ms -> {a * 1e3:9.2f} ms  ({b / a:.2f}x; same numbers: {same})")

    print(f"this code against {args.baseline}, K = {k} (set-up: 256), medians of {10 * args.repeats} calls each:")
    for source in (SourceConfig(kind="random", vocab=3), SourceConfig(kind="random", vocab=2, order=2),
                   SourceConfig(kind="random", vocab=3, pool_size=64), SourceConfig(kind="binary", p=0.5, q=0.8)):
        model = preset("attn-only-2layer", d_vocab=source.vocab_size, n_ctx=64)
        runs = [RunConfig(source=source, model=model, train=TrainConfig(steps=10, batch_size=64, seq_len=64,
                                                                        device=args.device, seed=s,
                                                                        stream=args.stream))
                for s in range(k)]
        ours, theirs = groups(runs)
        compare(f"sampling a step, {_describe(source)}", lambda: ours.data.train(0), theirs.sample_train)
    seeds = [r.replace(source=SourceConfig(kind="binary", p=0.5, q=0.8))
             for r in make_runs(k, 10, args.seq_len, args.batch_size, args.device, eval_every=0)]
    ours, theirs = groups(seeds)
    compare("an evaluation of a stack of seeds (4 batches)", lambda: ours._evaluate(10), lambda: theirs._evaluate(10))
    lr = torch.full((k,), 1e-3, dtype=torch.float64, device=device)
    alive = torch.ones(k, dtype=torch.bool, device=device)
    compare("a training step", lambda: ours._step(lr, lr, alive, 0), lambda: theirs._step(lr, lr, alive, 0))
    for name, runs in _setup_runs(args, 256).items():
        base_runs = [for_baseline(baseline, r) for r in runs]
        compare(f"set-up of a stack of {len(runs)}, {name}",
                lambda: loop._Group.create(runs, [None] * len(runs), device) and None,
                lambda: base_loop._Group.create(base_runs, [None] * len(runs), device) and None)


def _describe(source: SourceConfig) -> str:
    if source.kind == "binary":
        return f"binary ({source.p}, {source.q})"
    pool = f", pool {source.pool_size}" if source.pool_size else ""
    return f"random, {source.vocab} states, order {source.order}{pool}"


def _same_output(a, b) -> "bool | str":
    """Whether two calls' outputs agree: tensors exactly, evaluation rows and steps' (losses, ok) likewise."""
    if a is None or b is None:
        return "n/a"
    if isinstance(a, torch.Tensor):
        return bool(torch.equal(a, b))
    if isinstance(a, tuple):
        return all(_same_output(x, y) is True for x, y in zip(a, b))
    return a == b


def _setup_runs(args: argparse.Namespace, k: int) -> dict[str, list]:
    """k paper-1layer runs at --seq-len: one source (a stack of seeds), and as many distinct (p, q)."""
    same = make_runs(k, 1, args.seq_len, args.batch_size, args.device, eval_every=0)
    same = [r.replace(source=SourceConfig(kind="binary", p=0.5, q=0.8)) for r in same]
    grid = [round(0.05 + 0.9 * i / 15, 4) for i in range(16)]
    distinct = [r.replace(source=SourceConfig(kind="binary", p=grid[i % 16], q=grid[(i // 16) % 16]))
                for i, r in enumerate(same)]
    return {"one source (a stack of seeds)": same, f"{len(set(r.source for r in distinct))} distinct sources": distinct}


def setup_mode(args: argparse.Namespace) -> None:
    """Seconds of `_Group.create` for a stack of --members (one source / distinct sources), medians of --repeats."""
    from markov_interp.training import loop

    k = args.members
    loop._Group.create(make_runs(2, 1, 8, 2, args.device, eval_every=0), [None, None], torch.device(args.device))
    for name, runs in _setup_runs(args, k).items():  # after a warm-up (lazy imports)
        times = [timed(lambda: loop._Group.create(runs, [None] * k, torch.device(args.device)), args.device)
                 for _ in range(args.repeats)]
        print(f"set-up of a stack of {k}, {name}: median {_median(times):.3f} s "
              f"({', '.join(f'{t:.3f}' for t in times)}; issue 29: < 5 s)")


def layernorm_mode(args: argparse.Namespace) -> None:
    """LayerNorm formulations on [K, batch, seq, d_model], forward + backward, interleaved; medians."""
    import torch.nn.functional as F

    eps = 1e-5

    def fused(x):
        return F.layer_norm(x, x.shape[-1:], eps=eps)

    def two_reductions(x):
        centred = x - x.mean(-1, keepdim=True)
        return centred * torch.rsqrt(centred.square().mean(-1, keepdim=True) + eps)

    def var_mean(x):
        var, mean = torch.var_mean(x, -1, keepdim=True, correction=0)
        return (x - mean) * torch.rsqrt(var + eps)

    dtype = torch.bfloat16 if args.bf16 else torch.float32
    x = torch.randn(args.members, args.batch_size, args.seq_len, args.d_model, device=args.device, dtype=dtype,
                    generator=torch.Generator(args.device).manual_seed(0), requires_grad=True)
    grad = torch.randn_like(x)
    forms = {"F.layer_norm": fused, "two reductions": two_reductions, "var_mean": var_mean}
    reference = fused(x).float()
    for name, fn in forms.items():
        print(f"  {name:15s}: largest |difference| from F.layer_norm {(fn(x).float() - reference).abs().max():.3g}")
    times = {name: [] for name in forms}
    for _ in range(args.repeats):
        for name, fn in forms.items():
            def run(fn=fn):
                for _ in range(args.long):
                    fn(x).backward(grad)
                    x.grad = None
            times[name].append(timed(run, args.device) / args.long)
    t = {name: _median(v) for name, v in times.items()}
    for name, seconds in t.items():
        print(f"  {name:15s}: {seconds * 1e3:8.3f} ms forward + backward  ({t['F.layer_norm'] / seconds:.2f}x "
              "the speed of F.layer_norm)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--members", type=int, default=8)
    parser.add_argument("--steps", type=int, default=100, help="steps of each full run")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--repeats", type=int, default=3, help="full runs: alternating solo / stack pairs")
    parser.add_argument("--marginal", action="store_true", help="per-step cost from two run lengths (GPU mode)")
    parser.add_argument("--short", type=int, default=20, help="marginal: the shorter run's steps")
    parser.add_argument("--long", type=int, default=80, help="marginal: the longer run's steps")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="wall time (default) or this process's CPU time (steadier when other jobs share the "
                        "CPU; meaningless for GPU work)")
    parser.add_argument("--sweep", action="store_true",
                        help="the sweep's throughput: K solo cells on --workers processes vs one stack of K")
    parser.add_argument("--workers", type=int, default=8, help="sweep mode: pool size of the solo sweep")
    parser.add_argument("--engine", action="store_true",
                        help="eager against compiled, package against anchor, per step (issue 29's CPU check)")
    parser.add_argument("--baseline", default=None, metavar="CHECKOUT",
                        help="engine mode: also time another checkout's eager package in this process")
    parser.add_argument("--layernorm", action="store_true", help="LayerNorm formulations on the stack's shapes")
    parser.add_argument("--setup", action="store_true", help="host time to set up a stack of --members")
    parser.add_argument("--host", action="store_true", help="host work against --baseline's (sampling, evaluation, "
                        "a step, set-up), interleaved")
    parser.add_argument("--stream", default="counter-1", choices=["counter-1", "torch-1"],
                        help="TrainConfig.stream of this code's runs (a --baseline before streams draws 'torch-1')")
    parser.add_argument("--eager-only", action="store_true", help="engine mode: leave out the compiled sides")
    parser.add_argument("--d-model", type=int, default=8, help="layernorm mode: row length")
    parser.add_argument("--bf16", action="store_true", help="layernorm mode: bf16 activations")
    parser.add_argument("--anchor-dir", default=str(Path(__file__).resolve().parents[2] / "shared" / "anchors"),
                        help="folder of stacked_loop.py (default ../shared/anchors beside the checkout)")
    args = parser.parse_args()
    _CLOCK[0] = time.process_time if args.clock == "cpu" else time.perf_counter
    _STREAM[0] = args.stream
    torch.set_num_threads(args.threads)
    if args.sweep:  # before anything initialises CUDA here (the solo sweep's workers fork)
        print(f"device {args.device}, sweep mode, paper-1layer, seq {args.seq_len}, batch {args.batch_size}, "
              f"K = {args.members}, {args.steps} steps, torch {torch.__version__}")
        return sweep_mode(args)
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(f"device {args.device} ({name}), threads {torch.get_num_threads()}, paper-1layer, seq {args.seq_len}, "
          f"batch {args.batch_size}, K = {args.members}, torch {torch.__version__}, {args.clock} clock")
    if args.layernorm:
        return layernorm_mode(args)
    if args.setup:
        return setup_mode(args)
    if args.host:
        return host_mode(args)
    if args.engine:
        return engine_mode(args)
    (marginal if args.marginal else full_runs)(args)


if __name__ == "__main__":
    main()
