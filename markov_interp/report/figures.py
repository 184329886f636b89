"""Figures of a run, from probe results: each function returns a matplotlib `Figure` (or a `CircuitsFigure`).

Nothing here computes a probe number: the numbers come from `markov_interp.probes` (and the reference losses
from `markov_interp.theory` via the run's metrics); these functions only draw them. Figures are made with
`matplotlib.figure.Figure` (no pyplot state, any backend); in Jupyter they display inline as usual, and
`markov_interp.report` inlines them into the HTML report as SVG.
"""

import math
from collections.abc import Mapping, Sequence
from typing import Any, Optional, Protocol, runtime_checkable

import numpy as np
import torch
from einops import rearrange
from jaxtyping import Float, Int
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle as _Rectangle
from torch import Tensor

from markov_interp.dynamics import FRACTIONS, MedianCurve, StepInterval, Survival
from markov_interp.probes._common import context_labels, state_labels
from markov_interp.theory import ReferenceLosses

from markov_interp import landscape
from markov_interp.report._html import CircuitsFigure, circuits_figure
from markov_interp.theory import format_loss

# Colours and labels of the reference losses (one place, so every figure says the same thing).
REFERENCE_STYLE = {
    "entropy_rate": ("entropy rate (bigram optimum)", "#2a7", "--"),
    "unigram_loss": ("unigram plateau (H(pi); random kernels: in-context unigram)", "#c33", ":"),
    "bayes_loss": ("in-context Bayes optimum", "#36c", "-."),
}


def _reference_lines(ax: Any, references: Mapping[str, float]) -> None:
    for key, (label, colour, style) in REFERENCE_STYLE.items():
        value = references.get(key)
        if value is not None and math.isfinite(value):
            text = format_loss(value, references.get(f"{key}_se"))  # with the standard error if it shows
            ax.axhline(value, color=colour, linestyle=style, linewidth=1.2, label=f"{label} {text}")


def _as_row(references: "Mapping[str, float] | ReferenceLosses") -> Mapping[str, float]:
    return references.as_row() if isinstance(references, ReferenceLosses) else references


def _need(value: Any, attrs: tuple[str, ...], what: str, figure: str) -> None:
    """A clear error when a figure gets something other than the probe result it draws."""
    if not all(hasattr(value, a) for a in attrs):
        raise ValueError(f"{figure} draws {what}, got {type(value).__name__}")


def loss_curves_figure(
    metrics: Sequence[Mapping[str, Any]],
    references: "Mapping[str, float] | ReferenceLosses",
    *,
    checkpoint_steps: Sequence[int] = (),
) -> Figure:
    """Training and evaluation loss (nats) over optimiser steps beside the reference losses.

    The unigram line is the plateau of a model that predicts pi whatever the context (the tied one-layer
    model's bad minimum); the entropy rate is the loss of the true kernel (the global optimum); for random
    kernels the in-context Bayes line is the best any model can do. Leaving the unigram plateau shows as the
    eval curve dropping off the red line. `references` is a `theory.ReferenceLosses` or its `as_row()` (as a
    run's metrics or `TrainResult.final.references` hold it).
    """
    references = _as_row(references)
    fig = Figure(figsize=(8, 4.2))
    ax = fig.add_subplot()
    train = [(r["step"], r["train_loss"]) for r in metrics if "train_loss" in r]
    evals = [(r["step"], r["eval_loss"]) for r in metrics if "eval_loss" in r]
    if train:
        ax.plot(*zip(*train), color="#888", linewidth=1, label="train loss")
    if evals:
        ax.plot(*zip(*evals), "o-", color="#222", markersize=3.5, linewidth=1.4, label="eval loss (fresh batches)")
    _reference_lines(ax, references)
    for i, step in enumerate(checkpoint_steps):
        ax.axvline(step, color="#bbb", linewidth=0.6, zorder=0, label="checkpoints" if i == 0 else None)
    ax.set_xlabel("optimiser step")
    ax.set_ylabel("loss (nats)")
    ax.set_title("Loss during training")
    if not train and not evals:
        ax.text(0.5, 0.5, "no metrics logged", transform=ax.transAxes, ha="center")
    _zoom_losses(ax, [v for _, v in train + evals], references)
    ax.legend(fontsize=8, loc="upper right")
    ax.grid(alpha=0.25)
    return fig


def _zoom_losses(ax: Any, values: Sequence[float], references: Mapping[str, float]) -> None:
    """y-limits around the reference lines and the late losses (the first steps are often far above)."""
    refs = [v for k, v in references.items() if k in REFERENCE_STYLE and v is not None and math.isfinite(v)]
    finite = [v for v in values if math.isfinite(v)]
    if not refs or not finite:
        return
    tail = finite[len(finite) // 5:] or finite
    low = min(min(refs), min(tail))
    high = max(max(refs), float(np.percentile(tail, 95)))
    pad = 0.15 * (high - low) + 0.01
    ax.set_ylim(low - pad, high + 2 * pad)


def position_loss_figure(behaviour: Any, references: "Mapping[str, float] | ReferenceLosses") -> Figure:
    """Loss (nats) of the prediction made at each position, averaged over the probe batch.

    `behaviour` is a `probes.BehaviourReport`. A model that learned the kernel in its weights is flat from
    the first position (as the true-kernel curve is); an in-context learner starts high and falls with the
    add-beta estimator as it sees more of the sequence (Olsson et al.'s in-context learning score).
    """
    _need(behaviour, ("loss_curve", "icl_score"), "a probes.BehaviourReport (e.g. mech.behaviour)",
          "position_loss_figure")
    references = _as_row(references)
    fig = Figure(figsize=(8, 3.8))
    ax = fig.add_subplot()
    curves = (
        ("model", behaviour.loss_curve, "#222", "-"),
        ("true kernel (oracle)", behaviour.kernel_loss_curve, "#2a7", "-"),
        (f"in-context add-beta (beta={behaviour.beta:g})", behaviour.add_beta_loss_curve, "#36c", "-"),
    )
    for label, curve, colour, style in curves:
        values = _smooth(np.asarray(curve.detach().cpu(), dtype=float))
        ax.plot(np.arange(len(values)), values, style, color=colour, linewidth=1.3, label=label)
    unigram = references.get("unigram_loss")
    if unigram is not None:  # random kernels: the in-context unigram estimator's loss, not E[H(pi)]
        name = "in-context unigram loss" if references.get("bayes_loss") is not None else "unigram loss H(pi)"
        ax.axhline(unigram, color="#c33", linestyle=":", linewidth=1.2, label=f"{name} {unigram:.4f}")
    ax.set_xlabel("position t (predicting x_{t+1})")
    ax.set_ylabel("loss (nats)")
    ax.set_title(f"Loss along the sequence (in-context learning score {behaviour.icl_score:+.4f} nats)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.25)
    return fig


def _smooth(values: np.ndarray, *, width: int = 5) -> np.ndarray:
    """A centred running mean (edges use what is there): per-position losses are noisy over a small batch."""
    if len(values) <= width:
        return values
    kernel = np.ones(width)
    sums = np.convolve(values, kernel, mode="same")
    counts = np.convolve(np.ones_like(values), kernel, mode="same")
    return sums / counts


def head_scores_figure(scores: Any) -> Figure:
    """Per-head previous-token, induction and same-token scores as [layer x head] heatmaps, against chance.

    `scores` is a `probes.AttentionScores`. Colour is the excess over chance, (score - chance) / (1 - chance):
    0 (white) is what uniform causal attention gets on the same tokens, 1 a head that attends only where the
    score looks. Each cell is annotated with the raw score. A two-layer in-context model shows a
    previous-token head in layer 0 and an induction head in layer 1.
    """
    _need(scores, ("previous_token", "excess"), "a probes.AttentionScores (e.g. mech.attention)", "head_scores_figure")
    names = (("previous_token", "previous-token"), ("induction", "induction"), ("same_token", "same-token"))
    n_layers, n_heads = scores.previous_token.shape
    fig = Figure(figsize=(3.2 * len(names) + 1.0, 0.55 * n_layers + 2.0))
    axes = fig.subplots(1, len(names))
    image = None
    for ax, (name, title) in zip(np.atleast_1d(axes), names):
        excess = scores.excess(name).detach().cpu().numpy()
        raw = getattr(scores, name).detach().cpu().numpy()
        chance = getattr(scores, f"{name}_chance")
        image = ax.imshow(excess, cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto")
        for layer in range(n_layers):
            for head in range(n_heads):
                ax.text(head, layer, f"{raw[layer, head]:.2f}", ha="center", va="center", fontsize=8,
                        color="white" if abs(excess[layer, head]) > 0.6 else "black")
        ax.set_title(f"{title}\n(chance {chance:.3f})", fontsize=10)
        ax.set_xticks(range(n_heads), [f"H{h}" for h in range(n_heads)])
        ax.set_yticks(range(n_layers), [f"L{layer}" for layer in range(n_layers)])
        ax.set_xlabel("head")
    np.atleast_1d(axes)[0].set_ylabel("layer")
    fig.colorbar(image, ax=list(np.atleast_1d(axes)), label="(score - chance) / (1 - chance)", shrink=0.9)
    return fig


def attention_patterns_figure(
    patterns: Float[Tensor, "layer head query_pos key_pos"] | Float[Tensor, "head query_pos key_pos"],
    tokens: Int[Tensor, "*one pos"] | Sequence[int] | Sequence[str],
    *,
    layer: Optional[int] = None,
) -> CircuitsFigure:
    """Every head's attention pattern on one sequence, drawn by circuitsvis ("AttentionHeads"), states as labels.

    Args:
        patterns: one sequence's patterns, as TransformerLens gives them: `cache["pattern", L][0]` ([head,
            query_pos, key_pos], one layer) or `cache.stack_activation("pattern")[:, 0]` ([layer, head, query_pos,
            key_pos]).
        tokens: the sequence's states ([pos], or [1, pos]), or their labels (`probes.state_labels(tokens)`).
        layer: the layer of a [head, query_pos, key_pos] pattern (names the heads "L{layer}H{h}"; default "H{h}").

    Returns:
        A `CircuitsFigure` (displays in Jupyter; the report inlines it). A previous-token head is a bright line
        just below the diagonal; an induction head lights the keys that followed earlier visits to the current
        state.

    >>> uniform = torch.ones(3, 3).tril() / torch.arange(1, 4)[:, None]
    >>> fig = attention_patterns_figure(uniform[None, None], torch.tensor([0, 1, 1]))
    >>> fig.component, fig.props["tokens"], fig.props["attentionHeadNames"]
    ('AttentionHeads', ['0', '1', '1'], ['L0H0'])
    >>> attention_patterns_figure(uniform[None], torch.tensor([0, 1, 1]), layer=1).props["attentionHeadNames"]
    ['L1H0']
    """
    patterns, names = _patterns_by_head(patterns, layer)
    if isinstance(tokens, Tensor) and tokens.ndim == 2 and tokens.shape[0] != 1:
        raise ValueError(f"tokens must be one sequence ([pos] or [1, pos]), got shape {tuple(tokens.shape)}: "
                         "pick the sequence the patterns are of, e.g. tokens[0]")
    labels = tokens if _is_labels(tokens) else state_labels(tokens)
    n_query, n_key = patterns.shape[-2:]
    if len(labels) != n_query or n_query != n_key:
        raise ValueError(f"patterns of shape {tuple(patterns.shape)} do not match {len(labels)} tokens: expected "
                         "[head, pos, pos] or [layer, head, pos, pos] for one sequence of pos states")
    return circuits_figure(
        "AttentionHeads",
        {
            "attention": patterns,
            "tokens": list(labels),
            "attentionHeadNames": names,
            "maskUpperTri": True,
            "maxValue": 1.0,
            "minValue": 0.0,
        },
        digits=3,
    )


def _is_labels(tokens: Any) -> bool:
    return isinstance(tokens, (list, tuple)) and bool(tokens) and all(isinstance(t, str) for t in tokens)


def _patterns_by_head(patterns: Any, layer: Optional[int]) -> tuple[Tensor, list[str]]:
    """[(layer head), query_pos, key_pos] patterns and the heads' names, from a 3-D or 4-D pattern tensor."""
    if not isinstance(patterns, Tensor) or patterns.ndim not in (3, 4) or not patterns.is_floating_point():
        shape = tuple(patterns.shape) if isinstance(patterns, Tensor) else type(patterns).__name__
        raise ValueError(
            f"patterns must be a float tensor [head, query_pos, key_pos] (cache['pattern', layer][0]) or [layer, "
            f"head, query_pos, key_pos] (cache.stack_activation('pattern')[:, 0]), got {shape}; for a batch pick "
            "one sequence")
    flat = patterns.detach().float().cpu()
    if flat.ndim == 3:
        prefix = "" if layer is None else f"L{layer}"
        return flat, [f"{prefix}H{head}" for head in range(flat.shape[0])]
    if layer is not None:
        raise ValueError(f"layer={layer} only names the heads of a one-layer [head, query_pos, key_pos] pattern")
    n_layers, n_heads = flat.shape[:2]
    names = [f"L{lay}H{head}" for lay in range(n_layers) for head in range(n_heads)]
    return rearrange(flat, "layer head query_pos key_pos -> (layer head) query_pos key_pos"), names


def ablation_figure(table: Any, *, bigram_gain: Optional[float] = None) -> Figure:
    """Loss change (nats) when each head, attention layer or MLP is ablated alone, as horizontal bars.

    `table` is a `probes.AblationTable`. Large bars mark the components the prediction relies on; for an
    induction circuit, ablating either head of the circuit should cost a large part of the bigram gain
    (dashed line: what the model gains over the in-context unigram estimator by looking at x_t).
    """
    _need(table, ("names", "loss_change"), "a probes.AblationTable (e.g. mech.ablation)", "ablation_figure")
    names = list(table.names)
    changes = [float(c) for c in table.loss_change]
    fig = Figure(figsize=(7.5, 0.38 * len(names) + 1.6))
    ax = fig.add_subplot()
    colours = ["#36c" if n[-1].isdigit() else ("#c73" if n.endswith("mlp") else "#7a4") for n in names]
    y = np.arange(len(names))
    ax.barh(y, changes, color=colours)
    ax.set_yticks(y, names)
    ax.invert_yaxis()
    ax.axvline(0, color="#444", linewidth=0.8)
    if bigram_gain is not None and math.isfinite(bigram_gain) and bigram_gain > 0:
        ax.axvline(bigram_gain, color="#c33", linestyle="--", linewidth=1, label=f"bigram gain {bigram_gain:.4f}")
        ax.legend(fontsize=8)
    for yi, change in zip(y, changes):
        ax.text(change, yi, f" {change:+.4f}", va="center", ha="left" if change >= 0 else "right", fontsize=8)
    ax.set_xlabel(f"loss change when ablated ({table.method} ablation; clean loss {table.clean_loss:.4f} nats)")
    ax.set_title("Ablations: heads (blue), attention layers (green), MLPs (orange)")
    ax.margins(x=0.25)
    ax.grid(alpha=0.25, axis="x")
    return fig


def _context_labels(n_contexts: int, vocab: int) -> list[str]:
    order = max(1, round(math.log(n_contexts, vocab))) if vocab > 1 else 1
    return context_labels(vocab, order)


def kernel_figure(readout: Any) -> Figure:
    """The transition matrix implied by the model's predictions beside the true kernel (a `probes.KernelReadout`).

    Rows are the current context (last `order` states), columns the next state. A model that learned the
    kernel reproduces the true matrix; one stuck at the unigram solution has every row equal to pi. For a
    random-kernel source there is no single true kernel; the implied matrix is then the model's average
    prediction per context (near the mean kernel for an in-context learner).
    """
    _need(readout, ("implied", "true"), "a probes.KernelReadout (e.g. mech.readout)", "kernel_figure")
    implied = readout.implied.detach().cpu().numpy()
    mats = [("model (implied)", implied)]
    if readout.true is not None:
        mats.append(("true kernel", readout.true.detach().cpu().numpy()))
        mats.append(("model - true", implied - mats[1][1]))
    n_ctx, vocab = implied.shape
    labels = _context_labels(n_ctx, vocab)
    fig = Figure(figsize=(3.3 * len(mats) + 0.5, 0.45 * n_ctx + 2.2), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(mats)))
    for ax, (title, mat) in zip(axes, mats):
        diff = title.startswith("model -")
        lim = max(float(np.nanmax(np.abs(mat))), 0.1) if diff else 1.0  # differences below 0.1 stay pale
        ax.imshow(mat, cmap="RdBu_r" if diff else "Blues", vmin=-lim if diff else 0, vmax=lim, aspect="auto")
        for i in range(n_ctx):
            for j in range(vocab):
                value = mat[i, j]
                text = "n/a" if not math.isfinite(value) else (f"{value:+.3f}" if diff else f"{value:.3f}")
                dark = math.isfinite(value) and abs(value) > 0.6 * lim
                ax.text(j, i, text, ha="center", va="center", fontsize=9, color="white" if dark else "black")
        ax.set_title(title, fontsize=10)
        ax.set_xticks(range(vocab), [str(v) for v in range(vocab)])
        ax.set_yticks(range(n_ctx), labels)
        ax.set_xlabel("next state")
    axes[0].set_ylabel("current context")
    if readout.max_abs_error is not None:
        fig.suptitle(f"Kernel readout: max |error| {readout.max_abs_error:.4f}, pi-weighted KL "
                     f"{readout.weighted_kl:.5f} nats", fontsize=10)
    else:
        fig.suptitle("Kernel readout (random kernels: model's mean prediction per context)", fontsize=10)
    return fig


def in_context_tracking_figure(
    model_probs: Float[Tensor, "pos vocab"],
    add_beta_probs: Float[Tensor, "pos vocab"],
    kernel: Float[Tensor, "state next_state"],
    tokens: Int[Tensor, " pos"],
) -> Figure:
    """On one sequence of a random-kernel source: the model's P(next = (i+1) mod V | current = i) at the
    positions where the current state is i, beside that sequence's true kernel entry and the in-context
    add-beta estimate. An induction circuit follows the add-beta curve towards the true value; a model that
    stored one kernel in its weights stays flat.
    """
    vocab = kernel.shape[1]
    fig = Figure(figsize=(8, 3.8))
    ax = fig.add_subplot()
    colours = ["#36c", "#c33", "#2a7", "#a5c", "#c73", "#555"]
    tok = tokens.detach().cpu()
    for i in range(min(vocab, len(colours))):
        j = (i + 1) % vocab
        where = torch.nonzero(tok == i).flatten().numpy()
        if len(where) == 0:
            continue
        colour = colours[i]
        ax.plot(where, model_probs[where, j].detach().cpu().numpy(), "o-", color=colour, markersize=2.5,
                linewidth=1.2, label=f"model P({j}|{i})")
        ax.plot(where, add_beta_probs[where, j].detach().cpu().numpy(), ":", color=colour, linewidth=1.2,
                label=f"add-beta P({j}|{i})")
        ax.axhline(float(kernel[i, j]), color=colour, linestyle="--", linewidth=0.9, alpha=0.7,
                   label=f"true P({j}|{i}) = {float(kernel[i, j]):.3f}")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("position t")
    ax.set_ylabel("predicted probability")
    ax.set_title("In-context estimation on one sequence")
    ax.legend(fontsize=7, ncol=3)
    ax.grid(alpha=0.25)
    return fig


def training_probes_figure(
    steps: Sequence[int],
    series: Mapping[str, Sequence[float]],
    *,
    metrics: Sequence[Mapping[str, Any]] = (),
    references: Optional[Mapping[str, float]] = None,
    head_threshold: Optional[float] = None,
    events: Optional[Mapping[str, int]] = None,
) -> Figure:
    """Probe scores at each saved checkpoint (top) and the eval loss with its references (bottom).

    `series` maps a label (e.g. "previous-token excess, L0H0") to one value per checkpoint step, as computed
    by `markov_interp.probes` on each checkpoint. Shows when the induction head forms and when the loss leaves
    the unigram plateau, on a shared step axis; `events` ({label: step}) are marked on both panels.
    """
    fig = Figure(figsize=(8, 6))
    top, bottom = fig.subplots(2, 1, sharex=True)
    for label, values in series.items():
        top.plot(list(steps), [float(v) for v in values], "o-", markersize=3.5, linewidth=1.3, label=label)
    if head_threshold is not None:
        top.axhline(head_threshold, color="#999", linestyle="--", linewidth=0.9,
                    label=f"head threshold {head_threshold:g}")
    top.axhline(0, color="#444", linewidth=0.6)
    top.set_ylabel("score")
    top.set_title("Probe scores over training (checkpoints)")
    top.legend(fontsize=8)
    top.grid(alpha=0.25)
    evals = [(r["step"], r["eval_loss"]) for r in metrics if "eval_loss" in r]
    train = [(r["step"], r["train_loss"]) for r in metrics if "train_loss" in r]
    if train:
        bottom.plot(*zip(*train), color="#888", linewidth=1, label="train loss")
    if evals:
        bottom.plot(*zip(*evals), "o-", color="#222", markersize=3, linewidth=1.3, label="eval loss")
    for i, (label, step) in enumerate((events or {}).items()):
        colour = ("#a5c", "#c73", "#555")[i % 3]
        for ax in (top, bottom):
            ax.axvline(step, color=colour, linestyle="-.", linewidth=1.1, label=f"{label} (step {step})"
                       if ax is bottom else None)
    references = references or {}
    _reference_lines(bottom, references)
    _zoom_losses(bottom, [v for _, v in train + evals], references)
    for step in steps:
        bottom.axvline(step, color="#ccc", linewidth=0.6, zorder=0)
    if len(steps) and min(steps) > 0:
        bottom.set_xscale("log")
        bottom.set_xlim(left=min(steps) / 1.3)
    bottom.set_xlabel("optimiser step (log scale)")
    bottom.set_ylabel("loss (nats)")
    bottom.legend(fontsize=8)
    bottom.grid(alpha=0.25)
    return fig


def strategy_similarity_figure(
    steps: Sequence[int],
    divergences: Mapping[str, Sequence[float]],
    *,
    events: Optional[Mapping[str, int]] = None,
) -> Figure:
    """Mean KL(strategy || model) at each saved checkpoint, one line per strategy (Edelman et al. 2024).

    `divergences` maps a strategy label (e.g. "in-context unigram") to one value per checkpoint step, as
    computed by `markov_interp.probes.strategy_similarity` on each checkpoint. The lowest line at a step is the
    strategy the model is closest to there: on random kernels the phases uniform -> in-context unigram ->
    in-context bigram read off as the lines crossing. `events` ({label: step}) are marked as vertical lines.
    """
    fig = Figure(figsize=(8, 3.6))
    ax = fig.subplots()
    for label, values in divergences.items():
        ax.plot(list(steps), [float(v) for v in values], "o-", markersize=3.5, linewidth=1.3, label=label)
    for i, (label, step) in enumerate((events or {}).items()):
        ax.axvline(step, color=("#a5c", "#c73", "#555")[i % 3], linestyle="-.", linewidth=1.1,
                   label=f"{label} (step {step})")
    if len(steps) and min(steps) > 0:
        ax.set_xscale("log")
        ax.set_xlim(left=min(steps) / 1.3)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("optimiser step (log scale)")
    ax.set_ylabel("mean KL(strategy || model), nats")
    ax.set_title("Distance to each prediction strategy over training (lowest = closest)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.25)
    return fig


# ---------------------------------------------------------------------------------------------------------------
# the canonical landscape (markov_interp.landscape): regime maps and the b-profiled loss
# ---------------------------------------------------------------------------------------------------------------

_OUTCOME_COLOURS = ("#d9a441", "#3b7dbf")  # unigram, bigram


def _new_axes(ax: Any, figsize: tuple[float, float]) -> tuple[Any, Any]:
    if ax is not None:
        return ax.figure, ax
    fig = Figure(figsize=figsize, layout="constrained")
    return fig, fig.add_subplot()


def _draw_outcomes(ax: Any, rmap: landscape.RegimeMap) -> None:
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    ax.pcolormesh(rmap.x, rmap.y, rmap.bigram.astype(float), cmap=ListedColormap(_OUTCOME_COLOURS), vmin=0,
                  vmax=1, shading="nearest", rasterized=True)  # a raster: the grid as vector art is megabytes
    ax.set_xlabel(rmap.x_label)
    ax.set_ylabel(rmap.y_label)
    handles = [Patch(color=_OUTCOME_COLOURS[1], label="bigram (learns the kernel)"),
               Patch(color=_OUTCOME_COLOURS[0], label="unigram (stuck at H(pi))")]
    ax.legend(handles=handles, loc="upper right", fontsize="small", framealpha=0.9)


def regime_map_pq_figure(rmap: landscape.RegimeMap, *, ax: Any = None) -> Figure:
    """A (p, q) regime map (`landscape.regime_map_pq`) with the theory's boundary p + q = 1 drawn dashed."""
    if rmap.kind != "pq":
        raise ValueError(f"expected a regime map of kind 'pq', got kind {rmap.kind!r}")
    fig, ax = _new_axes(ax, (5.2, 4.6))
    _draw_outcomes(ax, rmap)
    ax.plot([0, 1], [1, 0], "k--", lw=1.2, label="p + q = 1")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_aspect("equal")
    s = rmap.settings
    ax.set_title(f"{'tied' if rmap.tied else 'untied'}: init e0={s['e0']:g}, w0={s['w0']:g}", fontsize="medium")
    return fig


def regime_map_init_figure(rmap: landscape.RegimeMap, *, ax: Any = None) -> Figure:
    """An init-plane regime map (`landscape.regime_map_init`) with the b-profiled theory's separatrix and the
    line w0 = -1/sqrt(2) (tied)."""
    if rmap.kind != "init":
        raise ValueError(f"expected a regime map of kind 'init', got kind {rmap.kind!r}")
    fig, ax = _new_axes(ax, (6.0, 4.2))
    _draw_outcomes(ax, rmap)
    if rmap.tied:
        ws = np.linspace(rmap.x.min(), min(rmap.x.max(), -1e-3), 400)
        ax.plot(ws, landscape.separatrix(ws), "k--", lw=1.2, label="separatrix E = -h*")
        ax.axvline(landscape.W_SADDLE, color="k", lw=0.8, ls=":")
        ax.set_ylim(rmap.y.min(), rmap.y.max())
    s = rmap.settings
    ax.set_title(f"{'tied' if rmap.tied else 'untied'}: p={s['p']:g}, q={s['q']:g}, b0={s['b0']}",
                 fontsize="medium")
    return fig


def landscape_figure(*, p: float, q: float, w_range: tuple[float, float] = (-2.5, 1.5),
                     e_range: tuple[float, float] = (0.0, 2.5), n: int = 161,
                     trajectory: Optional[landscape.Trajectory] = None, ax: Any = None) -> Figure:
    """The b-profiled canonical loss minus the entropy rate over (w, e) (`landscape.profile_loss`), with the
    global-minimum curve, the unigram line, the saddle at w = -1/sqrt(2) and optionally a `landscape.Trajectory`
    (a run's `coordinates_trajectory` over checkpoints, or `gradient_flow`) drawn on it."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ValueError(f"n must be an integer >= 2, got {n!r}")
    refs = landscape.reference_losses(p, q)  # checks p and q
    ws = np.linspace(float(w_range[0]), float(w_range[1]), n)
    es = np.linspace(float(e_range[0]), float(e_range[1]), n)
    ww, ee = np.meshgrid(ws, es)
    excess = np.maximum(landscape.profile_loss(ee, ww, p=p, q=q) - refs["entropy_rate"], 1e-12)
    fig, ax = _new_axes(ax, (6.0, 4.2))
    mesh = ax.pcolormesh(ws, es, np.log10(excess), shading="nearest", cmap="viridis", rasterized=True)
    fig.colorbar(mesh, ax=ax, label="log10(loss - entropy rate), b optimal")
    unigram_excess = refs["unigram_loss"] - refs["entropy_rate"]
    if unigram_excess > 0:
        ax.contour(ws, es, excess, levels=[unigram_excess], colors="w", linewidths=0.8, linestyles=":")
    ax.plot(ws, landscape.bigram_minima(ws, p=p, q=q).e, color="r", lw=1.5, label="global minima")
    ax.axhline(0.0, color="orange", lw=2, label="unigram line")
    ax.plot([landscape.W_SADDLE], [0.0], "kx", ms=8, label="saddle w = -1/sqrt(2)")
    if trajectory is not None:
        ax.plot(trajectory.w, np.abs(trajectory.e), "w-", lw=1.2, label="trajectory")
        ax.plot(trajectory.w[:1], np.abs(trajectory.e[:1]), "wo", ms=4)
    ax.set_xlim(ws[0], ws[-1])
    ax.set_ylim(es[0], es[-1])
    ax.set_xlabel("w (MLP scale)")
    ax.set_ylabel("|e| (embedding scale)")
    ax.set_title(f"canonical landscape, p={float(p):g}, q={float(q):g}", fontsize="medium")
    ax.legend(loc="upper right", fontsize="small")
    return fig


def separatrix_figure(w0: Sequence[float], escaped: Mapping[str, Sequence[float]], *, boundary: float,
                      title: str = "") -> Figure:
    """The escaped fraction against w0 for each arm of the experiment `reduction` (one line per arm), with the
    flow's separatrix as a vertical line."""
    fig = Figure(figsize=(7.5, 4.2))
    ax = fig.add_subplot()
    for i, (name, values) in enumerate(escaped.items()):
        ax.plot(list(w0), list(values), marker="o", ms=3, lw=1.4 if i > 1 else 2.2,
                ls="--" if i < 2 else "-", label=name)
    ax.axvline(boundary, color="k", lw=0.8, ls=":", label=f"flow separatrix {boundary:.3f}")
    ax.set_xlabel("w0 (canonical init)")
    ax.set_ylabel("fraction escaped (0.5 line)")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title(title, fontsize="medium")
    ax.legend(fontsize="x-small", ncol=2)
    return fig


def paths_on_landscape_figure(paths: Mapping[str, Sequence[np.ndarray]], flows: Sequence[landscape.Trajectory], *,
                              p: float, q: float, columns: int = 4) -> Figure:
    """Runs' (e, w, b) paths (arrays [checkpoint, 3]) in the (w, |e|) plane, one panel per arm (small multiples on
    shared axes), each with gradient flow's paths from the same inits (black), the global-minimum curve (red),
    the unigram line and the saddle w = -1/sqrt(2)."""
    every = [x for pts in paths.values() for x in pts] + [f.points for f in flows]
    w_lo = float(min(x[:, 1].min() for x in every)) - 0.1
    w_hi = float(max(x[:, 1].max() for x in every)) + 0.1
    e_hi = float(max(np.abs(x[:, 0]).max() for x in every)) * 1.1 + 0.05
    n = max(len(paths), 1)
    rows = math.ceil(n / columns)
    fig = Figure(figsize=(3.0 * min(n, columns), 2.6 * rows + 0.4))
    axes = fig.subplots(rows, min(n, columns), sharex=True, sharey=True, squeeze=False).ravel()
    ws = np.linspace(w_lo, w_hi, 200)
    minima = landscape.bigram_minima(ws, p=p, q=q).e
    for k, (ax, (name, pts)) in enumerate(zip(axes, paths.items())):
        ax.plot(ws, minima, color="r", lw=1.0)
        ax.axhline(0.0, color="orange", lw=1.5)
        ax.plot([landscape.W_SADDLE], [0.0], "kx", ms=6)
        for f in flows:
            ax.plot(f.w, np.abs(f.e), color="k", lw=1.6)
        for x in pts:
            ax.plot(x[:, 1], np.abs(x[:, 0]), color=f"C{k % 10}", lw=1.0, marker=".", ms=3)
        ax.set_title(name, fontsize="small")
        ax.set_xlim(w_lo, w_hi)
        ax.set_ylim(0.0, e_hi)
    for ax in axes[len(paths):]:
        ax.set_visible(False)
    fig.supxlabel("w (MLP scale)", fontsize="small")
    fig.supylabel("|e| (embedding scale)", fontsize="small")
    fig.suptitle(f"(e, w) paths against gradient flow (black), p={float(p):g}, q={float(q):g}", fontsize="medium")
    return fig


# ---------------------------------------------------------------------------------------------------------------
# the reproduction (markov_interp.reproduce): fractions stuck, depth, mechanisms, initialisation and precision
# ---------------------------------------------------------------------------------------------------------------


@runtime_checkable
class ConditionRow(Protocol):
    """What the reproduction's figures read of one condition's summary (`reproduce.ConditionSummary`)."""

    p: Optional[float]
    q: Optional[float]
    tied: Optional[bool]
    init: Optional[str]
    precision: Optional[str]
    budget: int  # training steps
    n_runs: int  # runs with a known escape
    n_censored: int
    median_escape: Optional[int]
    median_escape_ci: Optional[tuple[int, Optional[int]]]
    censored_ci: Optional[tuple[float, float]]
    stuck_fraction: Optional[float]
    theory: Optional[str]


def reproduction_phase_figure(panels: Mapping[str, Sequence[ConditionRow]], values: Sequence[float]) -> Figure:
    """The (p, q) square, one panel per setting ({title: conditions}), each cell coloured by the fraction of
    seeds stuck at the unigram loss, with the theory's boundary p + q = 1 and its predicted unigram cells (x).

    A condition's `p`, `q`, `stuck_fraction` (None: no finished seed) and `theory` (`landscape.predict_outcome`)
    are drawn; `values` are the grid's p (= q) values, which size the cells.
    """
    from matplotlib import colormaps
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize
    from matplotlib.patches import Rectangle

    fig = Figure(figsize=(10.5, 4.6))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    step = min((b - a for a, b in zip(values, values[1:])), default=0.2)
    cmap, norm = colormaps["coolwarm"], Normalize(0, 1)
    for ax, (title, rows) in zip(axes, panels.items()):
        ax.set_facecolor("#f4f4f4")
        for r in rows:
            frac, x, y = r.stuck_fraction, r.p, r.q
            colour = "#bbbbbb" if frac is None else cmap(norm(frac))
            ax.add_patch(Rectangle((x - step / 2, y - step / 2), step, step, facecolor=colour, edgecolor="white"))
            ax.annotate("n/a" if frac is None else f"{frac:.2f}", (x, y), ha="center", va="center", fontsize=8)
            if r.theory == "unigram":
                ax.plot([x], [y - step * 0.3], marker="x", color="black", markersize=5, ls="none")
        ax.plot([0, 1], [1, 0], color="black", lw=1.5, ls="--", label="theory boundary p + q = 1")
        ax.plot([], [], marker="x", color="black", ls="none", label="landscape predicts unigram")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_aspect("equal")
        ax.set_xlabel("p = P(1 | 0)")
        ax.set_ylabel("q = P(0 | 1)")
        ax.set_title(f"{title}: fraction of seeds stuck at H(pi)", fontsize=9)
        ax.text(0.98, 0.98, "p + q > 1", ha="right", va="top", transform=ax.transAxes, fontsize=8)
        ax.text(0.02, 0.02, "p + q < 1", ha="left", va="bottom", transform=ax.transAxes, fontsize=8)
    axes[0].legend(loc="upper left", fontsize=7, framealpha=0.9)
    fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=list(axes), shrink=0.8, label="fraction stuck")
    return fig


def reproduction_depth_figure(curves: Mapping[int, Sequence[tuple[Sequence[int], Sequence[float]]]],
                              references: Mapping[str, float], *, p: float, q: float) -> Figure:
    """Training loss against step for each depth ({n_layers: [(steps, losses) per seed]}, each seed a thin
    line), with the unigram loss and the entropy rate (`references`, may be empty)."""
    fig = Figure(figsize=(6.5, 4.2))
    ax = fig.subplots()
    colours = ["tab:red", "tab:blue", "tab:green", "tab:purple", "tab:orange"]
    for colour, (n, seeds) in zip(colours, sorted(curves.items())):
        for i, (steps, losses) in enumerate(seeds):
            ax.plot(list(steps), list(losses), color=colour, lw=0.9, alpha=0.8,
                    label=f"{n} layer{'s' if n > 1 else ''}" if i == 0 else None)
    if references:
        rate, unigram = references["entropy_rate"], references["unigram_loss"]
        ax.axhline(unigram, color="grey", ls="--", lw=1, label=f"unigram loss H(pi) = {unigram:.4f}")
        ax.axhline(rate, color="black", ls=":", lw=1, label=f"entropy rate = {rate:.4f}")
        ax.set_ylim(rate - 0.02, unigram + 0.04)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (nats, mean of 10 steps)")
    ax.set_title(f"depth at p = {p}, q = {q} (tied)")
    if ax.lines:
        ax.legend(fontsize=7)
    return fig


_MECHANISM_COLOURS = {"uniform": "lightgrey", "unigram": "tab:red", "in_context_unigram": "tab:orange",
                      "state_and_counts": "gold",
                      "kernel": "tab:blue", "induction": "tab:green", "other": "tab:purple", "?": "grey"}


def reproduction_mechanism_figure(panels: Mapping[str, Sequence[tuple[str, Mapping[str, int]]]]) -> Figure:
    """Counts of the classified mechanism by depth, one panel per setting ({title: [(n_layers label,
    {mechanism: seeds})]}), stacked bars coloured by `probes.classify_mechanism`'s label ("?": not probed)."""
    fig = Figure(figsize=(9, 3.8))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (title, bars) in zip(axes, panels.items()):
        labels = [label for label, _ in bars]
        bottom = [0] * len(bars)
        for mech, colour in _MECHANISM_COLOURS.items():
            counts = [int(counts.get(mech, 0)) for _, counts in bars]
            if any(counts):
                ax.bar(labels, counts, bottom=bottom, color=colour, label=mech)
                bottom = [b + c for b, c in zip(bottom, counts)]
        ax.set_xlabel("layers")
        ax.set_ylabel("seeds")
        ax.yaxis.get_major_locator().set_params(integer=True)
        ax.set_title(f"mechanism by depth: {title}", fontsize=9)
        ax.legend(fontsize=7)
    return fig


_COLOURS = ["tab:blue", "tab:red", "tab:green", "tab:purple", "tab:orange", "tab:brown", "tab:grey", "tab:pink",
            "tab:olive", "tab:cyan"]


def _draw_survival(ax: Any, curve: Survival, colour: str, label: str) -> None:
    """A survival curve as a step function dropping at each interval's `by` step, up to the last step it is
    known at, with its pointwise band where it has one (none on mixed grids or below `dynamics.MIN_RUNS` runs;
    a gap where the band is undefined, at S = 0)."""
    xs = [0, *curve.times, max(curve.last, *curve.times, 0)]
    end = curve.survival[-1] if curve.survival else 1.0
    ax.step(xs, [1.0, *curve.survival, end], where="post", color=colour, lw=1.4, label=f"{label} (n = {curve.n})")
    if curve.lower is not None and curve.upper is not None:
        lo_end = curve.lower[-1] if curve.lower else 1.0
        hi_end = curve.upper[-1] if curve.upper else 1.0
        ax.fill_between(xs, [1.0, *curve.lower, lo_end], [1.0, *curve.upper, hi_end], step="post", color=colour,
                        alpha=0.15, lw=0)


def escape_survival_figure(panels: Mapping[str, Mapping[str, Survival]],
                           *, budget: "int | Mapping[str, int]") -> Figure:
    """Survival of the escape crossing, one panel per experiment ({title: {condition: `dynamics.Survival`}}):
    the fraction of seeds that have not escaped by each step, with its 95% band. A curve that ends above zero
    is the censored fraction (seeds without a confirmed escape when training stopped). `budget`: the training
    steps, one for all panels or {title: steps}."""
    fig = Figure(figsize=(5.2 * max(len(panels), 1), 4.0))
    axes = fig.subplots(1, max(len(panels), 1), squeeze=False)[0]
    for ax, (title, curves) in zip(axes, panels.items()):
        steps = budget if isinstance(budget, int) else budget[title]
        for colour, (label, curve) in zip(_COLOURS, curves.items()):
            _draw_survival(ax, curve, colour, label)
        ax.set_xlim(0, steps)
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("step")
        ax.set_ylabel("fraction of seeds not yet escaped")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    return fig


def crossing_survival_figure(conditions: Mapping[str, Mapping[float, Survival]], *,
                             budget: Optional[int] = None, title: str = "") -> Figure:
    """Survival of the crossing at each line, one panel per fraction of the plateau's excess left
    ({condition: {fraction: `dynamics.Survival`}}, e.g. `ConditionDynamics.survival`): where conditions differ
    at one line and not at another, the escape time depends on its threshold."""
    fractions = sorted({f for per in conditions.values() for f in per}, reverse=True)
    fig = Figure(figsize=(3.6 * max(len(fractions), 1), 3.6))
    axes = fig.subplots(1, max(len(fractions), 1), squeeze=False, sharey=True)[0]
    for ax, fraction in zip(axes, fractions):
        for colour, (label, per) in zip(_COLOURS, conditions.items()):
            if fraction in per:
                _draw_survival(ax, per[fraction], colour, label)
        if budget is not None:
            ax.set_xlim(0, budget)
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("step")
        ax.set_title(f"crossing {fraction:g} of the plateau excess left", fontsize=9)
    axes[0].set_ylabel("fraction of seeds not yet crossed")
    axes[-1].legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def _finite(values: Sequence[float]) -> list[float]:
    """A diverged run's inf is left out of a drawing (nan)."""
    return [x if math.isfinite(x) else math.nan for x in values]


def _draw_excess_curves(ax: Any, curves: Mapping[str, MedianCurve], fractions: Sequence[float]) -> None:
    for colour, (label, m) in zip(_COLOURS, curves.items()):
        ax.plot(m.steps, _finite(m.median), color=colour, lw=1.5, label=f"{label} (median of {m.n})")
        ax.fill_between(m.steps, _finite(m.lower), _finite(m.upper), color=colour, alpha=0.15, lw=0)
    for f in fractions:
        ax.axhline(f, color="grey", ls=":", lw=0.8)
    top = max([1.05, *(x for m in curves.values() for x in m.upper if math.isfinite(x))])
    ax.set_ylim(min(-0.05, *(x for m in curves.values() for x in m.lower if math.isfinite(x))), min(top, 2.0))
    ax.set_xlabel("step")


def excess_curves_figure(curves: Mapping[str, MedianCurve], *, fractions: Sequence[float] = FRACTIONS,
                         title: str = "") -> Figure:
    """Median excess curves with their bands across seeds, one per condition ({condition:
    `dynamics.MedianCurve`}): the fraction of the plateau's excess left at each evaluation (1: on the plateau,
    0: at the true law), with the lines at `fractions` dotted. A second plateau shows as a flat stretch."""
    fig = Figure(figsize=(6.4, 4.0))
    ax = fig.subplots()
    _draw_excess_curves(ax, curves, fractions)
    ax.set_ylabel("fraction of the plateau excess left")
    bands = ", ".join(sorted({f"{m.band[0]:g}-{m.band[1]:g}" for m in curves.values()}))
    ax.set_title((title + "\n" if title else "") + f"excess over the true law relative to the plateau's (bands: the "
                 f"seeds' {bands} quantiles)", fontsize=9)
    ax.legend(fontsize=7)
    return fig


def excess_curves_panels_figure(panels: Mapping[str, Mapping[str, MedianCurve]], *,
                                fractions: Sequence[float] = FRACTIONS, columns: int = 3, title: str = "") -> Figure:
    """`excess_curves_figure` for several groups of conditions, one panel each ({panel title: {condition:
    `dynamics.MedianCurve`}}), `columns` panels per row, one y scale."""
    n = max(len(panels), 1)
    cols = min(columns, n)
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(4.6 * cols, 3.4 * rows))
    axes = fig.subplots(rows, cols, squeeze=False, sharey=True)
    for ax, (name, curves) in zip(axes.flat, panels.items()):
        _draw_excess_curves(ax, curves, fractions)
        ax.set_title(name, fontsize=9)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel("fraction of the plateau excess left")
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


SCORES_OVER_TRAINING = {"previous_token": "layer 0 previous-token", "induction": "layer 1 induction",
                        "same_token": "layer 1 same-token"}


def scores_over_training_figure(arms: Mapping[str, Sequence[Any]], *,
                                scores: Mapping[str, str] = SCORES_OVER_TRAINING, title: str = "") -> Figure:
    """Attention scores over training: one panel per score, one line per arm (the mean over seeds at each scored
    step, its bootstrap interval as a band), the uniform-attention chance level dotted, steps on a log axis.

    Args:
        arms: {arm: the scores at each step, in step order}, each with `step`, `<score>_mean`,
            `<score>_interval` and `<score>_chance` for every score (`experiments.interventions.CircuitScores`).
        scores: {attribute prefix: panel title}.
        title: the figure's title.

    Returns:
        The figure."""
    for points in arms.values():
        for point in points:
            _need(point, ("step", *(f"{k}_{x}" for k in scores for x in ("mean", "interval", "chance"))),
                  "scores at steps (CircuitScores)", "scores_over_training_figure")
    fig = Figure(figsize=(4.2 * len(scores), 3.4))
    axes = fig.subplots(1, len(scores), squeeze=False, sharey=True)[0]
    for ax, (key, label) in zip(axes, scores.items()):
        chance = math.nan
        for arm, points in arms.items():
            steps = [p.step for p in points]
            line, = ax.plot(steps, [getattr(p, f"{key}_mean") for p in points], "o-", markersize=3, label=arm)
            lows, highs = zip(*(getattr(p, f"{key}_interval") for p in points)) if points else ((), ())
            ax.fill_between(steps, lows, highs, color=line.get_color(), alpha=0.18, linewidth=0)
            chance = next((getattr(p, f"{key}_chance") for p in points), chance)
        if math.isfinite(chance):
            ax.axhline(chance, color="#777", linestyle=":", linewidth=1, label=f"uniform attention {chance:.2f}")
        ax.set_xscale("log")
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("optimiser step (log scale)")
        ax.grid(alpha=0.25)
        ax.legend(fontsize=6)
    axes[0].set_ylabel("mean score over seeds (95% bootstrap band)")
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def reproduction_init_precision_figure(rows: Sequence[ConditionRow], *, p: float, q: float) -> Figure:
    """Fraction of seeds stuck at the unigram loss by initialisation and precision (one layer, tied): each
    condition's `init`, `precision` ("fp32" / "fp16"), `stuck_fraction` and `theory` (the landscape's
    prediction)."""
    fig = Figure(figsize=(7, 3.8))
    ax = fig.subplots()
    inits = sorted({r.init for r in rows})
    for k, precision in enumerate(("fp32", "fp16")):
        xs, ys = [], []
        for i, init in enumerate(inits):
            match = [r for r in rows if r.init == init and r.precision == precision]
            if match and match[0].stuck_fraction is not None:
                xs.append(i + (k - 0.5) * 0.38)
                ys.append(match[0].stuck_fraction)
        label = precision + (" autocast, no loss scaling" if precision == "fp16" else "")
        bars = ax.bar(xs, ys, width=0.36, label=label)
        ax.bar_label(bars, labels=[f"{y:.2f}" for y in ys], fontsize=7)
    for i, init in enumerate(inits):
        match = [r for r in rows if r.init == init]
        if match and match[0].theory:
            ax.annotate(f"theory: {match[0].theory}", (i, 1.04), ha="center", fontsize=8)
    ax.set_xticks(range(len(inits)), inits, fontsize=8)
    ax.set_ylim(0, 1.12)
    ax.set_ylabel("fraction of seeds stuck at H(pi)")
    ax.set_title(f"initialisation and precision, p = {p}, q = {q}, one layer, tied", fontsize=9)
    ax.legend(fontsize=7, loc="center right")
    return fig


def reproduction_boundary_figure(rows: Sequence[ConditionRow], *, p: float) -> Figure:
    """Escape times along a line p fixed, q varied, across p + q = 1, tied beside untied: the Kaplan-Meier median
    escape step with its 95% interval (left; an open marker at the budget where the median was not reached) and
    the fraction of seeds censored at the budget with its Wilson interval (right). `rows` are the line's
    conditions (`q`, `tied`, `median_escape`, `median_escape_ci`, `n_censored` of `n_runs`, `censored_ci`,
    `budget`)."""
    fig = Figure(figsize=(10, 3.8))
    left, right = fig.subplots(1, 2)
    for k, (tied, colour) in enumerate(((True, "tab:red"), (False, "tab:blue"))):
        line = sorted((r for r in rows if r.tied == tied and r.n_runs), key=lambda r: r.q)
        if not line:
            continue
        label = "tied" if tied else "untied"
        shift = (k - 0.5) * 0.01  # tied and untied side by side at each q
        for r in line:
            budget, median = r.budget, r.median_escape
            x = r.q + shift
            y = budget if median is None else median
            lo, hi = r.median_escape_ci or (y, y)  # no interval (fewer than dynamics.MIN_RUNS seeds): no bar
            ax_lo, ax_hi = (budget if lo is None else lo), (budget if hi is None else hi)
            left.errorbar([x], [y], yerr=[[y - ax_lo], [ax_hi - y]], fmt="o", color=colour, capsize=3,
                          mfc="white" if median is None else colour, ms=5)
        left.plot([r.q + shift for r in line], [r.budget if r.median_escape is None else r.median_escape
                                                for r in line], color=colour, lw=1, label=label)
        fractions = [r.n_censored / r.n_runs for r in line]
        los = [f - r.censored_ci[0] for f, r in zip(fractions, line)]
        his = [r.censored_ci[1] - f for f, r in zip(fractions, line)]
        right.errorbar([r.q + shift for r in line], fractions, yerr=[los, his], fmt="o-", color=colour,
                       capsize=3, ms=5, lw=1, label=label)
    budget = max((r.budget for r in rows), default=0)
    for ax in (left, right):
        ax.axvline(1 - p, color="grey", ls="--", lw=1)
        ax.set_xlabel(f"q (p = {p}; dashed: p + q = 1)")
        ax.legend(fontsize=7)
    left.axhline(budget, color="grey", ls=":", lw=1)
    left.set_ylabel("median escape step (95% interval)")
    left.set_title("escape time across p + q = 1 (open: median beyond the budget)", fontsize=9)
    right.set_ylim(-0.02, 1.02)
    right.set_ylabel(f"fraction censored at {budget} steps (Wilson 95%)")
    right.set_title("seeds still on the plateau at the budget", fontsize=9)
    return fig


def run_escape_figure(curve: Survival, *, budget: int, crossing: Optional[StepInterval],
                      title: str = "") -> Figure:
    """One run against its condition: the survival of the escape over the condition's seeds (with its 95% band
    where it has one) and the run's own escape: the interval (after, by] it is known to lie in, or a cross
    where it was censored."""
    fig = Figure(figsize=(5.6, 3.8))
    ax = fig.subplots()
    _draw_survival(ax, curve, "tab:blue", "condition")
    if crossing is not None and crossing.censored:
        ax.plot([crossing.after], [curve.at(crossing.after)], "x", color="tab:red", ms=8,
                label=f"this run: censored after step {crossing.after}")
    elif crossing is not None:
        ax.axvspan(crossing.after, crossing.by, color="tab:red", alpha=0.2, lw=0)
        ax.plot([crossing.by], [curve.at(crossing.by)], "o", color="tab:red", ms=6,
                label=f"this run: escaped in {crossing}")
    ax.set_xlim(0, budget)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("step")
    ax.set_ylabel("fraction of seeds not yet escaped")
    ax.set_title(title or "this run's escape against its condition", fontsize=9)
    ax.legend(fontsize=7)
    return fig


# order reached (-1: not even the unigram step half climbed) -> colour; one hue per rung of the ladder
ORDER_COLOURS = {-1: "#eeeeee", 0: "#f4c27a", 1: "#8cc08c", 2: "#5b9bd5", 3: "#8e6bbf", 4: "#c0504d"}


def phase_diagram_figure(cells: Sequence[Mapping[str, Any]], *, title: str = "") -> Figure:
    """The order x depth x heads phase diagram: one panel per family, a row per shape and a column per source
    order k; each cell coloured by the median over seeds of the order reached, and labelled with the seeds
    reaching the order-k law, k/n, and its 95% interval.

    Args:
        cells: `experiments.phases.cell_summaries` (keys family, label, order, median_order, reached).
        title: above the panels.

    Returns:
        The figure.
    """
    families = list(dict.fromkeys(c["family"] for c in cells))
    fig = Figure(figsize=(3.2 + 1.6 * len({c["order"] for c in cells}) * len(families), 2.0 + 0.55 *
                          len({c["label"] for c in cells})), layout="constrained")
    axes = fig.subplots(1, max(len(families), 1), squeeze=False)[0]
    for ax, family in zip(axes, families):
        mine = [c for c in cells if c["family"] == family]
        shapes = list(dict.fromkeys(c["label"] for c in mine))
        orders = sorted({c["order"] for c in mine})
        for c in mine:
            x, y = orders.index(c["order"]), shapes.index(c["label"])
            reached = c["reached"][str(c["order"])]
            colour = ORDER_COLOURS.get(c["median_order"], "white") if c["median_order"] is not None else "white"
            ax.add_patch(_Rectangle((x - 0.5, y - 0.5), 1, 1, facecolor=colour, edgecolor="white", lw=2))
            if reached["n"]:
                lo, hi = reached["interval"]
                ax.text(x, y, f"{reached['k']}/{reached['n']}\n[{lo:.2f}, {hi:.2f}]", ha="center", va="center",
                        fontsize=7)
        ax.set_xlim(-0.5, len(orders) - 0.5)
        ax.set_ylim(len(shapes) - 0.5, -0.5)
        ax.set_xticks(range(len(orders)), [f"order {k}" for k in orders], fontsize=8)
        ax.set_yticks(range(len(shapes)), shapes, fontsize=8)
        ax.set_title(family, fontsize=9)
    names = {-1: "none", 0: "unigram", 1: "bigram", 2: "trigram", 3: "4-gram", 4: "5-gram"}
    handles = [_Rectangle((0, 0), 1, 1, facecolor=ORDER_COLOURS[j]) for j in sorted(ORDER_COLOURS)]
    fig.legend(handles, [f"{j}: {names[j]}" for j in sorted(ORDER_COLOURS)], title="median order reached",
               loc="outside lower center", ncol=len(handles), fontsize=7, title_fontsize=7)
    fig.suptitle((title + "\n" if title else "") + "text: seeds reaching the order-k law (g_k >= 1/2), 95% Wilson "
                 "interval", fontsize=9)
    return fig


_PHASE_COLOURS = {"unigram retrieval": "#f4c27a", "bigram retrieval": "#c0504d", "unigram inference": "#8cc08c",
                  "bigram inference": "#3b7dbf"}


def _pool_axis(ax: Any, sizes: Sequence[Optional[int]]) -> list[float]:
    """x positions for pool sizes on a log2 axis, the fresh source (None) one step right of the largest."""
    finite = [math.log2(n) for n in sizes if n is not None]
    right = (max(finite) if finite else 0) + 1.5
    xs = [right if n is None else math.log2(n) for n in sizes]
    ax.set_xticks(xs, ["∞" if n is None else str(n) for n in sizes], fontsize=7)
    ax.set_xlabel("pool size N (kernels)")
    return xs


def _mean_band(ax: Any, xs: Sequence[float], stats: Sequence[Mapping[str, Any]], colour: str, label: str,
               ls: str = "-") -> None:
    mean = [s["mean"] for s in stats]
    lo = [s["interval"][0] for s in stats]
    hi = [s["interval"][1] for s in stats]
    ax.plot(xs, mean, color=colour, ls=ls, marker="o", ms=3, lw=1.3, label=label)
    ax.fill_between(xs, lo, hi, color=colour, alpha=0.15, lw=0)


def diversity_figure(cells: Sequence[Mapping[str, Any]], transitions: Mapping[str, Mapping[str, Any]], *,
                     title: str = "") -> Figure:
    """The task-diversity sweep: the model's excess loss over the pool's Bayes and the in-context Bayes predictor
    in the pool, its excess over the in-context Bayes predictor on fresh kernels, the kernel-swap fraction with
    N* and its interval, and per depth the fraction of seeds closest to each of Park et al.'s four algorithms.

    Args:
        cells: `experiments.diversity.cell_summaries`.
        transitions: `experiments.diversity.transitions` ({depth: {"swap_fraction": {...}, ...}}).
        title: above the panels.

    Returns:
        The figure.
    """
    depths = list(dict.fromkeys(c["depth"] for c in cells))
    fig = Figure(figsize=(15, 8.0))
    grid = fig.add_gridspec(2, max(3, len(depths)))
    top = [fig.add_subplot(grid[0, i]) for i in range(3)]
    for colour, depth in zip(_COLOURS, depths):
        mine = [c for c in cells if c["depth"] == depth]
        xs = _pool_axis(top[0], [c["pool_size"] for c in mine])
        pooled = [(x, c) for x, c in zip(xs, mine) if "excess_pool_bayes" in c["in"]]
        _mean_band(top[0], [x for x, _ in pooled], [c["in"]["excess_pool_bayes"] for _, c in pooled], colour,
                   f"L{depth}: over the pool's Bayes")
        _mean_band(top[0], xs, [c["in"]["excess_in_context_bayes"] for c in mine], colour,
                   f"L{depth}: over in-context Bayes", ls="--")
        _pool_axis(top[1], [c["pool_size"] for c in mine])
        _mean_band(top[1], xs, [c["out"]["excess_in_context_bayes"] for c in mine], colour, f"L{depth}")
        _pool_axis(top[2], [c["pool_size"] for c in mine])
        _mean_band(top[2], [x for x, _ in pooled], [c["swap_fraction"] for _, c in pooled], colour,
                   f"L{depth}: {transitions.get(str(depth), {}).get('swap_fraction', {}).get('describe', '')}")
        t = transitions.get(str(depth), {}).get("swap_fraction")
        if t and t.get("interval") and t["relation"] == "=":
            lo, hi = (math.log2(v) if math.isfinite(v) else xs[-1] for v in t["interval"])
            top[2].axvspan(lo, hi, color=colour, alpha=0.08, lw=0)
            top[2].axvline(math.log2(t["estimate"]), color=colour, ls=":", lw=1)
    for ax, name in zip(top, ("in the pool: model minus reference (nats)",
                              "fresh kernels: model minus in-context Bayes (nats)",
                              "kernel-swap fraction (0 retrieval, 1 inference)")):
        ax.set_title(name, fontsize=9)
        ax.axhline(0.5 if ax is top[2] else 0.0, color="grey", ls=":", lw=0.8)
        ax.legend(fontsize=6)
    for i, depth in enumerate(depths):
        ax = fig.add_subplot(grid[1, i])
        mine = [c for c in cells if c["depth"] == depth]
        xs = _pool_axis(ax, [c["pool_size"] for c in mine])
        bottom = np.zeros(len(mine))
        for name, colour in _PHASE_COLOURS.items():
            share = np.array([c["phases"][name]["fraction"] or 0.0 for c in mine])
            ax.bar(xs, share, bottom=bottom, width=0.8, color=colour, label=name)
            bottom += share
        ax.set_ylim(0, 1)
        ax.set_ylabel("fraction of seeds closest")
        ax.set_title(f"L{depth}: closest of Park et al.'s algorithms (KL on in-pool sequences)", fontsize=9)
        ax.legend(fontsize=6)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def circuit_formation_figure(formation: Any, dynamics: Any = None, *, title: str = "") -> Figure:
    """The circuit over training: each edge's path-patching effect at every checkpoint (one line per edge ever
    kept; filled markers where it is kept, a star at the step it enters), over the run's excess-loss fraction
    with its crossings of the dynamics lines, both on one log step axis.

    Args:
        formation: a `probes.CircuitFormation` (`steps`, `edges`, `effects`, `kept`, `entered`).
        dynamics: the run's `dynamics.RunDynamics` (its excess curve and crossings), or None.
        title: the figure's title.

    Returns:
        The figure."""
    _need(formation, ("steps", "edges", "effects", "kept", "entered"), "a probes.CircuitFormation",
          "circuit_formation_figure")
    fig = Figure(figsize=(8.0, 6.2 if dynamics is not None else 4.2))
    axes = fig.subplots(2 if dynamics is not None else 1, 1, sharex=True, squeeze=False,
                        gridspec_kw={"height_ratios": [1, 1.6]} if dynamics is not None else None)[:, 0]
    ax = axes[-1]
    steps = list(formation.steps)
    for name in formation.edges:
        line, = ax.plot(steps, formation.effects[name], "-", linewidth=1.2, label=name)
        kept = [(s, e) for s, e, k in zip(steps, formation.effects[name], formation.kept[name]) if k]
        if kept:
            ax.plot(*zip(*kept), "o", markersize=4, color=line.get_color())
        entered = formation.entered[name]
        if entered is not None:
            ax.plot([entered], [formation.effects[name][steps.index(entered)]], "*", markersize=11,
                    color=line.get_color(), markeredgecolor="black", markeredgewidth=0.5)
    ax.set_ylabel("edge effect (nats; filled: kept, star: enters)")
    ax.set_xlabel("optimiser step (log scale)")
    ax.legend(fontsize=6, ncol=2, loc="upper left")
    if dynamics is not None:
        top = axes[0]
        curve = dynamics.curve
        top.plot(curve.steps, [e / p for e, p in zip(curve.excess, curve.plateau_excess)], color="#333", linewidth=1)
        top.set_ylabel("excess loss / plateau's")
        for i, (fraction, crossing) in enumerate(sorted(dynamics.crossings.items(), reverse=True)):
            colour = f"C{i}"
            top.axhline(fraction, color=colour, linestyle=":", linewidth=0.8)
            if crossing.escaped:
                for axis in axes:
                    axis.axvline(crossing.by, color=colour, linestyle="--", linewidth=0.8,
                                 label=f"crosses {fraction:g} by step {crossing.by}" if axis is top else None)
        top.legend(fontsize=6, loc="upper right")
        top.grid(alpha=0.25)
    ax.set_xscale("log")
    ax.grid(alpha=0.25)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig
