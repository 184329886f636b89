"""Representation probes' wall time, against one forward pass of the same batch, measured in the same process.

The README's two-layer attention-only model (d_model 16, untrained weights: the fit does the same work whatever
the weights) on random 2-state kernels, `--n-sequences` (512) x `--seq-len` (64) states, half of the sequences
held out, 1000 bootstrap resamples:

- the forward pass (the reference) and `run_with_cache` of the three residual-stream hooks;
- `linear_probe` of the lag-1 state at L0.resid_post by multinomial logistic regression (L-BFGS, the default) and
  by ridge on the one-hot labels; of the transition counts (4 real outputs, ridge);
- `probe_layers` of the lag-1 state at every residual-stream site (3 sites, one forward pass);
- `fit_probe` alone on the cached activations with no resamples, to separate the fit from the intervals.

    python benchmarks/bench_representation.py [--repeats 5] [--threads 1]
"""

import argparse
import statistics
import time

import torch

from markov_interp import probes
from markov_interp.sources import RandomMarkov
from markov_interp.models import build, preset


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
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--n-sequences", type=int, default=512)
    parser.add_argument("--seq-len", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = build(preset("attn-only-2layer", d_vocab=2, n_ctx=args.seq_len), seed=0)
    batch = probes.sample_batch(RandomMarkov(2), n_sequences=args.n_sequences, seq_len=args.seq_len, seed=0)
    lag1 = probes.probe_target("state", batch, lag=1)
    counts = probes.probe_target("transition_counts", batch)
    hooks = ["blocks.0.hook_resid_pre", "blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]
    _, cache = model.run_with_cache(batch.tokens, names_filter=hooks)
    site = cache["blocks.0.hook_resid_post"]
    with torch.no_grad():
        reference = median_time(lambda: model(batch.tokens), args.repeats)
        cases = {
            "run_with_cache (3 residual hooks)": lambda: model.run_with_cache(batch.tokens, names_filter=hooks),
            "linear_probe lag-1 state, logistic": lambda: probes.linear_probe(model, batch, ("resid_post", 0), lag1),
            "linear_probe lag-1 state, ridge one-hot": lambda: probes.linear_probe(
                model, batch, ("resid_post", 0), lag1, method="ridge"),
            "linear_probe transition counts, ridge": lambda: probes.linear_probe(
                model, batch, ("resid_post", 0), counts),
            "probe_layers lag-1 state (3 sites)": lambda: probes.probe_layers(model, batch, lag1),
            "fit_probe logistic, no resamples": lambda: probes.fit_probe(site, lag1, n_bootstrap=0),
            "fit_probe ridge one-hot, no resamples": lambda: probes.fit_probe(site, lag1, method="ridge",
                                                                              n_bootstrap=0),
        }
        print(f"attn-only-2layer d_model 16, RandomMarkov(2), {args.n_sequences} x {args.seq_len} states, "
              f"{args.threads} thread(s), median of {args.repeats}")
        print(f"{'case':45s} {'seconds':>9s} {'forward passes':>15s}")
        print(f"{'forward pass (reference)':45s} {reference:9.4f} {1.0:15.1f}")
        for label, fn in cases.items():
            seconds = median_time(fn, args.repeats)
            print(f"{label:45s} {seconds:9.4f} {seconds / reference:15.1f}")


if __name__ == "__main__":
    main()
