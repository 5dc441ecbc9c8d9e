#!/usr/bin/env bash
# GRPO with vectorised group statistics (docs/algorithms.md, grpo_vectorized).
#   bash examples/grpo_trainer/run_qwen2.5-0.5b_gsm8k_vectorized.sh          # 1 GPU: Qwen2.5-0.5B-Instruct on GSM8K
#   bash examples/grpo_trainer/run_qwen2.5-0.5b_gsm8k_vectorized.sh cpu      # CPU: the embedded default
set -euo pipefail
source "$(dirname "$0")/../common.sh"
ALGO=(
  algorithm.adv_estimator=grpo_vectorized
  actor_rollout_ref.actor.use_kl_loss=True
  actor_rollout_ref.actor.kl_loss_coef=0.001
  actor_rollout_ref.actor.kl_loss_type=low_var_kl
)
launch "$@"
