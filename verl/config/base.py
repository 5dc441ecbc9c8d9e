"""Conventions shared by every config dataclass (the one schema).

Each config section is a plain ``@dataclass``. Every field has a default and a one-line
doc string written directly under it (checked by a test). Cross-field rules live in a ``validate(self, path)`` method that
raises :class:`ConfigError` through :func:`check`, naming the full key.
"""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the full key."""


def check(condition: bool, key: str, expected: str, got: Any) -> None:
    """Raise ``ConfigError("<key>: expected <expected>, got <got>")`` unless ``condition``."""
    if not condition:
        raise ConfigError(f"{key}: expected {expected}, got {got!r}")


def check_choice(value: Any, choices: list | tuple | set | dict, key: str) -> None:
    """Raise unless ``value`` is one of ``choices``."""
    check(value in choices, key, f"one of {sorted(choices)}", value)
