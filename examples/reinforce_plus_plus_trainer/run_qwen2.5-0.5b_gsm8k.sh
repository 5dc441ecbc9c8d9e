#!/usr/bin/env bash
# REINFORCE++: discounted returns whitened over the batch (docs/algorithms.md, reinforce_plus_plus).
#   bash examples/reinforce_plus_plus_trainer/run_qwen2.5-0.5b_gsm8k.sh          # 1 GPU: Qwen2.5-0.5B-Instruct on GSM8K
#   bash examples/reinforce_plus_plus_trainer/run_qwen2.5-0.5b_gsm8k.sh cpu      # CPU: the embedded default
set -euo pipefail
source "$(dirname "$0")/../common.sh"
ALGO=(
  algorithm.adv_estimator=reinforce_plus_plus
  actor_rollout_ref.actor.use_kl_loss=True
  actor_rollout_ref.actor.kl_loss_coef=0.001
  actor_rollout_ref.actor.kl_loss_type=mse
)
launch "$@"
