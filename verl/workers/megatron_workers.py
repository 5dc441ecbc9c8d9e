"""verl's Megatron worker classes by their verl path (``verl.workers.megatron_workers``): the same
workers as :mod:`verl.workers.fsdp_workers`; ``actor.strategy=megatron`` puts them on megatron-core."""

from verl.workers.fsdp_workers import (
    ActorRolloutRefWorker,
    AsyncActorRolloutRefWorker,
    CriticWorker,
    RewardModelWorker,
)

__all__ = ["ActorRolloutRefWorker", "AsyncActorRolloutRefWorker", "CriticWorker", "RewardModelWorker"]
