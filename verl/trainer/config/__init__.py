"""verl's config location: the Hydra presets (``ppo_trainer.yaml``), found as ``pkg://verl.trainer.config``.

The schema (the dataclasses every key is checked against) is :mod:`verl.config`.
"""

from verl.config.algorithm import (
    AlgorithmConfig,
    FilterGroupsConfig,
    KLControlConfig,
    RolloutCorrectionConfig,
)
from verl.config.engine import CheckpointConfig

AlgoConfig = AlgorithmConfig
"""verl's name for the ``algorithm`` section's dataclass."""

__all__ = [
    "AlgoConfig",
    "CheckpointConfig",
    "FilterGroupsConfig",
    "KLControlConfig",
    "RolloutCorrectionConfig",
]
