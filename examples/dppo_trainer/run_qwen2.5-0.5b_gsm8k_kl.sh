#!/usr/bin/env bash
# DPPO-KL: drop tokens whose binary KL to the old policy is too large (docs/algorithms.md, dppo_kl).
#   bash examples/dppo_trainer/run_qwen2.5-0.5b_gsm8k_kl.sh          # 1 GPU: Qwen2.5-0.5B-Instruct on GSM8K
#   bash examples/dppo_trainer/run_qwen2.5-0.5b_gsm8k_kl.sh cpu      # CPU: the embedded default
set -euo pipefail
source "$(dirname "$0")/../common.sh"
ALGO=(
  algorithm.adv_estimator=grpo
  actor_rollout_ref.actor.policy_loss.loss_mode=dppo_kl
  actor_rollout_ref.actor.clip_ratio_low=0.05
  actor_rollout_ref.actor.clip_ratio_high=0.05
  actor_rollout_ref.actor.clip_ratio_c=20.0
)
launch "$@"
