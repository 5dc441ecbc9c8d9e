"""The loop's watchdog: a run in which no training step finishes within ``trainer.step_timeout_s``
prints where every process is (the driver's threads and each worker's, taken by a signal) and
exits non-zero, instead of hanging silently.

Worker-group calls have their own time-out (``trainer.worker_call_timeout_s``), whose error
holds the late ranks' stacks; this one also catches a stall outside any call (a driver thread
waiting on a queue, a reward call, a deadlock between the trainer's own threads).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from verl.utils.stacks import format_own_stacks

logger = logging.getLogger(__name__)

STALL_EXIT_CODE = 3


class StepWatchdog:
    """``with StepWatchdog(timeout_s, groups, where) as dog:`` ... ``dog.step_done()`` per step.

    ``groups`` are the worker groups whose processes to dump (colocated roles share a process and
    are dumped once); ``where()`` describes the driver's position (step and phase) for the report;
    ``on_stall(report)`` defaults to printing the report and ending the process with
    :data:`STALL_EXIT_CODE`. ``timeout_s=None`` turns the watchdog off.
    """

    def __init__(
        self,
        timeout_s: float | None,
        groups: Mapping[str, Any],
        where: Callable[[], str],
        on_stall: Callable[[str], None] | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self.groups = groups
        self.where = where
        self.on_stall = on_stall or _print_and_exit
        self._last_step = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> StepWatchdog:
        if self.timeout_s is not None:
            self._last_step = time.monotonic()
            self._thread = threading.Thread(target=self._watch, name="verl-step-watchdog", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def step_done(self) -> None:
        self._last_step = time.monotonic()

    def _watch(self) -> None:
        assert self.timeout_s is not None
        while not self._stop.wait(min(1.0, self.timeout_s)):
            if time.monotonic() - self._last_step > self.timeout_s:
                self.on_stall(self.report())
                return

    def report(self) -> str:
        """The driver's position and threads, then each worker process's stacks."""
        parts = [
            f"no training step finished within trainer.step_timeout_s={self.timeout_s:g}s "
            f"({self.where()}); the stacks of every process follow.",
            f"--- driver (pid {os.getpid()}) ---\n{format_own_stacks()}",
        ]
        seen: set[int] = set()
        for role, group in self.groups.items():
            if group is None or not hasattr(group, "dump_stacks"):
                continue
            for rank, text in group.dump_stacks().items():
                pid = group.pids[rank]
                if pid not in seen:  # colocated roles share a process
                    seen.add(pid)
                    parts.append(f"--- role {role!r} rank {rank} (pid {pid}) ---\n{text}")
        return "\n".join(parts)


def _print_and_exit(report: str) -> None:
    logger.critical(report)
    print(report, file=sys.stderr, flush=True)
    os._exit(STALL_EXIT_CODE)  # from the watchdog thread: the stuck main thread cannot be interrupted
