#!/usr/bin/env bash
# SAPO: GRPO advantages, a smooth sigmoid gate instead of the PPO clip (docs/algorithms.md, sapo).
#   bash examples/sapo_trainer/run_qwen2.5-0.5b_gsm8k.sh          # 1 GPU: Qwen2.5-0.5B-Instruct on GSM8K
#   bash examples/sapo_trainer/run_qwen2.5-0.5b_gsm8k.sh cpu      # CPU: the embedded default
set -euo pipefail
source "$(dirname "$0")/../common.sh"
ALGO=(
  algorithm.adv_estimator=grpo
  actor_rollout_ref.actor.policy_loss.loss_mode=sapo
  actor_rollout_ref.actor.tau_pos=1.0
  actor_rollout_ref.actor.tau_neg=1.05
)
launch "$@"
