"""End to end: a few real PPO/GRPO steps on the built-in task, 2 data-parallel ranks on CPU."""

from __future__ import annotations

import math

import pytest

from verl.config.ppo_trainer import load_config
from verl.trainer.main_ppo import run_ppo

SMALL_RUN = [
    "trainer.n_gpus_per_node=2",
    "trainer.cpus_per_worker=1",
    "trainer.total_training_steps=2",
    "trainer.val_before_train=False",
    "trainer.logger=[console]",
    "data.train_batch_size=8",
    "data.val_max_samples=16",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.calculate_log_probs=True",
]


def run(overrides: list[str]) -> dict[str, float]:
    config = load_config(SMALL_RUN + overrides)
    return run_ppo(config, overrides)


def assert_finite(metrics: dict[str, float], keys: list[str]) -> None:
    for key in keys:
        assert key in metrics, f"missing metric {key}"
        assert math.isfinite(metrics[key]), f"{key}={metrics[key]}"


@pytest.mark.usefixtures("ray_session", "builtin_assets")
def test_grpo_two_ranks_with_kl_loss():
    metrics = run(["actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0.01"])
    assert metrics["training/global_step"] == 2
    assert_finite(
        metrics,
        [
            "actor/pg_loss",
            "actor/kl_loss",
            "actor/grad_norm",
            "critic/score/mean",
            "val-core/arith/acc/mean@1",
        ],
    )
    assert "critic/vf_loss" not in metrics  # GRPO has no critic
    # The hf rollout recomputes its log-probs teacher-forced with the actor's function and weights.
    # They agree to fp32 rounding, bit for bit only on some CPUs: the rollout's weights do not require
    # grad, so torch.matmul runs the LM head over the strided response slice as a batched GEMM where
    # the actor's runs one folded GEMM, and MKL rounds the two differently on an Intel Xeon (6e-7).
    # Wrong weights are far above 1e-5: one of the 50 tensors one Adam step (lr) behind moves the
    # log-probs by 8e-4 (median; all but an attention key bias, which softmax ignores, beyond 1e-5).
    assert metrics["training/rollout_logprob_diff_max"] <= 1e-5
    assert metrics["timing_s/ref"] > 0
    # memory of the worker process (a model of ~0.8M params plus torch: well over 100 MB)
    assert metrics["perf/cpu_memory_used_gb"] > 0.1


@pytest.mark.usefixtures("ray_session", "builtin_assets")
def test_gae_two_ranks_trains_a_critic():
    metrics = run(["algorithm.adv_estimator=gae", "algorithm.use_kl_in_reward=True"])
    assert metrics["training/global_step"] == 2
    assert_finite(
        metrics,
        [
            "critic/vf_loss",
            "critic/vf_clipfrac",
            "critic/values/mean",
            "actor/pg_loss",
            "actor/reward_kl_penalty",
        ],
    )
    assert metrics["timing_s/update_critic"] > 0 and metrics["timing_s/values"] > 0
