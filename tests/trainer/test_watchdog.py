"""trainer.step_timeout_s: a loop in which no step finishes reports every process's stack."""

from __future__ import annotations

import threading
import time

import pytest

from tests.single_controller.workers import EchoWorker
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from verl.trainer.ppo.watchdog import StepWatchdog


@pytest.mark.slow
def test_a_stalled_loop_reports_the_stuck_worker_and_the_driver(ray_session):
    pool = RayResourcePool([1], use_gpu=False, name_prefix="stall", cpus_per_process=0.5)
    wg = RayWorkerGroup(pool, RayClassWithInitArgs(EchoWorker), role="actor_rollout", call_timeout_s=600)
    reports: list[str] = []
    fired = threading.Event()

    def on_stall(report: str) -> None:
        reports.append(report)
        fired.set()

    try:
        wg.spin(blocking=False)  # the "step" that never ends
        deadline = time.monotonic() + 120  # until the call runs (a busy machine may start it late)
        while "_spin_forever_in_a_python_loop" not in wg.dump_stacks()[0]:
            assert time.monotonic() < deadline, "spin() never started"
        # the same group under two roles (colocated roles share a process): dumped once
        with StepWatchdog(0.5, {"actor_rollout": wg, "ref": wg}, lambda: "step 7, phase gen", on_stall):
            assert fired.wait(120), "the watchdog never fired"
        (report,) = reports
        assert report.startswith(
            "no training step finished within trainer.step_timeout_s=0.5s (step 7, phase gen)"
        )
        assert f"--- role 'actor_rollout' rank 0 (pid {wg.pids[0]}) ---" in report
        assert report.count(f"(pid {wg.pids[0]})") == 1
        assert "_spin_forever_in_a_python_loop" in report  # the worker's stack
        assert "test_a_stalled_loop_reports_the_stuck_worker_and_the_driver" in report  # the driver's threads
    finally:
        wg.shutdown()
        pool.release()


def test_steps_that_finish_keep_the_watchdog_quiet():
    fired = threading.Event()
    with StepWatchdog(3600, {}, lambda: "", lambda report: fired.set()) as dog:
        for _ in range(3):
            dog.step_done()
    assert not fired.is_set()
    with StepWatchdog(None, {}, lambda: "", lambda report: fired.set()):  # off
        pass
    assert not fired.is_set()
