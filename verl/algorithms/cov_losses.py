"""Entropy-preserving losses of Cui et al. 2025 (https://arxiv.org/abs/2505.22617): Clip-Cov and KL-Cov.

Both single out the few valid tokens with a large centred covariance
``cov = (A - mean A) * (log pi - mean log pi)`` (means over the valid tokens of the
micro-batch), the tokens that drive the entropy down. Numerics follow verl 0.9.1.
"""

from __future__ import annotations

from typing import Any

import torch

from verl.algorithms.policy_loss_base import aggregate, clip_range, pg_metrics, register_policy_loss
from verl.utils.torch_functional import masked_mean


@register_policy_loss("clip_cov")
def compute_policy_loss_clip_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clip-Cov: PPO clip (no dual clip, ``log_r`` not clamped), plus detaching a few tokens.

    Among valid tokens not already clipped by PPO with ``clip_cov_lb < cov < clip_cov_ub``,
    a random ``max(1, int(clip_cov_ratio * #valid))`` (drawn with ``torch.randperm``) get
    zero loss. ``pg_clipfrac`` is the fraction of valid tokens detached that way.
    """
    options = config.policy_loss
    if not options.clip_cov_ratio > 0:
        raise ValueError(f"actor.policy_loss.clip_cov_ratio: expected > 0, got {options.clip_cov_ratio}")
    low, high = clip_range(config)
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - low, 1 + high)

    with torch.no_grad():
        cov = (advantages - masked_mean(advantages, response_mask)) * (
            log_prob - masked_mean(log_prob, response_mask)
        )
        candidates = (
            (response_mask > 0)
            & ~(pg_losses2 > pg_losses1)
            & (cov > options.clip_cov_lb)
            & (cov < options.clip_cov_ub)
        )
    candidate_idx = torch.nonzero(candidates)
    corr = torch.ones_like(advantages)
    if len(candidate_idx) > 0:
        clip_num = max(int(options.clip_cov_ratio * response_mask.sum().item()), 1)
        chosen = candidate_idx[torch.randperm(len(candidate_idx))[:clip_num]]
        corr[chosen[:, 0], chosen[:, 1]] = 0

    pg_losses = torch.maximum(pg_losses1, pg_losses2) * corr
    pg_loss = aggregate(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    pg_clipfrac = masked_mean((corr == 0).float(), response_mask)
    return pg_loss, pg_metrics(pg_clipfrac, masked_mean(-log_ratio, response_mask), 0.0)


@register_policy_loss("kl_cov")
def compute_policy_loss_kl_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL-Cov: unclipped ``-A r``, plus ``ppo_kl_coef * |log_r|`` on the
    ``max(1, int(kl_cov_ratio * #valid))`` valid tokens with the largest ``cov``.

    ``actor/ppo_kl`` reports ``mean |log_r|``; the clip fractions are 0.
    """
    options = config.policy_loss
    if not options.kl_cov_ratio > 0:
        raise ValueError(f"actor.policy_loss.kl_cov_ratio: expected > 0, got {options.kl_cov_ratio}")
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio)
    pg_losses = -advantages * ratio
    pg_losses_kl = pg_losses + options.ppo_kl_coef * log_ratio.abs()

    valid = response_mask > 0
    n_valid = int(valid.sum().item())
    if n_valid > 0:
        adv_v, logp_v = advantages[valid].detach(), log_prob[valid].detach()
        cov = (adv_v - adv_v.mean()) * (logp_v - logp_v.mean())
        top = torch.topk(cov, max(1, int(n_valid * options.kl_cov_ratio)), largest=True).indices
        flat_selected = torch.zeros(n_valid, dtype=torch.bool, device=cov.device)
        flat_selected[top] = True
        selected = torch.zeros_like(valid)
        selected[valid] = flat_selected
        pg_losses = torch.where(selected, pg_losses_kl, pg_losses)

    pg_loss = aggregate(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    return pg_loss, pg_metrics(0.0, masked_mean(log_ratio.abs(), response_mask), 0.0)
