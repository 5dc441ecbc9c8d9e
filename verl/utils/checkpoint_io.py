"""Reading checkpoint files with errors a user can act on.

A truncated or corrupt file (``driver.pt``, a DCP shard, a safetensors file) otherwise surfaces as
a raw deserialisation error. :class:`CheckpointReadError` names the file, the step it belongs to,
and how to resume from the previous complete step instead. Used by the driver
(``verl.trainer.ppo.checkpoint``), the training engine and model loading.

The step-directory layout is defined here (``global_step_N/``, ``driver.pt`` marks a complete
one) so that workers and utilities can describe it without importing the trainer.
"""

from __future__ import annotations

import os
import re
from typing import Any

import torch

__all__ = [
    "DRIVER_FILE",
    "POINTER_FILE",
    "STEP_DIR",
    "CheckpointReadError",
    "find_truncated_dcp_file",
    "find_unreadable_safetensors",
    "read_error",
    "torch_load",
]

DRIVER_FILE = "driver.pt"
POINTER_FILE = "latest_checkpointed_iteration.txt"
"""In a run's checkpoint root: the number of the newest complete ``global_step_N``, written last."""
STEP_DIR = re.compile(r"^global_step_(\d+)$")


class CheckpointReadError(RuntimeError):
    """A checkpoint or model file could not be read; the message names it and a way out."""


def _step_of(path: str) -> tuple[str, int] | None:
    """(root, N) for the nearest ``global_step_N`` directory at or above ``path``."""
    path = os.path.abspath(path)
    while True:
        match = STEP_DIR.match(os.path.basename(path))
        if match:
            return os.path.dirname(path), int(match.group(1))
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent


def _previous_complete_step(root: str, step: int) -> int | None:
    if not os.path.isdir(root):
        return None
    steps = [
        int(m.group(1))
        for name in os.listdir(root)
        if (m := STEP_DIR.match(name)) and int(m.group(1)) < step
        if os.path.isfile(os.path.join(root, name, DRIVER_FILE))
    ]
    return max(steps, default=None)


def read_error(file: str, error: BaseException) -> CheckpointReadError:
    """The error to raise when ``file`` cannot be read: the file, its step, and how to go on."""
    message = f"cannot read {file}: it is truncated or corrupt ({type(error).__name__}: {error})"
    located = _step_of(file)
    if located is not None:
        root, step = located
        previous = _previous_complete_step(root, step)
        if previous is None:
            hint = f"there is no earlier complete checkpoint in {root}; start afresh with trainer.resume_mode=disable"
        else:
            path = os.path.join(root, f"global_step_{previous}")
            hint = (
                f"resume from the previous step with trainer.resume_mode=resume_path "
                f"trainer.resume_from_path={path}"
            )
        message += f". It belongs to the checkpoint of step {step}; {hint}"
    return CheckpointReadError(message)


def torch_load(path: str) -> Any:
    """``torch.load`` of a file this project wrote (driver state, RNG states, LR schedule)."""
    try:
        return torch.load(path, weights_only=False)
    except FileNotFoundError:
        raise
    except Exception as error:  # unpickling raises many types: EOFError, RuntimeError, UnpicklingError
        raise read_error(path, error) from error


def find_truncated_dcp_file(folder: str) -> str | None:
    """The first file of a ``torch.distributed.checkpoint`` folder that cannot hold what the
    metadata says it holds (or the metadata file itself when it is unreadable); None if all fit."""
    from torch.distributed.checkpoint import FileSystemReader

    try:
        metadata = FileSystemReader(folder).read_metadata()
    except Exception:
        return os.path.join(folder, ".metadata")
    needed: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    for relative, size in sorted(needed.items()):
        path = os.path.join(folder, relative)
        if not os.path.isfile(path) or os.path.getsize(path) < size:
            return path
    return None


def find_unreadable_safetensors(folder: str) -> str | None:
    """The first ``*.safetensors`` file in ``folder`` whose header or data cannot be read."""
    from safetensors import safe_open

    if not os.path.isdir(folder):
        return None
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".safetensors"):
            continue
        path = os.path.join(folder, name)
        try:
            with safe_open(path, framework="pt") as f:
                for key in f.keys():
                    f.get_slice(key)  # checks the tensor's byte range against the file size
        except Exception:
            return path
    return None
