#!/usr/bin/env bash
# PPO with a critic (GAE) written the way verl 0.8 scripts are: the legacy reward_model block
# (reward loop, reward-model worker keys), custom_reward_function.*, critic micro-batch keys.
# Resolved by tests/trainer/config/test_verl_scripts.py; run for real with
#   MODEL=<hf dir> DATA=<dir with train/test.parquet> bash tests/trainer/config/verl_scripts/ppo_gae.sh [key=value ...]
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
MODEL=${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}
DATA=${DATA:-$HOME/data/gsm8k}
OUT=${OUT:-/tmp/verl_scripts/ppo_gae}

${PYTHON:-python3} -m verl.trainer.main_ppo \
    algorithm.adv_estimator=gae \
    algorithm.gamma=1.0 \
    algorithm.lam=0.95 \
    algorithm.use_kl_in_reward=False \
    algorithm.kl_ctrl.kl_coef=0.001 \
    data.train_files="$DATA/train.parquet" \
    data.val_files="$DATA/test.parquet" \
    data.train_batch_size=16 \
    data.max_prompt_length=512 \
    data.max_response_length=256 \
    data.return_raw_chat=True \
    actor_rollout_ref.model.path="$MODEL" \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.model.enable_gradient_checkpointing=True \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=8 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.actor.use_dynamic_bsz=False \
    actor_rollout_ref.actor.fsdp_config.param_offload=False \
    actor_rollout_ref.actor.use_torch_compile=False \
    actor_rollout_ref.rollout.name="${ENGINE:-hf}" \
    actor_rollout_ref.rollout.n=1 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 \
    critic.optim.lr=1e-5 \
    critic.model.path="$MODEL" \
    critic.model.use_remove_padding=True \
    critic.model.enable_gradient_checkpointing=True \
    critic.model.fsdp_config.param_offload=False \
    critic.model.fsdp_config.optimizer_offload=False \
    critic.ppo_micro_batch_size=8 \
    reward_model.enable=False \
    reward_model.use_reward_loop=True \
    reward_model.num_workers=1 \
    reward_model.reward_manager=naive \
    reward_model.model.use_remove_padding=True \
    reward_model.model.fsdp_config.param_offload=True \
    reward_model.rollout.name=vllm \
    reward_model.rollout.tensor_model_parallel_size=1 \
    reward_model.rollout.gpu_memory_utilization=0.5 \
    custom_reward_function.path="$HERE/reward_fn.py" \
    custom_reward_function.name=compute_score \
    trainer.critic_warmup=0 \
    trainer.logger='["console","file"]' \
    trainer.project_name=verl_scripts \
    trainer.experiment_name=ppo_gae \
    trainer.n_gpus_per_node=1 \
    trainer.nnodes=1 \
    trainer.save_freq=-1 \
    trainer.test_freq=5 \
    trainer.total_epochs=1 \
    trainer.default_local_dir="$OUT/checkpoints" "$@"
