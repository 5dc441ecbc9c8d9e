#!/usr/bin/env bash
# OPO: length-weighted group baseline, strictly on-policy (docs/algorithms.md, opo).
#   bash examples/opo_trainer/run_qwen2.5-0.5b_gsm8k.sh          # 1 GPU: Qwen2.5-0.5B-Instruct on GSM8K
#   bash examples/opo_trainer/run_qwen2.5-0.5b_gsm8k.sh cpu      # CPU: the embedded default
set -euo pipefail
source "$(dirname "$0")/../common.sh"
ALGO=(
  algorithm.adv_estimator=opo
  'actor_rollout_ref.actor.ppo_mini_batch_size=${data.train_batch_size}'  # one update per batch
  actor_rollout_ref.actor.entropy_coeff=0
)
launch "$@"
