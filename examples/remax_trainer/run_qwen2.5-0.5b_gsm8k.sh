#!/usr/bin/env bash
# ReMax: the reward of a greedy response is the baseline (docs/algorithms.md, remax).
#   bash examples/remax_trainer/run_qwen2.5-0.5b_gsm8k.sh          # 1 GPU: Qwen2.5-0.5B-Instruct on GSM8K
#   bash examples/remax_trainer/run_qwen2.5-0.5b_gsm8k.sh cpu      # CPU: the embedded default
set -euo pipefail
source "$(dirname "$0")/../common.sh"
ALGO=(
  algorithm.adv_estimator=remax
  algorithm.use_kl_in_reward=True
  algorithm.kl_penalty=kl
  algorithm.kl_ctrl.kl_coef=0.001
)
launch "$@"
