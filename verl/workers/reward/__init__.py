"""Reward managers: turn generated responses into token-level scores.

``load_reward_manager(config, tokenizer)`` builds the one named by ``reward_model.reward_manager``
(``naive``, ``batch``, ``dapo`` or one added with ``register_reward_manager``). Scorers run in a
:class:`ScoringPool` of processes with a per-call timeout (``reward_model.scoring``).
"""

from verl.workers.reward.base import RewardManager
from verl.workers.reward.batch import BatchRewardManager
from verl.workers.reward.dapo import DAPORewardManager, overlong_penalty
from verl.workers.reward.loader import load_reward_manager, scorer_spec_from_config
from verl.workers.reward.naive import NaiveRewardManager
from verl.workers.reward.pool import ScoreOutcome, ScorerLoadError, ScoringPool
from verl.workers.reward.registry import (
    get_reward_manager_cls,
    register_reward_manager,
    registered_reward_managers,
)

__all__ = [
    "BatchRewardManager",
    "DAPORewardManager",
    "NaiveRewardManager",
    "RewardManager",
    "ScoreOutcome",
    "ScorerLoadError",
    "ScoringPool",
    "get_reward_manager_cls",
    "load_reward_manager",
    "overlong_penalty",
    "register_reward_manager",
    "registered_reward_managers",
    "scorer_spec_from_config",
]
