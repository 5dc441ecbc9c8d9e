"""Reward managers by name, so ``reward_model.reward_manager=<name>`` can pick one.

Register your own class (verl's decorator, ``register``) in a module imported before
:func:`verl.trainer.ppo.reward.load_reward_manager` runs (e.g. through
``actor_rollout_ref.model.external_lib``)::

    from verl.workers.reward_manager import register

    @register("my_manager")
    class MyRewardManager(NaiveRewardManager): ...
"""

from __future__ import annotations

from collections.abc import Callable

from verl.config.base import ConfigError

__all__ = ["get_reward_manager_cls", "register", "register_reward_manager", "registered_reward_managers"]

_REGISTRY: dict[str, type] = {}


def register(name: str) -> Callable[[type], type]:
    """Class decorator that makes the class available as ``reward_model.reward_manager=name``."""

    def decorate(cls: type) -> type:
        existing = _REGISTRY.get(name)
        if existing is not None and existing is not cls:
            raise ValueError(f"reward manager {name!r} is already registered to {existing.__qualname__}")
        _REGISTRY[name] = cls
        return cls

    return decorate


register_reward_manager = register
"""The decorator's earlier name in this project."""


def registered_reward_managers() -> list[str]:
    """Names that can be used for reward_model.reward_manager."""
    return sorted(_REGISTRY)


def get_reward_manager_cls(name: str) -> type:
    """The class registered as ``name``; a ConfigError (a ValueError) naming reward_model.reward_manager otherwise."""
    if name not in _REGISTRY:
        raise ConfigError(
            f"reward_model.reward_manager: expected one of {registered_reward_managers()}, got {name!r}"
        )
    return _REGISTRY[name]
