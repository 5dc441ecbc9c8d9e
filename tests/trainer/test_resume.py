"""Crash and resume, for real: ``python -m verl.trainer.main_ppo`` in a subprocess, killed with
SIGKILL (the whole process group: driver, Ray and the workers), then started again.

The metric stream of the interrupted-and-resumed run must equal the uninterrupted one on
every step, bit for bit (timings and memory excepted). The uninterrupted run and the resumes are
trained in this process, in the test session's Ray (no start-up of their own): what a resume reads
is what the killed process left on disk, whichever process reads it.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from verl.config.ppo_trainer import load_config
from verl.trainer.main_ppo import run_ppo
from verl.trainer.ppo import checkpoint as ckpt

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
STEPS = 4  # checkpoints at 2 and 4, validations at 0, 3 and 4
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
# Two runs start their own Ray clusters side by side: on a busy 2-core machine one run's driver
# once gave up reaching its cluster's GCS after Ray's default 60 s and exited before the test could
# kill it. A longer limit only delays the failure of a run that truly cannot reach its GCS.
SLOW_START = {"RAY_gcs_rpc_server_reconnect_timeout_s": "300"}


def start(workdir: Path, extra: list[str] = (), env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start main_ppo in ``workdir``; its output goes to a file there (``output_of``), not a pipe, so
    runs side by side never block on a full pipe nobody reads yet."""
    workdir.mkdir(parents=True, exist_ok=True)
    pythonpath = os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])
    launch = len(list(workdir.glob("output-*.log")))
    with open(workdir / f"output-{launch}.log", "w") as output:
        proc = subprocess.Popen(
            [sys.executable, "-m", "verl.trainer.main_ppo", *RUN, *extra],
            cwd=workdir,
            env={**os.environ, "PYTHONPATH": pythonpath, "RAY_ADDRESS": "", **SLOW_START, **(env or {})},
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: SIGKILL takes Ray down with it
        )
    proc.output_path = output.name
    return proc


def finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    """Wait for the run; its exit code and output."""
    proc.wait(timeout=timeout)
    return proc.returncode, Path(proc.output_path).read_text()


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
    proc.wait(timeout=60)


def kill_after_step(proc: subprocess.Popen, workdir: Path, step: int) -> None:
    """SIGKILL the run's process group once it has logged ``step``, wherever it is then."""
    deadline = time.monotonic() + 300  # only catches a run that never gets there
    while logged_steps(workdir) < step and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be killed"
    kill_group(proc)


def assert_same_stream(actual: dict, expected: dict, steps: int = STEPS) -> None:
    assert sorted(actual) == sorted(expected) == list(range(steps + 1))
    for step in expected:
        assert actual[step] == expected[step], f"step {step} differs"


def uninterrupted_stream(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> dict[int, dict[str, float]]:
    """The reference run, trained in this process (its logs/ and checkpoints/ under ``workdir``)."""
    workdir.mkdir(parents=True)
    monkeypatch.chdir(workdir)
    run_ppo(load_config(RUN), RUN)
    return metric_stream(workdir)


def resume_here(workdir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> str:
    """Start the killed run of ``workdir`` again, in this process; what the trainer logged."""
    monkeypatch.chdir(workdir)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="verl.trainer.ppo.ray_trainer"):
        run_ppo(load_config(RUN), RUN)
    return caplog.text


@pytest.mark.usefixtures("ray_session", "builtin_assets")
def test_a_run_killed_at_a_random_step_or_while_saving_resumes_to_the_uninterrupted_stream(
    tmp_path, monkeypatch, caplog
):
    """Two runs side by side (each its own process group and Ray cluster, so they only share the
    CPU): one SIGKILLed after a random step; one SIGKILLed in the middle of writing the step-4
    checkpoint. Meanwhile the uninterrupted reference trains here; then both resume here."""
    reference, at_step, while_saving = tmp_path / "reference", tmp_path / "at_step", tmp_path / "while_saving"
    runs = [start(at_step), start(while_saving, env={"VERL_FAULT": "kill_during_save@4"})]
    kill_after = random.Random().randint(2, STEPS - 1)
    with ThreadPoolExecutor(1) as killer:
        killed = killer.submit(kill_after_step, runs[0], at_step, kill_after)
        expected = uninterrupted_stream(reference, monkeypatch)
        killed.result()
    code, out = finish(runs[1])
    assert code == -signal.SIGKILL, out[-3000:]

    # killed at a step: the last committed checkpoint is before the end
    pointer = ckpt.read_pointer(str(at_step / "checkpoints" / "resume" / "run"))
    assert pointer is not None and pointer <= STEPS - 1
    # killed while saving step 4: written, never committed; the pointer stays at step 2
    root = while_saving / "checkpoints" / "resume" / "run"
    assert ckpt.read_pointer(str(root)) == 2
    assert (root / "global_step_4" / "actor").is_dir()
    assert not (root / "global_step_4" / ckpt.DRIVER_FILE).exists()

    out_at_step = resume_here(at_step, monkeypatch, caplog)
    assert "resumed from" in out_at_step and f"global_step_{pointer}" in out_at_step
    out_saving = resume_here(while_saving, monkeypatch, caplog)
    assert "global_step_2 (step 2)" in out_saving
    assert ckpt.read_pointer(str(root)) == STEPS

    assert_same_stream(metric_stream(at_step), expected)
    assert_same_stream(metric_stream(while_saving), expected)
