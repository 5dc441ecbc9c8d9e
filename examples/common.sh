# Sourced by examples/*/run_*.sh. A script sets ALGO (its algorithm's keys) and calls
# `launch "$@"`:
#   bash run_x.sh [key=value ...]       1 GPU: Qwen2.5-0.5B-Instruct on GSM8K (first run
#                                       `python examples/data_preprocess/gsm8k.py`)
#   bash run_x.sh cpu [key=value ...]   a CPU: the embedded default (built-in task and model)
# Extra key=value arguments go last, so they win. VERL_DRY_RUN=1 prints the command, one
# argument per line, instead of running it (the tests read the scripts that way). PYTHON
# defaults to the repository's .venv when it exists.
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ -z "${PYTHON:-}" ]]; then  # the repository's venv (made by `make install`) when present
  if [[ -x "$REPO_ROOT/.venv/bin/python" ]]; then PYTHON="$REPO_ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
export PYTHONPATH="$REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}"  # recipes import as recipe.<name>
ENTRY=${ENTRY:-verl.trainer.main_ppo}
MODEL=${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}
DATA=${DATA:-$HOME/data/gsm8k}

GSM8K_ONE_GPU=(
  data.train_files="$DATA/train.parquet"
  data.val_files="$DATA/test.parquet"
  data.train_batch_size=256
  data.max_prompt_length=512
  data.max_response_length=512
  data.filter_overlong_prompts=True
  actor_rollout_ref.model.path="$MODEL"
  actor_rollout_ref.model.enable_gradient_checkpointing=True
  actor_rollout_ref.actor.optim.lr=1e-6
  actor_rollout_ref.actor.ppo_mini_batch_size=64
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16
  actor_rollout_ref.rollout.n=5
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32
  critic.optim.lr=1e-5
  critic.ppo_micro_batch_size_per_gpu=16
  trainer.n_gpus_per_node=1
  trainer.total_training_steps=null
  trainer.total_epochs=15
  trainer.test_freq=10
  trainer.save_freq=50
  trainer.project_name=verl_examples
)

GPU_ALGO=()  # a script's keys for the GPU line only (e.g. sized to 512-token responses)

launch() {
  local cmd
  if [[ "${1:-}" == cpu ]]; then
    shift
    cmd=("$PYTHON" -m "$ENTRY" "${ALGO[@]}" "$@")
  else
    cmd=("$PYTHON" -m "$ENTRY" "${GSM8K_ONE_GPU[@]}" "${ALGO[@]}" "${GPU_ALGO[@]}" "$@")
  fi
  if [[ -n "${VERL_DRY_RUN:-}" ]]; then
    printf '%s\n' "${cmd[@]}"
  else
    exec "${cmd[@]}"
  fi
}
