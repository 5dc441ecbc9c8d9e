"""The driver's phases: each one timed under its name (``timing_s/<name>``), and named in the errors
of the worker calls inside it and in the step watchdog's report."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from verl.single_controller import WorkerGroupError


@contextmanager
def timed(name: str, timing: dict[str, float]) -> Iterator[None]:
    """Time a phase under ``timing_s/<name>``; a worker failure inside it names the phase (and so
    does the step watchdog's report, through :data:`PHASES`)."""
    start = time.perf_counter()
    PHASES.append(name)
    try:
        yield
    except WorkerGroupError as error:
        if not any(note.startswith("(in phase") for note in getattr(error, "__notes__", [])):
            error.add_note(f"(in phase {name!r})")  # the innermost phase names it
        raise
    finally:
        PHASES.pop()
    timing[name] = timing.get(name, 0.0) + time.perf_counter() - start


PHASES: list[str] = []
"""The driver's phases being timed now, outermost first."""
