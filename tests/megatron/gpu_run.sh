#!/usr/bin/env bash
# The Megatron engine's checks on a lent GPU machine (torch and transformers there; megatron-core,
# hydra, omegaconf and tensordict carried as wheels in .whl/): the CUDA test of the engine against
# FSDP (fp32 and bf16, actor and critic), then benchmarks/megatron_vs_fsdp.py --gpu. Logs go to $OUT.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/out}
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$OUT/megatron_gpu.log"
python3 -m pytest -q -p no:cacheprovider -o addopts="" --tb=short -W ignore tests/workers/engine/test_megatron_gpu.py 2>&1 | tail -40 | tee -a "$OUT/megatron_gpu.log"
timeout 360 python3 benchmarks/megatron_vs_fsdp.py --gpu --steps 2 2>&1 | tail -30 | tee -a "$OUT/megatron_gpu.log"
