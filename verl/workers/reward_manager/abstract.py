"""verl's interface of a reward manager (``verl.workers.reward_manager.abstract``).

A reward manager is built as ``cls(tokenizer, num_examine, compute_score, reward_fn_key, **kwargs)``
(``compute_score``: a plain function ``fn(data_source, solution_str, ground_truth, extra_info)``)
and called as ``manager(data, return_dict=False)``: the ``[B, R]`` reward tensor, or
``{"reward_tensor": ..., "reward_extra_info": {...}}``. This project's managers
(:class:`~verl.workers.reward_manager.base.RewardManager`) implement it; a class written against
verl's interface and registered with ``@register`` is loaded as it is.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import torch

from verl.protocol import DataProto

__all__ = ["AbstractRewardManager", "RawRewardFn"]

RawRewardFn = Callable[..., Any]


class AbstractRewardManager(ABC):
    @abstractmethod
    def __init__(
        self,
        tokenizer: Any,
        num_examine: int,
        compute_score: RawRewardFn | None,
        reward_fn_key: str = "data_source",
        **kwargs: Any,
    ) -> None: ...

    @abstractmethod
    def __call__(self, data: DataProto, return_dict: bool = False) -> torch.Tensor | dict[str, Any]: ...

    def _extract_reward_from_rm_scores(
        self, data: DataProto, return_dict: bool = False
    ) -> torch.Tensor | dict[str, Any] | None:
        """The reward a reward-model worker already put in ``data.batch["rm_scores"]`` (with the
        extra columns ``meta_info["reward_extra_keys"]`` names); None when there is none."""
        if "rm_scores" not in data.batch.keys():
            return None
        if not return_dict:
            return data.batch["rm_scores"]
        keys = data.meta_info.get("reward_extra_keys", [])
        return {
            "reward_tensor": data.batch["rm_scores"],
            "reward_extra_info": {key: data.non_tensor_batch[key] for key in keys},
        }
