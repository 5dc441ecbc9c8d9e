"""The policy worker on one CUDA device: FSDP2 with bf16 compute, GPU generation, weight sync.

Runs the real ``ActorRolloutRefWorker`` in this process (its methods called directly, as a
one-rank worker group would) so it needs no Ray on the GPU machine. Skipped without CUDA.
"""

from __future__ import annotations

import os
import socket

import numpy as np
import pytest
import torch

from verl.algorithms.advantages import compute_advantage_for
from verl.config.ppo_trainer import load_config
from verl.protocol import DataProto

pytestmark = pytest.mark.gpu

PROMPTS = ["3+4=", "9+9=", "1+0=", "5+7=", "2+2=", "8+1=", "6+3=", "4+4="]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def worker(builtin_assets):
    from verl.workers.actor_rollout_ref import ActorRolloutRefWorker

    os.environ.update(
        RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port())
    )
    os.environ["VERL_DEVICE"] = "cuda"
    config = load_config(
        [
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
            "actor_rollout_ref.actor.use_kl_loss=True",
            "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.rollout.calculate_log_probs=True",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
            "actor_rollout_ref.actor.optim.total_training_steps=10",
        ]
    )
    w = ActorRolloutRefWorker(config.actor_rollout_ref, role="actor_rollout_ref")
    w.init_model()
    yield w, config
    torch.distributed.destroy_process_group()


def _prompts(tokenizer, n: int) -> DataProto:
    width = 8
    rows = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(r)) + r for r in rows])
    mask = (ids != tokenizer.pad_token_id).long()
    data = DataProto.from_dict(
        {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)},
        non_tensors={"uid": np.array([str(i) for i in range(len(PROMPTS))], dtype=object)},
    )
    return data.repeat(n, interleave=True)


def test_fsdp2_bf16_step_on_cuda(worker):
    w, config = worker
    assert w.actor.sharded and next(w.actor.module.parameters()).device.type == "cuda"
    batch = _prompts(w.tokenizer, config.actor_rollout_ref.rollout.n)
    prompts = batch.pop(batch_keys=["input_ids", "attention_mask", "position_ids"])
    prompts.meta_info.update(global_steps=1, do_sample=True)
    batch.union(w.generate_sequences(prompts))
    assert batch.batch["responses"].shape[0] == len(PROMPTS) * 4

    batch.union(w.compute_log_prob(batch).select(batch_keys=["old_log_probs"]))
    batch.union(w.compute_ref_log_prob(batch))
    mask = batch.batch["response_mask"].bool()
    gap = (batch.batch["rollout_log_probs"] - batch.batch["old_log_probs"]).abs()[mask]
    # bf16 compute on both sides: the gap is rounding, not a mismatch of models or tokens
    assert float(gap.max()) < 0.1, float(gap.max())
    assert torch.equal(batch.batch["old_log_probs"], batch.batch["ref_log_prob"])

    responses = batch.batch["responses"]
    scores = torch.zeros(mask.shape)
    last = mask.sum(-1) - 1
    scores[torch.arange(len(scores)), last] = (responses[:, 0] % 2).float()  # any varied reward
    batch.batch["token_level_rewards"] = scores
    algo = config.algorithm
    compute_advantage_for(batch, algo)

    before = {k: v.detach().float().cpu().clone() for k, v in w.actor.full_state_dict()}
    version = w.get_version()
    metrics = w.update_actor(batch).meta_info["metrics"]
    after = dict(w.actor.full_state_dict())
    assert np.isfinite(metrics["actor/pg_loss"]) and np.isfinite(metrics["actor/grad_norm"])
    assert any(not torch.equal(before[k], v.float().cpu()) for k, v in after.items())
    sync = w.update_weights(version + 1)  # the driver's update_weights phase
    assert w.get_version() == version + 1
    assert sync["rollout/weight_sync_probe_gap"] < 5e-2
    rollout_weights = dict(w.rollout.module.state_dict())
    key = "model.layers.0.mlp.up_proj.weight"
    assert torch.allclose(rollout_weights[key].float().cpu(), after[key].float().cpu(), atol=1e-2)


def test_checkpoint_roundtrip_on_cuda(worker, tmp_path):
    w, _ = worker
    w.save_checkpoint(str(tmp_path))
    saved = {k: v.float().cpu().clone() for k, v in w.actor.full_state_dict()}
    with torch.no_grad():
        for p in w.actor.module.parameters():
            p.add_(1.0)
    w.load_checkpoint(str(tmp_path))
    for k, v in w.actor.full_state_dict():
        assert torch.equal(saved[k], v.float().cpu()), k


def test_rollout_weight_offload_between_generations(worker):
    w, _ = worker
    batch = _prompts(w.tokenizer, 1)
    prompts = batch.pop(batch_keys=["input_ids", "attention_mask", "position_ids"])
    prompts.meta_info.update(global_steps=1, do_sample=False)
    on_gpu = w.generate_sequences(prompts)
    assert next(w.rollout.module.parameters()).device.type == "cuda"  # default: stays resident
    # what rollout.offload_weights=True sets when the rollout is built (its lifecycle frees memory)
    w.rollout.lifecycle.frees_memory = True
    try:
        offloaded = w.generate_sequences(prompts)
        assert next(w.rollout.module.parameters()).device.type == "cpu"
    finally:
        w.rollout.lifecycle.frees_memory = False
        w.rollout.wake_up()
    assert torch.equal(on_gpu.batch["responses"], offloaded.batch["responses"])
