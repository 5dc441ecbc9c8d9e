#!/usr/bin/env bash
# GRPO in rollout-correction bypass mode: the rollout's log-probs stand in for old_log_probs (no
# old-log-prob pass); REINFORCE with token importance weights truncated at 2 and token rejection,
# computed inside the actor's loss from the current policy (docs/algorithms.md, rollout correction).
#   bash examples/grpo_trainer/run_qwen2.5-0.5b_gsm8k_bypass.sh          # 1 GPU: Qwen2.5-0.5B-Instruct on GSM8K
#   bash examples/grpo_trainer/run_qwen2.5-0.5b_gsm8k_bypass.sh cpu      # CPU: the embedded default
set -euo pipefail
source "$(dirname "$0")/../common.sh"
ALGO=(
  algorithm.adv_estimator=grpo
  actor_rollout_ref.rollout.calculate_log_probs=True
  algorithm.rollout_correction.bypass_mode=True
  algorithm.rollout_correction.loss_type=reinforce
  algorithm.rollout_correction.rollout_is=token
  algorithm.rollout_correction.rollout_is_threshold=2.0
  algorithm.rollout_correction.rollout_rs=token_k1
  algorithm.rollout_correction.rollout_rs_threshold=0.5_2.0
)
launch "$@"
