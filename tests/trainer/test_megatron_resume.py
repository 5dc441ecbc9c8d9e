"""Crash and resume with the Megatron engine (tensor parallel 2 on 2 ranks): ``main_ppo`` in a
subprocess, SIGKILLed (its whole process group) after step 3 with the step-2 checkpoint committed,
then started again. Every step's metrics (losses, gradient norms, rewards, validation) equal the
uninterrupted run's bit for bit, as for FSDP (tests/trainer/test_resume.py, whose helpers run both).

The subprocess's Ray workers get the test-only megatron-core CPU shim through Ray's
``RAY_RUNTIME_ENV_HOOK``, as the test session's workers get it from tests/conftest.py.
"""

from __future__ import annotations

import time

import pytest

pytest.importorskip("megatron.core")

from tests.trainer.test_resume import (
    assert_same_stream,
    finish,
    kill_group,
    logged_steps,
    metric_stream,
    start,
)
from verl.trainer.ppo import checkpoint as ckpt

pytestmark = pytest.mark.slow

STEPS = 4  # saved at 2 (trainer.save_freq=2 in test_resume.RUN), killed after 3
MEGATRON = [
    f"trainer.total_training_steps={STEPS}",  # later than test_resume.RUN's: this one wins
    "actor_rollout_ref.actor.strategy=megatron",
    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
]
SHIM = {"RAY_RUNTIME_ENV_HOOK": "tests.megatron.cpu_shim.ray_runtime_env_hook"}


def test_a_megatron_run_killed_after_a_checkpoint_resumes_to_the_uninterrupted_stream(tmp_path):
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    runs = [start(reference, MEGATRON, env=SHIM), start(killed, MEGATRON, env=SHIM)]
    deadline = time.monotonic() + 300
    while logged_steps(killed) < 3 and runs[1].poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert runs[1].poll() is None, finish(runs[1])[1][-3000:]
    kill_group(runs[1])
    code, out = finish(runs[0])
    assert code == 0, out[-3000:]
    root = killed / "checkpoints" / "resume" / "run"
    assert ckpt.read_pointer(str(root)) == 2
    assert sorted(p.name for p in (root / "global_step_2" / "actor").glob("megatron_rank_*.pt")) == [
        "megatron_rank_0.pt",
        "megatron_rank_1.pt",
    ]

    code, out = finish(start(killed, MEGATRON, env=SHIM))
    assert code == 0, out[-3000:]
    assert "global_step_2 (step 2)" in out

    expected = metric_stream(reference)
    for key in ("actor/pg_loss", "actor/grad_norm", "critic/score/mean"):
        assert all(key in expected[step] for step in range(1, STEPS + 1)), (key, sorted(expected[1]))
    assert_same_stream(metric_stream(killed), expected, steps=STEPS)
