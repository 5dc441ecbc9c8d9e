#!/usr/bin/env bash
# PPO with a critic and GAE (docs/algorithms.md, gae).
#   bash examples/ppo_trainer/run_qwen2.5-0.5b_gsm8k.sh          # 1 GPU: Qwen2.5-0.5B-Instruct on GSM8K
#   bash examples/ppo_trainer/run_qwen2.5-0.5b_gsm8k.sh cpu      # CPU: the embedded default
set -euo pipefail
source "$(dirname "$0")/../common.sh"
ALGO=(
  algorithm.adv_estimator=gae
  algorithm.lam=0.95
  algorithm.use_kl_in_reward=False
)
launch "$@"
