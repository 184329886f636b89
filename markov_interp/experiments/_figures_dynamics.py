"""Figures of training dynamics over seeds, shared by the experiments (`interventions`, `factorial`, `phases`) and
the reproduction: survival of the escape and of the crossings at each line, and median excess curves with their
bands (`markov_interp.dynamics` computes them; these functions only draw them).

Reach them as `markov_interp.experiments.escape_survival_figure` (and `crossing_survival_figure`,
`excess_curves_figure`, `excess_curves_panels_figure`), loaded on first use. One run against its condition
(`run_escape_figure`) is the report's own and stays in `markov_interp.report.figures`.
"""

import math
from collections.abc import Mapping, Sequence
from typing import Optional

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from markov_interp.dynamics import FRACTIONS, MedianCurve, Survival
from markov_interp.report.figures import CONDITION_COLOURS, draw_survival


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
        for colour, (label, curve) in zip(CONDITION_COLOURS, curves.items()):
            draw_survival(ax, curve, colour, label)
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
        for colour, (label, per) in zip(CONDITION_COLOURS, conditions.items()):
            if fraction in per:
                draw_survival(ax, per[fraction], colour, label)
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


def _draw_excess_curves(ax: Axes, curves: Mapping[str, MedianCurve], fractions: Sequence[float]) -> None:
    for colour, (label, m) in zip(CONDITION_COLOURS, curves.items()):
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
