"""verl's worker classes by their verl path (``verl.workers.fsdp_workers``).

The project writes each role's worker once, over a training engine chosen by the role's
``strategy`` (``fsdp``/``fsdp2``/``megatron``), so these are the same classes as
``verl.workers.megatron_workers``'s: a recipe's ``role_worker_mapping`` may name either.
"""

from verl.workers.actor_rollout_ref import ActorRolloutRefWorker
from verl.workers.critic import CriticWorker
from verl.workers.reward_model import RewardModelWorker

AsyncActorRolloutRefWorker = ActorRolloutRefWorker
"""verl's server-mode variant; here ``rollout.mode=async`` makes the same worker serve requests."""

__all__ = ["ActorRolloutRefWorker", "AsyncActorRolloutRefWorker", "CriticWorker", "RewardModelWorker"]
