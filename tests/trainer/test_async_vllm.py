"""The asynchronous trainer with its rollout pool on two vLLM engine replicas (vLLM's CPU build):
the staleness bound holds for every consumed sample and the run learns."""

from __future__ import annotations

import pytest

from tests.trainer.test_vllm_learning import needs_vllm
from verl.builtin.assets import prepare_ppo_assets
from verl.config.ppo_trainer import load_config
from verl.trainer.ppo.async_trainer import AsyncPPOTrainer

STEPS = 50
BOUND = 1


@needs_vllm
@pytest.mark.slow
@pytest.mark.usefixtures("ray_session", "builtin_assets")
def test_two_vllm_replicas_keep_the_staleness_bound_and_learn():
    overrides = [
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.calculate_log_probs=True",
        "actor_rollout_ref.actor.tis_imp_ratio_cap=2.0",
        "trainer.mode=async",
        f"async_training.max_staleness={BOUND}",
        "async_training.partial_rollout=False",  # the samples do not depend on thread timing
        "async_training.rollout_n_gpus=2",  # two engines, each generating half of every batch
        "async_training.rollout_cpus_per_worker=0.5",
        "trainer.n_gpus_per_node=1",
        "trainer.cpus_per_worker=1",
        "trainer.logger=[console]",
        f"trainer.total_training_steps={STEPS}",
        f"trainer.test_freq={STEPS}",
    ]
    config = load_config(overrides)
    prepare_ppo_assets(config)
    trainer = AsyncPPOTrainer(config)
    try:
        trainer.init_workers()
        assert trainer.rollout_wg.world_size == 2
        metrics = trainer.fit()
    finally:
        trainer.close()
    rows = config.data.train_batch_size * config.actor_rollout_ref.rollout.n
    assert len(trainer.staleness_seen) == STEPS * rows  # every consumed sample was checked
    assert max(trainer.staleness_seen) <= BOUND
    assert metrics["async/policy_version"] == STEPS - 1
    (_, before), (_, after) = trainer.validator.history[0], trainer.validator.history[-1]
    key = "val-core/arith/acc/mean@1"
    assert after[key] >= before[key] + 0.15, (before[key], after[key])
