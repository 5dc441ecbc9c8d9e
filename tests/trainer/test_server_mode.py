"""Server mode (``actor_rollout_ref.rollout.mode=async``) in both trainers, on the hf engine:
the rollout ranks serve requests over loopback HTTP and the trainer sends one per sample."""

from __future__ import annotations

import json
import urllib.request

import pytest
import torch

from tests.workers.rollout.test_vllm_rollout import SMALL_RUN
from verl.builtin.assets import prepare_ppo_assets
from verl.config.ppo_trainer import load_config
from verl.trainer.ppo.async_trainer import AsyncPPOTrainer
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.workers.rollout.server_client import ServerRolloutClient

HF_SERVER_RUN = [o for o in SMALL_RUN if not o.startswith("actor_rollout_ref.rollout.name=")] + [
    "actor_rollout_ref.rollout.mode=async"
]
ACC = "val-core/arith/acc/mean@1"


def health(address: str) -> dict:
    with urllib.request.urlopen(f"{address}/health", timeout=60) as response:
        return json.loads(response.read())


@pytest.mark.usefixtures("ray_session", "builtin_assets")
def test_sync_trainer_in_server_mode_replays_a_step_and_matches_the_trainers_log_probs():
    trainer = RayPPOTrainer(load_config([*HF_SERVER_RUN, "trainer.total_training_steps=2"]))
    try:
        trainer.init_workers()
        assert isinstance(trainer.rollout_client, ServerRolloutClient)
        trainer.batches = trainer._batches()
        prompts = trainer._repeat_prompts(next(trainer.batches).batch)
        first = trainer._generate(prompts.select(deepcopy=True), {})
        again = trainer._generate(prompts.select(deepcopy=True), {})
        # one request per sample, each seeded by (step, row): the same step samples the same tokens
        assert torch.equal(first.batch["responses"], again.batch["responses"])
        mask = first.batch["response_mask"].bool()
        assert (first.batch["response_versions"][mask] == trainer.policy_version).all()
        assert (first.batch["response_versions"][~mask] == -1).all()
        metrics = trainer.fit()
    finally:
        trainer.close()
    assert metrics["rollout/weight_sync_probe_gap"] <= 1e-6
    assert metrics["training/rollout_logprob_diff_max"] <= 1e-4  # decode vs teacher-forced, fp32


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session", "builtin_assets")
def test_async_trainer_on_two_server_replicas_keeps_the_staleness_bound():
    """(Learning in server mode: tests/trainer/test_vllm_learning.py; in the async trainer:
    tests/trainer/test_async.py.)"""
    steps, bound = 10, 1
    overrides = [
        "actor_rollout_ref.rollout.mode=async",
        "actor_rollout_ref.rollout.calculate_log_probs=True",
        "actor_rollout_ref.actor.tis_imp_ratio_cap=2.0",
        "trainer.mode=async",
        f"async_training.max_staleness={bound}",
        "async_training.rollout_n_gpus=2",  # two servers; requests go to the less busy one
        "async_training.rollout_cpus_per_worker=0.5",
        "trainer.n_gpus_per_node=1",
        "trainer.cpus_per_worker=1",
        "trainer.logger=[console]",
        f"trainer.total_training_steps={steps}",
        f"trainer.test_freq={steps}",
    ]
    config = load_config(overrides)
    prepare_ppo_assets(config)
    trainer = AsyncPPOTrainer(config)
    try:
        trainer.init_workers()
        addresses = trainer.rollout_client.addresses
        assert len(addresses) == 2
        metrics = trainer.fit()
        served = [health(a)["finished"] for a in addresses]
    finally:
        trainer.close()
    rows = config.data.train_batch_size * config.actor_rollout_ref.rollout.n
    assert len(trainer.staleness_seen) == steps * rows and max(trainer.staleness_seen) <= bound
    assert min(served) > 0 and sum(served) >= steps * rows  # both replicas served (plus validation)
    assert metrics["async/policy_version"] == steps - 1
    assert [step for step, _ in trainer.validator.history] == [0, steps]  # validation went through them too
    assert 0 <= trainer.validator.history[-1][1][ACC] <= 1
