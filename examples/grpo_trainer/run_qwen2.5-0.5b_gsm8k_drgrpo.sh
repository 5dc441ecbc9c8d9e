#!/usr/bin/env bash
# Dr.GRPO: GRPO without the std division and with a length-unbiased loss (docs/algorithms.md, grpo).
#   bash examples/grpo_trainer/run_qwen2.5-0.5b_gsm8k_drgrpo.sh          # 1 GPU: Qwen2.5-0.5B-Instruct on GSM8K
#   bash examples/grpo_trainer/run_qwen2.5-0.5b_gsm8k_drgrpo.sh cpu      # CPU: the embedded default
set -euo pipefail
source "$(dirname "$0")/../common.sh"
ALGO=(
  algorithm.adv_estimator=grpo
  algorithm.norm_adv_by_std_in_grpo=False
  actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm
  actor_rollout_ref.actor.use_kl_loss=False
)
launch "$@"
