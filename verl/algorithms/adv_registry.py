"""The advantage-estimator registry and the grouping helpers the estimators share.

Every registered estimator takes keyword arguments and ignores those it does not use::

    fn(*, token_level_rewards [B, R], response_mask [B, R], index (np object array of uids, len B) | None,
       config (AlgorithmConfig), values [B, R] | None, reward_baselines [B] | None,
       old_log_probs [B, R] | None, sum_pi_squared [B, R] | None, rollout_is_weights [B, R] | None,
       non_tensor_batch (dict) | None, batch (TensorDict) | None, **kwargs)
    -> (advantages [B, R], returns [B, R])

so a new estimator is one decorated function::

    @register_adv_est("my_estimator")
    def my_estimator(*, token_level_rewards, response_mask, config, **kwargs): ...

Groups are the rows that share a ``uid`` (the n responses to one prompt).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

AdvEstimatorFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]
ADV_ESTIMATOR_REGISTRY: dict[str, AdvEstimatorFn] = {}

GROUP_STD_EPS = 1e-6
"""Added to the group std before dividing (GRPO, pass@k)."""


def register_adv_est(name: str) -> Callable[[AdvEstimatorFn], AdvEstimatorFn]:
    """Register an estimator under ``name`` (``algorithm.adv_estimator=name`` selects it)."""

    def decorator(fn: AdvEstimatorFn) -> AdvEstimatorFn:
        known = ADV_ESTIMATOR_REGISTRY.get(name)
        if known is not None and known is not fn:
            raise ValueError(f"advantage estimator {name!r} is already registered to {known.__qualname__}")
        ADV_ESTIMATOR_REGISTRY[name] = fn
        return fn

    return decorator


def get_adv_estimator_fn(name: str) -> AdvEstimatorFn:
    """The estimator registered under ``name``; unknown names list the known ones."""
    if name not in ADV_ESTIMATOR_REGISTRY:
        raise ValueError(
            f"unknown advantage estimator {name!r}; registered: {sorted(ADV_ESTIMATOR_REGISTRY)}"
        )
    return ADV_ESTIMATOR_REGISTRY[name]


def check_index(index: np.ndarray | None, batch_size: int, estimator: str) -> np.ndarray:
    """``index`` itself, after checking that it is there and has one uid per row."""
    if index is None:
        raise ValueError(
            f"advantage estimator {estimator!r} needs the non-tensor column 'uid' to group responses"
        )
    if len(index) != batch_size:
        raise ValueError(
            f"advantage estimator {estimator!r}: 'uid' has {len(index)} rows but rewards have {batch_size}"
        )
    return index


def groups(index: np.ndarray | None, batch_size: int, estimator: str) -> list[torch.Tensor]:
    """Row indices of each group, in order of first appearance."""
    rows: dict[Any, list[int]] = {}
    for i, uid in enumerate(check_index(index, batch_size, estimator)):
        rows.setdefault(uid, []).append(i)
    return [torch.tensor(r, dtype=torch.long) for r in rows.values()]


def group_ids(index: np.ndarray | None, batch_size: int, estimator: str) -> torch.Tensor:
    """``[B]`` group number of each row (0, 1, ... in order of first appearance)."""
    ids: dict[Any, int] = {}
    return torch.tensor(
        [ids.setdefault(uid, len(ids)) for uid in check_index(index, batch_size, estimator)], dtype=torch.long
    )


def group_mean_std(scores: torch.Tensor, group_rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row mean and unbiased std of its group; a single-sample group gets mean 0, std 1."""
    mean, std = torch.zeros_like(scores), torch.ones_like(scores)
    for rows in group_rows:
        if len(rows) > 1:
            mean[rows] = torch.mean(scores[rows])
            std[rows] = torch.std(scores[rows])
    return mean, std


def require(tensor: Any, key: str, estimator: str) -> Any:
    """``tensor``, or an error naming the batch key the estimator needs."""
    if tensor is None:
        raise ValueError(f"advantage estimator {estimator!r} needs batch key {key!r}")
    return tensor
