#!/usr/bin/env bash
# DRO: policy gradient with a quadratic log-ratio penalty (docs/algorithms.md, dro).
#   bash examples/dro_trainer/run_qwen2.5-0.5b_gsm8k.sh          # 1 GPU: Qwen2.5-0.5B-Instruct on GSM8K
#   bash examples/dro_trainer/run_qwen2.5-0.5b_gsm8k.sh cpu      # CPU: the embedded default
set -euo pipefail
source "$(dirname "$0")/../common.sh"
ALGO=(
  algorithm.adv_estimator=grpo
  actor_rollout_ref.actor.policy_loss.loss_mode=dro
  actor_rollout_ref.actor.policy_loss.dro_beta=0.05
)
launch "$@"
