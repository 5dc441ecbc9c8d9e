#!/usr/bin/env bash
# GPG: group policy gradient, plain REINFORCE loss with no clipping (docs/algorithms.md, gpg).
#   bash examples/gpg_trainer/run_qwen2.5-0.5b_gsm8k.sh          # 1 GPU: Qwen2.5-0.5B-Instruct on GSM8K
#   bash examples/gpg_trainer/run_qwen2.5-0.5b_gsm8k.sh cpu      # CPU: the embedded default
set -euo pipefail
source "$(dirname "$0")/../common.sh"
ALGO=(
  algorithm.adv_estimator=gpg
  actor_rollout_ref.actor.policy_loss.loss_mode=gpg
  actor_rollout_ref.actor.use_kl_loss=False
)
launch "$@"
