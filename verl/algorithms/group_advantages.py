"""Outcome estimators with a group baseline: GRPO and its variants, RLOO, OPO, GPG, REINFORCE++-baseline.

They use the sequence score ``s_i = sum_t r_{i,t}`` and broadcast one scalar per response
over its valid tokens. Numerics follow verl 0.9.1: unbiased group std, ``epsilon = 1e-6``, and a
group of one sample has mean 0 and std 1 (except where a doc string says otherwise). Signatures
are verl's; ``epsilon`` and ``config`` are accepted everywhere verl accepts them, even where the
formula does not use them (RLOO, OPO, REINFORCE++-baseline).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from verl.algorithms.adv_registry import (
    GROUP_STD_EPS,
    AdvantageEstimator,
    group_ids,
    group_mean_std,
    groups,
    register_adv_est,
    require,
)
from verl.utils.torch_functional import masked_whiten

if TYPE_CHECKING:
    from verl.config.algorithm import AlgorithmConfig


def grpo_scalars(
    scores: torch.Tensor, index: np.ndarray | None, normalize: bool, name: str, epsilon: float = GROUP_STD_EPS
) -> torch.Tensor:
    """``(s_i - mean_g) / (std_g + epsilon)``, or ``s_i - mean_g`` without ``normalize`` ([B])."""
    mean, std = group_mean_std(scores, groups(index, len(scores), name))
    return (scores - mean) / (std + epsilon) if normalize else scores - mean


@register_adv_est(AdvantageEstimator.GRPO)
@torch.no_grad()
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | None,
    epsilon: float = GROUP_STD_EPS,
    norm_adv_by_std_in_grpo: bool = True,
    config: AlgorithmConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO (Shao et al. 2024, https://arxiv.org/abs/2402.03300): ``A_i = (s_i - mean_g) / (std_g + epsilon)``.

    With ``norm_adv_by_std_in_grpo=False`` it is ``A_i = s_i - mean_g`` (Dr.GRPO,
    https://arxiv.org/abs/2503.20783). The flag is the argument, as in verl (``config`` is not
    read); the driver passes ``algorithm.norm_adv_by_std_in_grpo``.
    """
    scores = grpo_scalars(token_level_rewards.sum(dim=-1), index, norm_adv_by_std_in_grpo, "grpo", epsilon)
    advantages = scores.unsqueeze(-1) * response_mask
    return advantages, advantages


@register_adv_est(AdvantageEstimator.GRPO_VECTORIZED)
@torch.no_grad()
def compute_grpo_vectorized_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | None,
    epsilon: float = GROUP_STD_EPS,
    norm_adv_by_std_in_grpo: bool = True,
    config: AlgorithmConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO with group sums by ``index_add`` (no Python loop over groups): the same formula as
    ``grpo``, with the std ``sqrt(sum_g (s - mean_g)^2 / max(n_g - 1, 1))`` taken in float32."""
    scores = token_level_rewards.sum(dim=-1).to(torch.float32)
    ids = group_ids(index, len(scores), "grpo_vectorized")
    n_groups = int(ids.max().item()) + 1

    def group_sum(values: torch.Tensor) -> torch.Tensor:
        return torch.zeros(n_groups, dtype=torch.float32, device=scores.device).index_add_(0, ids, values)

    count = group_sum(torch.ones_like(scores))
    mean = group_sum(scores) / count.clamp_min(1.0)
    centered = scores - mean[ids]
    std = torch.sqrt(torch.clamp(group_sum(centered * centered) / (count - 1.0).clamp_min(1.0), min=0.0))
    single = count <= 1.0
    mean, std = mean.masked_fill(single, 0.0), std.masked_fill(single, 1.0)
    if norm_adv_by_std_in_grpo:
        scalars = (scores - mean[ids]) / (std[ids] + epsilon)
    else:
        scalars = scores - mean[ids]
    advantages = scalars.unsqueeze(-1) * response_mask
    return advantages, advantages


@register_adv_est(AdvantageEstimator.GDPO)
@torch.no_grad()
def compute_gdpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | None,
    epsilon: float = GROUP_STD_EPS,
    norm_adv_by_std_in_grpo: bool = True,
    config: AlgorithmConfig | None = None,
    non_tensor_batch: dict | None = None,
    batch: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GDPO (https://arxiv.org/abs/2601.05242): normalise each reward dimension within its group
    before summing, so a dominant reward does not drown the others.

    ``A = whiten(sum_k w_k * GRPO(s^k)) * m`` over the valid tokens of the batch, where ``s^k``
    is the per-response value of ``algorithm.gdpo_reward_keys[k]`` (a column the reward
    function returns) and ``w_k`` = ``algorithm.gdpo_reward_weights`` (default 1). Without
    reward keys (or without ``config``) the only dimension is ``s_i = sum_t r_{i,t}``.
    """
    keys = getattr(config, "gdpo_reward_keys", None)
    if keys:
        columns = require(non_tensor_batch, "non_tensor_batch", "gdpo")
        missing = [k for k in keys if k not in columns]
        if missing:
            raise ValueError(
                f"algorithm.gdpo_reward_keys: {missing} not among the reward columns {sorted(columns)}"
            )
        dims = [
            torch.tensor(np.asarray(columns[k], dtype=np.float32), device=response_mask.device) for k in keys
        ]
    else:
        dims = [token_level_rewards.sum(dim=-1)]
    given = getattr(config, "gdpo_reward_weights", None) if keys else None
    weights = torch.tensor(given if given is not None else [1.0] * len(dims), dtype=torch.float32)
    total = None
    for weight, scores in zip(weights.to(response_mask.device), dims, strict=True):
        scalars = grpo_scalars(scores, index, norm_adv_by_std_in_grpo, "gdpo", epsilon)
        term = weight * (scalars.unsqueeze(-1) * response_mask)
        total = term if total is None else total + term
    advantages = masked_whiten(total, response_mask) * response_mask
    return advantages, advantages


@register_adv_est(AdvantageEstimator.GRPO_PASSK)
@torch.no_grad()
def compute_grpo_passk_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | None,
    epsilon: float = GROUP_STD_EPS,
    norm_adv_by_std_in_grpo: bool = True,
    config: AlgorithmConfig | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass@k training (Chen et al. 2025, https://arxiv.org/abs/2503.19595).

    Only the best response of each group gets a non-zero advantage, ``s_max - s_second``
    (divided by ``std_g + epsilon`` when normalising). Groups need >= 2 samples. As in verl, a
    given ``config`` decides the normalisation (``config.norm_adv_by_std_in_grpo``); without
    one, the argument does.
    """
    if config is not None:
        norm_adv_by_std_in_grpo = getattr(config, "norm_adv_by_std_in_grpo", True)
    scores = token_level_rewards.sum(dim=-1)
    advantages = torch.zeros_like(scores)
    for rows in groups(index, len(scores), "grpo_passk"):
        group = scores[rows]
        if group.numel() < 2 and not response_mask[rows].any():
            continue  # a masked-out row on its own (a stale sample dropped by the async trainer)
        if group.numel() < 2:
            raise ValueError(f"grpo_passk needs at least 2 responses per uid; row {rows[0].item()} is alone")
        top, top_idx = torch.topk(group, 2)
        advantage = top[0] - top[1]
        if norm_adv_by_std_in_grpo:
            advantage = advantage / (torch.std(group) + epsilon)
        advantages[rows[top_idx[0]]] = advantage
    advantages = advantages.unsqueeze(-1) * response_mask
    return advantages, advantages


@register_adv_est(AdvantageEstimator.REINFORCE_PLUS_PLUS_BASELINE)
@torch.no_grad()
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | None,
    epsilon: float = GROUP_STD_EPS,
    config: AlgorithmConfig | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with a group baseline (Hu 2025, https://arxiv.org/abs/2501.03262).

    ``A_i = s_i - mean_g`` on every valid token, then whitened over all valid tokens of the batch.
    """
    scores = token_level_rewards.sum(dim=-1)
    mean, _ = group_mean_std(scores, groups(index, len(scores), "reinforce_plus_plus_baseline"))
    scores = (scores - mean).unsqueeze(-1).tile([1, token_level_rewards.shape[-1]]) * response_mask
    advantages = masked_whiten(scores, response_mask) * response_mask
    return advantages, advantages


@register_adv_est(AdvantageEstimator.RLOO)
@torch.no_grad()
def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | None,
    epsilon: float = GROUP_STD_EPS,
    config: AlgorithmConfig | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO (Ahmadian et al. 2024, https://arxiv.org/abs/2402.14740): leave-one-out baseline.

    ``A_i = s_i - mean_{j != i} s_j = n / (n - 1) * (s_i - mean_g)`` for a group of ``n > 1``;
    a single-sample group keeps its raw score as the advantage (verl's behaviour).
    """
    scores = token_level_rewards.sum(dim=-1)
    for rows in groups(index, len(scores), "rloo"):
        n = len(rows)
        if n > 1:
            mean = torch.mean(scores[rows])
            scores[rows] = scores[rows] * n / (n - 1) - mean * n / (n - 1)
    advantages = scores.unsqueeze(-1) * response_mask
    return advantages, advantages


@register_adv_est(AdvantageEstimator.RLOO_VECTORIZED)
@torch.no_grad()
def compute_rloo_vectorized_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | None,
    epsilon: float = GROUP_STD_EPS,
    config: AlgorithmConfig | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO with group sums by ``bincount``: ``A_i = (n s_i - sum_g s) / (n - 1)``.

    Unlike ``rloo``, a single-sample group gets advantage 0 (as verl's vectorised version).
    """
    scores = token_level_rewards.sum(dim=-1)
    ids = group_ids(index, len(scores), "rloo_vectorized").to(scores.device)
    count = torch.bincount(ids)[ids].to(scores.dtype)
    group_sums = torch.bincount(ids, weights=scores)[ids]
    advantages = ((count * scores - group_sums) / (count - 1).clamp_min(1)) * (count > 1)
    advantages = advantages.unsqueeze(-1) * response_mask
    return advantages, advantages


@register_adv_est(AdvantageEstimator.OPO)
@torch.no_grad()
def compute_opo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | None,
    epsilon: float = GROUP_STD_EPS,
    config: AlgorithmConfig | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """On-Policy RL with Optimal reward baseline (Hao et al. 2025, https://arxiv.org/abs/2505.23585).

    Length-weighted group baseline ``b_g = sum_i |y_i| s_i / sum_i |y_i|``, ``A_i = s_i - b_g``;
    a single-sample group has baseline 0.
    """
    lengths = response_mask.sum(dim=-1)
    scores = token_level_rewards.sum(dim=-1)
    baseline = torch.zeros_like(scores)
    for rows in groups(index, len(scores), "opo"):
        if len(rows) > 1:
            baseline[rows] = (lengths[rows] * scores[rows]).sum() / lengths[rows].sum()
    advantages = (scores - baseline).unsqueeze(-1) * response_mask
    return advantages, advantages


@register_adv_est(AdvantageEstimator.GPG)
@torch.no_grad()
def compute_gpg_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | None,
    epsilon: float = GROUP_STD_EPS,
    f_norm: float = 1.0,
    alpha: float = 1.0,
    config: AlgorithmConfig | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPG (Chu et al. 2025, https://arxiv.org/abs/2504.02546): ``A_i = alpha * (s_i - mean_g) / f_norm``.

    ``alpha = B / max(1, #rows with non-zero score)`` rescales the gradient when many groups
    carry no signal; it is always computed so, and the ``alpha`` argument is ignored (as in verl).
    """
    scores = token_level_rewards.sum(dim=-1)
    alpha = len(scores) / torch.count_nonzero(scores).clamp(min=1)
    mean, _ = group_mean_std(scores, groups(index, len(scores), "gpg"))
    advantages = (alpha * (scores - mean) / f_norm).unsqueeze(-1) * response_mask
    return advantages, advantages
