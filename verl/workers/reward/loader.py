"""Moved to :mod:`verl.workers.reward_manager.loader`; kept while importers move (to be deleted)."""

from verl.workers.reward_manager.loader import load_reward_manager, scorer_spec_from_config

__all__ = ["load_reward_manager", "scorer_spec_from_config"]
