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
# # Hidden states: belief-state geometry in the residual stream (Mess3)
#
# Every other tutorial trains on chains whose state is the token itself. Here the state is **hidden**: a hidden
# Markov process emits tokens, and the best a model can do is to track the posterior over the hidden states given
# the tokens so far, the *belief*, and predict from it. Shai et al. (2024, "Transformers represent belief state
# geometry in their residual stream") trained small transformers on such processes and found the belief linearly
# in the residual stream, its fractal simplex included: for Mess3 in the final layer, for RRXOR only across the
# layers together.
#
# This notebook walks through Mess3: the source and its exact references, a model trained on it, the belief probes
# per layer, the simplex picture, and the causal test that asks whether the model *uses* the belief. The
# experiment `hidden` (docs/findings-hidden.md) runs the same measures on 8 seeds of Mess3 and RRXOR.
# With `MARKOV_INTERP_QUICK=1` (CI) the model is tiny and its numbers mean nothing.

# %%
# %matplotlib inline
from pathlib import Path

import torch

import markov_interp
from markov_interp import probes, report, theory, training
from markov_interp.probes import beliefs
from markov_interp.report.beliefs import belief_simplex_figure
from markov_interp.sources import hmm_preset

QUICK = markov_interp.quick_mode()
RUNS = Path("runs", "tutorial")  # run folders, relative to the folder the notebook runs in

# %% [markdown]
# ## 1. The source
#
# Mess3 (x = 0.05, α = 0.85, as in Shai et al.) has three hidden states and three tokens. Its labelled transition
# matrices T[x, i, j] = P(emit x, go to j | in i) are checked to be a proper HMM; the forward filter gives the
# belief after each token (from the stationary start) and the Bayes-optimal next-token law.

# %%
mess3 = hmm_preset("mess3")
print(mess3)
print(mess3.transition_matrices.sum(0))  # the hidden chain: rows sum to one
tokens = mess3.sample(4, 10, generator=torch.Generator().manual_seed(0))
print(tokens[0].tolist())
print(mess3.belief_states(tokens)[0, :4])  # P(hidden state after x_t | x_0..x_t)
print(mess3.bayes_predictions(tokens)[0, :4])  # the optimal law of x_{t+1}

# %% [markdown]
# The exact references (`theory`): the Bayes-optimal loss averaged over the training length's positions, its
# limit the entropy rate (bracketed for Mess3, whose presentation is not unifilar) and the losses of predicting
# from the last k tokens only. They are what `train` prints beside the loss.

# %%
refs = theory.reference_losses(mess3, 11)
print(refs.describe())
[round(v, 4) for v in refs.bayes_curve]  # the Bayes loss per position: it falls as the belief synchronises

# %% [markdown]
# ## 2. A model
#
# Shai et al.'s shape: 4 layers, one head, d_model 64, context 10. A CPU budget: 1500 steps of 64 sequences
# (they trained far longer).

# %%
run = training.default_run(kind="hmm", process="mess3", n_layers=2 if QUICK else 4, d_model=16 if QUICK else 64,
                           n_heads=1, tie_weights=False, n_ctx=10, seq_len=10, batch_size=64,
                           steps=20 if QUICK else 1500, seed=0, lr=3e-3, eval_every=10 if QUICK else 250,
                           n_checkpoints=0)
result = training.train(run, RUNS / "mess3", progress=False)
model = result.model
print(result.final.references.describe())
[(row["step"], round(row["eval_loss"], 4)) for row in result.metrics if "eval_loss" in row]

# %% [markdown]
# ## 3. Belief probes per layer
#
# Ridge regression of the belief on the residual stream at the embeddings (`L0.resid_pre`), after each block, and
# on all of them concatenated ("all layers"), fitted on half of the sequences and scored (R², pooled over the
# hidden states) on the other half, with a bootstrap interval over sequences; the control is the same probe on
# beliefs shuffled over positions.

# %%
probe_tokens = mess3.sample(1000, 10, generator=torch.Generator().manual_seed(1))
table = probes.beliefs.belief_probes(model, probe_tokens, mess3, n_bootstrap=200)
table.to_dataframe()

# %% [markdown]
# ## 4. The simplex
#
# The true beliefs of held-out positions in barycentric coordinates beside the probe's predictions at the final
# layer and across the layers, each point coloured by its true belief: where the probe reads the belief, the
# pictures agree, fractal included.

# %%
points = beliefs.simplex_points(model, probe_tokens, mess3, table)
belief_simplex_figure({"mess3": points}, title="one model, seed 0")

# %% [markdown]
# ## 5. The causal test
#
# A probe that fits says the belief can be read; it does not say the model reads it. At the final layer, replace
# the stream's component in the probe's subspace (the span of its activation pattern) by that of another
# sequence, and measure how far the next-token law moves towards that sequence's Bayes prediction (1: as far as
# Bayes), beside a random subspace of the same dimension and the span of the probe's decoder weights.

# %%
final = table.fits[-2]  # the last layer's probe ("all layers" is the last fit)
fresh = mess3.sample(300, 10, generator=torch.Generator().manual_seed(2))
for subspace in ("pattern", "weights"):
    print(subspace, probes.beliefs.belief_patch(model, fresh, mess3, final, subspace=subspace, n_bootstrap=200))

# %% [markdown]
# ## 6. The report
#
# `markov-interp report RUN_DIR` (or `report.build`) gives a run on a hidden source its summary (the loss against
# the Bayes references), its configuration and a "Belief states" section with the same table, simplex and test.

# %%
rep = report.build(RUNS / "mess3", device="cpu")
print([s.id for s in rep.sections])
rep.save()

# %% [markdown]
# ## 7. Eight seeds, Mess3 and RRXOR
#
# ```bash
# markov-interp experiment hidden --budget standard   # 8 seeds per process; --quick for a smoke test
# ```
#
# The committed results and what they say about Shai et al.'s two claims are in docs/findings-hidden.md
# (docs/reproduction/hidden-standard/: results.json, the figures and every model's weights).
