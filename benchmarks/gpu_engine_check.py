"""The compiled engine on a GPU (issue 29): one prepared script for a lent GPU.

    python benchmarks/gpu_engine_check.py | tee docs/reproduction/gpu/engine-$(date +%F).txt
    python benchmarks/gpu_engine_check.py --profile --stream torch-1    # the bf16 gap before counter streams
    python benchmarks/gpu_engine_check.py --profile --stream counter-1  # after (the default stream)
    python benchmarks/gpu_engine_check.py --capture --anchor-dir .anchors  # one CUDA graph per step, before / after

Every run draws from `--stream` (default "counter-1", new runs' stream; "torch-1" is one generator per member, the
code before counter streams, so the two `--profile` calls are the before / after of the whole stack's batch
drawn in one pass, inside the compiled graph).

Run once on an NVIDIA H200 (2026-11-27, through `scripts/gpu_check.sh`; output in
docs/reproduction/gpu/check-2026-11-27.txt): 190 s with --invariance, compiling included (about 15 s per three
graphs there). Its wiring is checked on the CPU with `--device cpu --members 4 --seq-len 64 --short 2 --long 5
--check-steps 6 --invariance` (numbers meaningless there). Run it with a 600 s limit; every line is
flushed and says the seconds elapsed, so a run cut short keeps what it printed (the checks come first: cheap
and decisive).

The anchor (`stacked_loop.py`) lives in ../shared/anchors beside the checkout, which does not travel to a lent
GPU machine: copy it into a git-ignored folder of the checkout, carry that folder, and pass it (`mkdir -p
.anchors && cp ../shared/anchors/stacked_loop.py .anchors/ && echo /.anchors/ >> .git/info/exclude`, then
`--anchor-dir .anchors`). Without it the script times the package alone and says so.

What it prints, in this order (the K = 256 bf16 line, issue 29's target, is the first timing):

1. The device, torch version and date.
2. Compiled against eager on CUDA: a stack of 4 (paper-1layer, p = 0.5, q = 0.8, seq 256, batch 16, 60 steps,
   fp32 and bf16): the largest difference of a logged training loss (on the CPU, tests/models/test_compile.py bounds
   it by 1e-5 in fp32), and whether the compiled run repeated in the same process is bit-identical (what a
   resume under the same mode needs).
3. Seconds per step (marginal: a --short and a --long run, so building, compiling and evaluation cancel) of the
   package with `TrainConfig.compile="default"` against the hand-written anchor in the same mode
   (`../shared/anchors/stacked_loop.py`, `time_stacked(..., compile=True, bf16=...)`), paper-1layer, seq 1024,
   batch 16, for each K in --members and each precision: model-steps/s and package / anchor. Issue 29's
   targets: compiled bf16 at K = 256 >= 0.9x the compiled bf16 anchor (>= 20,000 model-steps/s on an H100), and
   compiled fp32 >= 0.9x the compiled fp32 anchor. The package's eager bf16 step is printed beside them.
4. LayerNorm over rows of 8 values on the K = 256 activation shape, forward + backward: `F.layer_norm` against
   the two-reduction formulation (`benchmarks/bench_many.py --layernorm`), fp32 and bf16. On the CPU the fused
   kernel is the faster (docs/speed.md), so the package keeps it; this line decides whether eager CUDA should.
With --capture, only: the compiled bf16 stack of the first --members (256) timed uncaptured and with
`TrainConfig.capture="graph"` (the whole step, sampling to update, as one CUDA graph), interleaved in one process,
against the compiled anchor: `K = 256 bf16 compile=default: uncaptured ... ms/step; captured ... ms/step
(captured / uncaptured X); anchor ...; uncaptured / anchor Y, captured / anchor Z (target >= 0.9)`, after the
engine line of a short captured run (which says "one CUDA graph per step" or why not).

5. With --invariance: the same run alone and as member 3 of a stack of 8, eager and compiled (is a run's result
   independent of its companions on CUDA?).
"""

import argparse
import datetime
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import torch

from markov_interp import training
from markov_interp.sources import SourceConfig
from markov_interp.models import preset
from markov_interp.training import RunConfig, TrainConfig

HERE = Path(__file__).resolve().parent


DEVICE = ["cuda"]  # --device cpu: a smoke run of the script's wiring on a CPU (its numbers mean nothing)
STREAM = ["counter-1"]  # --stream: TrainConfig.stream of every run ("torch-1": the generator per member, before)
START = time.perf_counter()


def _say(line: str) -> None:
    """Print `line` at once, with the seconds since the script started (what the next estimate needs)."""
    print(f"[{time.perf_counter() - START:6.0f} s] {line}", flush=True)


def _run(seed: int, steps: int, seq_len: int, precision: str = "fp32", compile: str = "off") -> RunConfig:
    return RunConfig(source=SourceConfig(kind="binary", p=0.5, q=0.8), model=preset("paper-1layer", n_ctx=seq_len),
                     train=TrainConfig(steps=steps, seq_len=seq_len, batch_size=16, eval_every=0, n_checkpoints=0,
                                       device=DEVICE[0], seed=seed, precision=precision, compile=compile,
                                       stream=STREAM[0]))


def _with(runs: list, **changes) -> list:
    return [r.replace(train=r.train.replace(**changes)) for r in runs]


def compiled_against_eager(precision: str, seq_len: int, steps: int) -> None:
    runs = [_run(s, steps, seq_len, precision) for s in range(4)]
    eager = training.train_many(runs, progress=False, models_out=False)
    compiled = training.train_many(_with(runs, compile="default"), progress=False, models_out=False)
    again = training.train_many(_with(runs, compile="default"), progress=False, models_out=False)
    diff = max(abs(a["train_loss"] - b["train_loss"]) for e, c in zip(eager, compiled)
               for a, b in zip(e.metrics, c.metrics) if "train_loss" in a)
    same = [r.metrics for r in again] == [r.metrics for r in compiled]
    _say(f"{precision}: compiled vs eager, stack of 4, {steps} steps: largest |d train loss| {diff:.3g}; compiled "
         f"twice: {'bit-identical' if same else 'NOT bit-identical'}")


def _sync() -> None:
    if DEVICE[0].startswith("cuda"):
        torch.cuda.synchronize()


def _timed(fn) -> float:
    _sync()
    start = time.perf_counter()
    fn()
    _sync()
    return time.perf_counter() - start


def package_per_step(k: int, precision: str, compile: str, short: int, long: int, seq_len: int,
                     capture: str = "off") -> float:
    runs = [_run(s, long, seq_len, precision, compile) for s in range(k)]

    def train(steps: int) -> None:
        training.train_many(_with(runs, steps=steps, capture=capture), progress=False, models_out=False)

    train(3)  # compiles (once per shapes: the timed calls reuse it)
    return (_timed(lambda: train(long)) - _timed(lambda: train(short))) / (long - short)


def _anchor(anchor_dir: Path):
    """The anchor's `time_stacked`, or None (said in the output) where stacked_loop.py is not in `anchor_dir`."""
    if not (anchor_dir / "stacked_loop.py").is_file():
        _say(f"anchor: no stacked_loop.py in {anchor_dir} (see the docstring: copy and carry it); package only")
        return None
    sys.path.insert(0, str(anchor_dir))
    from stacked_loop import time_stacked  # the hand-written reference (not project code)

    return time_stacked


def _anchor_step(anchor_dir: Path, k: int, steps: int, seq_len: int) -> Optional[float]:
    """The compiled bf16 anchor's marginal seconds per step for a stack of k (`_anchor`), or None without it."""
    time_stacked = _anchor(anchor_dir)
    if time_stacked is None:
        return None
    return time_stacked(k, steps=steps, seq_len=seq_len, batch=16, device=DEVICE[0], compile=True, bf16=True)


def speed(members: list[int], anchor_dir: Path, short: int, long: int, seq_len: int) -> None:
    time_stacked = _anchor(anchor_dir)
    for k in members:
        for precision in ("bf16", "fp32"):
            package = package_per_step(k, precision, "default", short, long, seq_len)
            line = (f"K = {k:3d} {precision} compiled: package {package * 1e3:7.2f} ms/step {k / package:9.0f} "
                    "model-steps/s")
            if time_stacked is not None:
                anchor = time_stacked(k, steps=long - short, seq_len=seq_len, batch=16, device=DEVICE[0],
                                      compile=True, bf16=precision == "bf16")
                line += (f"; anchor {anchor * 1e3:7.2f} ms/step {k / anchor:9.0f}; package / anchor "
                         f"{anchor / package:.2f} (target >= 0.9)")
            _say(line)
        eager = package_per_step(k, "bf16", "off", short, long, seq_len)
        _say(f"K = {k:3d} bf16 eager   : package {eager * 1e3:7.2f} ms/step {k / eager:9.0f} model-steps/s")


def layernorm(k: int, seq_len: int) -> None:
    for flag in ([], ["--bf16"]):
        done = subprocess.run([sys.executable, str(HERE / "bench_many.py"), "--layernorm", "--device", DEVICE[0],
                               "--members", str(k), "--seq-len", str(seq_len), "--repeats", "5", "--long", "20", *flag],
                              capture_output=True, text=True, timeout=120)
        _say(f"LayerNorm, [{k}, 16, {seq_len}, 8] {'bf16' if flag else 'fp32'}:\n{done.stdout.strip()}"
             f"{done.stderr[-500:]}")


def invariance(seq_len: int, steps: int) -> None:
    for compile in ("off", "default"):
        run = _run(0, steps, seq_len, "fp32", compile)
        alone = training.train_many([run], progress=False)[0]
        runs = _with([run] * 8, compile=compile)
        runs = [r.replace(train=r.train.replace(seed=100 + i)) for i, r in enumerate(runs)]
        runs[3] = run
        member = training.train_many(runs, progress=False)[3]
        from markov_interp import models

        a, b = models.state_dict_for_save(alone.model), models.state_dict_for_save(member.model)
        diff = max((a[n] - b[n]).abs().max().item() for n in a)
        same = diff == 0 and alone.metrics == member.metrics
        _say(f"compile={compile}: alone vs member 3 of 8: {'bit-identical' if same else f'max |dw| {diff:.3g}'}")


def profile(k: int, seq_len: int, steps: int, compile: str, anchor_dir: Path, long: int) -> None:
    """Where a compiled bf16 step of a stack of k goes (the open gap: 0.53x the compiled anchor on an H200, on the
    generator stream): the torch profiler over `steps` steps after a warm-up, the top host and device operations,
    then the step's time (marginal over `steps` and `long` steps) against the compiled anchor's. Run it once per
    stream (`--stream torch-1`, the code before counter streams, and `--stream counter-1`): the before / after of
    drawing the whole stack's batch in one pass inside the compiled graph. On 2026-11-26's eager profile the host
    took 2.3 s of CPU for 0.69 s of CUDA (gpu-findings.md), so the host table is the first read."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    runs = [_run(s, steps, seq_len, "bf16", compile) for s in range(k)]
    training.train_many(_with(runs, steps=3), progress=False, models_out=False)  # compiles
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEVICE[0].startswith("cuda") else [])
    with torch_profile(activities=activities) as prof:
        training.train_many(runs, progress=False, models_out=False)
        _sync()
    table = prof.key_averages()
    _say(f"profile, K = {k} bf16 compiled, {steps} steps (set-up included), by host time:\n"
         + table.table(sort_by="self_cpu_time_total", row_limit=20))
    if DEVICE[0].startswith("cuda"):
        _say("by device time:\n" + table.table(sort_by="self_cuda_time_total", row_limit=12))
    package = package_per_step(k, "bf16", compile, steps, long, seq_len)
    line = (f"K = {k} bf16 compile={compile} stream={STREAM[0]}: package {package * 1e3:7.2f} ms/step "
            f"{k / package:9.0f} model-steps/s")
    anchor = _anchor_step(anchor_dir, k, long - steps, seq_len)
    if anchor is not None:
        line += f"; anchor {anchor * 1e3:7.2f} ms/step {k / anchor:9.0f}; package / anchor {anchor / package:.2f}"
    _say(line + " (target >= 0.9)")


def captured(k: int, seq_len: int, short: int, long: int, anchor_dir: Path, repeats: int = 2) -> None:
    """The compiled bf16 stack of k, uncaptured and captured (`TrainConfig.capture="graph"`), against the compiled
    anchor, each the median of `repeats` marginal timings taken in turn (ABAB: load and clocks hit both)."""
    engine = training.train_many(_with([_run(s, 6, seq_len, "bf16", "default") for s in range(k)], capture="graph"),
                                 progress=False, models_out=False)[0].engine
    _say(f"K = {k} bf16 compile=default capture=graph: {engine}")
    times: dict[str, list[float]] = {"off": [], "graph": []}
    for _ in range(repeats):
        for capture in times:
            times[capture].append(package_per_step(k, "bf16", "default", short, long, seq_len, capture=capture))
    plain, graph = (sorted(v)[len(v) // 2] for v in times.values())
    line = (f"K = {k} bf16 compile=default: uncaptured {plain * 1e3:7.2f} ms/step; captured {graph * 1e3:7.2f} "
            f"ms/step {k / graph:9.0f} model-steps/s (captured / uncaptured speed {plain / graph:.2f})")
    anchor = _anchor_step(anchor_dir, k, long - short, seq_len)
    if anchor is not None:
        line += (f"; anchor {anchor * 1e3:7.2f} ms/step; uncaptured / anchor {anchor / plain:.2f}, captured / "
                 f"anchor {anchor / graph:.2f}")
    _say(line + " (target >= 0.9)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--anchor-dir", default=str(HERE.parents[1] / "shared" / "anchors"))
    parser.add_argument("--members", default="256",
                        help="stack sizes to time, comma-separated (each adds two compiles)")
    parser.add_argument("--short", type=int, default=10)
    parser.add_argument("--long", type=int, default=40)
    parser.add_argument("--invariance", action="store_true", help="also: a run alone and inside a stack of 8")
    parser.add_argument("--device", default="cuda", help="cpu: a smoke run of the wiring (use small sizes)")
    parser.add_argument("--seq-len", type=int, default=1024, help="of the timed stacks (the checks use a quarter)")
    parser.add_argument("--check-steps", type=int, default=60, help="steps of the compiled-against-eager checks")
    parser.add_argument("--profile", action="store_true",
                        help="only: profile a compiled bf16 stack of the first --members (host and device tables), "
                        "then time it against the anchor")
    parser.add_argument("--stream", default="counter-1", choices=["counter-1", "torch-1"],
                        help="TrainConfig.stream of every run (torch-1: the generator per member, before counter "
                        "streams)")
    parser.add_argument("--capture", action="store_true",
                        help="only: the compiled bf16 stack of the first --members uncaptured and as one CUDA graph "
                        "per step, against the compiled anchor")
    parser.add_argument("--compile", default="default", choices=["default", "max"],
                        help="--profile's compile mode (max: autotuned, CUDA graphs on CUDA)")
    args = parser.parse_args()
    DEVICE[0] = args.device
    STREAM[0] = args.stream
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU (a smoke run)"
    _say(f"{name}, torch {torch.__version__}, {datetime.date.today()}, stream {args.stream}")
    members = [int(k) for k in args.members.split(",")]
    if args.capture:
        return captured(members[0], args.seq_len, args.short, args.long, Path(args.anchor_dir))
    if args.profile:
        return profile(members[0], args.seq_len, args.short, args.compile, Path(args.anchor_dir), args.long)
    for precision in ("fp32", "bf16"):
        compiled_against_eager(precision, args.seq_len // 4, args.check_steps)
    speed(members, Path(args.anchor_dir), args.short, args.long, args.seq_len)
    layernorm(members[0], args.seq_len)
    if args.invariance:
        invariance(args.seq_len // 4, args.check_steps)


if __name__ == "__main__":
    main()
