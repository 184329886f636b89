"""Figure of the experiment `phases` (`markov_interp.experiments.phases`): the order x depth x heads phase diagram.

Reach it as `markov_interp.experiments.phase_diagram_figure` (and `ORDER_COLOURS`), loaded on first use. The
escape-curve panels of the experiment are `excess_curves_panels_figure` (`experiments._figures_dynamics`).
"""

from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib.figure import Figure
from matplotlib.patches import Rectangle


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
            ax.add_patch(Rectangle((x - 0.5, y - 0.5), 1, 1, facecolor=colour, edgecolor="white", lw=2))
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
    handles = [Rectangle((0, 0), 1, 1, facecolor=ORDER_COLOURS[j]) for j in sorted(ORDER_COLOURS)]
    fig.legend(handles, [f"{j}: {names[j]}" for j in sorted(ORDER_COLOURS)], title="median order reached",
               loc="outside lower center", ncol=len(handles), fontsize=7, title_fontsize=7)
    fig.suptitle((title + "\n" if title else "") + "text: seeds reaching the order-k law (g_k >= 1/2), 95% Wilson "
                 "interval", fontsize=9)
    return fig
