"""Figures of a run, from probe results: each function returns a matplotlib `Figure` (or a `CircuitsFigure`).

Nothing here computes a probe number: the numbers come from `markov_interp.probes` (and the reference losses
from `markov_interp.theory` via the run's metrics); these functions only draw them. Figures are made with
`matplotlib.figure.Figure` (no pyplot state, any backend); in Jupyter they display inline as usual, and
`markov_interp.report` inlines them into the HTML report as SVG.
"""

import math
from collections.abc import Mapping, Sequence
from typing import Any, Optional

import numpy as np
import torch
from einops import rearrange
from jaxtyping import Float, Int
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from torch import Tensor

from markov_interp._plan import planned
from markov_interp.config import check_int
from markov_interp.landscape.flow import _grid_needs
from markov_interp.dynamics import RunDynamics, StepInterval, Survival
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


def annotation_format(limit: float) -> str:
    """The format of a heatmap's cell annotations whose colour scale spans +-`limit`: enough decimals that a cell
    at a tenth of the scale shows two significant digits, so no coloured cell reads 0.0.

    >>> annotation_format(12.0), annotation_format(0.8), annotation_format(0.004)
    ('{:.1f}', '{:.3f}', '{:.5f}')
    """
    if not math.isfinite(limit) or limit <= 0:
        return "{:.2f}"
    return "{:.%df}" % min(5, max(0, 2 - math.floor(math.log10(limit))))


def effect_text(value: float) -> str:
    """A path-patching effect (nats) in a table cell: 3 decimals, or two significant digits when smaller than that
    shows (a kept edge is never printed +0.000).

    >>> effect_text(0.0451), effect_text(2.3e-05), effect_text(0.0)
    ('+0.045', '+2.3e-05', '+0')
    """
    if value == 0 or not math.isfinite(value):
        return f"{value:+g}"
    return f"{value:+.3f}" if abs(value) >= 0.001 else f"{value:+.1e}"


def _reference_lines(ax: Axes, references: Mapping[str, float], where: str = "") -> None:
    """The reference losses as horizontal lines, each labelled with its value and `where` it was estimated (the
    training's evaluation or the probe batch: Monte Carlo references of random kernels differ between them)."""
    for key, (label, colour, style) in REFERENCE_STYLE.items():
        value = references.get(key)
        if value is not None and math.isfinite(value):
            text = format_loss(value, references.get(f"{key}_se"))  # with the standard error if it shows
            ax.axhline(value, color=colour, linestyle=style, linewidth=1.2, label=f"{label} {text}{where}")


def legend_below(ax: Axes, *, ncol: int = 2, fontsize: int = 8) -> None:
    """The legend under the axes, outside the data (the figure is saved with a tight bounding box)."""
    ax.legend(fontsize=fontsize, ncol=ncol, loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False)


def _as_row(references: "Mapping[str, float] | ReferenceLosses") -> Mapping[str, float]:
    return references.as_row() if isinstance(references, ReferenceLosses) else references


def require_attributes(value: object, attrs: tuple[str, ...], what: str, figure: str) -> None:
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
    losses = _plot_losses(ax, metrics, "eval loss (fresh batches)", markersize=3.5, linewidth=1.4)
    _reference_lines(ax, references, " (logged by training)")
    for i, step in enumerate(checkpoint_steps):
        ax.axvline(step, color="#bbb", linewidth=0.6, zorder=0, label="checkpoints" if i == 0 else None)
    ax.set_xlabel("optimiser step")
    ax.set_ylabel("loss (nats)")
    ax.set_title("Loss during training")
    if not losses:
        ax.text(0.5, 0.5, "no metrics logged", transform=ax.transAxes, ha="center")
    _zoom_losses(ax, losses, references)
    legend_below(ax, ncol=1)  # one column: the long reference labels keep the figure as wide as its axes
    ax.grid(alpha=0.25)
    return fig


def _plot_losses(ax: Axes, metrics: Sequence[Mapping[str, Any]], eval_label: str, *, markersize: float,
                 linewidth: float) -> list[float]:
    """A run's logged losses over steps on `ax`: the train loss (grey line), then the eval loss (dots,
    `eval_label`); returns every value drawn (train first), for `_zoom_losses`."""
    train = [(r["step"], r["train_loss"]) for r in metrics if "train_loss" in r]
    evals = [(r["step"], r["eval_loss"]) for r in metrics if "eval_loss" in r]
    if train:
        ax.plot(*zip(*train), color="#888", linewidth=1, label="train loss")
    if evals:
        ax.plot(*zip(*evals), "o-", color="#222", markersize=markersize, linewidth=linewidth, label=eval_label)
    return [v for _, v in train + evals]


def _zoom_losses(ax: Axes, values: Sequence[float], references: Mapping[str, float]) -> None:
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


def position_loss_figure(behaviour: object, references: "Mapping[str, float] | ReferenceLosses") -> Figure:
    """Loss (nats) of the prediction made at each position, averaged over the probe batch.

    `behaviour` is a `probes.behaviour.BehaviourReport`. A model that learned the kernel in its weights is flat from
    the first position (as the true-kernel curve is); an in-context learner starts high and falls with the
    add-beta estimator as it sees more of the sequence (Olsson et al.'s in-context learning score).
    """
    require_attributes(behaviour, ("loss_curve", "icl_score"),
                       "a probes.behaviour.BehaviourReport (e.g. mech.behaviour)", "position_loss_figure")
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
        ax.axhline(unigram, color="#c33", linestyle=":", linewidth=1.2,
                   label=f"{name} {unigram:.4f} (probe batch)")
    ax.set_xlabel("position t (predicting x_{t+1})")
    ax.set_ylabel("loss (nats)")
    ax.set_title(f"Loss along the sequence (in-context learning score {behaviour.icl_score:+.4f} nats)")
    legend_below(ax)
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


def head_scores_figure(scores: object) -> Figure:
    """Per-head previous-token, induction and same-token scores as [layer x head] heatmaps, against chance.

    `scores` is a `probes.attention.AttentionScores`. Colour is the excess over chance, (score - chance) / (1 - chance):
    0 (white) is what uniform causal attention gets on the same tokens, 1 a head that attends only where the
    score looks. Each cell is annotated with the raw score. A two-layer in-context model shows a
    previous-token head in layer 0 and an induction head in layer 1.
    """
    require_attributes(scores, ("previous_token", "excess"), "a probes.attention.AttentionScores (e.g. mech.attention)",
                       "head_scores_figure")
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


def _is_labels(tokens: object) -> bool:
    return isinstance(tokens, (list, tuple)) and bool(tokens) and all(isinstance(t, str) for t in tokens)


def _patterns_by_head(patterns: object, layer: Optional[int]) -> tuple[Tensor, list[str]]:
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


def ablation_figure(table: object, *, bigram_gain: Optional[float] = None) -> Figure:
    """Loss change (nats) when each head, attention layer or MLP is ablated alone, as horizontal bars.

    `table` is a `probes.ablation.AblationTable`. Large bars mark the components the prediction relies on; for an
    induction circuit, ablating either head of the circuit should cost a large part of the bigram gain
    (dashed line: what the model gains over the in-context unigram estimator by looking at x_t).
    """
    require_attributes(table, ("names", "loss_change"), "a probes.ablation.AblationTable (e.g. mech.ablation)",
                       "ablation_figure")
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


def kernel_figure(readout: object) -> Figure:
    """The transition matrix implied by the model's predictions beside the true kernel (a
    `probes.readout.KernelReadout`).

    Rows are the current context (last `order` states), columns the next state. A model that learned the
    kernel reproduces the true matrix; one stuck at the unigram solution has every row equal to pi. For a
    random-kernel source there is no single true kernel; the implied matrix is then the model's average
    prediction per context (near the mean kernel for an in-context learner).
    """
    require_attributes(readout, ("implied", "true"), "a probes.readout.KernelReadout (e.g. mech.readout)",
                       "kernel_figure")
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
    losses = _plot_losses(bottom, metrics, "eval loss", markersize=3.0, linewidth=1.3)
    for i, (label, step) in enumerate((events or {}).items()):
        colour = ("#a5c", "#c73", "#555")[i % 3]
        for ax in (top, bottom):
            ax.axvline(step, color=colour, linestyle="-.", linewidth=1.1, label=f"{label} (step {step})"
                       if ax is bottom else None)
    references = references or {}
    _reference_lines(bottom, references, " (logged by training)")
    _zoom_losses(bottom, losses, references)
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


def _new_axes(ax: Optional[Axes], figsize: tuple[float, float]) -> tuple[Figure, Axes]:
    if ax is not None:
        return ax.figure, ax
    fig = Figure(figsize=figsize, layout="constrained")
    return fig, fig.add_subplot()


def _draw_outcomes(ax: Axes, rmap: landscape.RegimeMap) -> None:
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    ax.pcolormesh(rmap.x, rmap.y, rmap.bigram.astype(float), cmap=ListedColormap(_OUTCOME_COLOURS), vmin=0,
                  vmax=1, shading="nearest", rasterized=True)  # a raster: the grid as vector art is megabytes
    ax.set_xlabel(rmap.x_label)
    ax.set_ylabel(rmap.y_label)
    handles = [Patch(color=_OUTCOME_COLOURS[1], label="bigram (learns the kernel)"),
               Patch(color=_OUTCOME_COLOURS[0], label="unigram (stuck at H(pi))")]
    ax.legend(handles=handles, loc="upper right", fontsize="small", framealpha=0.9)


def regime_map_pq_figure(rmap: landscape.RegimeMap, *, ax: Optional[Axes] = None) -> Figure:
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


def regime_map_init_figure(rmap: landscape.RegimeMap, *, ax: Optional[Axes] = None) -> Figure:
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


@planned(_grid_needs)
def landscape_figure(*, p: float, q: float, w_range: tuple[float, float] = (-2.5, 1.5),
                     e_range: tuple[float, float] = (0.0, 2.5), n: int = 161,
                     trajectory: Optional[landscape.Trajectory] = None, ax: Optional[Axes] = None) -> Figure:
    """The b-profiled canonical loss minus the entropy rate over (w, e) (`landscape.profile_loss`), with the
    global-minimum curve, the unigram line, the saddle at w = -1/sqrt(2) and optionally a `landscape.Trajectory`
    (a run's `coordinates_trajectory` over checkpoints, or `gradient_flow`) drawn on it."""
    check_int("n", n, minimum=2)
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


# ---------------------------------------------------------------------------------------------------------------
# survival (markov_interp.dynamics): one run against its condition; the experiments' and the reproduction's
# survival figures (markov_interp.experiments._figures_dynamics) draw with the same helper and colours
# ---------------------------------------------------------------------------------------------------------------

# one colour per condition, in order, for every figure that sets conditions side by side
CONDITION_COLOURS = ["tab:blue", "tab:red", "tab:green", "tab:purple", "tab:orange", "tab:brown", "tab:grey",
                     "tab:pink", "tab:olive", "tab:cyan"]


def draw_survival(ax: Axes, curve: Survival, colour: str, label: str) -> None:
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


def run_escape_figure(curve: Survival, *, budget: int, crossing: Optional[StepInterval],
                      title: str = "") -> Figure:
    """One run against its condition: the survival of the escape over the condition's seeds (with its 95% band
    where it has one) and the run's own escape: the interval (after, by] it is known to lie in, or a cross
    where it was censored."""
    fig = Figure(figsize=(5.6, 3.8))
    ax = fig.subplots()
    draw_survival(ax, curve, "tab:blue", "condition")
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


def circuit_formation_figure(formation: object, dynamics: Optional[RunDynamics] = None, *,
                             title: str = "") -> Figure:
    """The circuit over training: each edge's path-patching effect at every checkpoint (one line per edge ever
    kept; filled markers where it is kept, a star at the step it enters), over the run's excess-loss fraction
    with its crossings of the dynamics lines, both on one log step axis.

    Args:
        formation: a `probes.formation.CircuitFormation` (`steps`, `edges`, `effects`, `kept`, `entered`).
        dynamics: the run's `dynamics.RunDynamics` (its excess curve and crossings), or None.
        title: the figure's title.

    Returns:
        The figure."""
    require_attributes(formation, ("steps", "edges", "effects", "kept", "entered"),
                       "a probes.formation.CircuitFormation", "circuit_formation_figure")
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
