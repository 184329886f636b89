"""Long runs: the step rate stays flat now that metrics.jsonl is appended (issue 25, item 5).

metrics.jsonl used to be rewritten in full, with fsync, at every log step, so a log step cost O(rows so far):
over 40,000 steps the speed fell from 288 to 129 steps/s. Now `runs.MetricsLog` appends one line per row.

Two runs of the same tiny model in this process, each timed step by step (`loop._on_step`):

  (a) the package as it is: rows appended;
  (b) the reference: the same run with the old cost put back, every appended row followed by a rewrite of the
      whole file with fsync (`runs.write_metrics`, what the loop used to call at every row).

For each it prints the step rate over the first and the last 10% of the steps and their ratio (1.0: flat), and
the ratio of (a)'s last-window rate to (b)'s. On a busy machine the step rate's noise can hide the logging cost,
so (c) times the logging alone, per row, in a file already holding n rows (n = 100, 1000, 4000, 10000):
appending a row (with and without fsync) against rewriting the n rows with fsync. Everything runs in one
process, so the machine's load touches both sides; quote the load average with the numbers.

(d) `--long 40000`: one run of the package as a user runs it (the default logging, an evaluation every 100 steps,
8 log-spaced checkpoints) at 40,000 steps of a tiny model, timed step by step: the step rate over the first and the
last 10% of the steps, as a mean (steps / seconds) and from the median step time (which a checkpoint's or an
evaluation's step does not move), and last / first. Issue 33's bar: the end within 10% of the start.

    python benchmarks/bench_long_run.py [--steps 20000] [--log-every 10] [--rows-only] [--long 40000]
"""

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch

from markov_interp.models import preset
from markov_interp.training import RunConfig, TrainConfig, loop, train
from markov_interp import runs
from markov_interp.sources import SourceConfig


def stamped(run: RunConfig, cpu: "list[float] | None" = None) -> list[float]:
    """Train `run` into a temporary folder; the seconds at the end of each of its steps (and, into `cpu` when
    given, this process's CPU seconds there: what the machine's load does not stretch)."""
    stamps: list[float] = []

    def on_step(step: int) -> None:
        stamps.append(time.perf_counter())
        if cpu is not None:
            cpu.append(time.process_time())

    loop._on_step = on_step
    try:
        with tempfile.TemporaryDirectory() as folder:
            train(run, Path(folder) / "run", progress=False)
    finally:
        loop._on_step = lambda step: None
    return stamps


def timed_run(steps: int, log_every: int, rewrite: bool) -> list[float]:
    """Seconds at the end of every step of one run (rows appended, or appended and rewritten in full)."""
    run = RunConfig(source=SourceConfig(kind="binary", p=0.2, q=0.3), model=preset("paper-1layer", n_ctx=8),
                    train=TrainConfig(steps=steps, batch_size=2, seq_len=8, log_every=log_every, eval_every=0,
                                      eval_log_points=0, n_checkpoints=0, eval_batches=1, device="cpu"))
    real_append = runs.MetricsLog.append
    rows: list[dict] = []

    def append_and_rewrite(self, row):  # the old loop: every row so far rewritten, with fsync, at every row
        rows.append(row)  # (not appended too: the rewrite replaces the file the log holds open)
        runs.write_metrics(self.path.parent, rows)

    if rewrite:
        runs.MetricsLog.append = append_and_rewrite
    try:
        return stamped(run)
    finally:
        runs.MetricsLog.append = real_append


def long_run(steps: int) -> None:
    """(d): one run with the default logging, evaluation and checkpoints, its step rate at the start and end."""
    run = RunConfig(source=SourceConfig(kind="binary", p=0.2, q=0.3), model=preset("paper-1layer", n_ctx=8),
                    train=TrainConfig(steps=steps, batch_size=2, seq_len=8, device="cpu"))
    tc = run.train
    print(f"(d) one run of {steps} steps (batch 2 x 8, log every {tc.log_every}, evaluate every {tc.eval_every} "
          f"x {tc.eval_batches} batches, {tc.n_checkpoints} checkpoints); load average {os.getloadavg()[0]:.1f}")
    start, cpu = time.perf_counter(), []
    stamps = stamped(run, cpu)
    for name, clock in (("wall", stamps), ("CPU", cpu)):  # CPU seconds: the run's own work, whatever the load
        (mean0, mean1), (median0, median1) = window_rates(clock), median_rates(clock)
        print(f"  {name} time, first 10%: {mean0:7.1f} steps/s (mean), {median0:7.1f} steps/s (median step)")
        print(f"  {name} time, last 10%:  {mean1:7.1f} steps/s (mean), {median1:7.1f} steps/s (median step)")
        print(f"  {name} time, last / first: {mean1 / mean0:.3f} (mean), {median1 / median0:.3f} (median step)")
        tenths = [(len(w) - 1) / (w[-1] - w[0]) for w in _tenths(clock)]
        print(f"  {name} time, steps/s in each tenth: " + " ".join(f"{r:.0f}" for r in tenths))
    print(f"  {time.perf_counter() - start:.0f} s in all; load average now {os.getloadavg()[0]:.1f}")


def _tenths(stamps: list[float]) -> list[list[float]]:
    """The stamps in ten consecutive windows of equal length (a slowdown with length rises across them; the
    machine's load comes and goes)."""
    n = len(stamps) // 10
    return [stamps[i * n:(i + 1) * n] for i in range(10)]


def _windows(stamps: list[float]) -> tuple[list[float], list[float]]:
    """The stamps of the first and the last 10% of the steps."""
    n = max(2, len(stamps) // 10)
    return stamps[:n], stamps[-n:]


def window_rates(stamps: list[float]) -> tuple[float, float]:
    """Steps per second over the first and the last 10% of the steps (the mean rate)."""
    return tuple((len(w) - 1) / (w[-1] - w[0]) for w in _windows(stamps))  # type: ignore[return-value]


def median_rates(stamps: list[float]) -> tuple[float, float]:
    """1 / the median step time over the first and the last 10% (a checkpoint's or an evaluation's step does not
    move it)."""
    medians = [sorted(b - a for a, b in zip(w, w[1:])) for w in _windows(stamps)]
    return tuple(1 / gaps[len(gaps) // 2] for gaps in medians)  # type: ignore[return-value]


def logging_costs(sizes: tuple = (100, 1000, 4000, 10000), repeats: int = 20) -> None:
    """(c): seconds per row of appending (MetricsLog) and of rewriting in full (write_metrics), at n rows."""
    row = {"step": 0, "train_loss": 0.123456789, "lr": 0.001, "eval_loss": 0.3456, "eval_true_loss": 0.3,
           "entropy_rate": 0.5, "unigram_loss": 0.69, "grad_norm": 1.2345, "eval_plateau_loss": 0.6}
    print(f"(c) logging one row into a file of n rows ({len(json_line(row))} bytes a row), median of {repeats}:")
    for n in sizes:
        rows = [{**row, "step": i} for i in range(n)]
        with tempfile.TemporaryDirectory() as folder:
            runs.write_metrics(folder, rows)
            log = runs.MetricsLog(folder)
            append = median_time(lambda: log.append(row), repeats)
            synced = median_time(lambda: (log.append(row), log.sync()), repeats)
            log.close()
            rewrite = median_time(lambda: runs.write_metrics(folder, rows), repeats)
        print(f"  n={n:6d}: append {append * 1e6:8.1f} us, append+fsync {synced * 1e3:7.2f} ms, rewrite+fsync "
              f"{rewrite * 1e3:7.2f} ms ({rewrite / synced:5.1f}x append+fsync)")


def json_line(row: dict) -> str:
    import json

    return json.dumps(row, sort_keys=True) + "\n"


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--rows-only", action="store_true", help="only (c), the logging cost per row")
    parser.add_argument("--long", type=int, default=None, metavar="STEPS", help="only (d), one run of STEPS steps")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, one thread; load average {os.getloadavg()[0]:.1f}")
    if args.long is not None:
        long_run(args.long)
        return
    logging_costs()
    if args.rows_only:
        return
    print(f"{args.steps} steps, a row every {args.log_every} steps:")
    rates = {}
    for name, rewrite in (("appended (package)", False), ("rewritten in full (reference)", True)):
        first, last = window_rates(timed_run(args.steps, args.log_every, rewrite))
        rates[name] = last
        print(f"{name:32s} first 10%: {first:7.1f} steps/s   last 10%: {last:7.1f} steps/s   last/first {last / first:.2f}")
    a, b = rates.values()
    print(f"last-window rate, appended / rewritten: {a / b:.2f}x; load average now {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
