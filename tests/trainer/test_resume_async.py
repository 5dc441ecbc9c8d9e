"""kill -9 and resume for the asynchronous trainer (``trainer.mode=async``): ``python -m
verl.trainer.main_ppo`` in a subprocess, SIGKILLed (driver, Ray and both pools) after a random step
while the next batch is generated on the rollout pool, then started again with the same command.

The checkpoint keeps the generations in flight with their responses and the policy version, so the
resumed run's metric stream equals the uninterrupted one on every step, bit for bit (timings
excepted): every prompt trained exactly once, the staleness and the version counters as they were.
``partial_rollout=False`` makes the samples independent of thread timing."""

from __future__ import annotations

import random
import signal
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.trainer import test_resume as harness
from verl.trainer.ppo import checkpoint as ckpt

pytestmark = pytest.mark.slow

STEPS = 4
RUN = [
    "trainer.mode=async",
    "async_training.max_staleness=1",
    "async_training.partial_rollout=False",
    "trainer.n_gpus_per_node=1",  # a trainer process beside a rollout process on two cores
    "trainer.cpus_per_worker=1",
    f"trainer.total_training_steps={STEPS}",
    "trainer.test_freq=3",
    "trainer.save_freq=1",
    "trainer.logger=[file]",
    "trainer.project_name=resume",
    "trainer.experiment_name=run",
    "data.train_batch_size=8",
    "data.val_max_samples=16",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.rollout.calculate_log_probs=True",
    "actor_rollout_ref.actor.tis_imp_ratio_cap=2.0",
]


@pytest.mark.usefixtures("ray_session", "builtin_assets")
def test_an_async_run_killed_at_a_random_step_resumes_to_the_uninterrupted_stream(
    tmp_path, monkeypatch, caplog
):
    reference, killed_dir = tmp_path / "reference", tmp_path / "killed"
    monkeypatch.setattr(harness, "RUN", RUN)
    run = harness.start(killed_dir)
    kill_after = random.Random().randint(1, STEPS - 1)
    with ThreadPoolExecutor(1) as killer:
        killed = killer.submit(harness.kill_after_step, run, killed_dir, kill_after)
        expected = harness.uninterrupted_stream(reference, monkeypatch)
        killed.result()
    assert run.returncode == -signal.SIGKILL

    pointer = ckpt.read_pointer(str(killed_dir / "checkpoints" / "resume" / "run"))
    assert pointer is not None and kill_after <= pointer < STEPS, (kill_after, pointer)
    out = harness.resume_here(killed_dir, monkeypatch, caplog)
    assert f"global_step_{pointer}" in out
    actual = harness.metric_stream(killed_dir)
    harness.assert_same_stream(actual, expected, STEPS)
    # the bound held across the resume: step 1 on-policy, every later batch one version old
    assert [actual[s]["async/staleness_max"] for s in range(1, STEPS + 1)] == [0] + [1] * (STEPS - 1)
