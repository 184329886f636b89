"""Train the README's two-layer attention-only model briefly on random kernels and probe it layer by layer for the
current and the previous state (representation probes), printing one row per residual-stream site.

    OMP_NUM_THREADS=1 python scripts/probe_trained.py --vocab 2 --seeds 0 1 --steps 3000 --out /tmp/repr_runs

The run folders (weights, config, metrics) are written under --out; re-running loads them.
"""

import argparse
import time

import torch

from markov_interp import probes
from markov_interp.sources import SourceConfig
from markov_interp.models import preset
from markov_interp.training import RunConfig, TrainConfig, train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=2)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--n-sequences", type=int, default=512)
    parser.add_argument("--out", default="/tmp/repr_runs")
    args = parser.parse_args()
    torch.set_num_threads(1)
    for seed in args.seeds:
        run = RunConfig(source=SourceConfig(kind="random", vocab=args.vocab, alpha=1.0),
                        model=preset("attn-only-2layer", d_vocab=args.vocab, n_ctx=args.seq_len),
                        train=TrainConfig(steps=args.steps, seq_len=args.seq_len, batch_size=64, lr=1e-2,
                                          schedule="constant", seed=seed, eval_every=0, n_checkpoints=0, device="cpu"))
        start = time.perf_counter()
        result = train(run, f"{args.out}/v{args.vocab}-s{seed}-{args.steps}", progress=False)
        final = result.final
        print(f"V={args.vocab} seed {seed}: {args.steps} steps in {time.perf_counter() - start:.0f} s, eval loss "
              f"{final.eval_loss:.4f} (in-context Bayes {final.references.bayes_loss:.4f}, unigram "
              f"{final.references.unigram_loss:.4f})")
        source = run.source.build()
        batch = probes.sample_batch(source, n_sequences=args.n_sequences, seq_len=args.seq_len, seed=1)
        mech = probes.classify_mechanism(result.model, source, seed=0)
        print(f"  classify_mechanism: {mech.label}")
        heads = [("result", 0, 0), ("q", 1, 0), ("k", 1, 0), ("result", 1, 0)]
        sites = [*probes.representation.residual_sites(result.model), *heads]
        for name, target in (("x_t", probes.probe_target("state", batch)),
                             ("x_{t-1}", probes.probe_target("state", batch, lag=1)),
                             ("switch rate", probes.probe_target("switch_counts", batch, normalize=True)),
                             ("state freq", probes.probe_target("state_counts", batch, normalize=True)),
                             ("add-beta row", probes.probe_target("add_beta_row", batch))):
            for fit in probes.probe_layers(result.model, batch, target, sites=sites).fits:
                print(f"  {name:12s} {fit.site:14s} {fit.metric} {fit.score:.3f} [{fit.score_ci[0]:.3f}, "
                      f"{fit.score_ci[1]:.3f}]  control {fit.control:.3f}  selectivity {fit.selectivity:+.3f} "
                      f"[{fit.selectivity_ci[0]:+.3f}, {fit.selectivity_ci[1]:+.3f}]")


if __name__ == "__main__":
    main()
