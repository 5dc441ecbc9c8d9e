"""The full actor and critic losses of one micro-batch, composed as verl 0.9.1's ``ppo_loss``/``value_loss``.

Global-batch normalisation: :func:`verl.workers.ppo_update.run_ppo_updates` puts the counts of
the whole mini-batch on all ranks into every micro-batch (``dp_size``, ``batch_num_tokens``,
``global_batch_size``); the losses are then normalised by them (see
:mod:`verl.algorithms.loss_agg`), so the summed gradient is that of the mini-batch loss
whatever the micro-batch size. The engine scales each micro-batch's loss and metrics by its
share of the mini-batch's rows, ``rows * dp_size / global_batch_size``; the returned loss is
divided by that share, so ``share * loss`` is exactly the micro-batch's part of the mini-batch
loss (and the averaged ``*_loss`` metrics are the mini-batch's).
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from verl.algorithms.kl import kl_penalty
from verl.algorithms.loss_agg import agg_loss
from verl.algorithms.policy_losses import get_policy_loss_fn
from verl.algorithms.rollout_correction import truncated_is_weights
from verl.algorithms.value_loss import compute_value_loss
from verl.utils.torch_functional import masked_mean

GLOBAL_BATCH_KEYS = ("dp_size", "batch_num_tokens", "global_batch_size")
"""Scalars :func:`~verl.workers.ppo_update.run_ppo_updates` adds to every micro-batch."""


def _need(micro_batch: dict[str, torch.Tensor], key: str, why: str) -> torch.Tensor:
    if key not in micro_batch.keys():
        raise KeyError(f"micro-batch has no {key!r} ({why}); keys present: {sorted(micro_batch.keys())}")
    return micro_batch[key]


def global_batch_info(micro_batch: dict[str, torch.Tensor], config: Any) -> tuple[dict[str, Any], float]:
    """``(agg_loss keyword arguments, this micro-batch's share of the mini-batch rows)``.

    Without the counts in the micro-batch (a direct call): no global normalisation, share 1.
    """
    info: dict[str, Any] = {"loss_scale_factor": getattr(config, "loss_scale_factor", None)}
    if not all(key in micro_batch.keys() for key in GLOBAL_BATCH_KEYS):
        return info, 1.0
    dp_size = int(micro_batch["dp_size"])
    global_batch_size = int(micro_batch["global_batch_size"])
    info.update(
        dp_size=dp_size, batch_num_tokens=micro_batch["batch_num_tokens"], global_batch_size=global_batch_size
    )
    rows = micro_batch["response_mask"].shape[0]
    return info, rows * dp_size / global_batch_size


def importance_weights(
    micro_batch: dict[str, torch.Tensor], config: Any
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """The rollout importance weights every policy loss multiplies in, and their metrics.

    ``rollout_is_weights`` when the driver computed them (``algorithm.rollout_correction``);
    else, with ``actor.tis_imp_ratio_cap > 0`` and ``rollout_log_probs`` present, the truncated
    weights ``min(pi_old / pi_rollout, cap)`` per token or per response (``actor.tis_level``).
    """
    cap = getattr(config, "tis_imp_ratio_cap", -1)
    if "rollout_is_weights" in micro_batch.keys():
        if cap > 0:
            raise ValueError(
                "set either actor.tis_imp_ratio_cap or algorithm.rollout_correction.rollout_is, not both "
                "(each applies its own importance weights)"
            )
        return micro_batch["rollout_is_weights"], {}
    if cap <= 0 or "rollout_log_probs" not in micro_batch.keys():
        return None, {}
    old, rollout = micro_batch["old_log_probs"], micro_batch["rollout_log_probs"]
    mask = micro_batch["response_mask"]
    level = getattr(config, "tis_level", "token")
    weights, raw = truncated_is_weights(old - rollout, mask, level, cap)
    metrics = {
        "actor/tis_weight_mean": masked_mean(raw, mask).item(),
        "actor/tis_clipfrac": masked_mean((raw > cap).float(), mask).item(),
    }
    return weights, metrics


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
            when ``use_kl_loss``; ``rollout_is_weights`` or ``rollout_log_probs`` for importance
            weights (:func:`importance_weights`); the global counts (module doc) when present.
        config: the actor config (``policy_loss.loss_mode``, ``loss_agg_mode``, clip ratios,
            ``tis_imp_ratio_cap``, ``entropy_coeff``, ``use_kl_loss``, ``kl_loss_coef``, ``kl_loss_type``).

    Returns:
        The scalar loss and metrics ``actor/pg_loss``, ``actor/pg_clipfrac``, ``actor/ppo_kl``,
        ``actor/pg_clipfrac_lower`` (plus any the loss adds), ``actor/entropy`` when
        ``entropy`` is given, ``actor/kl_loss`` and ``actor/kl_coef`` when ``use_kl_loss``.
    """
    response_mask = micro_batch["response_mask"]
    mode = config.loss_agg_mode
    info, share = global_batch_info(micro_batch, config)
    weights, metrics = importance_weights(micro_batch, config)
    loss_config = copy.copy(config)
    loss_config.global_batch_info = info  # verl's attribute, read by every policy loss

    # bypass mode (algorithm.rollout_correction.bypass_mode, copied into policy_loss at start-up):
    # old_log_probs are the rollout's, and the loss applies the weights and rejection itself
    bypass = config.policy_loss.rollout_correction.bypass_mode
    loss_fn = get_policy_loss_fn("bypass_mode" if bypass else config.policy_loss.loss_mode)
    pg_loss, pg_metrics = loss_fn(
        micro_batch["old_log_probs"],
        log_prob,
        micro_batch["advantages"],
        response_mask,
        mode,
        loss_config,
        rollout_is_weights=weights,
    )
    loss = pg_loss / share
    metrics.update({"actor/pg_loss": loss.detach().item(), **pg_metrics})

    if entropy is not None:
        entropy_agg = agg_loss(entropy, response_mask, mode, **info) / share
        metrics["actor/entropy"] = entropy_agg.detach().item()
        if config.entropy_coeff != 0:
            loss = loss - entropy_agg * config.entropy_coeff
    elif config.entropy_coeff != 0:
        raise ValueError(f"actor.entropy_coeff={config.entropy_coeff} needs the per-token entropy; got None")

    if config.use_kl_loss:
        ref_log_prob = _need(micro_batch, "ref_log_prob", "actor.use_kl_loss=True")
        kld = kl_penalty(log_prob, ref_log_prob, config.kl_loss_type)
        kl_loss = agg_loss(kld, response_mask, mode, **info) / share
        loss = loss + kl_loss * config.kl_loss_coef
        metrics["actor/kl_loss"] = kl_loss.detach().item()
        metrics["actor/kl_coef"] = config.kl_loss_coef
    return loss, metrics


def compute_critic_loss(
    vpreds: torch.Tensor, micro_batch: dict[str, torch.Tensor], config: Any
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped value loss of one micro-batch (``values``, ``returns``, ``response_mask``).

    ``config`` is the critic config (``cliprange_value``, ``loss_agg_mode``,
    ``loss_scale_factor``). Normalised like the actor loss (module doc). Metrics:
    ``critic/vf_loss``, ``critic/vf_clipfrac``, ``critic/vpred_mean`` (masked mean of vpreds).
    """
    response_mask = micro_batch["response_mask"]
    info, share = global_batch_info(micro_batch, config)
    vf_loss, vf_clipfrac = compute_value_loss(
        vpreds=vpreds,
        returns=_need(micro_batch, "returns", "value targets"),
        values=_need(micro_batch, "values", "old values for clipping"),
        response_mask=response_mask,
        cliprange_value=config.cliprange_value,
        loss_agg_mode=config.loss_agg_mode,
        **info,
    )
    vf_loss = vf_loss / share
    metrics = {
        "critic/vf_loss": vf_loss.detach().item(),
        "critic/vf_clipfrac": vf_clipfrac.detach().item(),
        "critic/vpred_mean": masked_mean(vpreds, response_mask).detach().item(),
    }
    return vf_loss, metrics
