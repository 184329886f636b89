"""How the package's typed results show themselves: a one-line `repr`, a few-line `summary()`, an HTML view in
Jupyter (`_repr_html_`) and `to_dict()` (JSON-ready).

A result class either derives from `Result` (and is declared `@dataclass(repr=False)`, so that the dataclass does
not write its field-by-field repr of every tensor over it) or is decorated with `@displayed` (which puts `Result`'s
display on it, over the dataclass's repr). Either way it gets, unless it writes its own:

- `repr`: `<ClassName: headline>` on one line of at most 160 characters; the headline is the class's
  `_headline()`, else its `describe()`, else its fields (numbers rounded, tensors as their shape, never their
  values, and no NaN: a part the model does not have is left out);
- `summary()`: the headline (classes with more to say write their own);
- `_repr_html_`: the summary and a table of the fields;
- `to_dict()`: the fields as JSON (tensors as lists, NaN and infinities as None, nested results and configs by
  their own `to_dict`).

This module sits at the package's root so that every stage (theory, training, dynamics, landscape, probes, sweep,
report) can use it; it imports nothing heavy (pandas only when a table is asked for).
"""

import dataclasses
import html
import inspect
import math
import os
from collections.abc import Callable, Mapping
from typing import Any, Optional

_MAX_HEADLINE = 160  # characters of the one-line repr
_MAX_FIELDS = 40  # rows of the generic HTML table


def headline(value: Any) -> str:
    """The one-line description of a result (its `_headline()`), else its `str`, on one line of at most 160
    characters.

    Args:
        value: a result or anything else.

    Returns:
        One line.
    """
    own = getattr(value, "_headline", None)
    text = own() if callable(own) and not isinstance(value, type) else str(value)
    text = " ".join(text.split())
    return text if len(text) <= _MAX_HEADLINE else text[: _MAX_HEADLINE - 3] + "..."


def short(value: Any) -> Optional[str]:
    """A field value in a few characters, or None for a value to leave out (NaN: a part that is not there).

    Tensors and arrays show their shape, never their values; numbers are rounded; results show their class.

    >>> short(0.123456), short(float("nan")), short([1, 2, 3]), short("text")
    ('0.1235', None, '3 items', 'text')
    """
    if value is None or isinstance(value, (bool, int)):
        return str(value)
    if isinstance(value, float):
        return None if math.isnan(value) else f"{value:.4g}"
    if hasattr(value, "shape") and hasattr(value, "dtype"):  # a torch tensor or numpy array
        shape = tuple(value.shape)
        if not shape:
            return short(float(value)) if "float" in str(value.dtype) else str(value.item())
        return f"[{', '.join(str(n) for n in shape)}]"
    if isinstance(value, str):
        return value if len(value) <= 40 else value[:37] + "..."
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (list, tuple, set, frozenset, Mapping)):
        return f"{len(value)} items"
    if dataclasses.is_dataclass(value) or hasattr(value, "_headline"):
        return type(value).__name__
    text = str(value)
    return text if len(text) <= 40 else type(value).__name__


def _shown_fields(result: Any) -> list[tuple[str, Any]]:
    """(name, value) of the dataclass fields a display shows (those declared with `repr=True`)."""
    if not dataclasses.is_dataclass(result):
        return []
    return [(f.name, getattr(result, f.name)) for f in dataclasses.fields(result) if f.repr]


def fields_line(result: Any) -> str:
    """'name value, ...' over a dataclass result's shown fields (NaN left out)."""
    parts = [(name, short(value)) for name, value in _shown_fields(result)]
    return ", ".join(f"{name} {text}" for name, text in parts if text is not None)


def jsonable(value: Any) -> Any:
    """`value` as JSON: tensors and arrays to lists, NaN / infinities to None, results and configs by their own
    `to_dict`, dataclasses by their fields, paths to text.

    >>> jsonable({"a": float("nan"), "b": (1, 2.5)})
    {'a': None, 'b': [1, 2.5]}
    """
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.detach().cpu().tolist() if hasattr(value, "detach") else value.tolist()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        return jsonable(to_dict())
    if dataclasses.is_dataclass(value):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return str(value)


def _no_argument_method(obj: Any, name: str) -> Any:
    method = getattr(obj, name, None)
    if not callable(method):
        return None
    try:
        needed = [p for p in inspect.signature(method).parameters.values()
                  if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    except (TypeError, ValueError):
        return None
    return None if needed else method


class Result:
    """Display for typed results (module docstring): `repr` is one line, `summary()` a few, `_repr_html_` the
    summary and a table, `to_dict()` JSON. Subclasses override what they say better themselves."""

    def summary(self) -> str:
        """A few lines for people: the headline first, then the numbers that support it."""
        return self._headline()

    def _summary(self) -> str:
        """`summary()` read off the class (a dataclass may hold a field called `summary`)."""
        return type(self).summary(self)

    def _headline(self) -> str:
        """One line: the first of the class's own `summary()`, else its `describe()` when that needs no argument,
        else its fields."""
        if type(self).summary is not Result.summary:
            return (self._summary().splitlines() or [""])[0]
        describe = _no_argument_method(self, "describe")
        return describe() if describe is not None else fields_line(self)

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: {headline(self)}>"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # IPython's plain-text display: the summary
        printer.text(repr(self) if cycle else self._summary())

    def _html_tables(self) -> list[tuple[str, Any]]:
        """(caption, DataFrame) pairs shown under the summary in Jupyter: the result's own table if it has one."""
        to_dataframe = getattr(self, "to_dataframe", None)
        return [("", to_dataframe())] if callable(to_dataframe) else []

    def _html_fields(self) -> str:
        rows = [(name, short(value)) for name, value in _shown_fields(self)][:_MAX_FIELDS]
        cells = "".join(f"<tr><th>{html.escape(name)}</th><td>{html.escape(text)}</td></tr>"
                        for name, text in rows if text is not None)
        return f"<table>{cells}</table>" if cells else ""

    def _repr_html_(self) -> str:
        lines = self._summary().splitlines() or [""]
        first, rest = (self._headline(), lines) if len(lines) == 1 else (lines[0], lines[1:])
        parts = [f"<div class=\"markov-interp-result\"><p><b>{html.escape(type(self).__name__)}</b>: "
                 f"{html.escape(first)}</p>"]
        if rest and rest != [first]:
            parts.append("<ul>" + "".join(f"<li>{html.escape(line.strip())}</li>" for line in rest) + "</ul>")
        tables = self._html_tables()
        opened = " open"  # the first captioned table starts open, the others one click away
        for caption, frame in tables:
            text_columns = [c for c in frame.columns if frame[c].dtype == object]
            frame = frame.fillna({c: "" for c in text_columns})  # None reads as empty, not "None"
            table = frame.to_html(float_format=lambda x: f"{x:.4g}", na_rep="", border=0)
            if caption:
                parts.append(f"<details{opened}><summary>{html.escape(caption)}</summary>{table}</details>")
                opened = ""
            else:
                parts.append(table)
        if not tables:
            parts.append(self._html_fields())
        return "".join(parts) + "</div>"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: every field (tensors as lists, NaN as None, nested results by their own `to_dict`)."""
        return {f.name: jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)} \
            if dataclasses.is_dataclass(self) else {}


_ALWAYS = ("__repr__", "_repr_pretty_")  # put over the dataclass's own
_UNLESS_WRITTEN = ("summary", "_summary", "_headline", "_html_tables", "_html_fields", "_repr_html_", "to_dict")


def displayed(cls: Optional[type] = None, *, line: Optional[Callable[[Any], str]] = None) -> Any:
    """Class decorator: `Result`'s display on a class that does not derive from it (a dataclass whose repr would
    list every field, a class with a base of its own): the one-line repr always, and `summary`, `_repr_html_`,
    `to_dict` where the class does not write them itself. Put it above `@dataclass`; `@displayed(line=fn)` makes
    `fn(result)` the headline.

    >>> @displayed
    ... @dataclasses.dataclass(frozen=True)
    ... class Loss:
    ...     value: float
    ...     se: float = float("nan")
    >>> Loss(0.25)
    <Loss: value 0.25>
    >>> Loss(0.25).to_dict()
    {'value': 0.25, 'se': None}
    """
    if cls is None:
        return lambda c: displayed(c, line=line)
    for name in _ALWAYS:
        setattr(cls, name, Result.__dict__[name])
    if line is not None:
        cls._headline = lambda self: line(self)
    for name in _UNLESS_WRITTEN:
        if not any(name in vars(base) for base in cls.__mro__ if base is not object):
            setattr(cls, name, Result.__dict__[name])
    cls.__markov_displayed__ = True
    return cls
