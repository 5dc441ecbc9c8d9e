"""Crash and resume, for real: ``python -m verl.trainer.main_ppo`` in a subprocess, killed with
SIGKILL (the whole process group: driver, Ray and the workers), then started again.

The metric stream of the interrupted-and-resumed run must equal the uninterrupted one on
every step, bit for bit (timings and memory excepted).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from verl.trainer.ppo import checkpoint as ckpt

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
STEPS = 6
RUN = [
    "trainer.n_gpus_per_node=2",
    "trainer.cpus_per_worker=1",
    f"trainer.total_training_steps={STEPS}",
    "trainer.test_freq=3",
    "trainer.save_freq=2",
    "trainer.logger=[file]",
    "trainer.project_name=resume",
    "trainer.experiment_name=run",
    "data.train_batch_size=8",
    "data.val_max_samples=16",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
]
VOLATILE = ("timing_s/", "timing_per_token_ms/", "perf/")


def start(workdir: Path, extra: list[str] = (), env: dict[str, str] | None = None) -> subprocess.Popen:
    workdir.mkdir(parents=True, exist_ok=True)
    pythonpath = os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])
    return subprocess.Popen(
        [sys.executable, "-m", "verl.trainer.main_ppo", *RUN, *extra],
        cwd=workdir,
        env={**os.environ, "PYTHONPATH": pythonpath, "RAY_ADDRESS": "", **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: SIGKILL takes Ray down with it
    )


def finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def metrics_file(workdir: Path) -> Path:
    return workdir / "logs" / "resume" / "run" / "metrics.jsonl"


def metric_stream(workdir: Path) -> dict[int, dict[str, float]]:
    """Step -> metrics; a step logged twice (before a crash and after the resume) keeps the last."""
    steps: dict[int, dict[str, float]] = {}
    for line in metrics_file(workdir).read_text().splitlines():
        row = json.loads(line)
        step = row.pop("step")
        steps.setdefault(step, {}).update({k: v for k, v in row.items() if not k.startswith(VOLATILE)})
    return steps


def logged_steps(workdir: Path) -> int:
    path = metrics_file(workdir)
    if not path.exists():
        return 0
    return max((json.loads(line)["step"] for line in path.read_text().splitlines() if line), default=0)


def kill_group(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[int, dict[str, float]]:
    workdir = tmp_path_factory.mktemp("uninterrupted")
    code, out = finish(start(workdir))
    assert code == 0, out[-3000:]
    return metric_stream(workdir)


def assert_same_stream(actual: dict, expected: dict) -> None:
    assert sorted(actual) == sorted(expected) == list(range(STEPS + 1))
    for step in expected:
        assert actual[step] == expected[step], f"step {step} differs"


def test_sigkill_at_a_random_step_then_resume_equals_the_uninterrupted_run(tmp_path, reference):
    kill_after = random.Random().randint(2, STEPS - 1)
    proc = start(tmp_path)
    deadline = time.monotonic() + 240
    while logged_steps(tmp_path) < kill_after and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be killed"
    kill_group(proc)
    pointer = ckpt.read_pointer(str(tmp_path / "checkpoints" / "resume" / "run"))
    assert pointer is not None and pointer <= STEPS - 1

    code, out = finish(start(tmp_path))
    assert code == 0, out[-3000:]
    assert "resumed from" in out and f"global_step_{pointer}" in out
    assert_same_stream(metric_stream(tmp_path), reference)


def test_sigkill_while_saving_resumes_from_the_previous_checkpoint(tmp_path, reference):
    code, out = finish(start(tmp_path, env={"VERL_FAULT": "kill_during_save@4"}))
    assert code == -signal.SIGKILL, out[-3000:]
    root = tmp_path / "checkpoints" / "resume" / "run"
    assert ckpt.read_pointer(str(root)) == 2
    assert (root / "global_step_4" / "actor").is_dir()  # written, never committed
    assert not (root / "global_step_4" / ckpt.DRIVER_FILE).exists()

    code, out = finish(start(tmp_path))
    assert code == 0, out[-3000:]
    assert "global_step_2 (step 2)" in out
    assert ckpt.read_pointer(str(root)) == STEPS
    assert_same_stream(metric_stream(tmp_path), reference)
