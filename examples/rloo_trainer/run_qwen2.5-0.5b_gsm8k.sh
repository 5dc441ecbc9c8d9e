#!/usr/bin/env bash
# RLOO: leave-one-out baseline within the group, KL in the reward (docs/algorithms.md, rloo).
#   bash examples/rloo_trainer/run_qwen2.5-0.5b_gsm8k.sh          # 1 GPU: Qwen2.5-0.5B-Instruct on GSM8K
#   bash examples/rloo_trainer/run_qwen2.5-0.5b_gsm8k.sh cpu      # CPU: the embedded default
set -euo pipefail
source "$(dirname "$0")/../common.sh"
ALGO=(
  algorithm.adv_estimator=rloo
  algorithm.use_kl_in_reward=True
  algorithm.kl_penalty=kl
  algorithm.kl_ctrl.kl_coef=0.001
)
launch "$@"
