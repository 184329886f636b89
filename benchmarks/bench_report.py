"""`markov-interp report` on the README's quickstart run: CPU time and peak memory of the whole process, against
the floor of loading the model (importing torch, TransformerLens and the package, and building the hooked model)
measured the same way on the same machine.

    python benchmarks/bench_report.py [RUN_DIR] [--repeat 3] [--threads 1]

No progress bar is drawn (stderr is not a terminal). Without RUN_DIR the quickstart run is trained first (`markov-interp train --out TMP/quickstart`, the README's
command). Each measurement is a fresh process (`os.wait4`: user + system CPU seconds and the peak resident set);
the best of `--repeat` runs is printed, then the report's excess over the floor and their ratio, which is what to
hold as the machine changes (the floor is the part a report cannot avoid while it probes a TransformerLens model).
Then, in this process (after the imports), the build's CPU seconds against one forward + backward pass of the hooked
model on the report's probe batch (64 sequences of the training length): the second ratio to hold.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FLOOR = ("from markov_interp import runs; import matplotlib.figure; "
         "runs.load_model({run!r})")


def measure(argv: list[str], env: dict) -> tuple[float, float]:
    """(user + system CPU seconds, peak resident set in MB) of one child process; raises if it fails."""
    child = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(child.pid, 0)
    if status != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {child.stderr.read().decode()[-2000:]}")
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def in_process(run: str, out: Path, threads: "int | None") -> None:
    """The report's build + save against one forward + backward of its probe batch, CPU seconds in this process."""
    import torch

    if threads is not None:
        torch.set_num_threads(threads)

    from markov_interp import probes, report, runs

    model = runs.load_model(run)
    source = runs.read_config(run).source.build()
    batch = probes.sample_batch(source, n_sequences=64, seq_len=probes.probe_length(model), seed=0)

    def forward_backward() -> None:
        logits = model(batch.tokens)
        torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), batch.tokens[:, 1:].flatten()).backward()
        model.zero_grad(set_to_none=True)

    forward_backward()  # warm-up
    times = []
    for _ in range(5):
        start = time.process_time()
        forward_backward()
        times.append(time.process_time() - start)
    fb = statistics.median(times)
    start = time.process_time()
    report.build(run).save(out)
    seconds = time.process_time() - start
    print(f"in one process: build + save {seconds:.2f} s CPU = {seconds / fb:.0f} forward + backward passes of the "
          f"probe batch ({fb * 1e3:.0f} ms each); load average {os.getloadavg()[0]:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", nargs="?", metavar="RUN_DIR", help="a run folder (default: train the quickstart)")
    parser.add_argument("--repeat", type=int, default=3, metavar="N", help="runs of each side (the best is kept)")
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help="OMP_NUM_THREADS for both sides (default: torch's choice)")
    args = parser.parse_args()
    env = dict(os.environ)
    if args.threads is not None:
        env["OMP_NUM_THREADS"] = str(args.threads)
    cli = [sys.executable, "-m", "markov_interp.cli"]
    with tempfile.TemporaryDirectory() as tmp:
        run = args.run_dir or str(Path(tmp) / "quickstart")
        if args.run_dir is None:
            subprocess.run(cli + ["train", "--out", run, "--no-progress"], env=env, check=True,
                           stdout=subprocess.DEVNULL)
        floor, report = [], []
        for _ in range(args.repeat):  # interleaved: both sides see the same load
            floor.append(measure([sys.executable, "-c", FLOOR.format(run=run)], env))
            report.append(measure(cli + ["report", run, "--out", str(Path(tmp) / "report.html")], env))
        (f_cpu, f_mb), (r_cpu, r_mb) = min(floor), min(report)
        print(f"floor (imports + the hooked model): {f_cpu:.2f} s CPU, {f_mb:.0f} MB peak")
        print(f"markov-interp report:                {r_cpu:.2f} s CPU, {r_mb:.0f} MB peak")
        print(f"the report's own work: {r_cpu - f_cpu:.2f} s CPU = {(r_cpu - f_cpu) / f_cpu:.2f}x the floor "
              f"(whole process {r_cpu / f_cpu:.2f}x), +{r_mb - f_mb:.0f} MB over the floor's peak; load average "
              f"{os.getloadavg()[0]:.1f}")
        pairs = [((r[0] - f[0]) / f[0], r[1] - f[1]) for f, r in zip(floor, report)]  # each repeat's interleaved pair
        print(f"spread over the {len(pairs)} repeats (each report against the floor run just before it): own work "
              f"{min(p[0] for p in pairs):.2f}x-{max(p[0] for p in pairs):.2f}x the floor, "
              f"+{min(p[1] for p in pairs):.0f} to +{max(p[1] for p in pairs):.0f} MB over its peak")
        in_process(run, Path(tmp) / "report-in-process.html", args.threads)


if __name__ == "__main__":
    main()
