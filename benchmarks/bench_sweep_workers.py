"""Cost of running each sweep cell in its own supervised child process (`markov_interp._workers.supervise`)
against the process pool it replaced (`concurrent.futures.ProcessPoolExecutor`, fork), on trivial tasks so
that only the per-task process overhead is measured (a real cell trains for seconds).

    python benchmarks/bench_sweep_workers.py [--tasks 64] [--workers 2] [--repeats 3]

Prints the per-task wall time of each and the ratio, measured in this process (torch imported, as in a sweep).
"""

import argparse
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor

import torch

from markov_interp._workers import supervise


def task(x: int) -> dict:
    """A stand-in for a cell: a tiny torch computation returning a small record."""
    return {"status": "ok", "value": float(torch.arange(x + 1.0).sum())}


def with_pool(n: int, workers: int) -> float:
    start = time.perf_counter()
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("fork")) as pool:
        results = list(pool.map(task, range(n)))
    assert len(results) == n
    return time.perf_counter() - start


def with_supervise(n: int, workers: int) -> float:
    results = []
    start = time.perf_counter()
    supervise(list(range(n)), task, lambda t, r, d: results.append(r), workers=workers, start_method="fork")
    assert len(results) == n and all(r is not None for r in results)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    pool = min(with_pool(args.tasks, args.workers) for _ in range(args.repeats))
    sup = min(with_supervise(args.tasks, args.workers) for _ in range(args.repeats))
    print(f"{args.tasks} trivial tasks, {args.workers} workers, best of {args.repeats}:")
    print(f"  process pool (reference)      {1e3 * pool / args.tasks:7.2f} ms per task")
    print(f"  one supervised child per task {1e3 * sup / args.tasks:7.2f} ms per task  "
          f"({sup / pool:.2f}x the pool)")


if __name__ == "__main__":
    main()
