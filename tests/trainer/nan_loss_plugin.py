"""A user-registered policy loss that is NaN: loaded into the workers through
``actor_rollout_ref.model.external_lib=tests.trainer.nan_loss_plugin``."""

from __future__ import annotations

import torch

from verl.algorithms.policy_losses import compute_policy_loss_gpg, register_policy_loss


@register_policy_loss("nan_for_tests")
def nan_loss(
    old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights=None
):
    loss, metrics = compute_policy_loss_gpg(
        old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights
    )
    return loss * torch.tensor(float("nan")), metrics
