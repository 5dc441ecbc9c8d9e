"""The ``reward.*`` section: verl 0.9's spelling of the reward keys.

verl 0.9 moved ``reward_model.reward_manager``, ``custom_reward_function.*`` and friends under one
``reward`` block (its ``migrate_legacy_reward_impl`` maps the old keys onto the new ones). This
project reads the older keys, so at start-up every ``reward.*`` key that is set is copied onto the
key this project reads (:func:`verl.config.compat.convert_verl_keys`); the note in the log
says which. Setting both spellings to different values is an error that names both.

* ``reward.num_workers`` -> ``reward_model.scoring.num_workers``
* ``reward.custom_reward_function.{path,name,reward_kwargs}`` -> ``custom_reward_function.*``
* ``reward.reward_manager.name`` -> ``reward_model.reward_manager``
* ``reward.reward_kwargs`` -> ``reward_model.reward_kwargs``
* ``reward.reward_model.{enable, model_path, enable_resource_pool, n_gpus_per_node, nnodes}`` ->
  ``reward_model.{enable, model.path, enable_resource_pool, n_gpus_per_node, nnodes}``
* ``reward.reward_manager.source`` must stay ``register``; ``reward.reward_model.rollout`` and
  ``reward.sandbox_fusion`` are inert.

Every default here is null ("not set"), so an unset key never overrides the older spelling.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from verl.config.base import NON_NEGATIVE, BaseConfig, ranged
from verl.config.genrm import GenRMRolloutConfig
from verl.config.reward import SandboxFusionConfig

__all__ = ["RewardConfig"]


@dataclass
class RewardFunctionConfig(BaseConfig):
    path: str | None = None
    """Python file that defines your scorer; converted to custom_reward_function.path."""
    name: str | None = None
    """Function in that file; converted to custom_reward_function.name (null keeps compute_score)."""
    reward_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments of every call; converted to custom_reward_function.reward_kwargs."""


@dataclass
class ModuleConfig(BaseConfig):
    path: str | None = None
    """verl: file of a reward manager for source=importlib (refused: source must be register)."""
    name: str = "custom_reward_manager"
    """verl: class in that file for source=importlib."""


@dataclass
class RewardManagerConfig(BaseConfig):
    source: str = "register"
    """Where the manager class comes from: register (by name; the only one supported here)."""
    name: str | None = None
    """Registered manager name (naive | batch | dapo | ...); converted to reward_model.reward_manager."""
    module: ModuleConfig = field(default_factory=ModuleConfig)
    """verl: the module for source=importlib."""


@dataclass
class RewardModelWorkerConfig(BaseConfig):
    enable: bool | None = None
    """Score with a reward model; converted to reward_model.enable."""
    enable_resource_pool: bool | None = None
    """The reward model on a pool of its own; converted to reward_model.enable_resource_pool."""
    n_gpus_per_node: int | None = ranged(None, NON_NEGATIVE)
    """Devices per node of that pool; converted to reward_model.n_gpus_per_node."""
    nnodes: int | None = ranged(None, NON_NEGATIVE)
    """Nodes of that pool; converted to reward_model.nnodes."""
    model_path: str | None = None
    """The reward model; converted to reward_model.model.path."""
    rollout: GenRMRolloutConfig = field(default_factory=GenRMRolloutConfig)
    """verl: inference engine of a generative reward model."""


@dataclass
class RewardConfig(BaseConfig):
    num_workers: int | None = ranged(None, NON_NEGATIVE)
    """verl: reward workers scoring in parallel; converted to reward_model.scoring.num_workers."""
    custom_reward_function: RewardFunctionConfig = field(default_factory=RewardFunctionConfig)
    """verl 0.9 spelling of custom_reward_function.*."""
    reward_manager: RewardManagerConfig = field(default_factory=RewardManagerConfig)
    """verl 0.9 spelling of reward_model.reward_manager."""
    reward_model: RewardModelWorkerConfig = field(default_factory=RewardModelWorkerConfig)
    """verl 0.9 reward-model settings (converted to reward_model.*; rollout is inert)."""
    sandbox_fusion: SandboxFusionConfig = field(default_factory=SandboxFusionConfig)
    """verl: remote code sandbox; no effect."""
    reward_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra reward-manager arguments (verl's DAPO scripts); merged into reward_model.reward_kwargs."""
