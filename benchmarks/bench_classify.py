"""`classify_mechanism` wall time on the README's models, against one forward pass of the same batch.

The models are the README's (untrained weights: the probes do the same work whatever the weights; the kept-edge
rule may try a few more circuit-only runs on a model whose edges all matter a little): the paper's one-layer
model on the binary chain
(probe length 128, the default for a model whose training length is unknown; 256, `train`'s default length and
so the probe default for its runs, from Python, `probe`, `report` and sweeps alike; 1024, the training length
of the full reproduction's (p, q) grid, which its sweeps now probe at), and the two-layer attention-only model
on random 3-state kernels (length 32, as in the README's example, and 128). Prints the median seconds of
`--repeats` calls and the ratio to one forward pass on the same probe batch, measured in the same process, and
the share of it spent in circuit discovery (exhaustive path patching of every edge on 16 of the sequences, the
gradient estimate, faithfulness and minimality: `probes.discover_circuit`). The issue's bar: under 5 s on one
thread at lengths 128 / 256 (paper model) and 32 / 128 (two-layer model).

    python benchmarks/bench_classify.py [--repeats 5] [--threads 1] [--n-sequences 64]
"""

import argparse
import statistics
import time

import torch

from markov_interp import models
from markov_interp.data import BinaryChain, RandomMarkov
from markov_interp.probes import classify_mechanism, discover_circuit, sample_batch

CASES = (
    ("paper-1layer, binary p=0.2 q=0.3", "paper-1layer", {}, BinaryChain(0.2, 0.3), 128),
    ("paper-1layer, binary p=0.2 q=0.3", "paper-1layer", {}, BinaryChain(0.2, 0.3), 256),
    ("paper-1layer, binary p=0.2 q=0.3", "paper-1layer", {}, BinaryChain(0.2, 0.3), 1024),
    ("attn-only-2layer, RandomMarkov(3)", "attn-only-2layer", dict(d_vocab=3, n_ctx=32), RandomMarkov(3), 32),
    ("attn-only-2layer, RandomMarkov(3)", "attn-only-2layer", dict(d_vocab=3), RandomMarkov(3), 128),
)


def median_time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--n-sequences", type=int, default=64)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch threads {torch.get_num_threads()}, {args.n_sequences} probe sequences, median of {args.repeats}")
    for label, name, overrides, source, seq_len in CASES:
        model = models.build(models.preset(name, **overrides), seed=0)
        batch = sample_batch(source, n_sequences=args.n_sequences, seq_len=seq_len, seed=0)
        forward = median_time(lambda: model(batch.tokens), args.repeats)
        full = median_time(lambda: classify_mechanism(model, source, batch=batch), args.repeats)
        graph = median_time(lambda: discover_circuit(model, source, batch=batch, n_sequences=16), args.repeats)
        print(f"{label:36s} length {seq_len:4d}: classify {full:6.3f} s = {full / forward:6.1f} forward passes "
              f"({forward * 1e3:.1f} ms each); circuit discovery {graph:6.3f} s ({graph / full:.0%})")


if __name__ == "__main__":
    main()
