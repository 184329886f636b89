"""Train the models behind docs/circuits.md: stacks of seeds per setting (`training.train_many`).

Settings: random kernels of order 1 (RandomMarkov(3)) and order 2 (RandomMarkov(2, order=2)), attention-only
models of depth 1-3 with 1 or 2 heads per layer (d_model 16, untied; `preset("attn-only-2layer")` with the depth
and head count replaced), plus two fixed-chain controls for the kernel-swap test: the paper's one-layer model on
BinaryChain(0.2, 0.3) (learns the kernel in its weights) and a two-layer attention-only model on a fixed 3-state
chain. Every setting is one stack of `--seeds` seeds, `--steps` steps of `--batch` x `--seq-len` states,
constant lr 1e-2 (the paper model on the fixed chain: the paper's 2e-3 one-cycle), fp32, with `--checkpoints`
log-spaced checkpoints (the mid-training snapshots the table also probes).

    python docs/circuits/train_models.py --out runs --device cuda           # what docs/circuits.md used (H100)
    nice python docs/circuits/train_models.py --out /tmp/runs --device cpu --only o2-L2-H1   # one setting

Run folders go to <out>/<setting>/seed<k>; a rerun loads finished runs instead of retraining them. Training
builds no hooked model (`models_out=False`), so it runs without transformer_lens.
"""

import argparse
import dataclasses
import time
from pathlib import Path

from markov_interp.sources import SourceConfig
from markov_interp.models import preset
from markov_interp.training import RunConfig, TrainConfig, train_many

RANDOM = {1: SourceConfig(kind="random", vocab=3, order=1), 2: SourceConfig(kind="random", vocab=2, order=2)}
FIXED3 = SourceConfig(kind="markov", kernel=[[0.7, 0.2, 0.1], [0.1, 0.6, 0.3], [0.3, 0.3, 0.4]])


def settings(seq_len: int) -> dict[str, tuple[SourceConfig, object, dict]]:
    """{name: (source, model config, train overrides)}."""
    out = {}
    for order, source in RANDOM.items():
        for layers in (1, 2, 3):
            for heads in (1, 2):
                model = preset("attn-only-2layer", n_layers=layers, n_heads=heads, d_vocab=source.vocab_size,
                               n_ctx=seq_len)
                out[f"o{order}-L{layers}-H{heads}"] = (source, model, {})
    out["fixed-binary-paper1"] = (SourceConfig(kind="binary", p=0.2, q=0.3), preset("paper-1layer", n_ctx=seq_len),
                                  {"lr": 2e-3, "schedule": "one-cycle"})
    out["fixed-3state-L2"] = (FIXED3, preset("attn-only-2layer", d_vocab=3, n_ctx=seq_len), {})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--checkpoints", type=int, default=4)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--only", nargs="*", default=None, help="setting names (default: all)")
    args = parser.parse_args()
    for name, (source, model, extra) in settings(args.seq_len).items():
        if args.only and name not in args.only:
            continue
        train = TrainConfig(steps=args.steps, batch_size=args.batch, seq_len=args.seq_len, lr=1e-2,
                            schedule="constant", device=args.device, eval_every=0, n_checkpoints=args.checkpoints,
                            log_every=50)
        train = dataclasses.replace(train, **extra)
        runs = [RunConfig(source=source, model=model, train=dataclasses.replace(train, seed=s))
                for s in range(args.seeds)]
        dirs = [Path(args.out) / name / f"seed{s}" for s in range(args.seeds)]
        start = time.perf_counter()
        results = train_many(runs, dirs, progress=False, models_out=False)  # no transformer_lens needed
        losses = ", ".join(f"{r.final.eval_loss:.4f}" for r in results)
        print(f"{name}: {time.perf_counter() - start:.0f} s; final eval losses {losses}", flush=True)


if __name__ == "__main__":
    main()
