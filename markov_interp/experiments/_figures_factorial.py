"""Figure of the experiment `factorial` (`markov_interp.experiments.factorial`): attention scores over training, one
line per arm (the `CircuitScores` of `experiments.interventions`).

Reach it as `markov_interp.experiments.scores_over_training_figure` (and `SCORES_OVER_TRAINING`), loaded on first
use.
"""

import math
from collections.abc import Mapping, Sequence

from matplotlib.figure import Figure

from markov_interp.report.figures import require_attributes


SCORES_OVER_TRAINING = {"previous_token": "layer 0 previous-token", "induction": "layer 1 induction",
                        "same_token": "layer 1 same-token"}


def scores_over_training_figure(arms: Mapping[str, Sequence[object]], *,
                                scores: Mapping[str, str] = SCORES_OVER_TRAINING, title: str = "") -> Figure:
    """Attention scores over training: one panel per score, one line per arm (the mean over seeds at each scored
    step, its bootstrap interval as a band), the uniform-attention chance level dotted, steps on a log axis.

    Args:
        arms: {arm: the scores at each step, in step order}, each with `step`, `<score>_mean`,
            `<score>_interval` and `<score>_chance` for every score (`experiments._arms.CircuitScores`).
        scores: {attribute prefix: panel title}.
        title: the figure's title.

    Returns:
        The figure."""
    for points in arms.values():
        for point in points:
            require_attributes(point, ("step", *(f"{k}_{x}" for k in scores for x in ("mean", "interval", "chance"))),
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
