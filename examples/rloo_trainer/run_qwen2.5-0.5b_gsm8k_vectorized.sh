#!/usr/bin/env bash
# RLOO with vectorised group sums; single-sample groups get 0 (docs/algorithms.md, rloo).
#   bash examples/rloo_trainer/run_qwen2.5-0.5b_gsm8k_vectorized.sh          # 1 GPU: Qwen2.5-0.5B-Instruct on GSM8K
#   bash examples/rloo_trainer/run_qwen2.5-0.5b_gsm8k_vectorized.sh cpu      # CPU: the embedded default
set -euo pipefail
source "$(dirname "$0")/../common.sh"
ALGO=(
  algorithm.adv_estimator=rloo_vectorized
  algorithm.use_kl_in_reward=True
  algorithm.kl_penalty=kl
  algorithm.kl_ctrl.kl_coef=0.001
)
launch "$@"
