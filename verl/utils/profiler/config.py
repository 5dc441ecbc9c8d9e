"""What a worker's profiler records (verl's ``verl.utils.profiler.config``); see
:class:`~verl.utils.profiler.profile.DistProfiler`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["ProfilerConfig", "TorchProfilerToolConfig"]

TORCH_CONTENTS = ("cuda", "cpu", "memory", "shapes", "stack")


@dataclass
class TorchProfilerToolConfig:
    """``torch.profiler`` settings."""

    contents: list[str] = field(default_factory=list)
    """What to record besides the CPU (and CUDA) activity: ``memory``, ``shapes``, ``stack``."""
    discrete: bool = False
    """verl: one trace per task instead of one per step (not supported: one per step)."""
    name: str = "torch"

    def __post_init__(self) -> None:
        unknown = sorted(set(self.contents) - set(TORCH_CONTENTS))
        if unknown:
            raise ValueError(
                f"profiler tool_config.contents: expected some of {TORCH_CONTENTS}, got {unknown}"
            )


@dataclass
class ProfilerConfig:
    """Which ranks profile, with which tool, and where the traces go."""

    tool: str | None = None
    """``torch`` (torch.profiler); verl's ``nsys`` / ``npu`` / ``torch_memory`` are not supported."""
    enable: bool = False
    all_ranks: bool = False
    """Profile every rank (else those in ``ranks``; rank 0 when that is empty)."""
    ranks: list[int] = field(default_factory=list)
    save_path: str | None = None
    """Folder of the traces (``outputs/profile`` when None)."""
    tool_config: Any = None
    """The tool's settings, e.g. a :class:`TorchProfilerToolConfig`."""
    global_tool_config: Any = None
