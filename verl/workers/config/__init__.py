"""verl's config dataclasses by their verl path (``verl.workers.config``): the project's one schema
(:mod:`verl.config`) under verl's names. One dataclass serves every training engine here (the
engine is the section's ``strategy``), so ``FSDPActorConfig`` and ``McoreActorConfig`` are
``ActorConfig``, and so on."""

from verl.config.actor import ActorConfig, ModelConfig
from verl.config.algorithm import PolicyLossConfig
from verl.config.critic import CriticConfig
from verl.config.engine import CheckpointConfig, FSDPConfig, OptimConfig
from verl.config.megatron import MegatronConfig
from verl.config.reward import RewardModelConfig, SandboxFusionConfig
from verl.config.rollout import MultiTurnConfig, RolloutConfig, ServerConfig

FSDPActorConfig = McoreActorConfig = ActorConfig
FSDPCriticConfig = McoreCriticConfig = CriticConfig
OptimizerConfig = FSDPOptimizerConfig = McoreOptimizerConfig = OptimConfig
FSDPEngineConfig = FSDPConfig
McoreEngineConfig = MegatronConfig
HFModelConfig = ModelConfig

__all__ = [
    "ActorConfig",
    "CheckpointConfig",
    "CriticConfig",
    "FSDPActorConfig",
    "FSDPCriticConfig",
    "FSDPEngineConfig",
    "FSDPOptimizerConfig",
    "HFModelConfig",
    "McoreActorConfig",
    "McoreCriticConfig",
    "McoreEngineConfig",
    "McoreOptimizerConfig",
    "MultiTurnConfig",
    "OptimizerConfig",
    "PolicyLossConfig",
    "RewardModelConfig",
    "RolloutConfig",
    "SandboxFusionConfig",
    "ServerConfig",
]
