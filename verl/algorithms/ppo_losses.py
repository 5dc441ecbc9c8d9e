"""Ratio-based policy losses: PPO and its sequence-level, smoothed and clipped-weight variants.

Notation: ``log_r = log_prob - old_log_prob``, ``r = exp(log_r)``, ``A`` the advantage,
``eps_low``/``eps_high`` from :func:`clip_range`, ``w`` the rollout importance weights
(1 when absent). Numerics (clamps, epsilons, which tokens count) follow verl 0.9.1.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from verl.algorithms.loss_agg import agg_loss, global_batch_info
from verl.algorithms.policy_loss_base import (
    aggregate,
    clamped_log_ratio,
    clip_range,
    pg_metrics,
    register_policy_loss,
)
from verl.utils.torch_functional import masked_mean

GSPO_LOG_RATIO_MAX = 10.0
"""GSPO clamps its per-token log sequence ratio from above only."""
GEO_MEAN_EPS = 1e-8
"""Added to the response length before dividing (GMPO)."""
GEO_MEAN_LOG_EPS = 1e-10
"""Added to the importance weights before their log (GMPO's geometric mean of weights)."""


@register_policy_loss("vanilla")
def compute_policy_loss_vanilla(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate (https://arxiv.org/abs/1707.06347), dual clip (https://arxiv.org/abs/1912.09729).

    ``L1 = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))``; for ``A < 0`` the loss is
    further capped at ``-A * clip_ratio_c``: ``L = min(L1, -A c)``; then ``L * w``. ``log_r``
    is clamped to [-20, 20]. ``ppo_kl = mean(-log_r)``; ``pg_clipfrac`` is the fraction of
    tokens where the clipped term wins, ``pg_clipfrac_lower`` where the dual clip binds.
    """
    low, high = clip_range(config)
    pg_losses, pg_clipfrac, ppo_kl, pg_clipfrac_lower = dual_clip_pg_losses(
        old_log_prob, log_prob, advantages, response_mask, low, high, config.clip_ratio_c
    )
    pg_loss = aggregate(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    return pg_loss, pg_metrics(pg_clipfrac, ppo_kl, pg_clipfrac_lower)


def dual_clip_pg_losses(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    clip_ratio_c: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token dual-clip PPO losses ``[B, R]`` and ``(pg_clipfrac, ppo_kl, pg_clipfrac_lower)``."""
    if not clip_ratio_c > 1.0:
        raise ValueError(f"actor.clip_ratio_c: expected a value > 1.0 for dual-clip PPO, got {clip_ratio_c}")
    log_ratio = clamped_log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    ppo_kl = masked_mean(-log_ratio, response_mask)

    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_clipfrac = masked_mean(torch.gt(pg_losses2, pg_losses1).float(), response_mask)

    pg_losses3 = -advantages * clip_ratio_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    pg_clipfrac_lower = masked_mean(
        torch.gt(clip_pg_losses1, pg_losses3) * (advantages < 0).float(), response_mask
    )
    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    return pg_losses, pg_clipfrac, ppo_kl, pg_clipfrac_lower


def compute_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange: float | None = None,
    cliprange_low: float | None = None,
    cliprange_high: float | None = None,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """verl's older PPO loss with the clip ranges as arguments (deprecated there and here: use
    :func:`compute_policy_loss_vanilla`, which reads them from the actor config).

    The same dual-clip loss as ``vanilla``; ``cliprange_low``/``cliprange_high`` fall back to
    ``cliprange``. Aggregated with ``agg_loss`` on this batch alone (no global-batch counts, no
    importance weights). Returns ``(pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)`` as tensors.
    """
    warnings.warn(
        "compute_policy_loss is deprecated; use compute_policy_loss_vanilla", FutureWarning, stacklevel=2
    )
    low = cliprange if cliprange_low is None else cliprange_low
    high = cliprange if cliprange_high is None else cliprange_high
    if low is None or high is None:
        raise ValueError("compute_policy_loss needs cliprange (or both cliprange_low and cliprange_high)")
    pg_losses, pg_clipfrac, ppo_kl, pg_clipfrac_lower = dual_clip_pg_losses(
        old_log_prob, log_prob, advantages, response_mask, low, high, clip_ratio_c
    )
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode)
    return pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower


@register_policy_loss("gspo")
def compute_policy_loss_gspo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO (Zheng et al. 2025, https://arxiv.org/abs/2507.18071): a sequence-level ratio.

    ``s_i = exp(mean_t log_r_{i,t})`` over valid tokens. Per token the ratio is
    ``sg[s_i] * pi / sg[pi]`` (value ``s_i``, gradient of ``log pi``), log clamped at 10,
    then clipped as in PPO (no dual clip). Aggregated with ``loss_agg_mode`` (the paper's
    choice is ``seq-mean-token-mean``; verl 0.9.1 honours the configured mode).
    """
    low, high = clip_range(config)
    log_ratio = log_prob - old_log_prob
    seq_lengths = torch.sum(response_mask, dim=-1).clamp(min=1)
    seq_log_ratio = torch.sum(log_ratio * response_mask, dim=-1) / seq_lengths
    log_seq_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    seq_ratio = torch.exp(torch.clamp(log_seq_ratio, max=GSPO_LOG_RATIO_MAX))

    pg_losses1 = -advantages * seq_ratio
    pg_losses2 = -advantages * torch.clamp(seq_ratio, 1 - low, 1 + high)
    pg_losses = torch.maximum(pg_losses1, pg_losses2)
    pg_loss = aggregate(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)

    pg_clipfrac = masked_mean(torch.gt(pg_losses2, pg_losses1).float(), response_mask)
    return pg_loss, pg_metrics(pg_clipfrac, masked_mean(-log_ratio, response_mask), 0.0)


@register_policy_loss("sapo")
def compute_policy_loss_sapo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """SAPO, Soft Adaptive Policy Optimization (https://arxiv.org/abs/2511.20347): a smooth gate, not a clip.

    ``L = -f(r) A`` with ``f(r) = sigmoid(tau (r - 1)) * 4 / tau``, ``tau = actor.tau_pos``
    where ``A > 0`` and ``actor.tau_neg`` otherwise (``log_r`` clamped to [-20, 20]).
    ``f(1) = 2 / tau`` and ``f'(1) = 1``: on-policy it is the plain policy gradient, and the
    gradient fades smoothly as ``r`` leaves 1. Always aggregated with
    ``seq-mean-token-mean`` (``loss_agg_mode`` is ignored, as in verl).
    """
    tau_pos = torch.as_tensor(config.tau_pos, dtype=advantages.dtype, device=advantages.device)
    tau_neg = torch.as_tensor(config.tau_neg, dtype=advantages.dtype, device=advantages.device)
    log_ratio = clamped_log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    taus = torch.where(advantages > 0, tau_pos, tau_neg)
    gates = torch.sigmoid(taus * (ratio - 1.0)) * (4.0 / taus)
    pg_losses = -gates * advantages
    pg_loss = aggregate(pg_losses, response_mask, "seq-mean-token-mean", config, rollout_is_weights)
    return pg_loss, pg_metrics(0.0, masked_mean(-log_ratio, response_mask), 0.0)


@register_policy_loss("cispo")
def compute_policy_loss_cispo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO (MiniMax-M1, https://arxiv.org/abs/2506.13585): clip the importance weight, not the update.

    ``L = -sg[clip(r, 1 - eps_low, 1 + eps_high)] * A * log pi``: every token keeps a
    gradient; ``log_r`` is clamped to [-20, 20]. ``pg_clipfrac`` = fraction with clipped weight.
    """
    low, high = clip_range(config)
    log_ratio = clamped_log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    clipped_ratio = torch.clamp(ratio, 1 - low, 1 + high)
    pg_losses = -clipped_ratio.detach() * advantages * log_prob
    pg_clipfrac = masked_mean((ratio != clipped_ratio).float(), response_mask)
    pg_loss = aggregate(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    return pg_loss, pg_metrics(pg_clipfrac, masked_mean(-log_ratio, response_mask), 0.0)


@register_policy_loss("gpg")
def compute_policy_loss_gpg(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GPG (Chu et al. 2025, https://arxiv.org/abs/2504.02546): plain policy gradient ``-A log pi``.

    No ratio and no clipping; the metrics are reported as 0.
    """
    pg_loss = aggregate(-log_prob * advantages, response_mask, loss_agg_mode, config, rollout_is_weights)
    return pg_loss, pg_metrics(0.0, 0.0, 0.0)


@register_policy_loss("dro")
def compute_policy_loss_dro(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """DRO, Direct Reward Optimisation (cf. Richemond et al. 2024, https://arxiv.org/abs/2405.19107).

    ``L = -(A log pi - beta / 2 * log_r^2)`` with ``beta = policy_loss.dro_beta > 0``: the
    policy gradient plus a quadratic pull towards ``pi_old``. ``ppo_kl = mean(-log_r)``.
    """
    beta = config.policy_loss.dro_beta
    if beta is None or beta <= 0:
        raise ValueError(
            f"actor.policy_loss.dro_beta: expected a positive number for loss_mode=dro, got {beta}"
        )
    log_ratio = log_prob - old_log_prob
    pg_losses = -(log_prob * advantages - 0.5 * beta * log_ratio.square())
    pg_loss = aggregate(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    return pg_loss, pg_metrics(0.0, masked_mean(-log_ratio, response_mask), 0.0)


@register_policy_loss("geo_mean")
def compute_policy_loss_geo_mean(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GMPO (Zhao et al. 2025, https://arxiv.org/abs/2507.20673): geometric mean of token ratios.

    Token log-ratios are clipped on the side that matters for ``sign(A)``:
    ``l = sign(A) * min(sign(A) log_r, sign(A) clip(log_r, -eps_low, eps_high))``; then
    ``rho_i = exp(sum_t m l / (|y_i| + 1e-8))``, ``A_i = sum_t m A / (|y_i| + 1e-8)`` and
    ``L_i = -A_i rho_i w_i`` with ``w_i`` the geometric mean of the row's importance weights.
    ``loss = mean_i L_i`` over all rows (``loss_agg_mode`` is ignored, as in verl). With
    global-batch info the mean is ``dp_size * sum_i L_i / global_batch_size`` (verl takes the
    micro-batch mean there, which makes the loss scale depend on the micro-batch count).
    """
    low, high = clip_range(config)
    log_ratio = log_prob - old_log_prob
    sign = torch.sign(advantages)
    log_ratio_clamped = torch.clamp(log_ratio, -low, high)
    log_ratio_min = sign * torch.min(sign * log_ratio, sign * log_ratio_clamped)

    lengths = response_mask.sum(dim=-1)
    seq_ratio = torch.exp((log_ratio_min * response_mask).sum(dim=-1) / (lengths + GEO_MEAN_EPS))
    seq_advantage = (advantages * response_mask).sum(dim=-1) / (lengths + GEO_MEAN_EPS)
    pg_losses = -seq_advantage * seq_ratio
    if rollout_is_weights is not None:
        log_weights = torch.log(rollout_is_weights + GEO_MEAN_LOG_EPS) * response_mask
        pg_losses = pg_losses * torch.exp(log_weights.sum(dim=-1) / (lengths + GEO_MEAN_EPS))
    info = global_batch_info(config)
    if info.get("global_batch_size") is not None:
        pg_loss = pg_losses.sum() / info["global_batch_size"] * info.get("dp_size", 1)
    else:
        pg_loss = torch.mean(pg_losses)

    clipped = torch.ne(log_ratio, log_ratio_clamped)
    pg_clipfrac = masked_mean((clipped * (advantages > 0)).float(), response_mask)
    pg_clipfrac_lower = masked_mean((clipped * (advantages < 0)).float(), response_mask)
    return pg_loss, pg_metrics(pg_clipfrac, masked_mean(-log_ratio, response_mask), pg_clipfrac_lower)
