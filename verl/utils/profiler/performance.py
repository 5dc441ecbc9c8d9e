"""Phase timers and device-memory logging (verl's ``verl.utils.profiler.performance``).

``simple_timer(name, timing_raw)`` adds the seconds its block took to ``timing_raw[name]``; the
trainer reports such a dict as ``timing_s/<name>``. ``marked_timer`` is the same timer (verl adds an
NVTX range with it when nsys profiling is on; profiling is not supported here). Both work on CPU.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["GPUMemoryLogger", "log_gpu_memory_usage", "marked_timer", "reduce_timing", "simple_timer"]

_GB = 1024**3


@contextmanager
def simple_timer(name: str, timing_raw: dict[str, float]) -> Iterator[None]:
    """Add the wall-clock seconds of the block to ``timing_raw[name]`` (0 when absent)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        timing_raw[name] = timing_raw.get(name, 0.0) + time.perf_counter() - start


@contextmanager
def marked_timer(
    name: str,
    timing_raw: dict[str, float],
    color: str | None = None,
    domain: str | None = None,
    category: str | None = None,
) -> Iterator[None]:
    """:func:`simple_timer`; ``color`` / ``domain`` / ``category`` describe a profiler range in verl
    and are accepted for its callers."""
    with simple_timer(name, timing_raw):
        yield


def reduce_timing(
    timing_raw: dict[str, float], reduce_op: dist.ReduceOp = dist.ReduceOp.AVG
) -> dict[str, float]:
    """``timing_raw`` combined over every rank of the default group (``AVG``: the mean, ``MAX``,
    ``MIN``, ``SUM``); unchanged outside ``torch.distributed``."""
    if not dist.is_initialized():
        return timing_raw
    keys = sorted(timing_raw)
    values = torch.tensor([timing_raw[k] for k in keys], dtype=torch.float64)
    average = reduce_op == dist.ReduceOp.AVG  # gloo has no AVG: sum, then divide
    dist.all_reduce(values, op=dist.ReduceOp.SUM if average else reduce_op)
    if average:
        values /= dist.get_world_size()
    return dict(zip(keys, values.tolist()))


def _memory_gb() -> tuple[float, float, float, float]:
    """(allocated, reserved, used on the device, device total) in GB; zeros without CUDA."""
    if not torch.cuda.is_available():
        return 0.0, 0.0, 0.0, 0.0
    free, total = torch.cuda.mem_get_info()
    allocated, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    return allocated / _GB, reserved / _GB, (total - free) / _GB, total / _GB


def _memory_message(head: str) -> str:
    allocated, reserved, used, total = _memory_gb()
    return (
        f"{head}, memory allocated (GB): {allocated:.2f}, memory reserved (GB): {reserved:.2f}, "
        f"device memory used/total (GB): {used:.2f}/{total:.2f}"
    )


def log_gpu_memory_usage(
    head: str, logger: logging.Logger | None = None, level: int = logging.DEBUG, rank: int | None = 0
) -> None:
    """Log the device's memory figures after ``head`` (to ``logger`` at ``level``, else print), on
    rank ``rank`` only (every rank with None). Without CUDA the figures are 0."""
    if dist.is_initialized() and rank is not None and dist.get_rank() != rank:
        return
    message = _memory_message(head)
    if logger is None:
        print(message)
    else:
        logger.log(level, message)


class GPUMemoryLogger:
    """A decorator that logs the device's memory before and after each call of the function.

    >>> @GPUMemoryLogger(role="actor")
    ... def update_actor(batch): ...
    """

    def __init__(
        self,
        role: str,
        logger: logging.Logger | None = None,
        level: int = logging.DEBUG,
        log_only_rank_0: bool = True,
    ) -> None:
        self.role, self.logger, self.level = role, logger, level
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.log_only_rank_0 = log_only_rank_0

    def __call__(self, function: Callable) -> Callable:
        @functools.wraps(function)
        def logged(*args: Any, **kwargs: Any) -> Any:
            return self.log(function, *args, **kwargs)

        return logged

    def log(self, function: Callable, *args: Any, **kwargs: Any) -> Any:
        self._emit(f"Before {function.__name__}")
        output = function(*args, **kwargs)
        self._emit(f"After {function.__name__}")
        return output

    def _emit(self, head: str) -> None:
        if self.log_only_rank_0 and self.rank != 0:
            return
        message = f"[{self.role}] {_memory_message(head)}"
        if self.logger is None:
            print(message)
        else:
            self.logger.log(self.level, message)
