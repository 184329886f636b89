"""Figures of the experiment `hidden` (`markov_interp.experiments.hidden`): belief R^2 per layer and loss per
position against the Bayes-optimal predictor (the belief simplex beside the probe's predictions is
`report.beliefs.belief_simplex_figure`, which a run's report draws too).

Reach them as `markov_interp.experiments.r2_by_layer_figure` and `loss_by_position_figure`, loaded on first use.
"""

from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib.figure import Figure


def _process_panels(summaries: Sequence[Mapping[str, Any]], *, height: float) -> tuple[Figure, Any, list]:
    """One panel per process that has seeds (`n`): the figure, its axes and those processes' summaries."""
    shown = [s for s in summaries if s.get("n")]
    fig = Figure(figsize=(4.2 * max(len(shown), 1), height), layout="constrained")
    return fig, fig.subplots(1, max(len(shown), 1), squeeze=False)[0], shown


def r2_by_layer_figure(summaries: Sequence[Mapping[str, Any]], *, title: str = "") -> Figure:
    """Belief R^2 at each site (mean over seeds, 95% interval) and its shuffled control, one panel per process.

    Args:
        summaries: `experiments.hidden.process_summary` per process.
        title: above the panels.

    Returns:
        The figure.
    """
    fig, axes, shown = _process_panels(summaries, height=3.2)
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
    fig, axes, shown = _process_panels(summaries, height=3.0)
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
