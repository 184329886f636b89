"""Memory and time of `theory.reference_losses` for random kernels, in blocks (`sources.contexts.BLOCK_BYTES`) or not.

The reference is the same computation with every array in one block (BLOCK_BYTES = 2**40: what the package
did before blocking), on the same source. Time: both measured in this process, alternately (caches off), and
printed as a ratio. Peak memory: each variant once in a fresh child process (VmHWM), with the child's
resident size after importing torch as its baseline. The numbers of both variants are checked to be equal.

    python benchmarks/bench_reference_memory.py [--vocab 3 10] [--seq-len 257] [--repeats 3] [--threads 1]

Unblocked, vocab 30 peaks near 8 GB: add it (--vocab 30) only on a machine with that much free.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import torch

from markov_interp import theory
from markov_interp.sources import contexts as chains
from markov_interp.sources import RandomMarkov

UNBLOCKED = 1 << 40


def compute(vocab: int, seq_len: int, block: int) -> dict:
    """A fresh reference computation with `block` bytes per block; the references as a row."""
    chains.BLOCK_BYTES = block
    theory._random_references.cache_clear()
    theory._kernel_expectations_cached.cache_clear()
    return theory.reference_losses(RandomMarkov(vocab), seq_len).as_row()


def peak_mb() -> float:
    """This process's peak resident MB: VmHWM (Linux; ru_maxrss would include the parent's, inherited at fork)."""
    try:
        with open("/proc/self/status") as handle:
            return next(int(line.split()[1]) for line in handle if line.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(vocab: int, seq_len: int, block: int) -> None:
    """Run in a fresh process: print the row, the peak resident MB and the baseline after imports as JSON."""
    base = peak_mb()
    row = compute(vocab, seq_len, block)
    print(json.dumps({"row": row, "peak_mb": peak_mb(), "base_mb": base}))


def peak_memory(vocab: int, seq_len: int, block: int, threads: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", str(vocab), str(seq_len), str(block),
                          "--threads", str(threads)], capture_output=True, text=True, check=True,
                         env={**os.environ, "MARKOV_INTERP_CACHE": "off"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, nargs="+", default=[3, 10])
    parser.add_argument("--seq-len", type=int, default=257, help="references at this length (training's + 1)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--child", type=int, nargs=3, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    os.environ["MARKOV_INTERP_CACHE"] = "off"
    if args.child is not None:
        child(*args.child)
        return
    blocked = chains.BLOCK_BYTES
    print(f"torch {torch.__version__}, {args.threads} thread(s), load average {os.getloadavg()[0]:.1f}, "
          f"block {blocked / 2**20:.0f} MiB")
    for vocab in args.vocab:
        times: dict = {blocked: [], UNBLOCKED: []}
        for _ in range(args.repeats):
            for block in (blocked, UNBLOCKED):
                start = time.perf_counter()
                compute(vocab, args.seq_len, block)
                times[block].append(time.perf_counter() - start)
        t_new, t_old = statistics.median(times[blocked]), statistics.median(times[UNBLOCKED])
        new, old = (peak_memory(vocab, args.seq_len, b, args.threads) for b in (blocked, UNBLOCKED))
        assert new["row"] == old["row"], (new["row"], old["row"])
        print(f"vocab {vocab}, seq_len {args.seq_len}: blocked {t_new:.2f} s = {t_new / t_old:.2f}x unblocked "
              f"({t_old:.2f} s); peak RSS {new['peak_mb']:.0f} MB vs {old['peak_mb']:.0f} MB unblocked "
              f"(after imports {new['base_mb']:.0f} MB); same numbers")


if __name__ == "__main__":
    main()
