#!/usr/bin/env bash
# KL-Cov: a KL penalty on the highest-covariance tokens (docs/algorithms.md, kl_cov).
#   bash examples/entropy_trainer/run_qwen2.5-0.5b_gsm8k_kl_cov.sh          # 1 GPU: Qwen2.5-0.5B-Instruct on GSM8K
#   bash examples/entropy_trainer/run_qwen2.5-0.5b_gsm8k_kl_cov.sh cpu      # CPU: the embedded default
set -euo pipefail
source "$(dirname "$0")/../common.sh"
ALGO=(
  algorithm.adv_estimator=grpo
  actor_rollout_ref.actor.policy_loss.loss_mode=kl_cov
)
launch "$@"
