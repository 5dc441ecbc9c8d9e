#!/usr/bin/env bash
# Clip-Cov: detach the tokens with the largest advantage-logprob covariance (docs/algorithms.md, clip_cov).
#   bash examples/entropy_trainer/run_qwen2.5-0.5b_gsm8k_clip_cov.sh          # 1 GPU: Qwen2.5-0.5B-Instruct on GSM8K
#   bash examples/entropy_trainer/run_qwen2.5-0.5b_gsm8k_clip_cov.sh cpu      # CPU: the embedded default
set -euo pipefail
source "$(dirname "$0")/../common.sh"
ALGO=(
  algorithm.adv_estimator=grpo
  actor_rollout_ref.actor.policy_loss.loss_mode=clip_cov
)
launch "$@"
