"""Offline HTML: one self-contained file, figures inline, circuitsvis's JavaScript bundle included once.

Nothing here reaches the network. Matplotlib figures become inline SVG; circuitsvis figures become a `<div>`
plus a one-line `CircuitsVis.render(...)` call that uses the bundle (`circuitsvis/dist/cdn/iife.js`, shipped
with the Python package) inlined once in the document's `<head>`. In Jupyter, `CircuitsFigure._repr_html_`
inlines the bundle into its own output instead, and never calls circuitsvis's `RenderedHTML`, whose
`_repr_html_` probes the internet (an HTTP request to google.com) before choosing a CDN.
"""

import dataclasses
import functools
import html
import io
import itertools
import json
import math
import os
import re
from pathlib import Path
from collections.abc import Sequence
from typing import Any, Optional

import matplotlib
from matplotlib.figure import Figure

from markov_interp._io import atomic_write
from markov_interp.config import check_int

_SCRIPT_CLOSE = re.compile(r"</(script)", re.IGNORECASE)
_COUNTER = itertools.count()


@functools.lru_cache(maxsize=1)
def circuitsvis_bundle() -> str:
    """circuitsvis's browser bundle (an IIFE that defines the global `CircuitsVis`), safe to inline.

    `</script` inside it is written `<\\/script` (the same string to JavaScript) so that it cannot end the
    enclosing `<script>` element, and the source-map comment is dropped (it would name a file that is not there).
    """
    import circuitsvis

    path = Path(circuitsvis.__file__).parent / "dist" / "cdn" / "iife.js"
    if not path.exists():
        raise FileNotFoundError(f"circuitsvis's JavaScript bundle is missing at {path}")
    text = path.read_text(encoding="utf-8")
    text = re.sub(r"\n//# sourceMappingURL=\S*\s*$", "\n", text)
    return _SCRIPT_CLOSE.sub(r"<\\/\1", text)


def _json_for_script(value: Any) -> str:
    """JSON that is also safe inside an inline `<script>` (no `</`, `<!--` or stray line separators)."""
    text = json.dumps(value, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def _jsonable(value: Any, digits: int) -> Any:
    """Tensors / arrays to nested lists, floats rounded to `digits` decimals (NaN and inf become None)."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()
    if isinstance(value, dict):
        return {str(k): _jsonable(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, digits) for v in value]
    if isinstance(value, float):
        return round(value, digits) if math.isfinite(value) else None
    return value


@dataclasses.dataclass(frozen=True)
class CircuitsFigure:
    """A circuitsvis React component (e.g. "AttentionHeads") with its props, drawn offline.

    `div(bundle_loaded=True)` is the fragment for a document that already holds the bundle;
    `_repr_html_()` (Jupyter) carries the bundle itself in a module script, so the output works on its own.
    """

    component: str
    props: dict
    element_id: str = dataclasses.field(default_factory=lambda: f"circuits-vis-{next(_COUNTER)}")

    def _call(self) -> str:
        return (
            f"CircuitsVis.render({_json_for_script(self.element_id)}, CircuitsVis.{self.component}, "
            f"{_json_for_script(self.props)});"
        )

    def div(self) -> str:
        """`<div>` + render call for a document whose `<head>` already defines `CircuitsVis` (see `document`)."""
        return (
            f'<div class="circuitsvis" id="{html.escape(self.element_id)}"></div>\n'
            f"<script>{self._call()}</script>"
        )

    def _repr_html_(self) -> str:
        return (
            f'<div class="circuitsvis" id="{html.escape(self.element_id)}"></div>\n'
            f'<script type="module">\n{circuitsvis_bundle()}\n{self._call()}\n</script>'
        )


def circuits_figure(component: str, props: dict, *, digits: int = 4) -> CircuitsFigure:
    """A `CircuitsFigure` whose props are made JSON-ready (tensors to lists, floats rounded to `digits`)."""
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9]*", component):
        raise ValueError(f"circuitsvis component must be a plain name like 'AttentionHeads', got {component!r}")
    clean = {k: _jsonable(v, digits) for k, v in props.items() if v is not None}
    return CircuitsFigure(component=component, props=clean)


def figure_svg(fig: Figure, *, salt: str = "") -> str:
    """A matplotlib figure as an inline `<svg>` element (text kept as text; ids salted to stay unique).

    Colour meshes (`pcolormesh`) are rasterised first (an embedded PNG instead of one path per cell).

    The figure is closed afterwards when pyplot manages it.
    """
    from matplotlib.collections import QuadMesh

    for ax in fig.axes:  # a mesh of n x n cells is n^2 SVG paths (megabytes): draw meshes as images
        for artist in ax.collections:
            if isinstance(artist, QuadMesh):
                artist.set_rasterized(True)
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": salt or f"fig{next(_COUNTER)}"}):
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None, "Creator": None,
                                                                      "Format": None, "Type": None})
    _close(fig)
    text = buf.getvalue()
    start = text.find("<svg")
    assert start >= 0, "matplotlib wrote no <svg> element"
    text = text[start:]
    return re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.DOTALL)


def _close(fig: Figure) -> None:
    import sys

    if "matplotlib.pyplot" in sys.modules:  # a figure made through pyplot stays open until closed
        sys.modules["matplotlib.pyplot"].close(fig)


@dataclasses.dataclass(frozen=True)
class Section:
    """One titled part of a report: `id` (the HTML anchor, `section-<id>`), a title and HTML body parts.

    Parts are strings of HTML, matplotlib `Figure`s (inlined as SVG) or `CircuitsFigure`s.
    """

    id: str
    title: str
    parts: tuple

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z][a-z0-9-]*", self.id):
            raise ValueError(f"section id must be lower-case letters, digits and '-', got {self.id!r}")

    def _repr_html_(self) -> str:
        """Jupyter: the section on its own (circuitsvis figures carry the bundle themselves)."""
        parts = [p._repr_html_() if isinstance(p, CircuitsFigure) else p for p in self.parts]
        inner = Section(self.id, self.title, tuple(parts)).body()
        return f"<style>{_CSS}</style><section><h2>{html.escape(self.title)}</h2>{inner}</section>"

    def body(self) -> str:
        out = []
        for i, part in enumerate(self.parts):
            if isinstance(part, Figure):
                out.append(f'<figure class="plot">{figure_svg(part, salt=f"{self.id}-{i}")}</figure>')
            elif isinstance(part, CircuitsFigure):
                out.append(part.div())
            elif isinstance(part, str):
                out.append(part)
            else:
                raise TypeError(f"section part must be HTML, a Figure or a CircuitsFigure, got {type(part).__name__}")
        return "\n".join(out)


_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;max-width:1100px;margin:0 auto;
padding:1.5em;color:#222;line-height:1.45}
h1{font-size:1.6em;margin-bottom:.2em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
nav ul{columns:2;font-size:.95em}pre{background:#f6f8fa;padding:.8em;overflow:auto;font-size:.85em}
table{border-collapse:collapse;margin:.6em 0}td,th{border:1px solid #ddd;padding:.25em .6em;text-align:left;
font-size:.92em}th{background:#f6f8fa}figure.plot{margin:.8em 0}figure.plot svg{max-width:100%;height:auto}
.verdict{font-size:1.25em;padding:.5em .8em;border-left:5px solid #4a7;background:#f3faf5}
.verdict.unsure{border-color:#d90;background:#fdf8ec}.note{color:#666;font-style:italic}
.circuitsvis{margin:15px 0;min-height:40px}
.why{margin:.4em 0}.why table{width:100%;margin:.3em 0}.why td:first-child{width:7em;font-weight:600}
.verdict .reason{font-size:.7em;color:#444;margin-top:.2em}
.first-screen{display:flex;gap:1em;align-items:flex-start}.first-screen figure{flex:1 1 50%;margin:0;min-width:0}
.first-screen svg{max-width:100%;height:auto}details.config-json summary{cursor:pointer;color:#444}
#section-summary>h2,#section-verdicts>h2{display:none}.wide{overflow-x:auto;max-width:100%}
table.edges td.kept{background:#fff3c4;text-align:right}table.edges td.absent{color:#bbb;text-align:center}
table.edges th.edge{font-size:.75em;writing-mode:vertical-rl;transform:rotate(180deg);white-space:nowrap}
h1{margin-top:.2em}footer{color:#888;font-size:.85em;margin-top:2em}
"""


def document(title: str, sections: Sequence[Section], *, intro: str = "", lead: int = 0) -> str:
    """The whole report: `<head>` with the CSS and circuitsvis's bundle (once, only if a section needs it), the
    title and `intro`, the first `lead` sections (the first screen), the contents (every section), then the other
    sections. Each section is a `<section id="section-<id>">`."""
    check_int("lead (sections on the first screen)", lead, minimum=0, maximum=len(sections))
    needs_bundle = any(isinstance(p, CircuitsFigure) for s in sections for p in s.parts)
    head_script = f"<script>\n{circuitsvis_bundle()}\n</script>\n" if needs_bundle else ""
    toc = "\n".join(f'<li><a href="#section-{s.id}">{html.escape(s.title)}</a></li>' for s in sections)
    body = [f'<section id="section-{s.id}">\n<h2>{html.escape(s.title)}</h2>\n{s.body()}\n</section>'
            for s in sections]
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        f"<title>{html.escape(title)}</title>\n<style>{_CSS}</style>\n{head_script}</head>\n<body>\n"
        f"<h1>{html.escape(title)}</h1>\n{intro}\n" + "\n".join(body[:lead])
        + f"\n<nav><h2>Contents</h2><ul>\n{toc}\n</ul></nav>\n" + "\n".join(body[lead:])
        + "\n<footer>Generated by markov-interp; this file opens without a network.</footer>\n</body>\n</html>\n"
    )


def iframe(doc: str, *, height: int = 900) -> str:
    """A whole HTML document as an `<iframe srcdoc=...>` (how Jupyter shows a report without mixing its CSS)."""
    return (
        f'<iframe srcdoc="{html.escape(doc, quote=True)}" style="width:100%;height:{int(height)}px;'
        f'border:1px solid #ddd"></iframe>'
    )


def table(rows: Sequence[Sequence[Any]], *, header: Optional[Sequence[str]] = None) -> str:
    """A small HTML table; cells are escaped, floats shown with 4 decimals."""

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return "n/a" if math.isnan(value) else f"{value:.4f}"
        return html.escape("n/a" if value is None else str(value))

    head = "" if header is None else "<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr>"
    body = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table>{head}{body}</table>"


def paragraph(text: str, *, cls: Optional[str] = None) -> str:
    """`<p>` with escaped text (and an optional class)."""
    attr = f' class="{html.escape(cls)}"' if cls else ""
    return f"<p{attr}>{html.escape(text)}</p>"


def atomic_write_text(path: "str | os.PathLike", text: str) -> Path:
    """Write `text` (UTF-8) to `path` atomically (`markov_interp._io.atomic_write`); refuses a folder."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"report path {path} is a folder; expected a file name such as report.html")
    return atomic_write(path, text)


def section_by_id(sections: "tuple[Section, ...]", section_id: str) -> "Section":
    """The section of `sections` called `section_id`; a ValueError naming the ids there otherwise."""
    for s in sections:
        if s.id == section_id:
            return s
    raise ValueError(f"no section {section_id!r}; have {[s.id for s in sections]}")
