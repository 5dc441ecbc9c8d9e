"""The advantage-estimator registry, verl's ``AdvantageEstimator`` names, and the grouping helpers.

Estimators have verl's signatures (positional or keyword, e.g.
``compute_grpo_outcome_advantage(token_level_rewards, response_mask, index, epsilon=1e-6,
norm_adv_by_std_in_grpo=True, config=None)``) and return ``(advantages [B, R], returns [B, R])``.
The driver, :func:`~verl.algorithms.advantages.compute_advantage`, calls them by keyword through
:func:`call_adv_estimator`, offering::

    token_level_rewards [B, R], response_mask [B, R], index (np object array of uids, len B) | None,
    config (AlgorithmConfig) | None, gamma, lam, norm_adv_by_std_in_grpo,
    values [B, R] | None, reward_baselines [B] | None, old_log_probs [B, R] | None,
    sum_pi_squared [B, R] | None, rollout_is_weights [B, R] | None,
    non_tensor_batch (dict) | None, batch (TensorDict) | None

and passing a function only the names it declares (all of them when it takes ``**kwargs``), so
both verl-style and keyword-style estimators plug in::

    @register_adv_est("my_estimator")
    def my_estimator(token_level_rewards, response_mask, config=None, **kwargs): ...

Groups are the rows that share a ``uid`` (the n responses to one prompt).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from enum import Enum
from typing import Any

import numpy as np
import torch

AdvEstimatorFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]
ADV_ESTIMATOR_REGISTRY: dict[str, AdvEstimatorFn] = {}

GROUP_STD_EPS = 1e-6
"""Added to the group std before dividing (GRPO, pass@k): the estimators' default ``epsilon``."""


class AdvantageEstimator(str, Enum):
    """verl's names of the built-in estimators (a ``str``: ``AdvantageEstimator.GRPO == "grpo"``).

    Any registered string works wherever a member does; this enum only lists verl's set.
    """

    GAE = "gae"
    GRPO = "grpo"
    REINFORCE_PLUS_PLUS = "reinforce_plus_plus"
    REINFORCE_PLUS_PLUS_BASELINE = "reinforce_plus_plus_baseline"
    REMAX = "remax"
    RLOO = "rloo"
    OPO = "opo"
    GRPO_PASSK = "grpo_passk"
    GPG = "gpg"
    RLOO_VECTORIZED = "rloo_vectorized"
    GRPO_VECTORIZED = "grpo_vectorized"
    OPTIMAL_TOKEN_BASELINE = "optimal_token_baseline"
    TIR_OPTIMAL_TOKEN_BASELINE = "tir_optimal_token_baseline"
    GDPO = "gdpo"


def estimator_name(name_or_enum: str | Enum) -> str:
    """The registry key: an enum member's value, a string as it is."""
    return name_or_enum.value if isinstance(name_or_enum, Enum) else name_or_enum


def register_adv_est(name_or_enum: str | AdvantageEstimator) -> Callable[[AdvEstimatorFn], AdvEstimatorFn]:
    """Register an estimator under a name or an :class:`AdvantageEstimator` member (stored under
    its string value, so ``algorithm.adv_estimator=<name>`` selects it either way)."""
    name = estimator_name(name_or_enum)

    def decorator(fn: AdvEstimatorFn) -> AdvEstimatorFn:
        known = ADV_ESTIMATOR_REGISTRY.get(name)
        if known is not None and known is not fn:
            raise ValueError(f"advantage estimator {name!r} is already registered to {known.__qualname__}")
        ADV_ESTIMATOR_REGISTRY[name] = fn
        return fn

    return decorator


def get_adv_estimator_fn(name_or_enum: str | AdvantageEstimator) -> AdvEstimatorFn:
    """The estimator registered under a name or enum member; unknown names list the known ones."""
    name = estimator_name(name_or_enum)
    if name not in ADV_ESTIMATOR_REGISTRY:
        raise ValueError(
            f"unknown advantage estimator {name!r}; registered: {sorted(ADV_ESTIMATOR_REGISTRY)}"
        )
    return ADV_ESTIMATOR_REGISTRY[name]


def call_adv_estimator(fn: AdvEstimatorFn, **offered: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``fn(**offered)``, leaving out the names ``fn`` neither declares nor takes as ``**kwargs``."""
    params = inspect.signature(fn).parameters.values()
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        accepted = {p.name for p in params if p.kind is not inspect.Parameter.VAR_POSITIONAL}
        offered = {k: v for k, v in offered.items() if k in accepted}
    return fn(**offered)


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
