#!/usr/bin/env bash
# Optimal token baseline: per-token group baseline weighted by path variance (docs/algorithms.md).
# The actor computes sum_pi_squared in its old-log-prob pass (calculate_sum_pi_squared).
#   bash examples/otb_trainer/run_qwen2.5-0.5b_gsm8k.sh          # 1 GPU: Qwen2.5-0.5B-Instruct on GSM8K
#   bash examples/otb_trainer/run_qwen2.5-0.5b_gsm8k.sh cpu      # CPU: the embedded default
set -euo pipefail
source "$(dirname "$0")/../common.sh"
ALGO=(
  algorithm.adv_estimator=optimal_token_baseline
  actor_rollout_ref.actor.calculate_sum_pi_squared=True
)
launch "$@"
