"""DPPO (https://arxiv.org/abs/2602.04879): drop the tokens whose probability moved too far.

Instead of clipping the ratio, DPPO keeps a token's policy-gradient term only while a
divergence between ``pi`` and ``pi_old`` *of that token's probability* stays under a
threshold (``actor.clip_ratio_high`` for ``A > 0``, ``clip_ratio_low`` otherwise; these are
divergence thresholds here, not ratio ranges). The surviving terms are
``L = -A * sg[min(r, clip_ratio_c)] * log pi`` (a truncated importance weight instead of the
dual clip; the paper recommends a large ``clip_ratio_c``). ``log_r`` is clamped to [-20, 20].
Metrics: ``pg_clipfrac`` = fraction of valid tokens dropped, ``pg_clipfrac_lower`` = fraction
kept but truncated. Numerics follow verl 0.9.1.
"""

from __future__ import annotations

from typing import Any

import torch

from verl.algorithms.policy_loss_base import (
    aggregate,
    clamped_log_ratio,
    clip_range,
    pg_metrics,
    register_policy_loss,
)
from verl.utils.torch_functional import masked_mean

BINARY_KL_EPS = 1e-8
"""Added inside the log of the binary KL's ``1 - p`` terms."""


def _dppo_loss(
    keep_positive: torch.Tensor,
    keep_negative: torch.Tensor,
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    config: Any,
    rollout_is_weights: torch.Tensor | None,
) -> tuple[torch.Tensor, dict[str, float]]:
    log_ratio = clamped_log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    truncated_ratio = torch.clamp(ratio, max=config.clip_ratio_c).detach()
    keep = torch.where(advantages > 0, keep_positive, keep_negative).detach().float()
    pg_losses = -advantages * truncated_ratio * log_prob * keep
    pg_loss = aggregate(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    pg_clipfrac = masked_mean((1.0 - keep).float(), response_mask)
    pg_clipfrac_lower = masked_mean((ratio > config.clip_ratio_c).float() * keep, response_mask)
    return pg_loss, pg_metrics(pg_clipfrac, masked_mean(-log_ratio, response_mask), pg_clipfrac_lower)


@register_policy_loss("dppo_tv")
def compute_policy_loss_dppo_tv(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """DPPO-Binary-TV: keep a token while ``p - p_old <= high`` (``A > 0``) or ``p - p_old >= -low``."""
    low, high = clip_range(config)
    delta = torch.exp(log_prob) - torch.exp(old_log_prob)
    return _dppo_loss(
        delta <= high,
        delta >= -low,
        old_log_prob,
        log_prob,
        advantages,
        response_mask,
        loss_agg_mode,
        config,
        rollout_is_weights,
    )


@register_policy_loss("dppo_kl")
def compute_policy_loss_dppo_kl(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """DPPO-Binary-KL: the KL between the Bernoulli distributions ``(p_old, 1 - p_old)`` and ``(p, 1 - p)``,

    ``kl = p_old log(p_old / p) + (1 - p_old) log((1 - p_old + 1e-8) / (1 - p + 1e-8))``. A token is
    kept while ``kl <= high`` or ``p <= p_old`` (``A > 0``), or ``kl <= low`` or ``p >= p_old``
    (otherwise): only moves in the direction the advantage pushes are limited.
    """
    low, high = clip_range(config)
    prob, old_prob = torch.exp(log_prob), torch.exp(old_log_prob)
    binary_kl = old_prob * (old_log_prob - log_prob) + (1 - old_prob) * torch.log(
        (1.0 - old_prob + BINARY_KL_EPS) / (1.0 - prob + BINARY_KL_EPS)
    )
    return _dppo_loss(
        (binary_kl <= high) | (prob <= old_prob),
        (binary_kl <= low) | (prob >= old_prob),
        old_log_prob,
        log_prob,
        advantages,
        response_mask,
        loss_agg_mode,
        config,
        rollout_is_weights,
    )
