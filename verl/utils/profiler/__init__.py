"""Timers, memory logging and the worker profiler at verl's path, ``verl.utils.profiler``."""

from verl.utils.profiler.config import ProfilerConfig, TorchProfilerToolConfig
from verl.utils.profiler.performance import (
    GPUMemoryLogger,
    log_gpu_memory_usage,
    marked_timer,
    reduce_timing,
    simple_timer,
)
from verl.utils.profiler.profile import (
    DistProfiler,
    DistProfilerExtension,
    mark_annotate,
    mark_end_range,
    mark_start_range,
)

__all__ = [
    "DistProfiler",
    "DistProfilerExtension",
    "GPUMemoryLogger",
    "ProfilerConfig",
    "TorchProfilerToolConfig",
    "log_gpu_memory_usage",
    "mark_annotate",
    "mark_end_range",
    "mark_start_range",
    "marked_timer",
    "reduce_timing",
    "simple_timer",
]
