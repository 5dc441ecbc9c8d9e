"""The old-log-prob phase: when the update can take ``old_log_probs`` from its own forward instead
(:func:`update_is_on_policy`), and the rollout/trainer gap the phase reports
(:func:`rollout_trainer_gap`)."""

from __future__ import annotations

import torch

from verl.algorithms.adv_registry import ADV_ESTIMATOR_REGISTRY
from verl.config.ppo_trainer import PPOTrainerConfig
from verl.workers.rollout.gap import GapSums

ESTIMATORS_READING_OLD_LOG_PROBS = ("optimal_token_baseline", "tir_optimal_token_baseline")


def update_is_on_policy(config: PPOTrainerConfig) -> bool:
    """True when the actor's update provably starts from the policy that generated the batch and
    only the loss reads ``old_log_probs``: then the update takes them from its own forward
    (``log_prob.detach()``, a ratio of exactly 1) and the separate forward is skipped
    (``trainer.skip_on_policy_old_log_prob``). Estimators registered outside this package might
    read them, so those keep the pass."""
    actor, algo = config.actor_rollout_ref.actor, config.algorithm
    estimator = ADV_ESTIMATOR_REGISTRY.get(algo.adv_estimator)
    return (
        config.trainer.skip_on_policy_old_log_prob
        and config.trainer.mode == "sync"
        and actor.ppo_epochs == 1
        and actor.ppo_mini_batch_size >= config.data.train_batch_size  # one optimizer step per batch
        and not algo.use_kl_in_reward  # the in-reward KL reads them before the update
        and algo.rollout_correction.rollout_is is None
        and algo.rollout_correction.rollout_rs is None
        and not actor.calculate_sum_pi_squared
        and estimator is not None
        and estimator.__module__.startswith("verl.algorithms.")
        and algo.adv_estimator not in ESTIMATORS_READING_OLD_LOG_PROBS
    )


def rollout_trainer_gap(
    rollout_lp: torch.Tensor, old_lp: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """How far the rollout engine's log-probs of the sampled tokens are from the trainer's, under
    verl's names: probabilities (``training/rollout_probs_diff_*``) and log-probs. When the update
    takes ``old_log_probs`` from its own forward (on-policy), the update reports them instead."""
    return GapSums.of(rollout_lp, old_lp, mask).metrics()
