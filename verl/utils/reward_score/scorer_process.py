"""What a scorer process runs: resolve the scoring function once, then score calls as they come.

The driver side is :class:`verl.workers.reward_manager.pool.ScoringPool`. The process is started as a
fresh interpreter (``python -c "...serve_fds(r, w)"``) rather than through ``multiprocessing``:
multiprocessing's spawn and forkserver contexts re-import the driver's ``__main__`` module in
every child (with ``python -m verl.trainer.main_ppo`` that is torch, Ray and the trainer, about a
second per process, paid again each time a hung scorer is replaced), while this module imports
only the scorers. A fresh interpreter is also safe next to Ray's threads (no fork of the driver).

Messages on the two pipes (``multiprocessing.connection`` framing, pickled):

* driver -> process: first a :class:`ScorerSpec`; then lists of ``(call_id, kwargs)``;
  ``None`` asks the process to exit.
* process -> driver: ``("ready", pid)`` or ``("failed", message)`` once; then one
  ``(call_id, ok, value_or_message)`` per call, in order.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from verl.utils import stacks

__all__ = ["ScorerLoadError", "ScorerSpec", "load_function_from_file", "serve", "serve_fds"]


class ScorerLoadError(RuntimeError):
    """The scoring function could not be loaded (missing file, import error, missing name)."""


@dataclass
class ScorerSpec:
    """How a process finds its scoring function; small and picklable, unlike a loaded module."""

    kind: str = "default"
    """default (per-row built-in) | default_batch (vectorised built-in) | file | callable."""
    path: str | None = None
    """For kind=file: the Python file that defines the function."""
    name: str | None = None
    """For kind=file: the function's name in that file."""
    fn: Callable[..., Any] | None = None
    """For kind=callable: a module-level function (pickled by reference)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments added to every call (custom_reward_function.reward_kwargs)."""

    def resolve(self) -> Callable[..., Any]:
        """The callable this spec names, with ``kwargs`` bound."""
        fn = self._function()
        if not self.kwargs:
            return fn
        extra = dict(self.kwargs)
        return lambda **call_kwargs: fn(**call_kwargs, **extra)

    def _function(self) -> Callable[..., Any]:
        from verl.utils.reward_score import default_compute_score, default_compute_score_batch

        if self.kind == "default":
            return default_compute_score
        if self.kind == "default_batch":
            return default_compute_score_batch
        if self.kind == "file":
            return load_function_from_file(self.path, self.name)
        if self.kind == "callable" and callable(self.fn):
            return self.fn
        raise ScorerLoadError(f"invalid scorer spec: kind={self.kind!r}, fn={self.fn!r}")


def load_function_from_file(
    path: str | None, name: str | None, key: str = "custom_reward_function"
) -> Callable[..., Any]:
    """Import ``path`` as a module and return its attribute ``name`` (a function or class);
    errors name ``<key>.path`` / ``<key>.name``."""
    file = Path(os.path.expanduser(path or ""))
    if not path or not file.is_file():
        raise ScorerLoadError(f"{key}.path: no such file {path!r}")
    # A stable, unique module name per file, registered in sys.modules so that objects defined
    # in the file (dataclasses, pickled results) resolve their module.
    module_name = "verl_user_module_" + hashlib.sha1(str(file.resolve()).encode()).hexdigest()[:12]
    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name, file)
        if spec is None or spec.loader is None:
            raise ScorerLoadError(f"{key}.path: {path!r} is not a Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as err:
            del sys.modules[module_name]
            raise ScorerLoadError(f"{key}.path: importing {path!r} failed: {err!r}") from err
    fn = getattr(module, name or "", None)
    if not callable(fn):
        names = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        raise ScorerLoadError(
            f"{key}.name: {path!r} has no function or class {name!r}; defined there: {names}"
        )
    return fn


def _run_one(fn: Callable[..., Any], call_id: int, kwargs: dict[str, Any]) -> tuple[int, bool, Any]:
    try:
        return call_id, True, fn(**kwargs)
    except Exception:
        return call_id, False, traceback.format_exc(limit=-3).strip()


def _send_result(conn: Connection, message: tuple[int, bool, Any]) -> None:
    try:
        conn.send(message)
    except Exception as err:  # the scorer returned something that cannot be pickled
        conn.send((message[0], False, f"unpicklable scorer result: {err!r}"))


def serve(reader: Connection, writer: Connection) -> None:
    """The process loop: load the scorer, report ready, then answer calls until told to stop."""
    spec = reader.recv()
    try:
        fn = spec.resolve()
    except Exception as err:
        writer.send(("failed", f"{type(err).__name__}: {err}"))
        return
    writer.send(("ready", os.getpid()))
    while True:
        try:
            batch = reader.recv()
        except EOFError:  # the driver closed the pipe or died
            return
        if batch is None:
            return
        for call_id, kwargs in batch:
            _send_result(writer, _run_one(fn, call_id, kwargs))


def _exit_when_orphaned(parent_pid: int, poll_s: float = 0.5) -> None:
    # A scorer stuck in a loop never reads the pipe again; if the driver is killed, this thread
    # still notices that the process was re-parented and ends it.
    while os.getppid() == parent_pid:
        time.sleep(poll_s)
    os._exit(0)


def serve_fds(read_fd: int, write_fd: int, parent_pid: int) -> None:
    """Entry point of the scorer process, given the pipe file descriptors the driver passed."""
    stacks.arm()  # a call that times out is reported with where it was stuck
    threading.Thread(target=_exit_when_orphaned, args=(parent_pid,), daemon=True).start()
    reader = Connection(read_fd, readable=True, writable=False)
    writer = Connection(write_fd, readable=False, writable=True)
    try:
        serve(reader, writer)
    finally:
        reader.close()
        writer.close()
