"""How probe results show themselves: a one-line `repr`, a few-line `summary()`, an HTML view in Jupyter, and a
pandas `DataFrame` where the result is naturally a table.

A result class derives from `ProbeResult` (and is declared `@dataclass(repr=False)`, so the dataclass does not
write its field-by-field repr of every tensor over it); it writes `summary()` (first line: the headline) and,
where a table is natural, `to_dataframe()`. pandas is imported only when a table is asked for (it comes with
TransformerLens).
"""

import dataclasses
import html
from collections.abc import Iterable, Mapping
from typing import Any, Optional

_MAX_HEADLINE = 160  # characters of the one-line repr


def dataframe(rows: Iterable[Mapping[str, Any]], *, index: Optional[str] = None) -> Any:
    """A pandas DataFrame of `rows` (dicts with the same keys), indexed by the column `index` if given.

    Args:
        rows: one mapping per row.
        index: the column to index by (None: a plain range index).

    Returns:
        A pandas DataFrame (pandas is imported here, not when the probes are).
    """
    try:
        import pandas
    except ImportError as err:  # pragma: no cover - pandas is a dependency of transformer-lens
        raise ImportError("to_dataframe() needs pandas (`pip install pandas`; TransformerLens installs it)") from err
    frame = pandas.DataFrame(list(rows))
    return frame.set_index(index) if index is not None and len(frame) else frame


def headline(value: Any) -> str:
    """The one-line description of a probe result (its summary's first line), else its `str`, shortened.

    Args:
        value: a probe result or anything else.

    Returns:
        At most 160 characters on one line.
    """
    text = value._headline() if isinstance(value, ProbeResult) else str(value)
    text = " ".join(text.split())
    return text if len(text) <= _MAX_HEADLINE else text[: _MAX_HEADLINE - 3] + "..."


class ProbeResult:
    """Display for probe results: `repr` is one line, `summary()` a few, `_repr_html_` the summary and the table.

    Subclasses write `summary()`; those with a natural table also write `to_dataframe()`.
    """

    def summary(self) -> str:
        """A few lines for people: the headline first, then the numbers that support it."""
        raise NotImplementedError

    def _headline(self) -> str:
        """One line: the summary's first (a class whose `summary()` is a single long sentence writes its own)."""
        return self.summary().splitlines()[0]

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: {headline(self)}>"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # IPython's plain-text display: the summary
        printer.text(repr(self) if cycle else self.summary())

    def _html_tables(self) -> list[tuple[str, Any]]:
        """(caption, DataFrame) pairs shown under the summary in Jupyter: the result's own table by default."""
        to_dataframe = getattr(self, "to_dataframe", None)
        return [("", to_dataframe())] if to_dataframe is not None else []

    def _repr_html_(self) -> str:
        lines = self.summary().splitlines()
        first, rest = (self._headline(), lines) if len(lines) == 1 else (lines[0], lines[1:])
        parts = [f"<div class=\"markov-interp-result\"><p><b>{html.escape(type(self).__name__)}</b>: "
                 f"{html.escape(first)}</p>"]
        if rest and rest != [first]:
            parts.append("<ul>" + "".join(f"<li>{html.escape(line.strip())}</li>" for line in rest) + "</ul>")
        opened = " open"  # the first captioned table starts open, the others one click away
        for caption, frame in self._html_tables():
            text_columns = [c for c in frame.columns if frame[c].dtype == object]
            frame = frame.fillna({c: "" for c in text_columns})  # None reads as empty, not "None"
            table = frame.to_html(float_format=lambda x: f"{x:.4g}", na_rep="", border=0)
            if caption:
                parts.append(f"<details{opened}><summary>{html.escape(caption)}</summary>{table}</details>")
                opened = ""
            else:
                parts.append(table)
        return "".join(parts) + "</div>"


_MAX_EVIDENCE_ROWS = 64  # longer tables (per-position curves) stay out of a report's HTML view


def evidence_tables(result: Any) -> list[tuple[str, Any]]:
    """(caption, DataFrame) for every field of a dataclass result that is itself a probe result with a table
    (read generically, so fields added later show up too); tables over 64 rows are left out.

    Args:
        result: a dataclass probe result (a `MechanismReport`).

    Returns:
        (caption, DataFrame) pairs in field order.
    """
    out = []
    for field in dataclasses.fields(result):
        value = getattr(result, field.name)
        if isinstance(value, ProbeResult) and hasattr(value, "to_dataframe"):
            frame = value.to_dataframe()
            if len(frame) <= _MAX_EVIDENCE_ROWS:
                out.append((f".{field.name}: {headline(value)}", frame))
    return out
