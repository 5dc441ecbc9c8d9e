#!/usr/bin/env bash
# DAPO (recipe/dapo): clip-higher, dynamic sampling, token-level loss, overlong shaping.
#   bash recipe/dapo/run_dapo_qwen2.5-0.5b_gsm8k.sh          # 1 GPU: Qwen2.5-0.5B-Instruct on GSM8K
#   bash recipe/dapo/run_dapo_qwen2.5-0.5b_gsm8k.sh cpu      # CPU: the embedded default
# Run from the repository root (the recipe is imported as recipe.dapo).
set -euo pipefail
ENTRY=recipe.dapo.main_dapo
source "$(dirname "$0")/../../examples/common.sh"
ALGO=()  # DAPO's keys are in recipe/dapo/config/dapo_trainer.yaml
GPU_ALGO=(
  reward_model.overlong_buffer.len=128
  algorithm.filter_groups.metric=acc
  algorithm.filter_groups.max_num_gen_batches=10
)
launch "$@"
