"""Optimal token baselines (OTB, as in verl 0.9.1): a per-timestep baseline from the group.

For each prompt group, the return-to-go ``G_t = sum_{t' >= t} m r`` gets the baseline that
minimises the gradient variance (a variance-weighted mean of the group's returns)::

    B_t = sum_i G_{i,t} W_{i,t} / (sum_i W_{i,t} + 1e-8),   W_{i,t} = sum_{j <= t} m_j w_j,
    w_j = (1 - 2 pi_j + sum_v pi_v^2) * rho_j^2

``w_j`` is a proxy of the squared norm of the score function at token ``j`` (``pi_j`` the
probability of the sampled token under ``old_log_probs``, ``sum_v pi_v^2`` the batch key
``sum_pi_squared``), ``rho_j`` the rollout importance weight (1 without ``rollout_is_weights``).
``A = (G - B) * m``; ``returns = G``. A single-sample group has ``B = 0``. With
``handle_zero_tail`` the part of a group's single longest response beyond the second-longest
gets ``B = 0`` (no other response informs it).
"""

from __future__ import annotations

import numpy as np
import torch

from verl.algorithms.adv_registry import AdvantageEstimator, groups, register_adv_est, require

OTB_EPS = 1e-8
"""Added to the summed path weights before dividing (the estimators' default ``epsilon``)."""


def path_weights(
    old_log_probs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is_weights: torch.Tensor | None,
) -> torch.Tensor:
    """``W_t = cumsum_t(m * (1 - 2 pi + sum pi^2) * rho^2)`` ([B, R])."""
    per_token = 1 - 2 * torch.exp(old_log_probs) + sum_pi_squared
    if rollout_is_weights is not None:
        per_token = per_token * (rollout_is_weights**2)
    return (per_token * response_mask).cumsum(dim=-1)


def reward_to_go(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``G_t = sum_{t' >= t} m_t' r_t'``."""
    return (token_level_rewards * response_mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])


def zero_tail(baselines: torch.Tensor, rows: list[int], lengths: torch.Tensor) -> None:
    """Set ``B = 0`` beyond the second-longest length on the group's single longest row (in place)."""
    ordered, _ = torch.sort(lengths)
    longest, second = int(ordered[-1].item()), int(ordered[-2].item())
    at_longest = (lengths == longest).nonzero(as_tuple=True)[0]
    if at_longest.numel() == 1 and longest > second:
        baselines[rows[int(at_longest[0])], second:] = 0.0


@register_adv_est(AdvantageEstimator.OPTIMAL_TOKEN_BASELINE)
@torch.no_grad()
def compute_optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | None,
    old_log_probs: torch.Tensor | None,
    sum_pi_squared: torch.Tensor | None,
    rollout_is_weights: torch.Tensor | None = None,
    handle_zero_tail: bool = True,
    epsilon: float = OTB_EPS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """OTB by position: ``B_t`` pools the group's tokens at the same index ``t`` (module doc)."""
    old_log_probs = require(old_log_probs, "old_log_probs", "optimal_token_baseline")
    sum_pi_squared = require(sum_pi_squared, "sum_pi_squared", "optimal_token_baseline")
    returns = reward_to_go(token_level_rewards, response_mask)
    weights = path_weights(old_log_probs, sum_pi_squared, response_mask, rollout_is_weights)
    baselines = torch.zeros_like(returns)
    for rows in groups(index, len(returns), "optimal_token_baseline"):
        if len(rows) == 1:
            continue
        mask = response_mask[rows]
        numerator = (returns[rows] * weights[rows] * mask).sum(dim=0)
        denominator = (weights[rows] * mask).sum(dim=0) + epsilon
        baselines[rows] = (numerator / denominator).unsqueeze(0).expand(len(rows), -1)
        if handle_zero_tail:
            zero_tail(baselines, rows.tolist(), mask.sum(dim=-1))
    return (returns - baselines) * response_mask, returns


@register_adv_est(AdvantageEstimator.TIR_OPTIMAL_TOKEN_BASELINE)
@torch.no_grad()
def compute_multi_turn_optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | None,
    old_log_probs: torch.Tensor | None,
    sum_pi_squared: torch.Tensor | None,
    rollout_is_weights: torch.Tensor | None = None,
    handle_zero_tail: bool = True,
    epsilon: float = OTB_EPS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """OTB for multi-turn (tool-integrated) responses: ``B_t`` pools the group's ``t``-th
    *valid* token, so the observation tokens between turns do not shift the positions.

    Each row's valid tokens are packed to the front, the baseline is taken there (rows
    without valid tokens are left out of their group), and the advantages are scattered back.
    """
    name = "tir_optimal_token_baseline"
    old_log_probs = require(old_log_probs, "old_log_probs", name)
    sum_pi_squared = require(sum_pi_squared, "sum_pi_squared", name)
    returns = reward_to_go(token_level_rewards, response_mask)
    weights = path_weights(old_log_probs, sum_pi_squared, response_mask, rollout_is_weights)
    valid = response_mask.bool()
    lengths = response_mask.sum(dim=-1).to(dtype=torch.long)
    width = int(lengths.max().item()) if lengths.numel() > 0 else 0
    packed_w = weights.new_zeros((len(lengths), width))
    packed_g = torch.zeros_like(packed_w)
    for i, length in enumerate(lengths.tolist()):
        packed_w[i, :length] = weights[i, valid[i]]
        packed_g[i, :length] = returns[i, valid[i]]

    baselines = torch.zeros_like(packed_g)
    for rows in groups(index, len(returns), name):
        rows = rows[lengths[rows] > 0]
        if len(rows) <= 1:
            continue
        b_star = (packed_g[rows] * packed_w[rows]).sum(dim=0) / (packed_w[rows].sum(dim=0) + epsilon)
        baselines[rows] = b_star.to(baselines.dtype)
        if handle_zero_tail:
            zero_tail(baselines, rows.tolist(), lengths[rows])

    advantages = torch.zeros_like(returns)
    for i, length in enumerate(lengths.tolist()):
        advantages[i, valid[i]] = (packed_g[i] - baselines[i])[:length]
    return advantages * response_mask, returns
