# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # The canonical landscape
#
# The follow-up paper ("Local to Global", arXiv 2406.03072) reduces a tied single-layer model on a binary chain to
# three scalars: the embedding scale e, the signed MLP scale w and the output bias b. `markov_interp.landscape`
# computes that loss, its critical points, the conserved quantity of gradient flow and the basin each
# initialisation falls into, and projects real runs onto it.

# %%
# %matplotlib inline
from pathlib import Path

import torch

import markov_interp

# Tiny budgets when MARKOV_INTERP_QUICK=1 (the tests set it): the code path in seconds, not the paper's results.
QUICK = markov_interp.quick_mode()
RUNS = Path("runs", "tutorial")  # run folders, relative to the folder the notebook runs in

# %%
import numpy as np

from markov_interp import landscape, report

P, Q = 0.5, 0.8  # p + q > 1: the unigram line is a local minimum for w > -1/sqrt(2)
print(landscape.reference_losses(P, Q))
print("loss on the unigram line:", float(landscape.canonical_loss(0.0, 0.3, landscape.unigram_bias(P, Q), p=P, q=Q)))

# %% [markdown]
# ## Gradient flow from two initialisations
#
# A small init with w0 > -1/sqrt(2) slides to the unigram line; w0 = -1 crosses into the global basin.

# %%
STEPS = 300 if QUICK else 3000
stuck = landscape.gradient_flow(0.1, 0.1, p=P, q=Q, steps=STEPS, lr=0.5)
escapes = landscape.gradient_flow(0.1, -1.0, p=P, q=Q, steps=STEPS, lr=0.5)
for name, traj in (("w0=+0.1", stuck), ("w0=-1.0", escapes)):
    print(f"{name}: final loss {traj.loss[-1]:.4f}, predicted",
          landscape.predict_outcome(traj.e[0], traj.w[0], p=P, q=Q))
fig = report.landscape_figure(p=P, q=Q, trajectory=escapes, n=61 if QUICK else 161)
fig.axes[0].plot(stuck.w, np.abs(stuck.e), "w--", lw=1.2)
fig

# %% [markdown]
# ## Regime maps
#
# Which chains a given initialisation learns (tied vs untied), and which initialisations learn a given chain.

# %%
N = 9 if QUICK else 41
tied = landscape.regime_map_pq(e0=0.1, w0=0.1, n=N)
untied = landscape.regime_map_pq(e0=0.1, w0=0.1, tied=False, a0=0.05, n=N)
report.regime_map_pq_figure(tied)

# %%
report.regime_map_pq_figure(untied)

# %%
init_map = landscape.regime_map_init(p=P, q=Q, n_w=11 if QUICK else 81, n_e=8 if QUICK else 50)
report.regime_map_init_figure(init_map)

# %% [markdown]
# ## A real run on the landscape
#
# Train the actual transformer from a canonical initialisation and project its checkpoints onto (e, w, b).

# %%
from markov_interp import models
from markov_interp.sources import SourceConfig
from markov_interp.models import preset
from markov_interp.training import RunConfig, TrainConfig, train

RUN_STEPS, SEQ_LEN = (30, 48) if QUICK else (400, 256)
cfg = RunConfig(
    source=SourceConfig(kind="binary", p=P, q=Q),
    model=preset("paper-1layer", n_ctx=SEQ_LEN, init="canonical", canonical_e=0.1, canonical_w=-1.0),
    train=TrainConfig(steps=RUN_STEPS, seq_len=SEQ_LEN, n_checkpoints=8, eval_every=max(RUN_STEPS // 5, 1),
                      device="cpu"),
)
result = train(cfg, RUNS / "canonical", progress=False)
states = [models.read_weights(path)[1] for _, path in report.checkpoint_files(result.out_dir)]
traj = landscape.coordinates_trajectory(states, p=P, q=Q)
print("start (e, w, b):", traj.points[0].round(3), " end:", traj.points[-1].round(3))
report.landscape_figure(p=P, q=Q, trajectory=traj, n=61 if QUICK else 161)
