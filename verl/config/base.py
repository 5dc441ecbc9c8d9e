"""Conventions shared by every config dataclass (the one schema).

Each config section is a plain ``@dataclass``. Every field has a default and a one-line
doc string written directly under it (checked by a test). A numeric field declares the values it
accepts next to its default, ``size: int = ranged(8, POSITIVE)``; :func:`check_ranges` checks them
all (a test fails on a numeric field without one). Rules that involve several fields live in a
``validate(self, path)`` method that raises :class:`ConfigError` through :func:`check`, naming the
full key.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import dataclass
from typing import Any

from verl.utils.errors import UserInputError


class ConfigError(UserInputError, ValueError):
    """A configuration value is invalid; the message names the full key."""

    kind = "config"


def check(condition: bool, key: str, expected: str, got: Any) -> None:
    """Raise ``ConfigError("<key>: expected <expected>, got <got>")`` unless ``condition``."""
    if not condition:
        raise ConfigError(f"{key}: expected {expected}, got {got!r}")


def check_choice(value: Any, choices: list | tuple | set | dict, key: str) -> None:
    """Raise unless ``value`` is one of ``choices``."""
    check(value in choices, key, f"one of {sorted(choices)}", value)


# ---------------------------------------------------------------------------- numeric ranges
RANGE = "range"
"""The key of a field's metadata that holds its :class:`Range`."""


@dataclass(frozen=True)
class Range:
    """The values a numeric key accepts: from ``low`` to ``high``, or one of the sentinels in ``also``.
    Null is accepted when the field's type allows it."""

    low: float | None = None
    """The smallest value (None: no lower bound)."""
    high: float | None = None
    """The largest value (None: no upper bound)."""
    low_open: bool = False
    """``low`` itself is excluded."""
    high_open: bool = False
    """``high`` itself is excluded."""
    also: tuple[float, ...] = ()
    """Values accepted outside the bounds (e.g. -1 for "off" or "all")."""

    def contains(self, value: float) -> bool:
        if value in self.also:
            return True
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        below = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return above and below  # False for NaN whenever there is a bound

    def describe(self, integer: bool = False) -> str:
        """``a positive integer``, ``at least 1``, ``a value in (0, 1]``, ``-1 or at least 1``, ..."""
        if self.low is not None and self.high is not None:
            left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
            text = f"a value in {left}{_num(self.low)}, {_num(self.high)}{right}"
        elif self.low == 0 and self.low_open:
            text = "a positive integer" if integer else "a positive number"
        elif self.low is not None:
            text = f"{'more than' if self.low_open else 'at least'} {_num(self.low)}"
        elif self.high is not None:
            text = f"{'less than' if self.high_open else 'at most'} {_num(self.high)}"
        else:
            text = "any number"
        return " or ".join([*(_num(v) for v in self.also), text])


def _num(value: float) -> str:
    return f"{value:g}"


def at_least(low: float, also: tuple[float, ...] = ()) -> Range:
    return Range(low=low, also=also)


def between(low: float, high: float, low_open: bool = False, high_open: bool = False) -> Range:
    return Range(low=low, high=high, low_open=low_open, high_open=high_open)


POSITIVE = Range(low=0, low_open=True)
"""Sizes, lengths, time-outs, clip values: > 0."""
NON_NEGATIVE = Range(low=0)
"""Coefficients, counts that may be 0: >= 0."""
FRACTION = between(0, 1)
"""Probabilities, ratios, discount factors: [0, 1]."""
ANY_NUMBER = Range()
"""Every value is meaningful (said explicitly, so that no numeric key goes unchecked by omission)."""


def ranged(default: Any, valid: Range) -> Any:
    """A dataclass field with ``default`` whose value must lie in ``valid`` (see :func:`check_ranges`)."""
    return dataclasses.field(default=default, metadata={RANGE: valid})


@functools.cache
def _field_types(cls: type) -> dict[str, tuple[bool, bool]]:
    """field name -> (accepts null, is an integer) from the annotations of ``cls``."""
    out = {}
    for name, hint in typing.get_type_hints(cls).items():
        union = typing.get_origin(hint) in (typing.Union, types.UnionType)
        members = set(typing.get_args(hint)) if union else {hint}
        out[name] = (type(None) in members, members - {type(None)} == {int})
    return out


def check_ranges(config: Any, path: str = "") -> None:
    """Raise a ConfigError naming the first key of ``config`` (a schema dataclass, walked with its
    sections; ``path``: its own dotted key) whose value lies outside the Range declared for it.

    The root's ``validate`` calls it, and so does the ``validate(path)`` of each section with
    numeric keys, so that a section validated on its own is checked too."""
    for f in dataclasses.fields(config):
        value, key = getattr(config, f.name), f"{path}.{f.name}" if path else f.name
        if dataclasses.is_dataclass(value):
            check_ranges(value, key)
            continue
        valid = f.metadata.get(RANGE)
        if valid is None or value is None:
            continue  # null is refused by the field's type where it is not accepted
        nullable, integer = _field_types(type(config))[f.name]
        expected = ("null or " if nullable else "") + valid.describe(integer)
        check(isinstance(value, int | float) and valid.contains(value), key, expected, value)


class BaseConfig:
    """verl's dict-like reading of a config dataclass, for code written against verl's configs:
    ``cfg.get("key", default)``, ``cfg["key"]``, ``"key" in cfg``, ``cfg.keys()``. Every section of
    the schema has it. Unlike verl's, fields stay assignable (the trainer fills in run-time values)."""

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key) if key in self else default

    def __getitem__(self, key: str) -> Any:
        if key not in self:
            raise KeyError(f"{type(self).__name__} has no key {key!r}; keys: {self.keys()}")
        return getattr(self, key)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key in self.keys()

    def keys(self) -> list[str]:
        return [f.name for f in dataclasses.fields(self)]  # type: ignore[arg-type]
