"""The algorithm math of PPO-style training, as pure functions (the module verl users import).

The parts live in small modules, re-exported here:

* :mod:`verl.trainer.ppo.advantages`: advantage estimators and ``compute_advantage``
* :mod:`verl.trainer.ppo.policy_losses`: policy losses (``loss_mode``)
* :mod:`verl.trainer.ppo.kl`: KL estimators, KL controllers, the in-reward KL penalty
* :mod:`verl.trainer.ppo.loss_agg`: ``agg_loss``
* :mod:`verl.trainer.ppo.rollout_correction`: rollout importance weights and rejection

``tests/trainer/ppo/test_verl091_parity.py`` checks them against verl 0.9.1's ``core_algos.py``.

This module adds the value loss and the entropy loss.
"""

from __future__ import annotations

import torch

from verl.trainer.ppo.advantages import (
    ADV_ESTIMATOR_REGISTRY,
    compute_advantage,
    compute_gae_advantage_return,
    compute_gdpo_outcome_advantage,
    compute_gpg_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    compute_grpo_vectorized_outcome_advantage,
    compute_multi_turn_optimal_token_baseline_advantage,
    compute_opo_outcome_advantage,
    compute_optimal_token_baseline_advantage,
    compute_pf_ppo_reweight_data,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    compute_rloo_outcome_advantage,
    compute_rloo_vectorized_outcome_advantage,
    get_adv_estimator_fn,
    register_adv_est,
)
from verl.trainer.ppo.kl import (
    KL_PENALTY_TYPES,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    get_kl_controller,
    kl_penalty,
)
from verl.trainer.ppo.loss_agg import LOSS_AGG_MODES, agg_loss
from verl.trainer.ppo.policy_losses import (
    POLICY_LOSS_REGISTRY,
    compute_policy_loss_bypass_mode,
    compute_policy_loss_cispo,
    compute_policy_loss_clip_cov,
    compute_policy_loss_dppo_kl,
    compute_policy_loss_dppo_tv,
    compute_policy_loss_dro,
    compute_policy_loss_geo_mean,
    compute_policy_loss_gpg,
    compute_policy_loss_gspo,
    compute_policy_loss_kl_cov,
    compute_policy_loss_reinforce,
    compute_policy_loss_sapo,
    compute_policy_loss_vanilla,
    get_policy_loss_fn,
    register_policy_loss,
)
from verl.trainer.ppo.rollout_correction import compute_rollout_correction_and_rejection_mask
from verl.utils.torch_functional import clip_by_value, entropy_from_logits, masked_mean

__all__ = [
    "ADV_ESTIMATOR_REGISTRY",
    "KL_PENALTY_TYPES",
    "LOSS_AGG_MODES",
    "POLICY_LOSS_REGISTRY",
    "AdaptiveKLController",
    "FixedKLController",
    "agg_loss",
    "apply_kl_penalty",
    "compute_advantage",
    "compute_entropy_loss",
    "compute_gae_advantage_return",
    "compute_gdpo_outcome_advantage",
    "compute_gpg_outcome_advantage",
    "compute_grpo_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_grpo_vectorized_outcome_advantage",
    "compute_multi_turn_optimal_token_baseline_advantage",
    "compute_opo_outcome_advantage",
    "compute_optimal_token_baseline_advantage",
    "compute_pf_ppo_reweight_data",
    "compute_policy_loss_bypass_mode",
    "compute_policy_loss_cispo",
    "compute_policy_loss_clip_cov",
    "compute_policy_loss_dppo_kl",
    "compute_policy_loss_dppo_tv",
    "compute_policy_loss_dro",
    "compute_policy_loss_geo_mean",
    "compute_policy_loss_gpg",
    "compute_policy_loss_gspo",
    "compute_policy_loss_kl_cov",
    "compute_policy_loss_reinforce",
    "compute_policy_loss_sapo",
    "compute_policy_loss_vanilla",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "compute_rloo_vectorized_outcome_advantage",
    "compute_rollout_correction_and_rejection_mask",
    "compute_value_loss",
    "get_adv_estimator_fn",
    "get_kl_controller",
    "get_policy_loss_fn",
    "kl_penalty",
    "register_adv_est",
    "register_policy_loss",
]


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    dp_size: int = 1,
    batch_num_tokens: int | torch.Tensor | None = None,
    global_batch_size: int | torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss of PPO (as in TRL and verl).

    ``v_clip = clip(vpreds, values - c, values + c)``;
    ``vf_loss = 0.5 * agg(max((vpreds - R)^2, (v_clip - R)^2))``;
    ``vf_clipfrac`` = fraction of valid tokens where the clipped term is larger. The last four
    arguments are ``agg_loss``'s global-batch normalisation.

    Returns:
        ``(vf_loss, vf_clipfrac)``, both scalar tensors.
    """
    vpred_clipped = clip_by_value(vpreds, values - cliprange_value, values + cliprange_value)
    vf_losses1 = (vpreds - returns) ** 2
    vf_losses2 = (vpred_clipped - returns) ** 2
    vf_loss = 0.5 * agg_loss(
        torch.max(vf_losses1, vf_losses2),
        response_mask,
        loss_agg_mode,
        dp_size=dp_size,
        batch_num_tokens=batch_num_tokens,
        global_batch_size=global_batch_size,
        loss_scale_factor=loss_scale_factor,
    )
    vf_clipfrac = masked_mean(torch.gt(vf_losses2, vf_losses1).float(), response_mask)
    return vf_loss, vf_clipfrac


def compute_entropy_loss(
    logits: torch.Tensor, response_mask: torch.Tensor, loss_agg_mode: str = "token-mean"
) -> torch.Tensor:
    """Aggregated entropy of ``softmax(logits)`` ([B, R, V]) over valid tokens (an entropy *bonus*:
    callers subtract ``entropy_coeff`` times it from the loss)."""
    return agg_loss(entropy_from_logits(logits), response_mask, loss_agg_mode)
