"""``batch``: one vectorised call for the whole batch,
``compute_score(data_sources, solution_strs, ground_truths, extra_infos) -> list``.

For scorers that are cheaper in bulk (a judge model, a remote service). The call runs in one
scorer process under the pool's timeout; if it raises, times out, or returns a list of the
wrong length, every row of the batch scores 0 and is counted as an error (or timeout).
"""

from __future__ import annotations

from collections.abc import Sequence

from verl.protocol import DataProto
from verl.workers.reward_manager.base import RewardManager
from verl.workers.reward_manager.pool import ScoreOutcome
from verl.workers.reward_manager.registry import register

__all__ = ["BatchRewardManager"]


@register("batch")
class BatchRewardManager(RewardManager):
    """Scores all responses with a single call of a vectorised function."""

    default_kind = "default_batch"

    def score_responses(self, data: DataProto, responses: list[str]) -> list[ScoreOutcome]:
        rows = self.score_calls(data, responses)
        call = {
            "data_sources": [r["data_source"] for r in rows],
            "solution_strs": [r["solution_str"] for r in rows],
            "ground_truths": [r["ground_truth"] for r in rows],
            "extra_infos": [r["extra_info"] for r in rows],
        }
        (outcome,) = self.pool.map([call])
        if outcome.status != "ok":
            return [outcome] * len(rows)
        values = outcome.value
        if not isinstance(values, Sequence) or isinstance(values, str) or len(values) != len(rows):
            got = len(values) if isinstance(values, Sequence) else type(values).__name__
            message = f"batch compute_score must return a list of {len(rows)} scores, got {got}"
            return [ScoreOutcome("error", message=message)] * len(rows)
        return [ScoreOutcome("ok", value) for value in values]
