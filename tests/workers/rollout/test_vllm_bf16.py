"""``rollout.use_dtype_on_cpu`` on a real vLLM engine (the CPU build). Its own module: the trainer
of test_vllm_rollout holds the placement groups while that module runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .test_vllm_rollout import build_trainer

pytestmark = pytest.mark.slow


def test_use_dtype_on_cpu_runs_the_engine_in_bf16(ray_session, builtin_assets):
    """``rollout.use_dtype_on_cpu``: the engine loads the model in ``rollout.dtype`` (bf16) while the
    trainer stays fp32, so their log-probs part by bf16 rounding (test_vllm_rollout's fp32 engine
    agrees to 1e-4) and the weight-sync probe applies its bf16 tolerance instead of failing."""
    trainer = build_trainer(
        ["trainer.total_training_steps=1", "actor_rollout_ref.rollout.use_dtype_on_cpu=True"]
    )
    try:
        trainer.global_steps += 1
        metrics = trainer.train_step(next(trainer.batches))
    finally:
        trainer.close()
    assert metrics["training/rollout_logprob_diff_max"] > 1e-3
    assert 1e-3 < metrics["rollout/weight_sync_probe_gap"] < 0.15

    # the fp32 weights went into the bf16 engine without a warning per parameter (or per layer with
    # nothing to load) in the worker's log, which does hold vLLM's other lines
    from ray._private import worker

    logs = Path(worker._global_node.get_logs_dir_path())
    text = "\n".join(f.read_text(errors="replace") for f in logs.glob("worker-*"))
    assert re.search(r"(INFO|WARNING) \d\d-\d\d [\d:]+ \[[\w.]+:\d+\]", text), "no vLLM log lines found"
    assert "Attempted to load weight" not in text
    assert "Failed to load weights" not in text
