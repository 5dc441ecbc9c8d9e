"""verl's ``core_algos`` import path: the algorithm math, re-exported from :mod:`verl.algorithms`.

verl users and recipes import estimators, losses and registries from here
(``register_adv_est``, ``AdvantageEstimator``, ``register_policy_loss``, ``agg_loss``, ...), with
verl's signatures: ``compute_gae_advantage_return(token_level_rewards, values, response_mask,
gamma, lam)`` works positionally as in verl. The math itself lives in :mod:`verl.algorithms`,
which the trainer and the workers both import:

* :mod:`verl.algorithms.adv_registry`: the estimator registry and ``AdvantageEstimator``
* :mod:`verl.algorithms.advantages`: advantage estimators and ``compute_advantage``
* :mod:`verl.algorithms.policy_losses`: policy losses (``loss_mode``)
* :mod:`verl.algorithms.kl`: KL estimators, KL controllers, the in-reward KL penalty
* :mod:`verl.algorithms.loss_agg`: ``agg_loss`` and the entropy loss
* :mod:`verl.algorithms.value_loss`: the clipped value loss
* :mod:`verl.algorithms.rollout_correction`: rollout importance weights and rejection

``tests/trainer/ppo/test_verl091_parity.py`` checks them against verl 0.9.1's ``core_algos.py``.
"""

from __future__ import annotations

from verl.algorithms.advantages import (
    ADV_ESTIMATOR_REGISTRY,
    AdvantageEstimator,
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
from verl.algorithms.kl import (
    KL_PENALTY_TYPES,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    compute_rewards,
    get_kl_controller,
    kl_penalty,
    kl_penalty_forward,
)
from verl.algorithms.loss_agg import LOSS_AGG_MODES, agg_loss, compute_entropy_loss
from verl.algorithms.policy_losses import (
    POLICY_LOSS_REGISTRY,
    PolicyLossFn,
    compute_policy_loss,
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
from verl.algorithms.rollout_correction import compute_rollout_correction_and_rejection_mask
from verl.algorithms.value_loss import compute_value_loss

__all__ = [
    "ADV_ESTIMATOR_REGISTRY",
    "KL_PENALTY_TYPES",
    "LOSS_AGG_MODES",
    "POLICY_LOSS_REGISTRY",
    "AdaptiveKLController",
    "AdvantageEstimator",
    "FixedKLController",
    "PolicyLossFn",
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
    "compute_policy_loss",
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
    "compute_rewards",
    "compute_rloo_outcome_advantage",
    "compute_rloo_vectorized_outcome_advantage",
    "compute_rollout_correction_and_rejection_mask",
    "compute_value_loss",
    "get_adv_estimator_fn",
    "get_kl_controller",
    "get_policy_loss_fn",
    "kl_penalty",
    "kl_penalty_forward",
    "register_adv_est",
    "register_policy_loss",
]
