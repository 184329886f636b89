"""One config base for every config of the package: source, model, training, run and sweep spec.

A config is a frozen, keyword-only dataclass that also derives from `Config`, which gives it, written once:

- serialisation: `to_dict()` (JSON-ready: tuples become lists, nested configs become dicts), `to_json()` (sorted
  keys), `from_dict()` and `from_json()`, with nested config fields rebuilt from their own sections;
- refusal of unknown keys on load, with a one-line `ValueError` listing the unknown and the valid keys, and a
  separate message when a value that should be a table (a dict) is not (`"source": "binary"`);
- `replace(**changes)`: `dataclasses.replace` after checking the field names.

The validators below (`check_int`, `check_number`, `check_choice`, `check_probability`, `check_bool`) are the
common checks of `__post_init__` methods; each raises a `ValueError` naming the option and the bad value.
This module imports nothing from the package, so every stage can use it.

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
import json
import math
from collections.abc import Mapping
from typing import Any, Optional, TypeVar

__all__ = [
    "Config",
    "check_keys",
    "check_int",
    "check_number",
    "check_choice",
    "check_probability",
    "check_bool",
    "to_jsonable",
    "parse_value",
    "parse_setting",
]

C = TypeVar("C", bound="Config")


def parse_value(text: str) -> Any:
    """A value given as text on a command line: JSON when it is JSON (numbers, true / false, null, lists, quoted
    strings), else the text itself.

    >>> parse_value("0.01"), parse_value("[1, 2]"), parse_value("uniform")
    (0.01, [1, 2], 'uniform')
    """
    try:
        return json.loads(text)
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
        raise ValueError(f"{flag} takes KEY=VALUE, got {item!r}")
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
        raise ValueError(f"{name}: {place} a table (dict) of options, got {type(data).__name__} {data!r}")
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
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"{cls.__name__} is not valid JSON: {err}") from None
        return cls.from_dict(data)

    def replace(self: C, **changes: Any) -> C:
        """A copy with `changes` (`dataclasses.replace`, re-validated); unknown field names raise ValueError."""
        check_keys(type(self), changes, what="fields")
        return dataclasses.replace(self, **changes)


# ----------------------------------------------------------------------------------------------- validators
def check_int(name: str, value: Any, *, minimum: int) -> None:
    """An integer (not a bool) >= `minimum`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def check_number(name: str, value: Any, *, minimum: Optional[float | int] = None, positive: bool = False) -> None:
    """A finite int or float (not a bool); with `minimum` also >= minimum, with `positive` also > 0."""
    bound = f" >= {minimum:g}" if minimum is not None else ""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number{bound}, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be a finite number{bound}, got {value!r}")
    if positive and value <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")


def check_choice(name: str, value: Any, choices: tuple) -> None:
    """One of `choices`."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")


def check_probability(name: str, value: Any) -> float:
    """A number in [0, 1] (NaN refused); returned as a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
    value = float(value)
    if not (0.0 <= value <= 1.0):  # also refuses NaN
        raise ValueError(f"{name} must be in [0, 1], got {value}")
    return value


def check_bool(name: str, value: Any) -> None:
    """True or False (not 0 / 1)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
