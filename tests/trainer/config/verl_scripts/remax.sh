#!/usr/bin/env bash
# ReMax written the way verl's example scripts are (KL in the reward, the verl 0.9 reward block).
# Resolved by tests/trainer/config/test_verl_scripts.py; run for real with
#   MODEL=<hf dir> DATA=<dir with train/test.parquet> bash tests/trainer/config/verl_scripts/remax.sh [key=value ...]
set -euo pipefail
MODEL=${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}
DATA=${DATA:-$HOME/data/gsm8k}
OUT=${OUT:-/tmp/verl_scripts/remax}

${PYTHON:-python3} -m verl.trainer.main_ppo \
    algorithm.adv_estimator=remax \
    algorithm.use_kl_in_reward=True \
    algorithm.kl_penalty=kl \
    algorithm.kl_ctrl.kl_coef=0.001 \
    data.train_files="$DATA/train.parquet" \
    data.val_files="$DATA/test.parquet" \
    data.train_batch_size=16 \
    data.max_prompt_length=512 \
    data.max_response_length=256 \
    actor_rollout_ref.model.path="$MODEL" \
    actor_rollout_ref.model.enable_gradient_checkpointing=True \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=8 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.actor.use_kl_loss=False \
    actor_rollout_ref.rollout.name="${ENGINE:-hf}" \
    actor_rollout_ref.rollout.n=4 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8 \
    reward.reward_manager.source=register \
    reward.reward_manager.name=naive \
    reward.sandbox_fusion.url=null \
    trainer.logger=console \
    trainer.project_name=verl_scripts \
    trainer.experiment_name=remax \
    trainer.n_gpus_per_node=1 \
    trainer.nnodes=1 \
    trainer.save_freq=-1 \
    trainer.test_freq=5 \
    trainer.total_epochs=1 \
    trainer.default_local_dir="$OUT/checkpoints" "$@"
