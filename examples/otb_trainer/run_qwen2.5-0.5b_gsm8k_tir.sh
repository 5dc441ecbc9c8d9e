#!/usr/bin/env bash
# TIR optimal token baseline: the per-token baseline pooled over the t-th valid tokens (multi-turn; docs/algorithms.md).
# The actor computes sum_pi_squared in its old-log-prob pass (calculate_sum_pi_squared).
#   bash examples/otb_trainer/run_qwen2.5-0.5b_gsm8k_tir.sh          # 1 GPU: Qwen2.5-0.5B-Instruct on GSM8K
#   bash examples/otb_trainer/run_qwen2.5-0.5b_gsm8k_tir.sh cpu      # CPU: the embedded default
set -euo pipefail
source "$(dirname "$0")/../common.sh"
ALGO=(
  algorithm.adv_estimator=tir_optimal_token_baseline
  actor_rollout_ref.actor.calculate_sum_pi_squared=True
)
launch "$@"
