"""Python stacks of stuck processes, so that a time-out explains itself.

Every worker process arms :mod:`faulthandler` on :data:`DUMP_SIGNAL` (:func:`arm`): on that
signal the interpreter writes the stack of every thread to the process's dump file, from C,
so it works even when the process is stuck in C code or holds the GIL. :func:`dump_remote`
sends the signal from a task pinned to the worker's node (so it works across machines) and
returns what was written.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

DUMP_SIGNAL = signal.SIGUSR2
_dump_file = None  # kept open for faulthandler, which writes to its file descriptor


def dump_path(pid: int) -> Path:
    """Where process ``pid`` writes its stacks (the node's temp directory)."""
    return Path(tempfile.gettempdir()) / f"verl-stacks-{os.getuid()}" / f"{pid}.txt"


def arm() -> None:
    """Make this process write all its threads' stacks to :func:`dump_path` on :data:`DUMP_SIGNAL`."""
    global _dump_file
    path = dump_path(os.getpid())
    path.parent.mkdir(parents=True, exist_ok=True)
    _dump_file = open(path, "a")  # append: a reader truncates, the next dump starts at 0  # noqa: SIM115
    faulthandler.register(DUMP_SIGNAL, file=_dump_file, all_threads=True, chain=False)


def read_dump(pid: int, wait_s: float = 10.0) -> str:
    """Signal local process ``pid`` and return the stacks it writes (waits until the file stops
    growing, at most ``wait_s``)."""
    path = dump_path(pid)
    if not path.exists():
        return f"(process {pid} has no stack dump file {path}: it was not armed, or it is not on this node)"
    with open(path, "r+") as f:
        f.truncate(0)
    try:
        os.kill(pid, DUMP_SIGNAL)
    except ProcessLookupError:
        return f"(process {pid} is gone)"
    deadline, size = time.monotonic() + wait_s, -1
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = path.stat().st_size
        if now > 0 and now == size:
            break
        size = now
    text = path.read_text(errors="replace").strip()
    return text or f"(process {pid} wrote no stacks within {wait_s:.0f}s)"


def dump_remote(pid: int, node_id: str | None, timeout_s: float = 30.0) -> str:
    """:func:`read_dump` of process ``pid`` run on its node (``node_id``: Ray's); never raises."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    try:
        options = {"num_cpus": 0}
        if node_id is not None:
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id, soft=False)
        return ray.get(ray.remote(read_dump).options(**options).remote(pid), timeout=timeout_s)
    except Exception as error:  # a dump is a courtesy: it must not hide the original error
        return f"(could not dump the stacks of process {pid}: {type(error).__name__}: {error})"


def format_own_stacks() -> str:
    """The stacks of every thread of this process but the calling one, as text."""
    names = {t.ident: t.name for t in threading.enumerate()}
    me = threading.get_ident()
    return "\n".join(
        f"Thread {names.get(ident, ident)!r}:\n" + "".join(traceback.format_stack(frame))
        for ident, frame in sys._current_frames().items()
        if ident != me
    )
