"""Circuit figures: the discovered circuit as an SVG diagram, per-head OV / QK matrices, direct logit attribution,
activation patching by layer x position. Every number comes from `markov_interp.probes`; this module only draws.

The diagram is plain SVG written here (no JavaScript, no network): nodes by layer (the token and position
embeddings at the bottom, each layer's heads in a row with its MLP above them, the logits at the top), the kept
edges as curves whose width grows with their path-patching effect, coloured and labelled by the receiver's input
(q, k, v, mlp, logits); edges that carry position information (out of "pos", or kept by the positional pass alone)
are dashed; cancelling sets the joint tests dropped are drawn dotted and grey, with their joint effect; the other
dropped edges are left out (the caption counts them). Hovering an edge shows its name, effects and SE; nodes and
edges carry `data-node` / `data-edge` (their names), which `report.interactive` hooks its panel to.

`axes_panel` is the mechanism verdict's two axes side by side: the circuit (kind, order from the lags, kept
edges, faithfulness and completeness, cancelling sets) and the law (reached raw or after the temperature fit,
the gains g_k with SEs, the kernel swap).
"""

import html
import math
import textwrap
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Optional

import numpy as np
from matplotlib.figure import Figure

if TYPE_CHECKING:  # for annotations only (the section imports probes when it is drawn)
    from markov_interp import probes

INPUT_COLOURS = {"q": "#1f77b4", "k": "#d62728", "v": "#2ca02c", "mlp": "#9467bd", "logits": "#555555"}
_WIDTH, _ROW, _MARGIN, _RADIUS = 720, 110, 40, 20
_CAPTION_CHARS = 96  # 12 px sans-serif: about 7 px a character at most, so a line stays inside the 720 px width


def _layout(graph: Any) -> dict[str, tuple[float, float]]:
    """(x, y) of every node: rows from the logits (top) down to the embedding."""
    layers = graph.n_layers
    rows: list[list[str]] = [["logits"]]
    for layer in reversed(range(layers)):
        rows.append([n for n in graph.nodes if n == f"L{layer}.mlp"])
        rows.append([n for n in graph.nodes if n.startswith(f"L{layer}H")])
    rows.append([n for n in ("embed", "pos") if n in graph.nodes])
    rows = [r for r in rows if r]
    pos = {}
    for i, row in enumerate(rows):
        for j, name in enumerate(row):
            x = _MARGIN + (_WIDTH - 2 * _MARGIN) * (j + 1) / (len(row) + 1)
            pos[name] = (float(x), float(_MARGIN + i * _ROW))
    return pos


def _edge_path(a: tuple[float, float], b: tuple[float, float], bend: float) -> tuple[str, float, float]:
    """A quadratic curve from sender `a` (below) to receiver `b` (above) and its midpoint."""
    (x1, y1), (x2, y2) = a, b
    cx, cy = (x1 + x2) / 2 + bend, (y1 + y2) / 2
    mx, my = 0.25 * x1 + 0.5 * cx + 0.25 * x2, 0.25 * y1 + 0.5 * cy + 0.25 * y2
    return f"M{x1:.1f},{y1 - _RADIUS:.1f} Q{cx:.1f},{cy:.1f} {x2:.1f},{y2 + _RADIUS:.1f}", mx, my


def _bend(a: tuple[float, float], b: tuple[float, float], n: int) -> float:
    """Sideways bow of an edge: edges that skip rows bow out (so they do not run through the nodes between),
    and the n-th edge between the same two nodes (q, k, v of one head) fans out further."""
    rows = round(abs(a[1] - b[1]) / _ROW)
    side = -1.0 if a[0] <= b[0] else 1.0
    skip = 70.0 * (rows - 1) if rows > 1 else 0.0
    fan = 26.0 * ((n + 1) // 2) * (1 if n % 2 else -1) if n else 0.0
    return side * skip + fan


def _edge_svg(edge: Any, a: tuple[float, float], b: tuple[float, float], n: int, width: float, style: str,
              tip: str) -> list[str]:
    """One edge: its curve (style "solid", "position": dashed, "cancelling": dotted grey) and its input label."""
    path, mx, my = _edge_path(a, b, _bend(a, b, n))
    colour = "#999999" if style == "cancelling" else INPUT_COLOURS.get(edge.input, "#555555")
    dash = {"position": ' stroke-dasharray="7,4"', "cancelling": ' stroke-dasharray="2,4"'}.get(style, "")
    out = [f'<path d="{path}" fill="none" stroke="{colour}" stroke-width="{width:.2f}" stroke-opacity="0.75"'
           f'{dash} class="edge{"" if style == "solid" else " " + style}" data-edge="{html.escape(edge.name)}">'
           f'<title>{html.escape(tip)}</title></path>']
    if edge.input in ("q", "k", "v"):
        out.append(f'<text x="{mx + 4:.1f}" y="{my:.1f}" fill="{colour}" font-weight="bold">{edge.input}</text>')
    return out


def circuit_diagram(graph: Any, *, title: Optional[str] = None) -> str:
    """The kept edges of a `probes.CircuitGraph` as an inline `<svg>` (module docstring).

    Args:
        graph: a `CircuitGraph` (`probes.discover_circuit`, or `MechanismReport.graph`).
        title: a caption above the diagram (default: faithfulness and the number of kept edges).

    Returns:
        SVG markup (a string), self-contained.
    """
    graph = getattr(graph, "graph", graph)  # a CircuitVerdict draws its graph
    pos = _layout(graph)
    height = max(y for _, y in pos.values()) + _MARGIN
    biggest = max((e.strength for e in graph.kept), default=1.0) or 1.0
    on_circuit = {n for e in graph.kept for n in (e.sender, e.receiver)}
    cancelling = [(c, graph.edge(name)) for c in graph.cancelling if c.dropped for name in c.edges]
    positional = {e.name for e in graph.position_edges} | {e.name for e in graph.kept if e.sender == "pos"}
    caption = title or (f"{len(graph.kept)} of {len(graph.edges)} edges kept ({graph.corruption} corruption"
                        f"{' and permuted positions' if graph.position is not None else ''}), faithfulness "
                        f"{graph.faithfulness:.2f}; width: path-patching effect (largest {biggest:.3f} nats); "
                        f"dashed: position information; dotted grey: cancelling sets dropped")
    lines = textwrap.wrap(caption, _CAPTION_CHARS)  # wrapped to the width: no caption runs off the picture
    full = height + 20 + 15 * (len(lines) - 1)
    caption_lines = "".join(f'<tspan x="{_WIDTH / 2}" dy="{0 if i == 0 else 15}">{html.escape(line)}</tspan>'
                            for i, line in enumerate(lines))
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{full:.0f}" '
             f'viewBox="0 0 {_WIDTH} {full:.0f}" font-family="sans-serif" font-size="12" '
             f'class="circuit-diagram"><title>{html.escape(caption)}</title>',
             f'<text class="caption" x="{_WIDTH / 2}" y="{height + 12:.0f}" text-anchor="middle" fill="#444">'
             f'{caption_lines}</text>']
    by_pair: dict[tuple[str, str], int] = {}
    drawn = [(e, "position" if e.name in positional else "solid", None) for e in graph.kept]
    drawn += [(e, "cancelling", c) for c, e in cancelling]
    for edge, style, group in sorted(drawn, key=lambda x: -x[0].strength):
        pair = (edge.sender, edge.receiver)
        n = by_pair.get(pair, 0)
        by_pair[pair] = n + 1
        width = 1.0 + 9.0 * max(edge.strength, 0.0) / biggest if style != "cancelling" else 1.5
        tip = (f"{edge.name}: effect {edge.effect:+.4f} nats (SE {edge.se:.4f})"
               + (f", positional pass {edge.position_effect:+.4f}" if edge.position_effect == edge.position_effect
                  else "")
               + (f"; cancelling set, joint effect {group.effect:+.4f} nats (dropped)" if group else ""))
        parts += _edge_svg(edge, pos[edge.sender], pos[edge.receiver], n, width, style, tip)
    for name, (x, y) in pos.items():
        active = name in on_circuit
        fill = "#fff3c4" if active and "H" in name else ("#e8eefc" if active else "#f2f2f2")
        stroke = "#333" if active else "#bbb"
        shape = (f'<rect x="{x - 34:.1f}" y="{y - _RADIUS:.1f}" width="68" height="{2 * _RADIUS}" rx="6"'
                 if name in ("embed", "pos", "logits") or name.endswith(".mlp") else
                 f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{_RADIUS}"')
        parts.append(f'{shape} fill="{fill}" stroke="{stroke}" class="node" data-node="{html.escape(name)}">'
                     f'<title>{html.escape(name)}</title>'
                     f'</{"rect" if shape.startswith("<rect") else "circle"}>')
        parts.append(f'<text x="{x:.1f}" y="{y + 4:.1f}" text-anchor="middle" fill="{"#111" if active else "#999"}" '
                     f'pointer-events="none">'
                     f'{html.escape(name)}</text>')
    legend = "".join(f'<tspan fill="{c}" font-weight="bold">{k}</tspan> ' for k, c in INPUT_COLOURS.items())
    parts.append(f'<text x="{_MARGIN}" y="16" fill="#444">receiver input: {legend}</text>')
    return "".join(parts) + "</svg>"


def _heatmap(ax: Any, values: np.ndarray, labels: Sequence[str], title: str, *, ylabel: str, xlabel: str) -> None:
    finite = np.abs(values[np.isfinite(values)])
    lim = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
    ax.imshow(values, cmap="RdBu_r", vmin=-lim, vmax=lim)
    ax.set_xticks(range(len(labels)), labels, fontsize=7)
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.set_title(title, fontsize=8)
    ax.set_xlabel(xlabel, fontsize=7)
    ax.set_ylabel(ylabel, fontsize=7)
    if values.shape[0] <= 5:  # annotated at the colour scale's precision, readable, never "-0.0"
        from markov_interp.report.figures import annotation_format

        fmt = annotation_format(lim)
        for (i, j), v in np.ndenumerate(values):
            if math.isfinite(v):
                text = fmt.format(v)
                ax.text(j, i, text.lstrip("-") if float(text) == 0 else text, ha="center", va="center",
                        fontsize=8, color="white" if abs(v) > 0.6 * lim else "black")


def ov_qk_figure(ov: Any, qk: Any, heads: Sequence[tuple[int, int]]) -> Figure:
    """Each head's OV circuit ([attended state, next state]: the logits it adds) and QK circuit ([query state,
    key state]: its attention bias) as V x V heatmaps, one row per head in `heads` ((layer, head) pairs).

    Args:
        ov: `probes.ov_circuits(model)`, [layer, head, V, V].
        qk: `probes.qk_circuits(model)`, [layer, head, V, V].
        heads: the heads to draw.
    """
    vocab = ov.shape[-1]
    labels = [str(s) for s in range(vocab)]
    fig = Figure(figsize=(5.2, 2.3 * len(heads) + 0.3))
    axes = fig.subplots(len(heads), 2, squeeze=False)
    for row, (layer, head) in zip(axes, heads):
        _heatmap(row[0], np.asarray(ov[layer, head], dtype=float), labels, f"L{layer}H{head} OV: W_E W_OV W_U",
                 ylabel="attended state", xlabel="next state (logit)")
        _heatmap(row[1], np.asarray(qk[layer, head], dtype=float), labels, f"L{layer}H{head} QK: W_E W_QK W_E^T",
                 ylabel="query state", xlabel="key state")
    fig.tight_layout()
    return fig


def logit_attribution_figure(attribution: Any) -> Figure:
    """Direct logit attribution per component (`probes.direct_logit_attribution`): bars for the embedding, every
    head and every MLP, and the rest (positions, biases); they add up to the total."""
    names, values = ["embed"], [attribution.embed]
    heads = np.asarray(attribution.heads, dtype=float)
    for layer in range(heads.shape[0]):
        for head in range(heads.shape[1]):
            if math.isfinite(heads[layer, head]):
                names.append(f"L{layer}H{head}")
                values.append(float(heads[layer, head]))
        mlp = math.nan if attribution.mlps is None else float(attribution.mlps[layer])  # None: no MLPs
        if math.isfinite(mlp):
            names.append(f"L{layer}.mlp")
            values.append(mlp)
    names.append("rest")
    values.append(attribution.rest)
    fig = Figure(figsize=(max(4.0, 0.55 * len(names) + 1.5), 2.8))
    ax = fig.subplots()
    ax.bar(names, values, color=["tab:green" if v >= 0 else "tab:red" for v in values])
    ax.axhline(0, color="#888", linewidth=0.8)
    ax.set_ylabel("logit of the next state\n(minus the mean logit)", fontsize=8)
    ax.set_title(f"direct logit attribution (total {attribution.total:.3f})", fontsize=9)
    ax.tick_params(axis="x", labelrotation=45, labelsize=8)
    fig.tight_layout()
    return fig


def position_patching_figure(result: Any) -> Figure:
    """Recovery of the clean prediction by layer x patched position (`probes.patching_by_position`)."""
    grid = np.asarray(result.recovery, dtype=float)
    fig = Figure(figsize=(min(11.0, 1.5 + 0.18 * grid.shape[1]), 0.6 * grid.shape[0] + 1.4))
    ax = fig.subplots()
    image = ax.imshow(grid, aspect="auto", cmap="viridis", vmin=min(0.0, float(np.nanmin(grid))) if
                      np.isfinite(grid).any() else 0.0, vmax=1.0)
    ax.set_yticks(range(grid.shape[0]), [f"before L{i}" for i in range(grid.shape[0])], fontsize=8)
    ax.set_xlabel("patched position (clean residual stream there, corrupted elsewhere)", fontsize=8)
    ax.set_title(f"activation patching by layer x position: recovery at position {result.position}", fontsize=9)
    fig.colorbar(image, ax=ax, fraction=0.03)
    fig.tight_layout()
    return fig


def circuit_section(mech: "probes.MechanismReport", widget: Any = None) -> tuple:
    """The parts of the report's "circuit" section: the diagram of the circuit `classify_mechanism` found (as
    `widget`, an `interactive.InteractiveCircuit`, when given) and its strongest edges (the OV / QK, direct logit
    attribution and patching-by-position sections are `report._build`'s)."""
    from markov_interp.report._html import paragraph, table

    graph = mech.graph
    positional = (f" A second, positional pass reads the same tokens at permuted positions (total effect "
                  f"{graph.position.total_effect:.4f} nats, faithfulness {graph.position.faithfulness:.3f}): the "
                  f"edges that carry position information." if graph.position is not None else "")
    intro = paragraph(
        f"Every edge of the model's graph (sender -> receiver input) was corrupted on its own ({graph.corruption} "
        f"corruption: the sender's output from another sequence, only where that receiver input reads it) on "
        f"{graph.n_sequences} sequences of {graph.seq_len} states ({graph.method}: {graph.n_verified} edge "
        f"measurements by path patching); its effect is the rise of the loss. {graph.rule}. Faithfulness "
        f"{graph.faithfulness:.3f}: the kept edges alone recover that fraction of what corrupting everything costs "
        f"({graph.total_effect:.4f} nats); completeness {graph.completeness:.3f}: corrupting the kept edges alone "
        f"costs that fraction of it.{positional}")
    top = sorted(graph.edges, key=lambda e: -e.strength)[:12]
    kept = set(graph.kept_names)
    joint = {name: j.effect for j in graph.joint for name in j.edges}
    rows = [(e.name, e.effect, e.se, e.position_effect, e.attribution, "yes" if e.name in kept else "",
             "yes" if graph.necessary_alone(e.name) else "", joint.get(e.name), graph.minimality.get(e.name))
            for e in top]
    edges = table(rows, header=("edge", "effect (nats)", "SE", "positional pass", "gradient estimate", "kept",
                                "necessary alone", "receiver's kept edges jointly", "own contribution in the circuit"))
    cancel = [paragraph("Cancelling sets (each edge costs much alone, all together little): "
                        + "; ".join(c.describe() for c in graph.cancelling) + ".", cls="note")] \
        if graph.cancelling else []
    disagree = paragraph("Edges the gradient estimate (edge attribution patching) would decide differently: "
                         + (", ".join(graph.disagreements) or "none") + ".", cls="note")
    diagram = circuit_diagram(graph) if widget is None else widget.html()
    return (intro, diagram, edges, *cancel, disagree)


def axes_panel(mech: "probes.MechanismReport") -> str:
    """The verdict's two axes side by side (module docstring): an HTML table, circuit on the left, law on the
    right, the gains g_k with their SEs."""
    from markov_interp import probes
    from markov_interp.report._gains import gains_text  # on a fixed chain: why there are none

    c, law, g = mech.circuit, mech.law, mech.gains
    raw = law.raw
    circuit_rows = [c.describe(), f"{len(c.graph.kept)} of {len(c.graph.edges)} edges kept; faithfulness "
                    f"{c.graph.faithfulness:.2f}, completeness {c.graph.completeness:.2f}",
                    f"kept only by the positional pass: {', '.join(e.name for e in c.graph.position_edges) or 'none'}",
                    "cancelling: " + ("; ".join(x.describe() for x in c.graph.cancelling) or "none")]
    law_rows = [law.describe(), f"temperature {law.temperature:.2f}: fit {law.fit_ratio:.3f}, margin "
                f"{law.margin_ratio:.3f}; raw ({probes.STRATEGY_LABELS.get(raw.law, raw.law)}): fit "
                f"{raw.fit_ratio:.3f}, margin {raw.margin_ratio:.3f}",
                "gains: " + (", ".join(f"g_{k} {v:.2f} ± {g.se[k]:.2f}" for k, v in g.items())
                             if mech.references.in_context else gains_text(mech, short=True)),
                f"kernel swap: in-context fraction {mech.in_context_fraction:.2f} ± {mech.kernel_swap.se:.2f}"]
    cells = "".join(f"<tr><td>{html.escape(a)}</td><td>{html.escape(b)}</td></tr>"
                    for a, b in zip(circuit_rows, law_rows))
    head = html.escape(f"{mech.label}{'' if mech.confident else ' (not confident)'}")
    return (f'<table class="axes"><caption>{head}</caption><thead><tr><th>circuit: {html.escape(c.kind)}</th>'
            f'<th>law: {html.escape(law.status)}</th></tr></thead><tbody>{cells}</tbody></table>')
