"""Figures of the experiment `hidden` (`markov_interp.experiments.hidden`): the belief simplex beside the probe's
predictions, belief R^2 per layer, loss per position against the Bayes-optimal predictor.

Reach them as `markov_interp.experiments.belief_simplex_figure` (and the others), loaded on first use.
"""

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from matplotlib.figure import Figure

# the colours of the hidden states' corners: a belief is drawn in the mixture of its states' colours
_CORNERS = ((0.85, 0.1, 0.1), (0.1, 0.65, 0.1), (0.1, 0.2, 0.9), (0.9, 0.6, 0.0), (0.6, 0.1, 0.75),
            (0.0, 0.7, 0.75), (0.5, 0.5, 0.5))


def belief_colours(beliefs: torch.Tensor) -> torch.Tensor:
    """RGB per belief [row, 3]: the mixture of its hidden states' corner colours (red, green, blue for 3 states),
    so a point's colour says where its true belief is, whatever plane it is drawn in."""
    hidden = beliefs.shape[-1]
    corners = torch.tensor([_CORNERS[i % len(_CORNERS)] for i in range(hidden)], dtype=torch.float64)
    return (beliefs.to(torch.float64).clamp(0, 1) @ corners).clamp(0, 1)


def belief_simplex_figure(points: Mapping[str, Mapping[str, Mapping[str, Sequence]]], *, title: str = "") -> Figure:
    """The true belief simplex beside the probe's predictions on held-out tokens, coloured alike (each point by its
    true belief), one row per process: the true beliefs, then the probe's predictions at each site given.

    Args:
        points: {process: {site: {"true": [[...]], "predicted": [[...]]}}} (`experiments.hidden`'s seed-0 points;
            every site of a process holds the same true beliefs).
        title: above the panels.

    Returns:
        The figure (3 hidden states: barycentric coordinates; more: the true beliefs' first two principal axes,
        said in the panel title).
    """
    from markov_interp.probes import simplex_projection

    processes = list(points)
    n_cols = 1 + max(len(points[p]) for p in processes)
    fig = Figure(figsize=(3.2 * n_cols, 3.1 * len(processes)), layout="constrained")
    axes = fig.subplots(len(processes), n_cols, squeeze=False)
    for row, process in zip(axes, processes):
        sites = list(points[process])
        true = torch.tensor(points[process][sites[0]]["true"], dtype=torch.float64)
        plane = simplex_projection(true)
        colours = belief_colours(true).numpy()
        how = "barycentric" if plane.method == "barycentric" else f"PCA of the true beliefs ({plane.explained:.0%})"
        panels = [(f"{process}: true beliefs\n{how}", true)] + [
            (f"{process}: probe at {site}", torch.tensor(points[process][site]["predicted"], dtype=torch.float64))
            for site in sites]
        for ax, (label, beliefs) in zip(row, panels):
            xy = plane(beliefs).numpy()
            ax.scatter(xy[:, 0], xy[:, 1], c=colours, s=3, alpha=0.6, linewidths=0, rasterized=True)
            ax.set_title(label, fontsize=8)
            ax.set_aspect("equal", adjustable="datalim")
            ax.set_xticks([])
            ax.set_yticks([])
        for ax in row[len(panels):]:
            ax.axis("off")
    fig.suptitle((title + "\n" if title else "") + "held-out positions, each coloured by its true belief", fontsize=9)
    return fig


def r2_by_layer_figure(summaries: Sequence[Mapping[str, Any]], *, title: str = "") -> Figure:
    """Belief R^2 at each site (mean over seeds, 95% interval) and its shuffled control, one panel per process.

    Args:
        summaries: `experiments.hidden.process_summary` per process.
        title: above the panels.

    Returns:
        The figure.
    """
    shown = [s for s in summaries if s.get("n")]
    fig = Figure(figsize=(4.2 * max(len(shown), 1), 3.2), layout="constrained")
    axes = fig.subplots(1, max(len(shown), 1), squeeze=False)[0]
    for ax, s in zip(axes, shown):
        sites = list(s["r2"])
        x = range(len(sites))
        means = [s["r2"][k]["mean"] for k in sites]
        low = [m - s["r2"][k]["interval"][0] for m, k in zip(means, sites)]
        high = [s["r2"][k]["interval"][1] - m for m, k in zip(means, sites)]
        ax.errorbar(x, means, yerr=[low, high], fmt="o-", color="#36c", capsize=3, label="belief R^2")
        ax.plot(x, [s["control"][k]["mean"] for k in sites], "x:", color="#999", label="shuffled control")
        ax.set_xticks(list(x), [k.replace(".resid_", " ") for k in sites], rotation=30, fontsize=7)
        ax.set_ylim(min(-0.05, min(s["control"][k]["mean"] for k in sites) - 0.05), 1.05)
        ax.axhline(1.0, color="#ccc", linewidth=0.8)
        ax.set_title(f"{s['process']} ({s['n']} seeds)", fontsize=9)
        ax.set_ylabel("held-out R^2")
        ax.legend(fontsize=7, loc="lower right")
    if title:
        fig.suptitle(title, fontsize=9)
    return fig


def loss_by_position_figure(summaries: Sequence[Mapping[str, Any]], *, title: str = "") -> Figure:
    """The model's loss at each position (mean over seeds) beside the forward filter's on the same tokens, one
    panel per process: the Bayes loss falls as the belief synchronises, and a model that tracks the belief follows.

    Args:
        summaries: `experiments.hidden.process_summary` per process.
        title: above the panels.

    Returns:
        The figure.
    """
    shown = [s for s in summaries if s.get("n")]
    fig = Figure(figsize=(4.2 * max(len(shown), 1), 3.0), layout="constrained")
    axes = fig.subplots(1, max(len(shown), 1), squeeze=False)[0]
    for ax, s in zip(axes, shown):
        model, bayes = s["curves"]["model_curve"], s["curves"]["bayes_curve"]
        ax.plot(range(len(model)), model, "o-", color="#c33", label="model")
        ax.plot(range(len(bayes)), bayes, "s--", color="#36c", label="Bayes (forward filter)")
        ax.set_xlabel("position t (predicting x_{t+1})")
        ax.set_ylabel("log-loss (nats)")
        ax.set_title(f"{s['process']} ({s['n']} seeds)", fontsize=9)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    return fig
