"""verl's ``verl.base_config``: :class:`BaseConfig`, the dict-like reading every config section has."""

from verl.config.base import BaseConfig

__all__ = ["BaseConfig"]
