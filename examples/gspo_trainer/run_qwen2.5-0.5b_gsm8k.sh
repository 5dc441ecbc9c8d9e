#!/usr/bin/env bash
# GSPO: GRPO advantages with a sequence-level importance ratio (docs/algorithms.md, gspo).
#   bash examples/gspo_trainer/run_qwen2.5-0.5b_gsm8k.sh          # 1 GPU: Qwen2.5-0.5B-Instruct on GSM8K
#   bash examples/gspo_trainer/run_qwen2.5-0.5b_gsm8k.sh cpu      # CPU: the embedded default
set -euo pipefail
source "$(dirname "$0")/../common.sh"
ALGO=(
  algorithm.adv_estimator=grpo
  actor_rollout_ref.actor.policy_loss.loss_mode=gspo
  actor_rollout_ref.actor.clip_ratio_low=0.0003
  actor_rollout_ref.actor.clip_ratio_high=0.0004
  actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean
)
launch "$@"
