"""A worker's step profiler (verl's ``DistProfiler``), with ``torch.profiler`` as its one tool.

A worker builds ``DistProfiler(rank, config)`` and the driver brackets the steps to profile with
``start(profile_step=N)`` / ``stop()``; the trace of each profiled step on each chosen rank goes to
``<save_path>/step<N>_rank<R>.json`` (open it in Perfetto or ``chrome://tracing``). Methods
decorated with ``DistProfiler.annotate(...)`` appear as named ranges in it. Disabled (the
default), every call is a no-op. verl's NVTX / Ascend markers are no-ops here
(``mark_start_range`` and friends).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import torch

from verl.utils.profiler.config import ProfilerConfig

__all__ = ["DistProfiler", "DistProfilerExtension", "mark_annotate", "mark_end_range", "mark_start_range"]


def mark_start_range(
    message: str | None = None,
    color: str | None = None,
    domain: str | None = None,
    category: str | None = None,
) -> None:
    """No-op (verl: open an NVTX range)."""


def mark_end_range(range_id: Any) -> None:
    """No-op (verl: close an NVTX range)."""


def mark_annotate(
    message: str | None = None,
    color: str | None = None,
    domain: str | None = None,
    category: str | None = None,
) -> Callable[[Callable], Callable]:
    """A decorator that returns the function unchanged (verl: an NVTX range around each call)."""
    return lambda function: function


class _TorchProfiler:
    """One ``torch.profiler.profile`` per profiled step."""

    def __init__(self, rank: int, config: ProfilerConfig, tool_config: Any) -> None:
        self.rank = rank
        self.folder = config.save_path or os.path.join("outputs", "profile")
        self.contents = set(getattr(tool_config, "contents", None) or [])
        self.profile: torch.profiler.profile | None = None
        self.step: int | None = None

    def start(self, profile_step: int | None = None, **kwargs: Any) -> None:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.step = profile_step
        self.profile = torch.profiler.profile(
            activities=activities,
            record_shapes="shapes" in self.contents,
            profile_memory="memory" in self.contents,
            with_stack="stack" in self.contents,
        )
        self.profile.__enter__()

    def stop(self) -> None:
        if self.profile is None:
            return
        self.profile.__exit__(None, None, None)
        os.makedirs(self.folder, exist_ok=True)
        step = "" if self.step is None else f"step{self.step}_"
        self.profile.export_chrome_trace(os.path.join(self.folder, f"{step}rank{self.rank}.json"))
        self.profile = None


class DistProfiler:
    """Profile the chosen ranks' steps with ``config.tool`` (``torch``); a no-op when disabled."""

    def __init__(
        self, rank: int, config: ProfilerConfig | None = None, tool_config: Any = None, **kwargs: Any
    ):
        config = config or ProfilerConfig()
        self.config, self.rank = config, rank
        self._enable = bool(config.enable)
        self._this_step = False
        if config.all_ranks:
            self._this_rank = True
        else:
            self._this_rank = rank in config.ranks if config.ranks else rank == 0
        self._impl: _TorchProfiler | None = None
        if not self._enable:
            return
        if config.tool != "torch":
            raise NotImplementedError(
                f"profiler tool {config.tool!r} is not supported here; set tool=torch (torch.profiler), "
                "or enable=False"
            )
        self._impl = _TorchProfiler(
            rank, config, tool_config if tool_config is not None else config.tool_config
        )

    def check_enable(self) -> bool:
        return self._enable

    def check_this_rank(self) -> bool:
        return self._this_rank

    def check_this_step(self) -> bool:
        return self._this_step

    def is_discrete_mode(self) -> bool:
        return False

    def start(self, **kwargs: Any) -> None:
        """Begin recording (``profile_step=N`` names the trace) on a chosen rank."""
        if self._enable and self._this_rank:
            self._this_step = True
            self._impl.start(**kwargs)

    def stop(self) -> None:
        """Stop recording and write the trace."""
        if self._enable and self._this_rank:
            self._this_step = False
            self._impl.stop()

    @classmethod
    def annotate(
        cls,
        message: str | None = None,
        color: str | None = None,
        domain: str | None = None,
        category: str | None = None,
        **kwargs: Any,
    ) -> Callable[[Callable], Callable]:
        """Decorate a worker method: while its worker's ``self.profiler`` records, each call is a
        range named ``message`` (default: the method's name) in the trace."""

        def decorate(method: Callable) -> Callable:
            @functools.wraps(method)
            def wrapper(self_instance: Any, *args: Any, **inner: Any) -> Any:
                profiler = getattr(self_instance, "profiler", None)
                if not (isinstance(profiler, DistProfiler) and profiler.check_this_step()):
                    return method(self_instance, *args, **inner)
                with torch.profiler.record_function(message or method.__name__):
                    return method(self_instance, *args, **inner)

            return wrapper

        return decorate


class DistProfilerExtension:
    """A mix-in giving a worker ``start_profile`` / ``stop_profile`` over its :class:`DistProfiler`.

    Unlike verl's, the two methods are not registered for dispatch from a worker group
    (``verl.utils`` cannot import the single controller): a worker class that wants the driver to
    call them registers them itself."""

    def __init__(self, profiler: DistProfiler) -> None:
        self.profiler = profiler

    def start_profile(self, **kwargs: Any) -> None:
        self.profiler.start(**kwargs)

    def stop_profile(self) -> None:
        self.profiler.stop()
