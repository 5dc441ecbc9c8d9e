"""verl's ``omega_conf_to_dataclass``: a config section (Hydra's ``DictConfig`` or a plain dict) as
the dataclass that types it."""

from __future__ import annotations

import dataclasses
from typing import Any

from omegaconf import DictConfig, OmegaConf

__all__ = ["omega_conf_to_dataclass"]


def omega_conf_to_dataclass(config: Any, dataclass_type: type | None = None) -> Any:
    """``config`` as an instance of ``dataclass_type`` (keys the dataclass lacks are refused by
    OmegaConf, naming them), or, without a type, the object a structured ``DictConfig`` was made
    from. A dataclass instance is returned as it is."""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return config
    if dataclass_type is None:
        if not isinstance(config, DictConfig) or OmegaConf.get_type(config) in (dict, None):
            raise TypeError(
                "omega_conf_to_dataclass: pass dataclass_type for a plain DictConfig or dict (this project's "
                "configs carry no _target_)"
            )
        return OmegaConf.to_object(config)
    if not dataclasses.is_dataclass(dataclass_type):
        raise TypeError(f"omega_conf_to_dataclass: {dataclass_type!r} is not a dataclass")
    merged = OmegaConf.merge(OmegaConf.structured(dataclass_type), config)
    return OmegaConf.to_object(merged)
