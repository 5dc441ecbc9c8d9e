"""Dotted key paths (``actor_rollout_ref.actor.optim.lr``) over the schema's dataclasses and their values."""

from __future__ import annotations

import dataclasses
from typing import Any


def get_key(config: Any, key: str) -> Any:
    for part in key.split("."):
        config = getattr(config, part)
    return config


def set_key(config: Any, key: str, value: Any) -> None:
    *parents, leaf = key.split(".")
    for part in parents:
        config = getattr(config, part)
    setattr(config, leaf, value)


def is_schema_key(schema: type, key: str) -> bool:
    """True when ``key`` names a field (a section or a leaf) of the dataclass ``schema``."""
    node: Any = schema
    for part in key.split("."):
        if not (isinstance(node, type) and dataclasses.is_dataclass(node)):
            return False  # below a leaf, e.g. inside a free-form dict such as override_config
        match = {f.name: f for f in dataclasses.fields(node)}.get(part)
        if match is None:
            return False
        node = _section_class(match)
    return True


def within_schema(schema: type, key: str) -> bool:
    """True when ``key`` is a field of ``schema`` or lies inside one of its free-form dicts
    (``engine_kwargs.vllm.x``)."""
    node: Any = schema
    for part in key.split("."):
        if not (isinstance(node, type) and dataclasses.is_dataclass(node)):
            return True
        match = {f.name: f for f in dataclasses.fields(node)}.get(part)
        if match is None:
            return False
        node = _section_class(match)
    return True


def _section_class(f: dataclasses.Field) -> type | None:
    """The dataclass of a nested section (they are built by ``default_factory``), else None."""
    if f.default_factory is dataclasses.MISSING:
        return None
    default = f.default_factory()
    return type(default) if dataclasses.is_dataclass(default) else None


__all__ = ["get_key", "is_schema_key", "set_key", "within_schema"]
