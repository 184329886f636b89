"""Why the package runs tiny models on one torch thread: CPU seconds and wall time of probing and training the
quickstart model with one thread against torch's default (one per core), on the machine as found ("found": idle
only if nothing else runs) and with every core kept busy by other processes, in the same process.

Rows: `classify_mechanism` on the quickstart model (the paper's one-layer model on the binary chain, untrained
weights: the probes do the same work whatever the weights) with 64 probe sequences, and 100 training steps of
`markov-interp train`'s default run. Each is timed with `markov_interp.threads(n)` for n = 1 and n = torch's
default; CPU seconds are the process's (every thread's) `time.process_time`. "busy" starts one spinning process per
core for the duration of the row (what a shared machine looks like). The ratios are default / one thread: above 1,
the default costs more.

    OMP_NUM_THREADS= python benchmarks/bench_threads.py [--repeats 3] [--only classify|train] [--no-busy]
"""

import argparse
import multiprocessing
import os
import statistics
import time

import torch

import markov_interp
from markov_interp import models
from markov_interp.probes import classify_mechanism
from markov_interp.training import default_run, train


def _spin(stop) -> None:
    while not stop.is_set():
        pass


class Busy:
    """`n` processes that spin until the block ends (the other engineers on a shared machine)."""

    def __init__(self, n: int):
        self.n = n

    def __enter__(self) -> "Busy":
        ctx = multiprocessing.get_context("spawn")
        self.stop = ctx.Event()
        self.procs = [ctx.Process(target=_spin, args=(self.stop,), daemon=True) for _ in range(self.n)]
        for p in self.procs:
            p.start()
        time.sleep(0.5)
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for p in self.procs:
            p.join(5)


def measure(fn, repeats: int) -> tuple[float, float]:
    """(median wall seconds, median CPU seconds of this process) of `fn()` after a warm-up call."""
    fn()
    walls, cpus = [], []
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return statistics.median(walls), statistics.median(cpus)


def workloads(only: str | None) -> dict:
    run = default_run()
    model = models.build(run.model, seed=0)
    source = run.source.build()
    short = run.replace(train=run.train.replace(steps=100, eval_every=0, n_checkpoints=0))
    out = {
        "classify (quickstart, 64 seq)": lambda: classify_mechanism(model, source, n_sequences=64, progress=False),
        "train (quickstart, 100 steps)": lambda: train(short, progress=False),
    }
    return {k: v for k, v in out.items() if only is None or k.startswith(only)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", choices=["classify", "train"], default=None)
    parser.add_argument("--no-busy", action="store_true", help="only the rows on the machine as found")
    args = parser.parse_args()
    default = torch.get_num_threads()
    cores = os.cpu_count() or 1
    print(f"torch {torch.__version__}, {cores} cores, torch's default {default} threads, "
          f"load average {os.getloadavg()[0]:.1f} at start; median of {args.repeats}")
    print(f"{'workload':32s} {'machine':6s} {'1 thread wall/CPU s':>20s} {f'{default} threads wall/CPU s':>20s} "
          f"{'wall ratio':>10s} {'CPU ratio':>9s}")
    for name, fn in workloads(args.only).items():
        for busy in (False, True)[:1 if args.no_busy else 2]:
            with Busy(cores if busy else 0):
                with markov_interp.threads(1):
                    one = measure(fn, args.repeats)
                with markov_interp.threads(default):
                    many = measure(fn, args.repeats)
            print(f"{name:32s} {'busy' if busy else 'found':6s} {one[0]:9.2f} / {one[1]:8.2f} "
                  f"{many[0]:9.2f} / {many[1]:8.2f} {many[0] / one[0]:10.2f} {many[1] / one[1]:9.2f}", flush=True)


if __name__ == "__main__":
    main()
