"""Which accelerator this process has (verl's ``verl.utils.device``): CUDA or none (CPU).

Ascend NPUs are not supported here, so ``is_npu_available`` is always False.
"""

from __future__ import annotations

import torch

__all__ = ["get_device_id", "get_device_name", "get_nccl_backend", "get_resource_name", "get_torch_device"]
__all__ += ["get_visible_devices_keyword", "is_cuda_available", "is_npu_available"]

is_cuda_available: bool = torch.cuda.is_available()
"""Whether CUDA is usable in this process (a value, as in verl, not a function)."""
is_npu_available: bool = False


def get_device_name() -> str:
    """``"cuda"`` where CUDA is available, else ``"cpu"``."""
    return "cuda" if is_cuda_available else "cpu"


def get_torch_device():
    """The torch module of the device: ``torch.cuda`` or ``torch.cpu``."""
    return getattr(torch, get_device_name())


def get_device_id() -> int | str:
    """The current device's index (``torch.cuda.current_device()``); ``"cpu"`` without CUDA."""
    return get_torch_device().current_device()


def get_nccl_backend() -> str:
    """The collective backend for the device: ``nccl`` with CUDA, ``gloo`` on CPU."""
    return "nccl" if is_cuda_available else "gloo"


def get_resource_name() -> str:
    """Ray's name for the accelerator resource."""
    return "GPU"


def get_visible_devices_keyword() -> str:
    """The environment variable that restricts the visible devices."""
    return "CUDA_VISIBLE_DEVICES"
