#!/usr/bin/env bash
# GRPO written the way verl's example scripts are (verl 0.9 keys: the reward.* block, +key=
# additions, deprecated global micro-batch sizes, GPU-only keys). Resolved by
# tests/trainer/config/test_verl_scripts.py; run for real with
#   MODEL=<hf dir> DATA=<dir with train/test.parquet> bash tests/trainer/config/verl_scripts/grpo.sh [key=value ...]
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
MODEL=${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}
DATA=${DATA:-$HOME/data/gsm8k}
OUT=${OUT:-/tmp/verl_scripts/grpo}

${PYTHON:-python3} -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files="$DATA/train.parquet" \
    data.val_files="$DATA/test.parquet" \
    data.train_batch_size=16 \
    data.max_prompt_length=512 \
    data.max_response_length=256 \
    data.filter_overlong_prompts=True \
    data.truncation=error \
    actor_rollout_ref.model.path="$MODEL" \
    +actor_rollout_ref.model.torch_dtype=bfloat16 \
    actor_rollout_ref.model.use_shm=False \
    actor_rollout_ref.model.lora_adapter_path=null \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.model.enable_gradient_checkpointing=True \
    +actor_rollout_ref.model.override_config.attn_implementation=sdpa \
    actor_rollout_ref.actor.strategy=fsdp \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=8 \
    actor_rollout_ref.actor.ppo_micro_batch_size=8 \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.actor.fsdp_config.param_offload=False \
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False \
    actor_rollout_ref.actor.fsdp_config.fsdp_size=-1 \
    actor_rollout_ref.actor.fsdp_config.model_dtype=fp32 \
    actor_rollout_ref.rollout.name="${ENGINE:-hf}" \
    actor_rollout_ref.rollout.n=4 \
    actor_rollout_ref.rollout.temperature=1.0 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size=16 \
    actor_rollout_ref.ref.log_prob_micro_batch_size=16 \
    actor_rollout_ref.ref.fsdp_config.param_offload=True \
    algorithm.use_kl_in_reward=False \
    reward.num_workers=2 \
    reward.reward_manager.name=naive \
    reward.custom_reward_function.path="$HERE/reward_fn.py" \
    reward.custom_reward_function.name=compute_score \
    reward.reward_model.enable=False \
    trainer.use_legacy_worker_impl=auto \
    trainer.logger=console \
    trainer.project_name=verl_scripts \
    trainer.experiment_name=grpo \
    trainer.n_gpus_per_node=1 \
    trainer.nnodes=1 \
    trainer.val_before_train=False \
    trainer.save_freq=-1 \
    trainer.test_freq=5 \
    trainer.total_epochs=1 \
    trainer.rollout_data_dir="$OUT/rollouts" \
    trainer.validation_data_dir="$OUT/validation" \
    trainer.default_local_dir="$OUT/checkpoints" "$@"
