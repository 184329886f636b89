"""Fixtures written with the code of main before the one training engine (commit 0433c0e): run
`git -C /work/main worktree add /tmp/main-0433c0e 0433c0e` and then, from this folder,
`PYTHONPATH=/tmp/main-0433c0e python make_fixtures.py` (it refuses to run on the one-engine code).

- init_main.json: sha256 of every initial weight `models.build` gave for a few configs (names, shapes, bytes).
- old_runs/finished/: a run folder written by the solo loop `training.train` (finished; no checkpoints).
- old_runs/unfinished/: the same loop killed after update 5 of 8 (checkpoint of step 3 kept), with a running-mean
  clamp whose state is in the checkpoint; old_runs/unfinished_final.safetensors: that run's weights when
  trained without interruption by the same loop.
"""
import hashlib
import json
import shutil
import sys
from pathlib import Path

import torch

from markov_interp import models, training

HERE = Path(__file__).parent
CONFIGS = {
    "standard-tied": dict(),
    "untied-biases": dict(tie_weights=False, attn_bias=True, mlp_bias=True, layernorm_bias=True),
    "attn-only-2layer": dict(attn_only=True, n_layers=2, tie_weights=False),
    "canonical": dict(init="canonical", canonical_v_std=0.1, canonical_b=0.3),
    "canonical-untied": dict(init="canonical", tie_weights=False, canonical_a=0.4, normalization=None),
    "lnpre-relu-2heads": dict(normalization="LNPre", act_fn="relu", d_model=16, n_heads=2),
    "rotary-2layer": dict(positional="rotary", n_heads=2, n_layers=2),
}


def init_hashes() -> dict:
    out = {}
    for name, opts in CONFIGS.items():
        cfg = models.preset("paper-1layer", n_ctx=16, **opts)
        state = models.state_dict_for_save(models.build(cfg, seed=3))
        digest = hashlib.sha256()
        for k, v in state.items():  # names, shapes and values, in order
            digest.update(f"{k}:{tuple(v.shape)};".encode())
            digest.update(v.contiguous().numpy().tobytes())
        out[name] = {"config": cfg.to_dict(), "seed": 3, "sha256": digest.hexdigest()}
    return out


def run_config(**train):
    from markov_interp.sources import SourceConfig

    kwargs = dict(steps=8, batch_size=2, seq_len=8, log_every=1, eval_every=4, eval_batches=1, n_checkpoints=0,
                  device="cpu", seed=1)
    kwargs.update(train)
    return training.RunConfig(source=SourceConfig(kind="binary", p=0.5, q=0.8),
                              model=models.preset("paper-1layer", n_ctx=8), train=training.TrainConfig(**kwargs))


class Kill(Exception):
    pass


def unfinished(out: Path) -> None:
    run = run_config(n_checkpoints=3, interventions=["blocks.0.hook_attn_out=mean@:6"])  # checkpoints 1, 3, 8
    original = training._lr_at

    def crash(cfg, step):
        if step == 5:  # 0-based: the 6th update
            raise Kill
        return original(cfg, step)

    training._lr_at = crash
    try:
        training.train(run, out, progress=False)
    except Kill:
        pass
    finally:
        training._lr_at = original
    for path in (out / "checkpoints").glob("step_0000001.*"):
        path.unlink()  # the newest checkpoint (step 3) is what a resume reads
    (out / ".lock").unlink()
    final = training.train(run, progress=False).model
    models.save(final, out.parent / "unfinished_final.safetensors")


if __name__ == "__main__":
    if not hasattr(models, "fast_forward"):
        sys.exit("run this with the code of main before the one engine (it has models.fast_forward)")
    torch.set_num_threads(1)
    (HERE / "init_main.json").write_text(json.dumps(init_hashes(), sort_keys=True))
    runs = HERE / "old_runs"
    shutil.rmtree(runs, ignore_errors=True)
    training.train(run_config(), runs / "finished", progress=False)
    (runs / "finished" / ".lock").unlink()
    unfinished(runs / "unfinished")
