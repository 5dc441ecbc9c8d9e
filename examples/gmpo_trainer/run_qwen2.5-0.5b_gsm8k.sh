#!/usr/bin/env bash
# GMPO: geometric mean of token ratios (docs/algorithms.md, geo_mean).
#   bash examples/gmpo_trainer/run_qwen2.5-0.5b_gsm8k.sh          # 1 GPU: Qwen2.5-0.5B-Instruct on GSM8K
#   bash examples/gmpo_trainer/run_qwen2.5-0.5b_gsm8k.sh cpu      # CPU: the embedded default
set -euo pipefail
source "$(dirname "$0")/../common.sh"
ALGO=(
  algorithm.adv_estimator=grpo
  actor_rollout_ref.actor.policy_loss.loss_mode=geo_mean
  actor_rollout_ref.actor.clip_ratio_low=0.4
  actor_rollout_ref.actor.clip_ratio_high=0.4
)
launch "$@"
