"""Figures of the experiment `reduction` (`markov_interp.experiments.reduction`): the escaped fraction against the
canonical init w0 beside the flow's separatrix, and the runs' (e, w) paths against gradient flow.

Reach them as `markov_interp.experiments.separatrix_figure` / `paths_on_landscape_figure` (loaded on first use, so
importing the experiments does not import matplotlib). Figures are `matplotlib.figure.Figure` (no pyplot state).
"""

import math
from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure

from markov_interp import landscape


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
