"""Figure of the experiment `diversity` (`markov_interp.experiments.diversity`): task diversity, the transition N*
and the fraction of seeds closest to each of Park et al.'s four algorithms.

Reach it as `markov_interp.experiments.diversity_figure`, loaded on first use.
"""

import math
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any, Optional

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from markov_interp.report.figures import CONDITION_COLOURS


_PHASE_COLOURS = {"unigram retrieval": "#f4c27a", "bigram retrieval": "#c0504d", "unigram inference": "#8cc08c",
                  "bigram inference": "#3b7dbf"}


def _pool_axis(ax: Axes, sizes: Sequence[Optional[int]]) -> list[float]:
    """x positions for pool sizes on a log2 axis, the fresh source (None) one step right of the largest."""
    finite = [math.log2(n) for n in sizes if n is not None]
    right = (max(finite) if finite else 0) + 1.5
    xs = [right if n is None else math.log2(n) for n in sizes]
    ax.set_xticks(xs, ["∞" if n is None else str(n) for n in sizes], fontsize=7)
    ax.set_xlabel("pool size N (kernels)")
    return xs


def _mean_band(ax: Axes, xs: Sequence[float], stats: Sequence[Mapping[str, Any]], colour: str, label: str,
               ls: str = "-") -> None:
    mean = [s["mean"] for s in stats]
    lo = [s["interval"][0] for s in stats]
    hi = [s["interval"][1] for s in stats]
    ax.plot(xs, mean, color=colour, ls=ls, marker="o", ms=3, lw=1.3, label=label)
    ax.fill_between(xs, lo, hi, color=colour, alpha=0.15, lw=0)


def _swap_panel(ax: Axes, pooled: Sequence[tuple[float, Mapping[str, Any]]], t: Optional[Mapping[str, Any]],
                colour: str, depth: int, right: float) -> list[str]:
    """One depth's kernel-swap fractions with N* and its interval (an unbounded one drawn to `right`); the note
    naming the sizes where the fraction is undefined for N* (a list of at most one line)."""
    head, _, note = (t or {}).get("describe", "").partition("; ")  # N*, then the sizes where it is undefined
    _mean_band(ax, [x for x, _ in pooled], [c["swap_fraction"] for _, c in pooled], colour, f"L{depth}: {head}")
    if t and t.get("interval") and t["relation"] == "=":
        lo, hi = (math.log2(v) if math.isfinite(v) else right for v in t["interval"])
        ax.axvspan(lo, hi, color=colour, alpha=0.08, lw=0)
        ax.axvline(math.log2(t["estimate"]), color=colour, ls=":", lw=1)
    return [f"L{depth}: {note}"] if note else []


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
    notes = []
    for colour, depth in zip(CONDITION_COLOURS, depths):
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
        notes += _swap_panel(top[2], pooled, transitions.get(str(depth), {}).get("swap_fraction"), colour, depth,
                             xs[-1])
    for ax, name in zip(top, ("in the pool: model minus reference (nats)",
                              "fresh kernels: model minus in-context Bayes (nats)",
                              "kernel-swap fraction (0 retrieval, 1 inference)")):
        ax.set_title(name, fontsize=9)
        ax.axhline(0.5 if ax is top[2] else 0.0, color="grey", ls=":", lw=0.8)
        ax.legend(fontsize=6)
    if notes:  # why the swap fraction is left out of N* at some sizes, under its panel
        top[2].text(0.0, -0.2, textwrap.fill(" ".join(notes), 80), transform=top[2].transAxes, fontsize=6, va="top")
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
