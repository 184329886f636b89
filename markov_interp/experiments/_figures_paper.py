"""Figures of the experiment `paper` (`markov_interp.experiments.paper`, the paper's reproduction): fractions stuck
over the (p, q) square, the boundary p + q = 1, depth, mechanisms by depth, and initialisation and precision.

Each function draws the numbers the reproduction's summary holds (its `paper.ConditionSummary` rows: each function
says the fields it reads) and returns a `matplotlib.figure.Figure` (no pyplot state). The survival of the escape
(`survival.png`) is `markov_interp.experiments.escape_survival_figure`, shared with the experiments.
"""

from collections.abc import Mapping, Sequence

from matplotlib.figure import Figure

from markov_interp.report.figures import require_attributes


def _conditions(rows: Sequence[object], fields: tuple[str, ...], figure: str) -> Sequence[object]:
    """`rows` after checking each has `fields` (a condition's summary, `paper.ConditionSummary`)."""
    for row in rows:
        require_attributes(row, fields, "a condition's summary (paper.ConditionSummary)", figure)
    return rows


def reproduction_phase_figure(panels: Mapping[str, Sequence[object]], values: Sequence[float]) -> Figure:
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
        for r in _conditions(rows, ("p", "q", "stuck_fraction", "theory"), "reproduction_phase_figure"):
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


def reproduction_init_precision_figure(rows: Sequence[object], *, p: float, q: float) -> Figure:
    """Fraction of seeds stuck at the unigram loss by initialisation and precision (one layer, tied): each
    condition's `init`, `precision` ("fp32" / "fp16"), `stuck_fraction` and `theory` (the landscape's
    prediction)."""
    rows = _conditions(rows, ("init", "precision", "stuck_fraction", "theory"), "reproduction_init_precision_figure")
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


def reproduction_boundary_figure(rows: Sequence[object], *, p: float) -> Figure:
    """Escape times along a line p fixed, q varied, across p + q = 1, tied beside untied: the Kaplan-Meier median
    escape step with its 95% interval (left; an open marker at the budget where the median was not reached) and
    the fraction of seeds censored at the budget with its Wilson interval (right). `rows` are the line's
    conditions (`q`, `tied`, `median_escape`, `median_escape_ci`, `n_censored` of `n_runs`, `censored_ci`,
    `budget`)."""
    rows = _conditions(rows, ("q", "tied", "median_escape", "median_escape_ci", "n_censored", "n_runs", "censored_ci",
                              "budget"), "reproduction_boundary_figure")
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
