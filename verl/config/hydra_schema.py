"""How a schema meets Hydra, whether or not it was registered when Hydra composed the preset.

A preset's defaults list names its schema as an optional option of the ``schema`` group
(``ppo_trainer.yaml``: ``- optional schema: ppo_trainer``). Importing the schema's module registers
it in Hydra's ConfigStore (:func:`register_schema`); composition then starts from the dataclasses
in struct mode, so an unknown key fails at once, naming it.

verl's recipes load the preset with plain Hydra: their own YAML lists ``ppo_trainer`` in its
defaults, and their ``@hydra.main`` often runs before anything of verl is imported. Hydra then
skips the optional entry and composes the YAML alone, a plain DictConfig (and its command line can
only set keys that YAML has, or add them with ``++key=value``). :func:`on_schema` merges such a
config onto the schema's defaults when it is typed, so an unknown key still fails, naming it.
"""

from __future__ import annotations

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from verl.config.base import ConfigError

SCHEMA_GROUP = "schema"
"""The Hydra config group the schemas are registered in, one option per preset."""


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


__all__ = ["SCHEMA_GROUP", "on_schema", "register_schema"]
