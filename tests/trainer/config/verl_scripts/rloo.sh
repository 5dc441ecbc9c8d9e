#!/usr/bin/env bash
# RLOO written the way verl's example scripts are (bare trainer.logger, deprecated global
# micro-batch sizes, reward-model worker keys left at verl's "off", a Ray timeline).
# Resolved by tests/trainer/config/test_verl_scripts.py; run for real with
#   MODEL=<hf dir> DATA=<dir with train/test.parquet> bash tests/trainer/config/verl_scripts/rloo.sh [key=value ...]
set -euo pipefail
MODEL=${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}
DATA=${DATA:-$HOME/data/gsm8k}
OUT=${OUT:-/tmp/verl_scripts/rloo}

${PYTHON:-python3} -m verl.trainer.main_ppo \
    algorithm.adv_estimator=rloo \
    algorithm.use_kl_in_reward=True \
    algorithm.kl_penalty=kl \
    algorithm.kl_ctrl.kl_coef=0.001 \
    data.train_files="$DATA/train.parquet" \
    data.val_files="$DATA/test.parquet" \
    data.train_batch_size=16 \
    data.max_prompt_length=512 \
    data.max_response_length=256 \
    actor_rollout_ref.model.path="$MODEL" \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=8 \
    actor_rollout_ref.actor.ppo_micro_batch_size=4 \
    actor_rollout_ref.actor.use_kl_loss=False \
    actor_rollout_ref.rollout.name="${ENGINE:-hf}" \
    actor_rollout_ref.rollout.n=4 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size=8 \
    actor_rollout_ref.ref.log_prob_micro_batch_size=8 \
    reward_model.enable=False \
    reward_model.launch_reward_fn_async=False \
    reward_model.micro_batch_size_per_gpu=4 \
    ray_init.timeline_json_file="$OUT/timeline.json" \
    trainer.logger=console \
    trainer.project_name=verl_scripts \
    trainer.experiment_name=rloo \
    trainer.n_gpus_per_node=1 \
    trainer.nnodes=1 \
    trainer.save_freq=-1 \
    trainer.test_freq=5 \
    trainer.total_epochs=1 \
    trainer.default_local_dir="$OUT/checkpoints" "$@"
