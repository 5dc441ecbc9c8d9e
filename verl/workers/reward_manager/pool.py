"""A pool of scorer processes with a per-call timeout.

Rule scorers run user code on model output; a scorer can raise, loop for ever or crash its
interpreter. The pool turns each of those into a scored-zero outcome instead of a stalled or
dead training run:

* a call that raises -> ``ScoreOutcome("error", message=traceback)``;
* a call still running ``timeout_s`` after it started -> ``"timeout"``; its process is killed
  (SIGKILL) and replaced, and the calls queued behind it go to other processes;
* a process that dies mid-call -> ``"error"``, and it is replaced.

Processes are fresh interpreters running :mod:`verl.utils.reward_score.scorer_process` (see
there why not ``multiprocessing``), talking over two pipes. Calls go out in small chunks and
results come back one by one, so the timeout applies to each call. ``close()`` stops the
processes; a finalizer does the same at interpreter exit if ``close()`` was never called.

With ``num_workers=0`` calls run in the calling process: errors are still caught and counted,
but timeouts cannot be enforced (there is no process to kill).

One caller at a time: ``map`` is not meant to be called from several threads at once.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import pickle
import subprocess
import sys
import time
import weakref
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from verl.utils import stacks
from verl.utils.reward_score.scorer_process import ScorerLoadError, ScorerSpec

__all__ = ["ScoreOutcome", "ScorerLoadError", "ScoringPool", "check_picklable"]

logger = logging.getLogger(__name__)

_MAX_CHUNK = 32
_BOOT = "import sys; from verl.utils.reward_score.scorer_process import serve_fds; serve_fds(*map(int, sys.argv[1:4]))"


@dataclass
class ScoreOutcome:
    """Result of one scorer call."""

    status: str
    """ok | error | timeout."""
    value: Any = None
    """What the scorer returned (status ok only)."""
    message: str = ""
    """Why the call failed (status error/timeout)."""


class _Process:
    """One scorer process and the calls it is working through."""

    def __init__(self, spec: ScorerSpec, startup_timeout_s: float) -> None:
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(_python_path())
        self.popen = subprocess.Popen(
            [sys.executable, "-c", _BOOT, str(to_child_r), str(from_child_w), str(os.getpid())],
            pass_fds=(to_child_r, from_child_w),
            env=env,
            start_new_session=True,  # Ctrl-C reaches the driver only; the driver stops the pool
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self.writer = Connection(to_child_w, readable=False, writable=True)
        self.reader = Connection(from_child_r, readable=True, writable=False)
        self.pending: deque[int] = deque()
        self.deadline = math.inf
        self.ready = False
        self.startup_deadline = time.monotonic() + startup_timeout_s
        # If the process died at once, sending fails and wait_ready() reports its exit code.
        with contextlib.suppress(OSError):
            self.writer.send(spec)

    def wait_ready(self) -> None:
        """Block until the process reports that its scorer is loaded; raise if it cannot load it."""
        if self.ready:
            return
        remaining = max(0.0, self.startup_deadline - time.monotonic())
        if not self.reader.poll(remaining):
            raise RuntimeError(f"scorer process {self.popen.pid} did not start within the startup timeout")
        try:
            status, detail = self.reader.recv()
        except EOFError:
            raise RuntimeError(f"scorer process exited during startup (code {self.popen.wait()})") from None
        if status != "ready":
            raise ScorerLoadError(detail)
        self.ready = True

    def assign(self, call_ids: list[int], calls: Sequence[dict[str, Any]], timeout_s: float) -> None:
        self.pending.extend(call_ids)
        self.deadline = time.monotonic() + timeout_s
        self.writer.send([(i, calls[i]) for i in call_ids])

    def stop(self, kill: bool) -> None:
        if not kill:
            try:
                self.writer.send(None)
                self.popen.wait(timeout=1.0)
            except (OSError, subprocess.TimeoutExpired):
                kill = True
        if kill and self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()
        self.writer.close()
        self.reader.close()


def _python_path() -> list[str]:
    # The child needs to import verl (and modules of user callables) even when verl is not
    # installed but found through the driver's working directory or sys.path.
    verl_root = str(Path(__file__).resolve().parents[3])
    paths = [verl_root] + [p for p in sys.path if p]
    return list(dict.fromkeys(paths))


def _kill_all(processes: list[_Process]) -> None:
    for proc in processes:
        if proc.popen.poll() is None:
            proc.popen.kill()
            proc.popen.wait()


class ScoringPool:
    """Runs ``spec``'s scoring function over many calls, in ``num_workers`` processes."""

    def __init__(
        self,
        spec: ScorerSpec,
        num_workers: int = 1,
        timeout_s: float = 10.0,
        startup_timeout_s: float = 120.0,
    ) -> None:
        if num_workers < 0 or timeout_s <= 0:
            raise ValueError(f"need num_workers >= 0 and timeout_s > 0, got {num_workers}, {timeout_s}")
        self.spec, self.num_workers, self.timeout_s = spec, num_workers, timeout_s
        self.startup_timeout_s = startup_timeout_s
        self._inline_fn = spec.resolve() if num_workers == 0 else None
        if num_workers > 0:
            check_picklable(spec)
        self._processes: list[_Process] = [_Process(spec, startup_timeout_s) for _ in range(num_workers)]
        self._finalizer = weakref.finalize(self, _kill_all, self._processes)

    # ------------------------------------------------------------------ public
    def map(self, calls: Sequence[dict[str, Any]]) -> list[ScoreOutcome]:
        """Call the scorer with each kwargs dict; outcomes in the same order as ``calls``."""
        if not calls:
            return []
        if self._inline_fn is not None:
            return [self._call_inline(kwargs) for kwargs in calls]
        self.wait_ready()
        results: list[ScoreOutcome | None] = [None] * len(calls)
        queue = deque(range(len(calls)))
        chunk = max(1, min(_MAX_CHUNK, math.ceil(len(calls) / (4 * len(self._processes)))))
        while queue or any(p.pending for p in self._processes):
            for proc in self._processes:
                if not proc.pending and queue:
                    ids = [queue.popleft() for _ in range(min(chunk, len(queue)))]
                    proc.assign(ids, calls, self.timeout_s)
            self._collect(results, queue)
        return results  # type: ignore[return-value]

    def wait_ready(self) -> None:
        """Block until every process has loaded its scorer (``map`` does this itself)."""
        if self._inline_fn is None and not self._processes:
            raise RuntimeError("the scoring pool is closed")
        for proc in self._processes:
            proc.wait_ready()

    def close(self) -> None:
        """Stop every process (politely, then by force); the pool cannot be used afterwards."""
        processes, self._processes = list(self._processes), []
        for proc in processes:
            proc.stop(kill=False)
        self._finalizer.detach()

    def __enter__(self) -> ScoringPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pids(self) -> list[int]:
        """Process ids of the live scorer processes (for tests and debugging)."""
        return [p.popen.pid for p in self._processes]

    # ------------------------------------------------------------------ internals
    def _call_inline(self, kwargs: dict[str, Any]) -> ScoreOutcome:
        try:
            return ScoreOutcome("ok", self._inline_fn(**kwargs))
        except Exception as err:
            return ScoreOutcome("error", message=f"{type(err).__name__}: {err}")

    def _collect(self, results: list[ScoreOutcome | None], queue: deque[int]) -> None:
        busy = [p for p in self._processes if p.pending]
        if not busy:
            return
        wait_s = max(0.0, min(p.deadline for p in busy) - time.monotonic())
        readable = set(wait([p.reader for p in busy], timeout=wait_s))
        for proc in busy:
            if proc.reader in readable:
                self._drain(proc, results, queue)
            elif time.monotonic() >= proc.deadline:
                where = stacks.read_dump(proc.popen.pid, wait_s=5.0)
                message = (
                    f"scorer call exceeded {self.timeout_s}s; its process was killed and replaced. "
                    f"It was at:\n{where}"
                )
                self._replace(proc, results, queue, ScoreOutcome("timeout", message=message))

    def _drain(self, proc: _Process, results: list[ScoreOutcome | None], queue: deque[int]) -> None:
        while proc.pending and proc.reader.poll():
            try:
                call_id, ok, value = proc.reader.recv()
            except (EOFError, OSError):
                code = proc.popen.wait()
                outcome = ScoreOutcome("error", message=f"scorer process died mid-call (exit code {code})")
                self._replace(proc, results, queue, outcome)
                return
            expected = proc.pending.popleft()
            if call_id != expected:
                raise RuntimeError(f"scorer process answered call {call_id}, expected {expected}")
            results[call_id] = ScoreOutcome("ok", value) if ok else ScoreOutcome("error", message=value)
            proc.deadline = time.monotonic() + self.timeout_s

    def _replace(
        self, proc: _Process, results: list[ScoreOutcome | None], queue: deque[int], outcome: ScoreOutcome
    ) -> None:
        """Record ``outcome`` for the call ``proc`` was on, requeue its other calls, restart it."""
        results[proc.pending.popleft()] = outcome
        queue.extendleft(reversed(proc.pending))
        proc.pending.clear()
        logger.warning("reward scorer process %d replaced after a %s", proc.popen.pid, outcome.status)
        proc.stop(kill=True)
        fresh = _Process(self.spec, self.startup_timeout_s)
        self._processes[self._processes.index(proc)] = fresh
        fresh.wait_ready()


def check_picklable(spec: ScorerSpec) -> None:
    """Raise ``ValueError`` unless ``spec`` can be sent to a scorer process."""
    try:
        pickle.dumps(spec)
    except Exception as err:
        raise ValueError(
            f"compute_score {spec.fn!r} cannot be sent to scorer processes ({err}); use a module-level "
            "function, custom_reward_function.path, or reward_model.scoring.num_workers=0"
        ) from err
