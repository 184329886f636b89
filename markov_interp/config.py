"""One config base for every config of the package: source, model, training, run and sweep spec.

A config is a frozen, keyword-only dataclass that also derives from `Config`, which gives it, written once:

- serialisation: `to_dict()` (JSON-ready: tuples become lists, nested configs become dicts), `to_json()` (sorted
  keys), `from_dict()` and `from_json()`, with nested config fields rebuilt from their own sections;
- refusal of unknown keys on load, with a one-line `ValueError` listing the unknown and the valid keys, and a
  separate message when a value that should be a table (a dict) is not (`"source": "binary"`);
- `replace(**changes)`: `dataclasses.replace` after checking the field names.

The validators below (`check_int`, `check_number`, `check_choice`, `check_probability`, `check_bool`, `check_seed`)
are the common checks of `__post_init__` methods and of public functions' arguments; each raises a `ValueError`
naming the option, what it takes and the bad value, quoted by `shown` (at most about 200 characters of it: a 60 MB
string in a config gives a line, not 60 MB). No module writes `isinstance(x, bool) or not isinstance(x, int)` itself
(tests/project/test_standards.py scans for it).

`check_value` is the one annotation checker: a value against its annotation (`check_type`) and the limits of
`bounds()`. `check_fields` applies it to every field of a dataclass (a budget, a probe's component, the classifier's
thresholds: bounds declared per field, or a class's own rule for its fields).

`Checked` is the base of the typed records of stored files (a sweep's cell records and results, a run's
divergence record, metrics rows, reference-cache entries): its `__post_init__` checks every field against its
annotation (`check_type`: `Optional[int]`, `tuple[int, int]`, `dict`, ...) and the bounds given with `bounds()`,
then the record's own rules across fields (`check`). One definition per file kind, read and written through it,
instead of checks written by hand at each read. This module imports only `_io` (which imports nothing of the
package), so every stage can use it; JSON it parses goes through `_io.loads_json` (a depth limit).

>>> import dataclasses
>>> @dataclasses.dataclass(frozen=True, kw_only=True)
... class Demo(Config):
...     steps: int = 10
...     def __post_init__(self) -> None:
...         check_int("steps", self.steps, minimum=1)
>>> Demo.from_json(Demo(steps=3).to_json())
Demo(steps=3)
>>> Demo.from_dict({"stepz": 3})
Traceback (most recent call last):
...
ValueError: unknown Demo keys ['stepz']; valid keys are ['steps']
"""

import dataclasses
import functools
import json
import math
import reprlib
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Optional, TypeVar, Union

from markov_interp._io import loads_json

__all__ = [
    "Config",
    "check_keys",
    "check_int",
    "check_number",
    "check_choice",
    "check_probability",
    "check_bool",
    "check_seed",
    "SEED_MAX",
    "MAX_PARALLEL",
    "shown",
    "to_jsonable",
    "Checked",
    "check_type",
    "bounds",
    "check_value",
    "check_fields",
    "field_limits",
    "scalar_kind",
    "parse_value",
    "parse_setting",
]

C = TypeVar("C", bound="Config")
R = TypeVar("R", bound="Checked")


def parse_value(text: str) -> Any:
    """A value given as text on a command line: JSON when it is JSON (numbers, true / false, null, lists, quoted
    strings), else the text itself.

    >>> parse_value("0.01"), parse_value("[1, 2]"), parse_value("uniform")
    (0.01, [1, 2], 'uniform')
    """
    try:
        return loads_json(text, "the value")
    except json.JSONDecodeError:
        return text


def parse_setting(item: str, *, flag: str = "--set") -> tuple[str, Any]:
    """The one `--set KEY=VALUE` form of the command line: (key, `parse_value(VALUE)`); ValueError naming `flag`
    and the item when there is no '=' or no key.

    >>> parse_setting("train.lr=0.01")
    ('train.lr', 0.01)
    """
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"{flag} takes KEY=VALUE, got {shown(item)}")
    return key.strip(), parse_value(text)


def to_jsonable(value: Any) -> Any:
    """`value` with tuples turned into lists and configs into dicts, recursively (what `json.dumps` writes)."""
    if isinstance(value, Config):
        return value.to_dict()
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {k: to_jsonable(v) for k, v in value.items()}
    return value


def check_keys(cls: type, data: Any, *, where: Optional[str] = None, what: str = "keys") -> dict:
    """`data` as a dict after checking it is a table whose keys all name fields of the dataclass `cls`.

    A non-dict gets its own message (naming `where`, the section it was given for); unknown keys raise
    ValueError listing them and the valid ones.
    """
    name = cls.__name__
    if not isinstance(data, Mapping):
        place = f"{where} must be" if where else "must be given"
        raise ValueError(f"{name}: {place} a table (dict) of options, got {type(data).__name__} {shown(data)}")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known, key=str)
    if unknown:
        prefix = f"{where}: " if where else ""
        raise ValueError(f"{prefix}unknown {name} {what} {unknown}; valid {what} are {sorted(known)}")
    return dict(data)


class Config:
    """Base of the package's configs (mix into a frozen, keyword-only dataclass); see the module docstring."""

    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-ready (nested configs as dicts, tuples as lists); a field named in
        `_LATER_FIELDS` is left out while it holds that value (see there)."""
        later = getattr(type(self), "_LATER_FIELDS", {})
        return {f.name: to_jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)
                if not (f.name in later and getattr(self, f.name) == later[f.name])}

    @classmethod
    def from_dict(cls: type[C], data: Any, *, where: Optional[str] = None) -> C:
        """Inverse of `to_dict`. Unknown keys, missing required keys and non-tables raise ValueError; a field
        typed as a `Config` is rebuilt from its own table (errors name the section)."""
        data = check_keys(cls, data, where=where)
        missing = sorted(
            f.name for f in dataclasses.fields(cls)
            if f.name not in data and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        )
        if missing:
            raise ValueError(f"{where + ': ' if where else ''}{cls.__name__} lacks required keys {missing}")
        for f in dataclasses.fields(cls):
            if f.name in data and isinstance(f.type, type) and issubclass(f.type, Config):
                data[f.name] = f.type.from_dict(data[f.name], where=f.name if where is None else f"{where}.{f.name}")
        return cls(**data)

    def to_json(self, *, indent: Optional[int] = None) -> str:
        """`to_dict()` as JSON with sorted keys (the form run folders and cell ids use)."""
        return json.dumps(self.to_dict(), sort_keys=True, indent=indent)

    @classmethod
    def from_json(cls: type[C], text: str) -> C:
        """Inverse of `to_json`; text that is not JSON raises ValueError."""
        try:
            data = loads_json(text, cls.__name__)
        except json.JSONDecodeError as err:
            raise ValueError(f"{cls.__name__} is not valid JSON: {err}") from None
        return cls.from_dict(data)

    def replace(self: C, **changes: Any) -> C:
        """A copy with `changes` (`dataclasses.replace`, re-validated); unknown field names raise ValueError."""
        check_keys(type(self), changes, what="fields")
        return dataclasses.replace(self, **changes)


# ----------------------------------------------------------------------------------------------- validators
SHOWN_CHARACTERS = 200  # the most characters of a bad value a message quotes


def _make_repr() -> reprlib.Repr:
    short = reprlib.Repr()
    short.maxstring = short.maxother = SHOWN_CHARACTERS
    short.maxlevel, short.maxlong = 4, 60
    short.maxlist = short.maxtuple = short.maxdict = short.maxset = short.maxfrozenset = short.maxdeque = 12
    return short


_SHORT_REPR = _make_repr()


def shown(value: Any) -> str:
    """`repr(value)` for an error message, cut to about `SHOWN_CHARACTERS` characters (long strings and lists keep
    their ends, `...` between), nested containers to 4 levels; an integer too long to print is described.

    >>> shown("x" * 10**6)[:12], len(shown("x" * 10**6)) <= 210, shown(10**5000)
    ("'xxxxxxxxxxx", True, 'an integer of 16610 bits')
    """
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 160:
        return f"{'a negative' if value < 0 else 'an'} integer of {value.bit_length()} bits"
    try:
        text = _SHORT_REPR.repr(value)
    except Exception:  # a repr that fails (or a huge int nested in a list): say what it is
        text = f"a {type(value).__name__}"
    return text if len(text) <= SHOWN_CHARACTERS + 10 else text[:SHOWN_CHARACTERS] + "..."


MAX_PARALLEL = 512  # the most threads (`--threads`) or worker processes (`workers`) one command starts

SEED_MAX = 2**63 - 1  # the largest seed: every generator the package seeds takes a signed 64-bit integer


def check_seed(name: str, value: Any) -> None:
    """A seed: an integer in 0..SEED_MAX (`torch.Generator.manual_seed` takes 64 bits; `2**70` used to pass the
    config check and fail at the first generator with "Overflow when unpacking long long").

    >>> check_seed("seed", 2**70)
    Traceback (most recent call last):
    ...
    ValueError: seed must be an integer in 0..9223372036854775807, got 1180591620717411303424
    """
    check_int(name, value, minimum=0, maximum=SEED_MAX)


def check_int(name: str, value: Any, *, minimum: Optional[int] = None, maximum: Optional[int] = None,
              none_ok: bool = False) -> None:
    """An integer (not a bool) >= `minimum` and <= `maximum` (either may be None: no bound); with `none_ok` None
    passes too. ValueError naming `name`, what it takes and the value.

    >>> check_int("workers", 0, minimum=1, none_ok=True)
    Traceback (most recent call last):
    ...
    ValueError: workers must be None or an integer >= 1, got 0
    """
    if none_ok and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or (minimum is not None and value < minimum) \
            or (maximum is not None and value > maximum):
        what = ("an integer" + (f" >= {minimum}" if maximum is None and minimum is not None else "")
                + (f" in {minimum}..{maximum}" if maximum is not None and minimum is not None else "")
                + (f" <= {maximum}" if minimum is None and maximum is not None else ""))
        raise ValueError(f"{name} must be {'None or ' if none_ok else ''}{what}, got {shown(value)}")


def check_number(name: str, value: Any, *, minimum: Optional[float | int] = None, positive: bool = False,
                 finite: bool = True) -> None:
    """An int or float (not a bool), finite unless `finite=False` (NaN is refused either way); with `minimum` also
    >= minimum, with `positive` also > 0."""
    bound = f" >= {minimum:g}" if minimum is not None else ""
    noun = "a finite number" if finite else "a number"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) \
            or (finite and not math.isfinite(value)):
        raise ValueError(f"{name} must be {noun}{bound}, got {shown(value)}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be {noun}{bound}, got {shown(value)}")
    if positive and value <= 0:
        raise ValueError(f"{name} must be > 0, got {shown(value)}")


def check_choice(name: str, value: Any, choices: tuple) -> None:
    """One of `choices`."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {shown(value)}")


def check_probability(name: str, value: Any, *, strict: bool = False) -> float:
    """A number in [0, 1] (NaN refused), with `strict` in (0, 1); returned as a float."""
    if strict:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < float(value) < 1.0:
            raise ValueError(f"{name} must be a probability strictly between 0 and 1, got {shown(value)}")
        return float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number in [0, 1], got {shown(value)}")
    value = float(value)
    if not (0.0 <= value <= 1.0):  # also refuses NaN
        raise ValueError(f"{name} must be in [0, 1], got {value}")
    return value


def check_bool(name: str, value: Any) -> None:
    """True or False (not 0 / 1)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {shown(value)}")


# ------------------------------------------------------------------------------------------ typed records
_TYPE_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false", dict: "a table",
               list: "a list", tuple: "a list", type(None): "null"}


def _type_name(kind: Any) -> str:
    """How a message names what an annotation admits ("an integer or null")."""
    if typing.get_origin(kind) in (Union, types.UnionType):
        return " or ".join(_type_name(k) for k in typing.get_args(kind))
    kind = typing.get_origin(kind) or kind
    return _TYPE_NAMES.get(kind, f"a {getattr(kind, '__name__', kind)}")


def check_type(name: str, value: Any, kind: Any) -> Any:
    """`value` checked against the annotation `kind`, as JSON gives values back; returns it (a list where a tuple
    is annotated becomes a tuple). ValueError naming `name`, the value and the expected type.

    Handles `Any`, `None`, `bool`, `int` (not a bool), `float` (an int or a float, not a bool; NaN allowed: bounds
    decide), `str`, `Optional` / unions, `tuple[X, ...]`, `tuple[X, Y]`, `list[X]`, `dict` / `dict[K, V]`.

    >>> check_type("head", [0, 1], Optional[tuple[int, int]]), check_type("n", None, Optional[int])
    ((0, 1), None)
    >>> check_type("loss", "0.5", float)
    Traceback (most recent call last):
    ...
    ValueError: loss must be a number, got '0.5'
    """
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is Any:
        return value
    if origin is typing.Literal:
        if value not in args:
            raise ValueError(f"{name} must be one of {list(args)}, got {shown(value)}")
        return value
    if origin in (Union, types.UnionType):
        others = [arm for arm in args if arm is not type(None)]
        if len(others) == 1 and len(args) == 2:  # Optional[X]: X's own message (a list of 3 values, not "or null")
            return None if value is None else check_type(name, value, others[0])
        for arm in args:
            try:
                return check_type(name, value, arm)
            except ValueError:
                continue
        raise ValueError(f"{name} must be {_type_name(kind)}, got {shown(value)}")
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{name} must be a list, got {shown(value)}")
        if origin is tuple and args and args[-1] is not Ellipsis and len(value) != len(args):
            raise ValueError(f"{name} must be a list of {len(args)} values, got {shown(value)}")
        items = [check_type(f"{name}[{i}]", v, args[0] if len(args) == 1 or args[-1] is Ellipsis else args[i])
                 for i, v in enumerate(value)] if args else list(value)
        return tuple(items) if origin is tuple else items
    if origin is dict or kind is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{name} must be a table, got {shown(value)}")
        if args:
            for k, v in value.items():
                check_type(f"{name} key", k, args[0])
                check_type(f"{name}[{shown(k)}]", v, args[1])
        return value
    if kind is type(None) or kind is None:
        ok = value is None
    elif kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, kind)
    if not ok:
        raise ValueError(f"{name} must be {_type_name(kind)}, got {shown(value)}")
    return value


def bounds(*, minimum: Optional[float | int] = None, maximum: Optional[float | int] = None, finite: bool = True,
           nonempty: bool = False, default: Any = dataclasses.MISSING) -> Any:
    """A dataclass field checked (by `Checked`, `check_fields`) against its annotation and these bounds: its numbers
    (and the numbers of a list, at any depth) finite (unless `finite=False`; NaN is refused whenever a bound is
    given) and within [minimum, maximum], with `nonempty` every list non-empty; None passes (the annotation says
    whether it may be None)."""
    return dataclasses.field(default=default, metadata={"bounds": dict(minimum=minimum, maximum=maximum,
                                                                       finite=finite, nonempty=nonempty)})


def scalar_kind(kind: Any) -> Any:
    """The scalar type an annotation holds (int for `Optional[tuple[int, ...]]`), for the messages of bounds."""
    arms = [a for a in typing.get_args(kind) if a is not type(None) and a is not Ellipsis]
    if typing.get_origin(kind) in (Union, types.UnionType, tuple, list) and len(set(arms)) == 1:
        return scalar_kind(arms[0])
    return kind


def _check_bounds(name: str, value: Any, *, minimum: Optional[float | int] = None,
                  maximum: Optional[float | int] = None, finite: bool = True, nonempty: bool = False,
                  integer: bool = False) -> None:
    if isinstance(value, (list, tuple)):
        if nonempty and not value:
            raise ValueError(f"{name} must be a non-empty list, got {shown(value)}")
        for i, v in enumerate(value):
            _check_bounds(f"{name}[{i}]", v, minimum=minimum, maximum=maximum, finite=finite, nonempty=nonempty,
                          integer=integer)
        return
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    if finite and not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {shown(value)}")
    if (minimum is not None and not value >= minimum) or (maximum is not None and not value <= maximum):
        noun = "an integer" if integer else "a number"
        if minimum is not None and maximum is not None:
            what = f"in [{_bound(minimum)}, {_bound(maximum)}]"
        else:
            what = f"{noun} >= {_bound(minimum)}" if minimum is not None else f"{noun} <= {_bound(maximum)}"
        raise ValueError(f"{name} must be {what}, got {shown(value)}")


def _bound(x: float | int) -> str:
    """A bound in a message: integers in full (1048576, not 1.04858e+06), other numbers short."""
    return str(x) if isinstance(x, int) else f"{x:g}"


def check_value(name: str, value: Any, kind: Any, **limits: Any) -> Any:
    """`value` checked against the annotation `kind` (`check_type`), then against `limits` (the keywords of
    `bounds`); returns it as `check_type` does. The one annotation checker of configs, budgets and records.

    >>> check_value("steps", 0, int, minimum=1)
    Traceback (most recent call last):
    ...
    ValueError: steps must be an integer >= 1, got 0
    """
    value = check_type(name, value, kind)
    if limits:
        _check_bounds(name, value, **limits, integer=scalar_kind(kind) is int)
    return value


def field_limits(field: "dataclasses.Field") -> dict[str, Any]:
    """The `bounds` a dataclass field was declared with ({} when none)."""
    return dict(field.metadata.get("bounds", {}))


def check_fields(obj: Any, *, prefix: str = "", limits: Optional[Callable[["dataclasses.Field"], dict]] = None,
                 ) -> None:
    """Every field of the (frozen) dataclass `obj` checked with `check_value` against its annotation and its
    limits (`limits(field)`, by default the field's `bounds`), and stored back (a list where a tuple is annotated
    becomes a tuple). ValueError naming `prefix` + the field. For a `__post_init__` of a dataclass that is no
    `Checked` record (a budget, a component)."""
    hints = _hints(type(obj))
    for f in dataclasses.fields(obj):
        value = check_value(prefix + f.name, getattr(obj, f.name), hints[f.name], **(limits or field_limits)(f))
        object.__setattr__(obj, f.name, value)


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


class Checked:
    """Base of a stored file's typed record (mix into a frozen dataclass): on construction every field is checked
    against its annotation (`check_type`) and its `bounds`, then `check()` applies the rules across fields. A
    record read from a file is built with `from_dict`, so a file of the wrong shape raises ValueError naming the
    field, and a record that would not read back cannot be written.

    >>> @dataclasses.dataclass(frozen=True, kw_only=True)
    ... class Loss(Checked):
    ...     value: float = bounds(minimum=0)
    ...     step: Optional[int] = None
    >>> Loss.from_dict({"value": 0.5, "step": 3})
    Loss(value=0.5, step=3)
    >>> Loss.from_dict({"value": -1})
    Traceback (most recent call last):
    ...
    ValueError: Loss: value must be a number >= 0, got -1
    """

    def __post_init__(self) -> None:
        for name, value in type(self)._typed({f.name: getattr(self, f.name) for f in dataclasses.fields(self)}).items():
            object.__setattr__(self, name, value)
        self.check()

    @classmethod
    def _typed(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        """`data` (field values) checked against the fields' annotations and bounds, lists made tuples where a
        tuple is annotated (before construction too: a runtime type checker then sees the annotated types)."""
        hints, fields = _hints(cls), {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        return {name: check_value(name, value, hints[name], **field_limits(fields[name]))
                for name, value in data.items()}

    def check(self) -> None:
        """Rules across fields (raise ValueError naming them); none here."""

    @classmethod
    def from_dict(cls: type[R], data: Any) -> R:
        """The record `data` (a file's table) holds; unknown or missing fields and wrong values raise ValueError
        (prefixed by the class name)."""
        try:
            data = check_keys(cls, data)
            missing = [f.name for f in dataclasses.fields(cls)  # type: ignore[arg-type]
                       if f.name not in data and f.default is dataclasses.MISSING
                       and f.default_factory is dataclasses.MISSING]
            if missing:
                raise ValueError(f"missing fields {missing}")
            return cls(**cls._typed(data))  # type: ignore[call-arg]
        except ValueError as err:
            raise ValueError(f"{cls.__name__}: {err}") from None
