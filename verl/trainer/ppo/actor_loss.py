"""The full actor and critic losses of one micro-batch, composed as verl's ``dp_actor``/``dp_critic`` do.

Workers call these after their forward pass; gradient-accumulation scaling
(``loss / n_micro_batches`` or the dynamic-batch equivalent) stays in the worker.
"""

from __future__ import annotations

from typing import Any

import torch

from verl.trainer.ppo.core_algos import agg_loss, compute_value_loss
from verl.trainer.ppo.kl import kl_penalty
from verl.trainer.ppo.policy_losses import get_policy_loss_fn
from verl.utils.torch_functional import masked_mean


def _need(micro_batch: dict[str, torch.Tensor], key: str, why: str) -> torch.Tensor:
    if key not in micro_batch.keys():
        raise KeyError(f"micro-batch has no {key!r} ({why}); keys present: {sorted(micro_batch.keys())}")
    return micro_batch[key]


def compute_actor_loss(
    log_prob: torch.Tensor,
    entropy: torch.Tensor | None,
    micro_batch: dict[str, torch.Tensor],
    config: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``loss = pg_loss - entropy_coeff * agg(entropy) + kl_loss_coef * agg(kl(log_prob, ref_log_prob))``.

    Args:
        log_prob: [B, R] log-probs of the response tokens under the current actor (with grad).
        entropy: [B, R] per-token entropy of the actor, or None when ``entropy_coeff == 0``
            and the entropy metric is not wanted.
        micro_batch: ``old_log_probs``, ``advantages``, ``response_mask``; ``ref_log_prob``
            when ``use_kl_loss``; ``rollout_log_probs`` is used when present and
            ``tis_imp_ratio_cap > 0`` (truncated importance sampling, vanilla loss).
        config: the actor config (``policy_loss.loss_mode``, ``loss_agg_mode``, clip ratios,
            ``tis_imp_ratio_cap``, ``entropy_coeff``, ``use_kl_loss``, ``kl_loss_coef``, ``kl_loss_type``).

    Returns:
        The scalar loss and metrics ``actor/pg_loss``, ``actor/pg_clipfrac``, ``actor/ppo_kl``,
        ``actor/pg_clipfrac_lower`` (plus any the loss adds), ``actor/entropy`` when
        ``entropy`` is given, ``actor/kl_loss`` and ``actor/kl_coef`` when ``use_kl_loss``.
    """
    response_mask = micro_batch["response_mask"]
    mode = config.loss_agg_mode
    rollout_log_probs = None
    if "rollout_log_probs" in micro_batch.keys() and config.tis_imp_ratio_cap > 0:
        rollout_log_probs = micro_batch["rollout_log_probs"]

    policy_loss_fn = get_policy_loss_fn(config.policy_loss.loss_mode)
    pg_loss, pg_metrics = policy_loss_fn(
        micro_batch["old_log_probs"],
        log_prob,
        micro_batch["advantages"],
        response_mask,
        mode,
        config,
        rollout_log_probs=rollout_log_probs,
    )
    metrics = {"actor/pg_loss": pg_loss.detach().item(), **pg_metrics}
    loss = pg_loss

    if entropy is not None:
        entropy_agg = agg_loss(entropy, response_mask, mode)
        metrics["actor/entropy"] = entropy_agg.detach().item()
        if config.entropy_coeff != 0:
            loss = loss - entropy_agg * config.entropy_coeff
    elif config.entropy_coeff != 0:
        raise ValueError(f"actor.entropy_coeff={config.entropy_coeff} needs the per-token entropy; got None")

    if config.use_kl_loss:
        ref_log_prob = _need(micro_batch, "ref_log_prob", "actor.use_kl_loss=True")
        kl_loss = agg_loss(kl_penalty(log_prob, ref_log_prob, config.kl_loss_type), response_mask, mode)
        loss = loss + kl_loss * config.kl_loss_coef
        metrics["actor/kl_loss"] = kl_loss.detach().item()
        metrics["actor/kl_coef"] = config.kl_loss_coef
    return loss, metrics


def compute_critic_loss(
    vpreds: torch.Tensor, micro_batch: dict[str, torch.Tensor], config: Any
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped value loss of one micro-batch (``values``, ``returns``, ``response_mask``).

    ``config`` is the critic config (``cliprange_value``, ``loss_agg_mode``). Metrics:
    ``critic/vf_loss``, ``critic/vf_clipfrac``, ``critic/vpred_mean`` (masked mean of vpreds).
    """
    response_mask = micro_batch["response_mask"]
    vf_loss, vf_clipfrac = compute_value_loss(
        vpreds=vpreds,
        returns=_need(micro_batch, "returns", "value targets"),
        values=_need(micro_batch, "values", "old values for clipping"),
        response_mask=response_mask,
        cliprange_value=config.cliprange_value,
        loss_agg_mode=config.loss_agg_mode,
    )
    metrics = {
        "critic/vf_loss": vf_loss.detach().item(),
        "critic/vf_clipfrac": vf_clipfrac.detach().item(),
        "critic/vpred_mean": masked_mean(vpreds, response_mask).detach().item(),
    }
    return vf_loss, metrics
