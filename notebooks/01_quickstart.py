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
# # markov-interp: quick start
#
# Train the paper's one-layer transformer on a binary Markov chain, compare its loss with the theory's
# reference losses, ask *how* it predicts, and write the visual report of the run.
#
# Reference: Makkuva et al., "Attention with Markov" (arXiv 2402.04161). Everything runs on a CPU in a few minutes
# (seconds with `MARKOV_INTERP_QUICK=1`).

# %%
# %matplotlib inline
from pathlib import Path

import torch

import markov_interp

# Tiny budgets when MARKOV_INTERP_QUICK=1 (the tests set it): the code path in seconds, not the paper's results.
QUICK = markov_interp.quick_mode()
RUNS = Path("runs", "tutorial")  # run folders, relative to the folder the notebook runs in

# %% [markdown]
# ## 1. A Markov source and its reference losses
#
# A binary chain switches from 0 to 1 with probability p and from 1 to 0 with probability q. Two numbers say
# what a model can reach: the **entropy rate** (the loss of the true kernel, the global optimum) and the
# **unigram loss** H(pi) (the loss of predicting the stationary law pi whatever the context: the plateau
# single-layer models can get stuck on).

# %%
from markov_interp import theory
from markov_interp.sources import SourceConfig

source_cfg = SourceConfig(kind="binary", p=0.2, q=0.3)
source = source_cfg.build()
print("kernel:\n", source.kernel)
print("stationary law pi:", theory.stationary_distribution(source.kernel))
print(theory.reference_losses(source, 256))  # entropy rate 0.5446, unigram loss 0.6730 nats

# %%
tokens = source.sample(2, 40, generator=torch.Generator().manual_seed(0))  # states are integer tokens 0..V-1
print(tokens)

# %% [markdown]
# ## 2. Train
#
# `train(run, folder)` writes a run folder: `config.json`, `metrics.jsonl` (with the reference losses beside
# every evaluation), `model.safetensors` and log-spaced `checkpoints/`. Re-running resumes or skips.
# The same from the shell: `markov-interp train --out runs/quickstart --steps 300`.

# %%
from markov_interp.models import preset
from markov_interp.training import RunConfig, TrainConfig, train

STEPS, SEQ_LEN = (30, 48) if QUICK else (300, 256)
run = RunConfig(
    source=source_cfg,
    model=preset("paper-1layer", n_ctx=SEQ_LEN),
    train=TrainConfig(steps=STEPS, seq_len=SEQ_LEN, eval_every=max(STEPS // 6, 1), device="cpu"),
)
result = train(run, RUNS / "quickstart", progress=False)
result.final

# %%
from markov_interp import report

report.loss_curves_figure(result.metrics, result.final.references)

# %% [markdown]
# ## 3. How does it predict?
#
# `classify_mechanism` names the law the model predicts with (it must be close to that law, measured against how
# far apart the candidate laws are) and, for in-context laws, the circuit behind it (previous-token and induction
# heads, confirmed by ablation). A one-layer model on a fixed chain learns the **kernel** in its weights. The
# probes run at the model's training length (the run folder records it). A probe result displays as a summary
# with tables: the candidate laws, then each piece of evidence (click to open); `mech.summary()` is the same
# in text, `mech.to_dict()` all of it as JSON.

# %%
from markov_interp import probes

mech = probes.classify_mechanism(result.model, source, n_sequences=16 if QUICK else 64, seed=0)
mech

# %%
mech.strategies.to_dataframe()  # mean KL(law || model) to every candidate law, and the gaps between the laws

# %%
report.kernel_figure(mech.readout)  # the transition matrix implied by the model's predictions vs the true one

# %%
report.position_loss_figure(mech.behaviour, mech.references)  # flat along the sequence: no in-context learning

# %% [markdown]
# ## 4. The report
#
# One self-contained HTML file per run (it opens with no network: circuitsvis's JavaScript is inlined once).
# From the shell: `markov-interp report runs/quickstart`.

# %%
rep = report.build(RUNS / "quickstart", n_sequences=16 if QUICK else 64, max_checkpoints=3 if QUICK else 8)
path = rep.save()
print(path, f"{path.stat().st_size / 1e6:.2f} MB")

# %%
rep.section("mechanism")  # any section displays on its own; `rep` alone shows the whole report in a frame
