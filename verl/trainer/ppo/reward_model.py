"""The reward with a reward model: its worker group scores the batch, then the reward manager runs.

:class:`ModelScoredReward` wraps a reward manager and is called like one (``fn(batch,
return_dict=True)``), so training, validation and ReMax's baseline all score the same way. It
adds ``rm_scores`` to the batch (the manager turns them into the reward, see
:mod:`verl.workers.reward_manager.base`) and reports ``reward_model/score/{mean,max,min}`` and
``reward_model/truncated`` (the share of conversations cut to ``reward_model.max_length``).
"""

from __future__ import annotations

from typing import Any

import torch

from verl.protocol import DataProto

RM_REQUEST_KEYS = ["prompts", "responses", "attention_mask"]


class ModelScoredReward:
    def __init__(self, reward_fn: Any, rm_wg: Any) -> None:
        self.reward_fn = reward_fn
        self.rm_wg = rm_wg

    def __call__(self, data: DataProto, return_dict: bool = False) -> torch.Tensor | dict[str, Any]:
        metrics: dict[str, float] = {}
        if "rm_scores" not in data.batch.keys():
            request = data.select(batch_keys=RM_REQUEST_KEYS, non_tensor_batch_keys=["raw_prompt"])
            scored = self.rm_wg.compute_rm_score(request)
            rm_scores = scored.batch["rm_scores"]
            data.batch["rm_scores"] = rm_scores
            per_row = rm_scores.sum(-1)
            metrics = {
                "reward_model/score/mean": per_row.mean().item(),
                "reward_model/score/max": per_row.max().item(),
                "reward_model/score/min": per_row.min().item(),
                "reward_model/truncated": scored.batch["rm_truncated"].mean().item(),
            }
        result = self.reward_fn(data, return_dict=True)
        if not return_dict:
            return result["reward_tensor"]
        result["reward_metrics"] = {**result.get("reward_metrics", {}), **metrics}
        return result

    def check_data_sources(self, locations: Any) -> None:
        self.reward_fn.check_data_sources(locations)

    def close(self) -> None:
        self.reward_fn.close()
