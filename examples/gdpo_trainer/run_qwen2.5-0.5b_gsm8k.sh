#!/usr/bin/env bash
# GDPO: each reward column normalised in its group, then summed (docs/algorithms.md, gdpo).
#   bash examples/gdpo_trainer/run_qwen2.5-0.5b_gsm8k.sh          # 1 GPU: Qwen2.5-0.5B-Instruct on GSM8K
#   bash examples/gdpo_trainer/run_qwen2.5-0.5b_gsm8k.sh cpu      # CPU: the embedded default
set -euo pipefail
source "$(dirname "$0")/../common.sh"
ALGO=(
  algorithm.adv_estimator=gdpo
  "algorithm.gdpo_reward_keys=[acc,score]"
  "algorithm.gdpo_reward_weights=[1.0,0.5]"
)
launch "$@"
