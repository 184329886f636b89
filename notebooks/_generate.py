"""Generate notebooks/*.ipynb (no outputs) with nbformat: `python notebooks/_generate.py` from the repository root.

The notebooks are written from this file so that they stay reviewable as code; edit here, then regenerate."""

import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

SETUP = '''%matplotlib inline
import os
import tempfile
from pathlib import Path

import torch

# QUICK=1 (set MARKOV_INTERP_QUICK=1, as CI does) runs everything tiny: the plots are then illustrations of the
# code path, not of the paper's results. Unset, each notebook takes a few minutes on a CPU.
QUICK = os.environ.get("MARKOV_INTERP_QUICK", "0") not in ("", "0")
RUNS = Path(os.environ.get("MARKOV_INTERP_RUNS") or tempfile.mkdtemp(prefix="markov-interp-runs-"))
print(f"QUICK={QUICK}, run folders under {RUNS}")'''


def md(text: str):
    return new_markdown_cell(text.strip("\n"))


def code(text: str):
    return new_code_cell(text.strip("\n"))


def notebook(cells: list) -> nbformat.NotebookNode:
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    nb.metadata["language_info"] = {"name": "python"}
    return nb


QUICKSTART = [
    md("""
# markov-interp: quick start

Train the paper's one-layer transformer on a binary Markov chain, compare its loss with the theory's
reference losses, ask *how* it predicts, and write the visual report of the run.

Reference: Makkuva et al., "Attention with Markov" (arXiv 2402.04161). Everything runs on a CPU in a few minutes
(seconds with `MARKOV_INTERP_QUICK=1`).
"""),
    code(SETUP),
    md("""
## 1. A Markov source and its reference losses

A binary chain switches from 0 to 1 with probability p and from 1 to 0 with probability q. Two numbers say
what a model can reach: the **entropy rate** (the loss of the true kernel, the global optimum) and the
**unigram loss** H(pi) (the loss of predicting the stationary law pi whatever the context: the plateau
single-layer models can get stuck on).
"""),
    code('''
from markov_interp import theory
from markov_interp.data import SourceConfig

source_cfg = SourceConfig(kind="binary", p=0.2, q=0.3)
source = source_cfg.build()
print("kernel:\\n", source.kernel)
print("stationary law pi:", theory.stationary_distribution(source.kernel))
print(theory.reference_losses(source, 256))  # entropy rate 0.5446, unigram loss 0.6730 nats
'''),
    code('''
tokens = source.sample(2, 40, generator=torch.Generator().manual_seed(0))  # states are integer tokens 0..V-1
print(tokens)
'''),
    md("""
## 2. Train

`train(run, folder)` writes a run folder: `config.json`, `metrics.jsonl` (with the reference losses beside
every evaluation), `model.safetensors` and log-spaced `checkpoints/`. Re-running resumes or skips.
The same from the shell: `markov-interp train --out runs/quickstart --steps 300`.
"""),
    code('''
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
'''),
    code('''
from markov_interp import report

report.loss_curves_figure(result.metrics, result.final.references)
'''),
    md("""
## 3. How does it predict?

`classify_mechanism` names the mechanism from behaviour first (does the prediction depend on the current
state? on the rest of the context?) and circuitry second (previous-token and induction heads, confirmed by
ablation). A one-layer model on a fixed chain learns the **kernel** in its weights.
"""),
    code('''
from markov_interp import probes

mech = probes.classify_mechanism(result.model, source, n_sequences=16 if QUICK else 64, seed=0)
print("mechanism:", mech.mechanism, "(confident)" if mech.confident else "(not confident)")
for reason in mech.reasons:
    print(" -", reason)
'''),
    code('''
report.kernel_figure(mech.readout)  # the transition matrix implied by the model's predictions vs the true one
'''),
    code('''
report.position_loss_figure(mech.behaviour, mech.references)  # flat along the sequence: no in-context learning
'''),
    md("""
## 4. The report

One self-contained HTML file per run (it opens with no network: circuitsvis's JavaScript is inlined once).
From the shell: `markov-interp report runs/quickstart`.
"""),
    code('''
rep = report.build(RUNS / "quickstart", n_sequences=16 if QUICK else 64, max_checkpoints=3 if QUICK else 8)
path = rep.save()
print(path, f"{path.stat().st_size / 1e6:.2f} MB")
'''),
    code('''
rep.section("mechanism")  # any section displays on its own; `rep` alone shows the whole report in a frame
'''),
]


SINGLE = [
    md("""
# Single-layer models: kernel learning, the unigram trap, weight tying, initialisation and precision

Makkuva et al. show that a one-layer transformer with **weight tying** on a binary chain with p + q > 1 has bad
local minima that predict the stationary law pi whatever the context (loss = unigram loss H(pi)); with
p + q < 1 it learns the kernel. Without tying the bad points are saddles. Whether a run escapes also depends
on the initialisation, the precision and the budget, so each is an explicit setting here.
"""),
    code(SETUP),
    code('''
from markov_interp import landscape, probes, report, theory
from markov_interp.data import SourceConfig
from markov_interp.models import preset
from markov_interp.training import RunConfig, TrainConfig, train

STEPS, SEQ_LEN = (16, 32) if QUICK else (400, 256)
SEEDS = [0] if QUICK else [0, 1, 2]


def run(name, *, p, q, seed=0, precision="fp32", loss_scaling=False, **model):
    """Train the paper's one-layer model on the (p, q) chain into RUNS/name (skipped if already there)."""
    cfg = RunConfig(
        source=SourceConfig(kind="binary", p=p, q=q),
        model=preset("paper-1layer", n_ctx=SEQ_LEN, **model),
        train=TrainConfig(steps=STEPS, seq_len=SEQ_LEN, seed=seed, precision=precision, loss_scaling=loss_scaling,
                          eval_every=max(STEPS // 5, 1), n_checkpoints=2 if QUICK else 6, device="cpu"),
    )
    return train(cfg, RUNS / name, progress=False)


def readout(result):
    """The kernel implied by the model's predictions (probes.kernel_readout) on a fixed probe batch."""
    source = result.config.source.build()
    batch = probes.sample_batch(source, n_sequences=16 if QUICK else 64, seq_len=SEQ_LEN, seed=0)
    return probes.kernel_readout(result.model, batch)


def summary(name, result):
    f, k = result.final, readout(result).implied
    print(f"{name:32s} eval {f.eval_loss:.4f}  (entropy rate {f.entropy_rate:.4f}, unigram {f.unigram_loss:.4f})"
          f"  learned P(1|0) = {float(k[0, 1]):.3f}, P(0|1) = {float(k[1, 0]):.3f}")
'''),
    md("""
## 1. Kernel learning (p + q < 1)

On p = 0.2, q = 0.3 the tied model learns the kernel: its implied transition matrix matches the true one and
its loss reaches the entropy rate, flat along the sequence.
"""),
    code('''
easy = run("easy", p=0.2, q=0.3)
summary("p=0.2, q=0.3, tied", easy)
report.kernel_figure(readout(easy))
'''),
    md("""
## 2. The unigram trap (p + q > 1)

On p = 0.5, q = 0.8 a tied model from the standard small initialisation sits on the unigram plateau
(H(pi) = 0.6663 against the entropy rate 0.6190): its learned P(1 | 0) is near pi_1 = 0.385 instead of p = 0.5.
Escaping the plateau takes hundreds of steps, if it happens at all.
"""),
    code('''
trapped = {seed: run(f"trap-seed{seed}", p=0.5, q=0.8, seed=seed) for seed in SEEDS}
for seed, result in trapped.items():
    summary(f"p=0.5, q=0.8, tied, seed {seed}", result)
print("pi_1 =", float(theory.stationary_distribution(trapped[SEEDS[0]].config.source.build().kernel)[1]))
'''),
    code('''
report.loss_curves_figure(trapped[SEEDS[0]].metrics, trapped[SEEDS[0]].final.references)
'''),
    md("""
## 3. Weight tying

Untie the output layer from the embedding and the bad minima become saddles: the same chain, the same seeds.
"""),
    code('''
untied = {seed: run(f"untied-seed{seed}", p=0.5, q=0.8, seed=seed, tie_weights=False) for seed in SEEDS}
for seed, result in untied.items():
    summary(f"p=0.5, q=0.8, untied, seed {seed}", result)
'''),
    md("""
## 4. Initialisation

The follow-up paper reduces the model to three scalars (e, w, b) under a low-rank "canonical" initialisation
and predicts the basin from the initial point: small inits with p + q > 1 go to the unigram minimum; w0 below
-1/sqrt(2) lands in the global basin. `landscape.predict_outcome` gives the prediction; `init="canonical"`
builds a model that starts exactly there.
"""),
    code('''
for w0 in (0.1, -1.0):
    print(f"w0 = {w0:+.1f}: predicted", landscape.predict_outcome(0.1, w0, p=0.5, q=0.8))
inits = {w0: run(f"canonical-w{w0}", p=0.5, q=0.8, init="canonical", canonical_e=0.1, canonical_w=w0)
         for w0 in (0.1, -1.0)}
for w0, result in inits.items():
    summary(f"canonical init w0={w0:+.1f}", result)
'''),
    code('''
# Where the canonical-init runs went, projected on the canonical landscape (checkpoints in order).
from markov_interp import models

fig = None
for w0, result in inits.items():
    states = [models.read_weights(path)[1] for _, path in report.checkpoint_files(result.out_dir)]
    traj = landscape.coordinates_trajectory(states, p=0.5, q=0.8)
    if fig is None:
        fig = landscape.plot_landscape(p=0.5, q=0.8, trajectory=traj)
    else:
        fig.axes[0].plot(traj.w, abs(traj.e), "w--", lw=1.2)
fig
'''),
    md("""
## 5. Precision

The reference code trains in fp16 autocast without loss scaling; the plateau's escape depends on it. Here the
same seed in fp32, fp16 without and with dynamic loss scaling (on a CPU, autocast fp16 is slow but exact to
the setting). Report fractions over seeds before concluding anything.
"""),
    code('''
for precision, scaling in (("fp32", False), ("fp16", False), ("fp16", True)):
    name = f"{precision}{'-scaled' if scaling else ''}"
    summary(name, run(f"precision-{name}", p=0.5, q=0.8, precision=precision, loss_scaling=scaling))
'''),
]


TWO = [
    md("""
# Two-layer models: the induction head forming on random kernels

When every sequence comes from a fresh random kernel there is nothing to store in the weights: the best
predictor estimates the kernel **in context** (the add-alpha count estimator). Two-layer attention-only models
learn it with a circuit: layer 0 becomes a **previous-token head**, layer 1 an **induction head** that
attends to positions whose previous state matches the current one and copies what followed
(Edelman et al. 2024; Makkuva et al.). This notebook trains one, looks for the two heads, checks them by
ablation and follows them over training.

The circuit forms abruptly after a plateau at the in-context *unigram* loss, and the plateau's length depends
on the settings. At the paper's learning rate (2e-3) a few hundred to ~1000 CPU steps of the
`attn-only-2layer` preset stay on it; the recipe below (3 states, short sequences of 32, batch 64, a constant
learning rate of 1e-2, 600 steps: about a minute on a CPU core) forms the circuit, and the package's probe tests
train exactly this. With `MARKOV_INTERP_QUICK=1` (CI) the run is far too short and sits on the plateau: the
probes and the report then say so.
"""),
    code(SETUP),
    code('''
from markov_interp import probes, report, theory
from markov_interp.data import SourceConfig
from markov_interp.models import preset
from markov_interp.training import RunConfig, TrainConfig, train

VOCAB = 3
STEPS, SEQ_LEN = (40, 32) if QUICK else (int(os.environ.get("MARKOV_INTERP_TWO_LAYER_STEPS", "600")), 32)
source_cfg = SourceConfig(kind="random", vocab=VOCAB, alpha=1.0)
source = source_cfg.build()
theory.reference_losses(source, SEQ_LEN)  # bayes_loss: the in-context optimum; entropy_rate: an oracle's
'''),
    code('''
run = RunConfig(
    source=source_cfg,
    model=preset("attn-only-2layer", d_vocab=VOCAB, n_ctx=SEQ_LEN),
    train=TrainConfig(steps=STEPS, seq_len=SEQ_LEN, batch_size=64, lr=1e-2, schedule="constant",
                      eval_every=max(STEPS // 10, 1), n_checkpoints=8, device="cpu"),
)
result = train(run, RUNS / "two-layer", progress=False)
report.loss_curves_figure(result.metrics, result.final.references)
'''),
    md("""
## The mechanism and the heads

Scores come with their chance level (uniform causal attention on the same tokens); the colour is the excess
over chance.
"""),
    code('''
mech = probes.classify_mechanism(result.model, source, n_sequences=16 if QUICK else 64, seed=0)
print("mechanism:", mech.mechanism, "| previous-token head:", mech.previous_token_head,
      "| induction head:", mech.induction_head, "| circuit confirmed:", mech.circuit_confirmed)
for reason in mech.reasons:
    print(" -", reason)
report.head_scores_figure(mech.attention)
'''),
    code('''
# Attention patterns on one sequence (circuitsvis, drawn offline; states as labels).
from markov_interp.probes.attention import attention_hook_names

tokens = probes.sample_batch(source, n_sequences=2, seq_len=min(SEQ_LEN, 40), seed=1).tokens
_, cache = result.model.run_with_cache(tokens, names_filter=attention_hook_names(result.model))
patterns = torch.stack([cache[name][0] for name in attention_hook_names(result.model)])
report.attention_patterns_figure(patterns, tokens[0])
'''),
    code('''
batch = probes.sample_batch(source, n_sequences=16 if QUICK else 64, seq_len=SEQ_LEN, seed=0)
report.ablation_figure(probes.ablation_table(result.model, batch.tokens, method="mean"), bigram_gain=mech.bigram_gain)
'''),
    code('''
report.position_loss_figure(mech.behaviour, mech.references)  # an in-context learner's loss falls along the sequence
'''),
    md("""
## Over training

The report re-runs the probes on the saved checkpoints: when the previous-token and induction scores rise,
and when the loss leaves the in-context unigram plateau.
"""),
    code('''
rep = report.build(RUNS / "two-layer", n_sequences=16 if QUICK else 64, max_checkpoints=3 if QUICK else 8)
rep.save()
rep.section("training")
'''),
]


LANDSCAPE = [
    md("""
# The canonical landscape

The follow-up paper ("Local to Global", arXiv 2406.03072) reduces a tied single-layer model on a binary chain to
three scalars: the embedding scale e, the signed MLP scale w and the output bias b. `markov_interp.landscape`
computes that loss, its critical points, the conserved quantity of gradient flow and the basin each
initialisation falls into, and projects real runs onto it.
"""),
    code(SETUP),
    code('''
import numpy as np

from markov_interp import landscape

P, Q = 0.5, 0.8  # p + q > 1: the unigram line is a local minimum for w > -1/sqrt(2)
print(landscape.reference_losses(P, Q))
print("loss on the unigram line:", float(landscape.canonical_loss(0.0, 0.3, landscape.unigram_bias(P, Q), p=P, q=Q)))
'''),
    md("""
## Gradient flow from two initialisations

A small init with w0 > -1/sqrt(2) slides to the unigram line; w0 = -1 crosses into the global basin.
"""),
    code('''
STEPS = 300 if QUICK else 3000
stuck = landscape.gradient_flow(0.1, 0.1, p=P, q=Q, steps=STEPS, lr=0.5)
escapes = landscape.gradient_flow(0.1, -1.0, p=P, q=Q, steps=STEPS, lr=0.5)
for name, traj in (("w0=+0.1", stuck), ("w0=-1.0", escapes)):
    print(f"{name}: final loss {traj.loss[-1]:.4f}, predicted",
          landscape.predict_outcome(traj.e[0], traj.w[0], p=P, q=Q))
fig = landscape.plot_landscape(p=P, q=Q, trajectory=escapes, n=61 if QUICK else 161)
fig.axes[0].plot(stuck.w, np.abs(stuck.e), "w--", lw=1.2)
fig
'''),
    md("""
## Regime maps

Which chains a given initialisation learns (tied vs untied), and which initialisations learn a given chain.
"""),
    code('''
N = 9 if QUICK else 41
tied = landscape.regime_map_pq(e0=0.1, w0=0.1, n=N)
untied = landscape.regime_map_pq(e0=0.1, w0=0.1, tied=False, a0=0.05, n=N)
landscape.plot_regime_map_pq(tied)
'''),
    code('''
landscape.plot_regime_map_pq(untied)
'''),
    code('''
init_map = landscape.regime_map_init(p=P, q=Q, n_w=11 if QUICK else 81, n_e=8 if QUICK else 50)
landscape.plot_regime_map_init(init_map)
'''),
    md("""
## A real run on the landscape

Train the actual transformer from a canonical initialisation and project its checkpoints onto (e, w, b).
"""),
    code('''
from markov_interp import models, report
from markov_interp.data import SourceConfig
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
landscape.plot_landscape(p=P, q=Q, trajectory=traj, n=61 if QUICK else 161)
'''),
]


def main(out: Path) -> None:
    out.mkdir(exist_ok=True)
    for name, cells in (("01_quickstart", QUICKSTART), ("02_single_layer", SINGLE), ("03_two_layer", TWO),
                        ("04_landscape", LANDSCAPE)):
        nb = notebook(cells)
        nbformat.validate(nb)
        nbformat.write(nb, out / f"{name}.ipynb")
        print("wrote", out / f"{name}.ipynb")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("notebooks"))
