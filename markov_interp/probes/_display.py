"""How probe results show themselves: a one-line `repr`, a few-line `summary()`, an HTML view in Jupyter, `to_dict()`
and a pandas `DataFrame` where the result is naturally a table.

A result class derives from `ProbeResult` (`markov_interp._display.Result`, declared `@dataclass(repr=False)`, so
the dataclass does not write its field-by-field repr of every tensor over it) or is decorated `@displayed`; it
writes `summary()` (first line: the headline) and, where a table is natural, `to_dataframe()`. pandas is imported
only when a table is asked for (it comes with TransformerLens).
"""

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any, Optional

from markov_interp._display import Result, displayed, headline  # noqa: F401  (the probes' names for them)


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


class ProbeResult(Result):
    """Display for probe results (`markov_interp._display.Result`): `repr` is one line, `summary()` a few,
    `_repr_html_` the summary and the table, `to_dict()` JSON. Subclasses write `summary()`; those with a
    natural table also write `to_dataframe()`."""


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
