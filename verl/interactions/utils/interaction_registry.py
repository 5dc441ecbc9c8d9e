"""Interactions from verl's interaction YAML (a file path, or ``pkg://package/path`` for one shipped
in a package), named by ``actor_rollout_ref.rollout.multi_turn.interaction_config_path``::

    interaction:
      - name: gsm8k                  # optional: else the class name, less "Interaction", lower-cased
        class_name: verl.interactions.gsm8k_interaction.Gsm8kInteraction
        config: {}                   # given to the constructor, with the entry's name added

A row picks one by ``extra_info.interaction_kwargs.name``.
"""

from __future__ import annotations

import os
from typing import Any

import yaml

from verl.interactions.base import BaseInteraction
from verl.tools.tool_registry import load_class, resolve_tool_config_path

INTERACTION_CONFIG_KEY = "actor_rollout_ref.rollout.multi_turn.interaction_config_path"


def get_interaction_class(cls_name: str, where: str = "interaction") -> type[BaseInteraction]:
    """The :class:`BaseInteraction` subclass ``package.module.Class`` names."""
    return load_class(cls_name, where, BaseInteraction)


def default_name(cls_name: str) -> str:
    """verl's name for an entry without one: ``...Gsm8kInteraction`` -> ``gsm8k``."""
    simple = cls_name.rpartition(".")[2]
    return simple.removesuffix("Interaction").lower() or simple.lower()


def initialize_interactions_from_config(interaction_config_file: str) -> dict[str, BaseInteraction]:
    """Build every interaction of the YAML file, by name; errors name the file, the entry and the field."""
    path = resolve_tool_config_path(interaction_config_file, INTERACTION_CONFIG_KEY)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{INTERACTION_CONFIG_KEY}: {path}: no such file")
    with open(path) as f:
        data = yaml.safe_load(f) or {}
    entries = data.get("interaction") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{path}: expected a top-level `interaction:` list with at least one entry")
    interactions: dict[str, BaseInteraction] = {}
    for i, entry in enumerate(entries):
        where = f"{path}: interaction[{i}]"
        if not isinstance(entry, dict) or "class_name" not in entry:
            raise ValueError(f"{where}: expected a mapping with class_name (and name, config)")
        cls = get_interaction_class(str(entry["class_name"]), where)
        name = str(entry.get("name") or default_name(str(entry["class_name"])))
        if name in interactions:
            raise ValueError(f"{where}: the name {name!r} is taken by an earlier entry; names must be unique")
        config: Any = entry.get("config") or {}
        if not isinstance(config, dict):
            raise ValueError(f"{where}.config: expected a mapping, got {config!r}")
        interactions[name] = cls({**config, "name": name})
    return interactions
