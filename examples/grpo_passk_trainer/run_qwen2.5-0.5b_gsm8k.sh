#!/usr/bin/env bash
# pass@k training: only the best response of a group gets an advantage (docs/algorithms.md, grpo_passk).
#   bash examples/grpo_passk_trainer/run_qwen2.5-0.5b_gsm8k.sh          # 1 GPU: Qwen2.5-0.5B-Instruct on GSM8K
#   bash examples/grpo_passk_trainer/run_qwen2.5-0.5b_gsm8k.sh cpu      # CPU: the embedded default
set -euo pipefail
source "$(dirname "$0")/../common.sh"
ALGO=(
  algorithm.adv_estimator=grpo_passk
)
launch "$@"
