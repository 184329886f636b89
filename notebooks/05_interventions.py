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
# # Interventions during training: how circuits form
#
# Probing a trained model says *what* circuit it has. The next questions are causal and about formation: does
# the induction head form sooner when layer 0 already is a perfect previous-token head? Does layer 0 become a
# previous-token head while layer 1 cannot read it? Does a one-layer model need its attention at all, to learn
# the kernel or to get stuck on the unigram plateau? Singh et al. (2024, "What needs to go right for an
# induction head") answer such questions by **clamping** activations during training, Bietti et al. (2023) by
# **freezing** parameters. Here both are training options, named like TransformerLens hooks and state-dict
# entries, and run in the fused training path (no hooked forward while training).
#
# The answers are escape-time distributions over seeds (notebook 02 and `markov_interp.dynamics`): the first
# evaluation after which the model's excess loss over the true predictor stays below half the plateau's,
# censored at the budget. Each arm trains 16 seeds as one stacked model; arms are compared with the log-rank
# test and the shift of the median escape (bootstrap interval). With `MARKOV_INTERP_QUICK=1` (CI) the budgets
# are tiny and the numbers mean nothing.

# %%
# %matplotlib inline
from pathlib import Path

import markov_interp

QUICK = markov_interp.quick_mode()
RUNS = Path("runs", "tutorial")  # run folders, relative to the folder the notebook runs in

# %% [markdown]
# ## One clamped run
#
# `TrainConfig.interventions` holds freezes (state-dict names, globs, a step range) and clamps (a hook name and
# a value: `previous_token`, `uniform`, `self` or a tensor file for attention patterns; `zero`, `mean` or a
# tensor file for outputs and the residual stream). The command line has the same as
# `--clamp blocks.0.attn.hook_pattern=previous_token` and `--freeze 'blocks.1.*@:150'`.

# %%
import dataclasses

from markov_interp import dynamics, report
from markov_interp.experiments import interventions

budget = interventions.FULL
if QUICK:  # the code path only: 2 seeds, 30 steps
    budget = interventions.QUICK.replace(seeds=2, steps=30, release=10, chain_steps=30)
base, arms = interventions.experiment_arms("previous-token-clamp", budget)
clamped = dataclasses.replace(base, train=dataclasses.replace(base.train, interventions=arms[1].interventions))
print(clamped.train.interventions)

# %%
import json

from markov_interp.training import train

result = train(clamped, RUNS / "clamped", progress=False)
print(json.loads((RUNS / "clamped" / "config.json").read_text())["train"]["interventions"])
print("escape:", dynamics.escape_from_metrics(result.metrics))
report.loss_curves_figure(result.metrics, result.final.references)

# %% [markdown]
# ## 1. A perfect previous-token head in layer 0
#
# Random kernels (a fresh Dirichlet(1) kernel on 3 states per sequence), two attention-only layers, 16 seeds
# per arm. Free, against layer 0's pattern clamped to the previous position for the whole run, and clamped for
# the first 150 updates and then trained. The released arm is *not* a head start: under a pattern clamp layer 0's
# Q/K get no gradient, so at release it is back at its near-uniform init (a real head start,
# `ModelConfig.init_attention`, is an arm of the `factorial` experiment). Read the crossings table: the clamped
# runs are slower from the first line (0.9) on, and under the clamp layer 1 does not become an induction head (see
# docs/reproduction/interventions/ for 1500 steps). On kernels without self-transitions the same clamp speeds the
# descent instead (docs/findings-dynamics.md).

# %%
from IPython.display import Markdown, display

first = interventions.run_experiment("previous-token-clamp", budget, RUNS / "experiments")
display(Markdown(interventions.summary_markdown([first])))

# %% [markdown]
# ## 2. Layer 1 frozen until step 150, then released; and frozen throughout
#
# Does layer 0 become a previous-token head while the head that would read it cannot learn? Its previous-token
# score after 150 updates (frozen reader against free), the escape times once layer 1 is released, and the control:
# layer 1 frozen for the whole run, read at the end, when free runs have formed their previous-token head.

# %%
second = interventions.run_experiment("reader-frozen", budget, RUNS / "experiments")
display(Markdown(interventions.summary_markdown([second])))

# %% [markdown]
# ## 3. Does the one-layer plateau need attention?
#
# One layer, tied embeddings, p = 0.5, q = 0.8 (the chain the paper reports stuck at the unigram loss): free,
# the pattern clamped to uniform causal attention, the attention weights frozen at their initial values, and the
# control that splits attention in two: Q/K (the pattern) or V/O (the values) frozen at init.

# %%
third = interventions.run_experiment("attention-in-one-layer", budget, RUNS / "experiments")
display(Markdown(interventions.summary_markdown([third])))
interventions.survival_figure([first, second, third])

# %% [markdown]
# ## 4. Finding 1's scope: the factorial
#
# The experiment `factorial` crosses the clamp with layer 1's head count {1, 2} and the data: Dirichlet(1) kernels,
# or kernels with a zero diagonal (no self-transitions, so counting self-transitions carries no information and a
# same-token head in layer 1 cannot help). Here one cell, zero diagonal with one layer-1 head, free against clamped
# at the quick budget (5 seeds, 150 steps): there the clamp *speeds* the descent. The whole factorial (16 seeds,
# 600 steps, the mixed clamp and a real head start) is `python -m markov_interp.experiments --only factorial`, or
# `scripts/gpu_factorial.sh` on a GPU; docs/findings-dynamics.md has the quick budget's four cells.

# %%
from markov_interp.experiments import factorial

cell_budget = factorial.QUICK.replace(data=("zero-diagonal",), heads=(1,))
if QUICK:
    cell_budget = cell_budget.replace(seeds=2, discovered=1, score_checkpoints=3, steps=20, eval_every=5)
cell = factorial.run(cell_budget, RUNS / "factorial")
display(Markdown(cell.overview().markdown()))
cell.figures()[f"curves-{cell.cells[0].name}.png"]

# %% [markdown]
# ## 5. The exact reduction, kept exact
#
# Notebook 04's landscape predicts, from the canonical init (e0, w0, b0), whether a one-layer tied model without
# LayerNorm reaches the entropy rate or sticks at the unigram line. That prediction is for gradient flow on the
# three scalars; free training leaves the (e, w, b) family. `TrainConfig(reduction="canonical")` projects every
# gradient onto the family (the chain rule of the map from (e, w, b) to the weights), so plain SGD on the network
# *is* gradient descent on (e, w, b); `release=[...]` frees one part at a time. Which freedom moves the
# separatrix? Below: the reduced network, positions released and nothing constrained, against the flow and Adam on
# (e, w, b) itself (2 seeds at 7 values of w0 here; the experiment `reduction` runs 8 seeds, 12 values and every
# arm: docs/reproduction/reduction/).

# %%
from markov_interp.experiments import reduction

red_budget = reduction.FULL.replace(seeds=2, w0=(-0.8, -0.7, -0.65, -0.6, -0.55, -0.5, -0.4),
                                    arms=("reduced", "positions", "free-sgd", "free-adam"))
if QUICK:
    red_budget = reduction.QUICK.replace(steps=20, eval_every=5)
red = reduction.run(red_budget, RUNS / "reduction")
display(Markdown(red.outcome_table().markdown()))
print("arms whose separatrix is not the flow's:", red.moved())
red.figures()["separatrix.png"]

# %%
display(Markdown(red.gap_table().markdown()))
red.figures()["paths.png"]
