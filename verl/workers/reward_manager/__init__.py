"""Reward managers: turn generated responses into token-level scores (verl's
``verl.workers.reward_manager``).

``load_reward_manager(config, tokenizer)`` (also at verl's :mod:`verl.trainer.ppo.reward`) builds
the one named by ``reward_model.reward_manager``: ``naive``, ``batch``, ``dapo``, ``prime``, or one
added with ``@register("name")``. Scorers run in a :class:`ScoringPool` of processes with a
per-call timeout (``reward_model.scoring``).
"""

from verl.workers.reward_manager.abstract import AbstractRewardManager
from verl.workers.reward_manager.base import RewardManager
from verl.workers.reward_manager.batch import BatchRewardManager
from verl.workers.reward_manager.dapo import DAPORewardManager, overlong_penalty
from verl.workers.reward_manager.loader import load_reward_manager, scorer_spec_from_config
from verl.workers.reward_manager.naive import NaiveRewardManager
from verl.workers.reward_manager.pool import ScoreOutcome, ScorerLoadError, ScoringPool
from verl.workers.reward_manager.prime import PrimeRewardManager
from verl.workers.reward_manager.registry import (
    get_reward_manager_cls,
    register,
    register_reward_manager,
    registered_reward_managers,
)

__all__ = [
    "AbstractRewardManager",
    "BatchRewardManager",
    "DAPORewardManager",
    "NaiveRewardManager",
    "PrimeRewardManager",
    "RewardManager",
    "ScoreOutcome",
    "ScorerLoadError",
    "ScoringPool",
    "get_reward_manager_cls",
    "load_reward_manager",
    "overlong_penalty",
    "register",
    "register_reward_manager",
    "registered_reward_managers",
    "scorer_spec_from_config",
]
