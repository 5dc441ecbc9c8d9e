"""How a schema meets Hydra, whether or not it was registered when Hydra composed the preset.

A preset's defaults list names its schema as an optional option of the ``schema`` group
(``ppo_trainer.yaml``: ``- optional schema: ppo_trainer``). Importing the schema's module registers
it in Hydra's ConfigStore (:func:`register_schema`); composition then starts from the dataclasses
in struct mode, so an unknown key fails at once, naming it.

verl's recipes load the preset with plain Hydra: their own YAML lists ``ppo_trainer`` in its
defaults, and their ``@hydra.main`` often runs before anything of verl is imported. Hydra then
skips the optional entry and composes the YAML alone, a plain DictConfig. So that its command line
can set every key as verl's can (Hydra overrides only keys the config has), ``ppo_trainer.yaml``
also lists ``generated: ppo_trainer``: the schema's defaults written out as YAML
(``verl/trainer/config/generated/ppo_trainer.yaml``, rewritten by ``python -m
verl.config.write_generated``; a test checks it is current). On the schema that entry would only merge
the same values again, so this project's compositions drop it (:func:`compose_on_schema`).
:func:`on_schema` merges a plain config onto the schema's defaults when it is typed, so an unknown
key still fails, naming it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from hydra.core.config_store import ConfigStore
from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from verl.config.base import ConfigError

SCHEMA_GROUP = "schema"
"""The Hydra config group the schemas are registered in, one option per preset."""
GENERATED_GROUP = "generated"
"""The Hydra config group of the schemas' defaults as YAML files, for plain Hydra."""
DROP_GENERATED = f"~{GENERATED_GROUP}"


def register_schema(preset: str, schema: type) -> None:
    """Store ``schema`` as option ``preset`` of the ``schema`` group, at the root of the config."""
    ConfigStore.instance().store(group=SCHEMA_GROUP, name=preset, node=schema, package="_global_")


def on_schema(cfg: DictConfig, schema: type) -> DictConfig:
    """``cfg`` as a config of ``schema``: unchanged when Hydra composed it on the schema, else (a
    plain DictConfig) merged onto the schema's defaults, interpolations left for later.

    An unknown key, or a value of the wrong type, raises :class:`ConfigError` naming the key."""
    if OmegaConf.get_type(cfg) is not dict:
        return cfg
    try:
        return OmegaConf.merge(OmegaConf.structured(schema), cfg)
    except (ConfigKeyError, ConfigAttributeError) as err:
        raise ConfigError(
            f"{err.full_key}: unknown key (the schema, {schema.__name__}, has no such key); this project "
            "does not read it. Remove it, or see the entry point's --cfg job for the keys it knows"
        ) from None
    except OmegaConfBaseException as err:
        raise ConfigError(
            f"{err.full_key}: {str(err).splitlines()[0]}"
        ) from None  # the rest: OmegaConf's types


def compose_on_schema(
    overrides: list[str], compose: Callable[[list[str]], DictConfig]
) -> tuple[list[str], DictConfig]:
    """``compose(overrides)`` without the ``generated`` entry when the config lists it (the same
    values again, half the composition's time); the overrides used, and the config."""
    try:
        return [*overrides, DROP_GENERATED], compose([*overrides, DROP_GENERATED])
    except ConfigCompositionException as err:
        if "Could not delete" not in str(err) or GENERATED_GROUP not in str(err):
            raise
    return overrides, compose(overrides)


def generated_yaml(schema: type) -> str:
    """The schema's defaults as the YAML of its ``generated`` option (interpolations kept)."""
    header = (
        "# @package _global_\n"
        f"# {schema.__name__}'s defaults, written by `python -m verl.config.write_generated` (do not edit):\n"
        "# plain Hydra composes them, so that every key can be overridden as in verl's YAML\n"
    )
    return header + OmegaConf.to_yaml(OmegaConf.structured(schema))


def write_generated(schema: type, path: Path) -> None:
    """Write :func:`generated_yaml` to ``path`` (a temporary file, then renamed)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as out:
        out.write(generated_yaml(schema))
    os.replace(tmp, path)


__all__ = [
    "DROP_GENERATED",
    "GENERATED_GROUP",
    "SCHEMA_GROUP",
    "compose_on_schema",
    "generated_yaml",
    "on_schema",
    "register_schema",
    "write_generated",
]
