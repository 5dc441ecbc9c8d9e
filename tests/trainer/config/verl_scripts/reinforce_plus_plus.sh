#!/usr/bin/env bash
# REINFORCE++ written the way verl's example scripts are (list-valued trainer.logger, KL loss,
# compile/kernel flags that verl has and this project accepts as inert).
# Resolved by tests/trainer/config/test_verl_scripts.py; run for real with
#   MODEL=<hf dir> DATA=<dir with train/test.parquet> bash tests/trainer/config/verl_scripts/reinforce_plus_plus.sh [key=value ...]
set -euo pipefail
MODEL=${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}
DATA=${DATA:-$HOME/data/gsm8k}
OUT=${OUT:-/tmp/verl_scripts/reinforce_plus_plus}

${PYTHON:-python3} -m verl.trainer.main_ppo \
    algorithm.adv_estimator=reinforce_plus_plus \
    algorithm.gamma=1.0 \
    algorithm.use_kl_in_reward=False \
    data.train_files="$DATA/train.parquet" \
    data.val_files="$DATA/test.parquet" \
    data.train_batch_size=16 \
    data.max_prompt_length=512 \
    data.max_response_length=256 \
    actor_rollout_ref.model.path="$MODEL" \
    actor_rollout_ref.model.use_fused_kernels=False \
    actor_rollout_ref.model.use_liger=False \
    actor_rollout_ref.actor.optim.lr=3e-7 \
    actor_rollout_ref.actor.ppo_mini_batch_size=8 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=mse \
    actor_rollout_ref.actor.use_torch_compile=False \
    actor_rollout_ref.actor.fsdp_config.offload_policy=False \
    actor_rollout_ref.rollout.name="${ENGINE:-hf}" \
    actor_rollout_ref.rollout.n=4 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8 \
    actor_rollout_ref.ref.fsdp_config.model_dtype=bf16 \
    trainer.logger=['console','file'] \
    trainer.project_name=verl_scripts \
    trainer.experiment_name=reinforce_plus_plus \
    trainer.n_gpus_per_node=1 \
    trainer.nnodes=1 \
    trainer.save_freq=-1 \
    trainer.test_freq=5 \
    trainer.total_epochs=1 \
    trainer.default_local_dir="$OUT/checkpoints" "$@"
