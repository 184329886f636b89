"""Cost of `theory.reference_losses` for random kernels, as training pays it once at the start of a run.

For each setting: seconds of a fresh computation (memory and disk caches off) and of a cached call, beside the
reference measured in the same process: the previous method (a plain Monte Carlo over 2048 kernels and 2048
sequences, no error reported), and one training step's worth of sampling (a batch of 64 sequences). Prints
the standard errors reached too.

    python benchmarks/bench_references.py [--threads 1]
"""

import argparse
import os
import time

import torch

from markov_interp import theory
from markov_interp.sources import RandomMarkov

SETTINGS = [  # (vocab, seq_len): the CLI's default random source (2 states, 256 inputs) and the reproduction's
    (2, 257),
    (3, 33),
    (3, 65),
]


def previous_method(source: RandomMarkov, seq_len: int) -> float:
    """The reference: the package's earlier estimate (2048 kernels for E[rate], E[H(pi)]; 2048 sequences)."""
    gen = torch.Generator().manual_seed(0)
    kernels = source.sample_kernels(2048, gen)
    pi = theory.stationary_context_laws(kernels)
    float((pi * theory.entropy(kernels)).sum(-1).mean())
    return float(theory.in_context_loss_curve(source, seq_len, n_sequences=2048, generator=gen).mean())


def seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    os.environ["MARKOV_INTERP_CACHE"] = "off"
    for vocab, seq_len in SETTINGS:
        source = RandomMarkov(vocab)
        old = seconds(lambda: previous_method(source, seq_len))
        batch = seconds(lambda: source.sample(64, seq_len, torch.Generator().manual_seed(1)))
        theory._random_references.cache_clear()
        theory._kernel_expectations_cached.cache_clear()
        fresh = seconds(lambda: theory.reference_losses(source, seq_len))
        cached = seconds(lambda: theory.reference_losses(source, seq_len))
        refs = theory.reference_losses(source, seq_len)
        print(f"vocab {vocab}, {seq_len - 1} targets: fresh {fresh:.2f} s = {fresh / old:.1f}x the previous method "
              f"({old:.2f} s) = {fresh / batch:.0f} batches of 64; cached {cached * 1e6:.0f} us")
        print(f"    {refs.describe()}")


if __name__ == "__main__":
    main()
