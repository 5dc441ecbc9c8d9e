"""Small dict and environment helpers that verl's recipes import from ``verl.utils.py_functional``."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

__all__ = ["append_to_dict", "convert_to_regular_types", "rename_dict", "temp_env_var", "union_two_dict"]


def _prefixed(key: str, prefix: str) -> str:
    return key if key.startswith(prefix) else f"{prefix}{key}"


def append_to_dict(data: dict[str, list], new_data: Mapping[str, Any], prefix: str = "") -> None:
    """Collect ``new_data`` into lists in ``data``, in place: each value is appended to the list
    under its key (a list value is appended element by element), a new key starts a new list.
    Keys not starting with ``prefix`` get it prepended.

    >>> metrics = {}
    >>> append_to_dict(metrics, {"loss": 0.5}); append_to_dict(metrics, {"loss": [0.25, 0.125]})
    >>> metrics
    {'loss': [0.5, 0.25, 0.125]}
    """
    for key, value in new_data.items():
        column = data.setdefault(_prefixed(key, prefix), [])
        if isinstance(value, list):
            column.extend(value)
        else:
            column.append(value)


def union_two_dict(dict1: dict, dict2: Mapping) -> dict:
    """``dict1`` updated with ``dict2`` in place; a key both hold must map to equal values."""
    for key, value in dict2.items():
        if key in dict1 and dict1[key] != value:
            raise ValueError(
                f"union_two_dict: key {key!r} is {dict1[key]!r} in one dict and {value!r} in the other"
            )
        dict1[key] = value
    return dict1


def rename_dict(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A copy of ``data`` whose keys all start with ``prefix``."""
    return {_prefixed(key, prefix): value for key, value in data.items()}


def convert_to_regular_types(obj: Any) -> Any:
    """Plain ``dict`` / ``list`` in place of OmegaConf containers, tuples and mappings, recursively
    (what a JSON writer or ``ray.init(runtime_env=...)`` accepts)."""
    if type(obj).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf  # only reached with an OmegaConf object, so omegaconf is there

        obj = OmegaConf.to_container(obj, resolve=True)
    if isinstance(obj, Mapping):
        return {key: convert_to_regular_types(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [convert_to_regular_types(value) for value in obj]
    return obj


@contextmanager
def temp_env_var(key: str, value: str) -> Iterator[None]:
    """Set the environment variable ``key`` to ``value`` inside the block; restore (or remove) it after."""
    previous = os.environ.get(key)
    os.environ[key] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = previous
