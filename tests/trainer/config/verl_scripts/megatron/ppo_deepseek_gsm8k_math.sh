#!/usr/bin/env bash
# verl's examples/ppo_trainer/run_deepseek_math_gsm8k_megatron.sh (PPO with a Megatron critic), its
# launch line unchanged but for the model and data paths (MODEL, DATA) and the interpreter (PYTHON).
# It loads and validates (tests/trainer/config/test_megatron_config.py), and with the built-in model
# and data, pipeline 1 on two CPU ranks and the hf rollout it trains a step, critic included
# (tests/trainer/test_verl_megatron_examples.py). Run it with
#   MODEL=<hf dir> DATA=<dir with gsm8k/ and math/> bash tests/trainer/config/verl_scripts/megatron/ppo_deepseek_gsm8k_math.sh
set -euo pipefail
MODEL=${MODEL:-deepseek-ai/deepseek-llm-7b-chat}
DATA=${DATA:-$HOME/data}
train_files="['$DATA/gsm8k/train.parquet', '$DATA/math/train.parquet']"
test_files="['$DATA/gsm8k/test.parquet', '$DATA/math/test.parquet']"

${PYTHON:-python3} -m verl.trainer.main_ppo --config-path=./config --config-name='ppo_megatron_trainer'\
    algorithm.adv_estimator=gae \
    data.train_files="$train_files" \
    data.val_files="$test_files" \
    data.train_batch_size=1024 \
    data.max_prompt_length=1024 \
    data.max_response_length=512 \
    data.filter_overlong_prompts=True \
    data.truncation='error' \
    actor_rollout_ref.model.path="$MODEL" \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=256 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2 \
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2 \
    actor_rollout_ref.actor.use_kl_loss=False \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=4 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.4 \
    actor_rollout_ref.ref.megatron.pipeline_model_parallel_size=2 \
    actor_rollout_ref.ref.megatron.tensor_model_parallel_size=2 \
    critic.optim.lr=1e-5 \
    critic.model.path="$MODEL" \
    critic.ppo_micro_batch_size_per_gpu=4 \
    algorithm.use_kl_in_reward=False \
    trainer.critic_warmup=0 \
    trainer.logger='["console","wandb"]' \
    trainer.project_name='verl_ppo_gsm8k_math_examples' \
    trainer.experiment_name='deepseek_llm_7b_megatron' \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes=1 \
    trainer.save_freq=20 \
    trainer.test_freq=5 \
    trainer.total_epochs=100 "$@"
