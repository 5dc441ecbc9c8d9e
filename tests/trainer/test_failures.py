"""Failures end runs clearly and quickly: a killed worker, restarts, NaN updates."""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest

from tests.trainer.test_resume import STEPS, finish, logged_steps, metric_stream, start
from verl.config.ppo_trainer import load_config
from verl.trainer.main_ppo import run_ppo


def kill_a_worker_after(proc, workdir, step: int) -> float:
    """SIGKILL one worker process once ``step`` is logged; returns the time of the kill."""
    deadline = time.monotonic() + 240
    while logged_steps(workdir) < step and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    workers = [
        p for p in psutil.Process(proc.pid).children(recursive=True) if "WorkerHost" in " ".join(p.cmdline())
    ]
    assert workers, "no worker process found"
    workers[-1].kill()
    return time.monotonic()


def wait_for_line(proc, text: str, timeout: float = 240) -> float:
    """Wait until the run's output holds ``text``; returns when it was seen."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in Path(proc.output_path).read_text():
            return time.monotonic()
        assert proc.poll() is None, f"the run ended before printing {text!r}"
        time.sleep(0.2)
    raise AssertionError(f"no {text!r} in the run's output after {timeout} s")


@pytest.mark.slow
def test_a_killed_worker_fails_its_attempt_fast_and_max_restarts_resumes_the_run(tmp_path):
    """A SIGKILLed worker ends the attempt within a minute, named by role, rank and phase (the
    error a run without restarts ends with); ``trainer.max_restarts=1`` then rebuilds the workers,
    resumes from the last checkpoint (step 2: ``trainer.save_freq=2``) and completes."""
    no_validation = ["trainer.val_before_train=False", "trainer.test_freq=-1"]  # not what is tested
    proc = start(tmp_path, [*no_validation, "trainer.max_restarts=1"])
    killed_at = kill_a_worker_after(proc, tmp_path, 2)
    assert wait_for_line(proc, "restart 1/1 after a worker failure") - killed_at < 60
    code, out = finish(proc)
    assert code == 0, out[-3000:]
    restart = next(line for line in out.splitlines() if "restart 1/1 after a worker failure" in line)
    assert "WorkerDiedError" in restart and "role 'actor_rollout'" in restart and "rank " in restart
    assert "(in phase '" in restart
    assert "resumed from" in out
    assert max(metric_stream(tmp_path)) == STEPS


NAN_RUN = [
    "trainer.n_gpus_per_node=1",
    "trainer.val_before_train=False",
    "trainer.test_freq=-1",
    "trainer.logger=[console]",
    "data.train_batch_size=4",
    "data.val_max_samples=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.rollout.n=2",
    # a policy loss registered by a user module, imported in the workers, that returns NaN
    "actor_rollout_ref.model.external_lib=tests.trainer.nan_loss_plugin",
    "actor_rollout_ref.actor.policy_loss.loss_mode=nan_for_tests",
]


def test_nan_updates_are_skipped_and_counted(ray_session, builtin_assets):
    overrides = [*NAN_RUN, "trainer.total_training_steps=2", "trainer.max_consecutive_nan_steps=3"]
    metrics = run_ppo(load_config(overrides), overrides)
    assert metrics["actor/update_skipped"] == 1.0
    assert metrics["training/nan_skipped_steps"] == 2
    assert metrics["actor/grad_norm"] != metrics["actor/grad_norm"]  # NaN


def test_too_many_nan_steps_in_a_row_stop_the_run(ray_session, builtin_assets):
    overrides = [*NAN_RUN, "trainer.total_training_steps=5", "trainer.max_consecutive_nan_steps=2"]
    with pytest.raises(RuntimeError, match=r"2 steps in a row \(up to step 2\).*max_consecutive_nan_steps=2"):
        run_ppo(load_config(overrides), overrides)
