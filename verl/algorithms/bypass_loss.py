"""Bypass mode (verl 0.9.1): train against the rollout's own log-probs, with no recomputed ``pi_old``.

In bypass mode ``old_log_prob`` *is* ``log pi_rollout``: two policies instead of three. The
rollout-correction settings (``policy_loss.rollout_correction``: ``loss_type``,
``rollout_is``, ``rollout_is_threshold``, ``rollout_is_batch_normalize``, ``rollout_rs``,
``rollout_rs_threshold``; see :mod:`verl.algorithms.rollout_correction`) are applied to
``log_rho = log pi - log pi_rollout`` of the *current* policy, without gradient:

* ``loss_type=ppo_clip``: the rejection mask, then the vanilla PPO loss against
  ``pi_rollout`` (its ratio already is the importance ratio; no extra weights);
* ``loss_type=reinforce``: ``L = -A * w * log pi`` with the importance weights ``w`` and
  the rejection mask (REINFORCE with truncated importance sampling).
"""

from __future__ import annotations

from typing import Any

import torch

from verl.algorithms.policy_loss_base import aggregate, pg_metrics, register_policy_loss
from verl.algorithms.ppo_losses import compute_policy_loss_vanilla
from verl.algorithms.rollout_correction import compute_rollout_correction_and_rejection_mask
from verl.utils.torch_functional import masked_mean

BYPASS_LOSS_TYPES = ("ppo_clip", "reinforce")


def compute_policy_loss_reinforce(
    rollout_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-sum",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """REINFORCE, ``L = -A * w * log pi`` (``w = 1`` without weights).

    ``ppo_kl = mean(log pi_rollout - log pi)``.
    """
    pg_loss = aggregate(-advantages * log_prob, response_mask, loss_agg_mode, config, rollout_is_weights)
    ppo_kl = masked_mean(-(log_prob - rollout_log_prob), response_mask)
    return pg_loss, pg_metrics(0.0, ppo_kl, 0.0)


@register_policy_loss("bypass_mode")
def compute_policy_loss_bypass_mode(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Bypass-mode loss (module doc); ``old_log_prob`` are the rollout's log-probs and
    ``rollout_is_weights`` is ignored (the weights are computed here from the current policy)."""
    settings = getattr(getattr(config, "policy_loss", None), "rollout_correction", None)
    if settings is None:
        raise ValueError(
            "policy_loss.loss_mode=bypass_mode needs the rollout-correction settings in "
            "actor.policy_loss.rollout_correction (verl copies algorithm.rollout_correction there)"
        )
    loss_type = _get(settings, "loss_type", "ppo_clip")
    if loss_type not in BYPASS_LOSS_TYPES:
        raise ValueError(
            f"rollout_correction.loss_type: expected one of {list(BYPASS_LOSS_TYPES)}, got {loss_type!r}"
        )
    with torch.no_grad():
        weights, mask, corr_metrics = compute_rollout_correction_and_rejection_mask(
            old_log_prob=log_prob,
            rollout_log_prob=old_log_prob,
            response_mask=response_mask,
            rollout_is=_get(settings, "rollout_is", None),
            rollout_is_threshold=_get(settings, "rollout_is_threshold", 2.0),
            rollout_is_batch_normalize=_get(settings, "rollout_is_batch_normalize", False),
            rollout_rs=_get(settings, "rollout_rs", None),
            rollout_rs_threshold=_get(settings, "rollout_rs_threshold", None),
        )
    if loss_type == "reinforce":
        pg_loss, metrics = compute_policy_loss_reinforce(
            old_log_prob, log_prob, advantages, mask, loss_agg_mode, config, weights
        )
    else:
        pg_loss, metrics = compute_policy_loss_vanilla(
            old_log_prob, log_prob, advantages, mask, loss_agg_mode, config
        )
    return pg_loss, {**metrics, **corr_metrics}


def _get(settings: Any, key: str, default: Any) -> Any:
    if isinstance(settings, dict):
        return settings.get(key, default)
    return getattr(settings, key, default)
