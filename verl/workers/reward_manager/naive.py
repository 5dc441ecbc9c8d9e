"""``naive``: one scorer call per response, ``compute_score(data_source, solution_str, ground_truth,
extra_info)``, spread over the scoring pool's processes."""

from __future__ import annotations

from verl.protocol import DataProto
from verl.workers.reward_manager.base import RewardManager
from verl.workers.reward_manager.pool import ScoreOutcome
from verl.workers.reward_manager.registry import register

__all__ = ["NaiveRewardManager"]


@register("naive")
class NaiveRewardManager(RewardManager):
    """Scores each response on its own (the default reward manager)."""

    def score_responses(self, data: DataProto, responses: list[str]) -> list[ScoreOutcome]:
        return self.pool.map(self.score_calls(data, responses))
