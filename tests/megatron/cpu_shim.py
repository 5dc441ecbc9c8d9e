"""Test-only shim: megatron-core 0.16.1 on CPU over gloo.

megatron-core calls CUDA unconditionally in a few places even when every tensor is on the CPU.
This module, imported only by the tests (and by the test session's Ray workers through
``worker_process_setup_hook``), changes exactly these things in the process it runs in:

* ``torch.cuda.current_device()`` returns ``"cpu"``, so the tensors megatron creates "on the current
  device" (rotary frequencies, p2p shape buffers, all-gather outputs) land on the CPU;
* ``torch.cuda.synchronize``, ``Stream``, ``Event``, ``stream()`` and ``current_stream()`` are
  no-ops or dummies (gloo is synchronous);
* the CUDA RNG state calls that megatron's RNG tracker makes (``get_rng_state``, ``set_rng_state``,
  ``manual_seed``) use the CPU generator;
* the MoE token dispatcher's split sizes, which megatron-core moves to numpy only from CUDA
  tensors, are converted from CPU tensors too (``all_to_all_single`` refuses tensors there);
* a ``TorchFunctionMode`` (pushed for the process) maps ``device="cuda"`` in factory functions and
  ``Tensor.cuda()`` to the CPU, and answers ``Tensor.type()`` with the CUDA type names megatron's
  optimizer checks (``torch.cuda.FloatTensor``).

Written for and pinned to megatron-core 0.16.1 (:data:`MEGATRON_CORE_VERSION`); :func:`install`
refuses another version. The product (``verl/``) never imports this module: on a GPU megatron-core
runs as it is.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.metadata
import importlib.util
import sys

import torch
from torch.overrides import TorchFunctionMode

MEGATRON_CORE_VERSION = "0.16.1"
_installed = False


def _cpu(device):
    if isinstance(device, torch.device) and device.type == "cuda":
        return torch.device("cpu")
    if isinstance(device, str) and device.startswith("cuda"):
        return torch.device("cpu")
    if isinstance(device, int):
        return torch.device("cpu")
    return device


_CUDA_TYPES = {
    "torch.FloatTensor": "torch.cuda.FloatTensor",
    "torch.HalfTensor": "torch.cuda.HalfTensor",
    "torch.BFloat16Tensor": "torch.cuda.BFloat16Tensor",
}


class _CudaAsCpu(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if "device" in kwargs:
            kwargs["device"] = _cpu(kwargs["device"])
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name = func(*args)
            return _CUDA_TYPES.get(name, name)
        if func is torch.Tensor.to and args and isinstance(args[-1], str | torch.device) and len(args) == 2:
            args = (args[0], _cpu(args[1]))
        return func(*args, **kwargs)


class _Dummy:
    def __init__(self, *args, **kwargs):
        pass

    def __getattr__(self, name):
        return lambda *args, **kwargs: _Dummy()  # an event recorded on a dummy stream is a dummy too

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _splits_to_host(tensor, as_numpy: bool = False, record_stream: bool = False):
    """megatron-core's ``maybe_move_tensor_to_cpu`` converts only CUDA tensors (to numpy where asked,
    what ``all_to_all_single`` takes as split sizes); on CPU the split sizes stay tensors, which the
    collective refuses. Here a CPU tensor is converted as a GPU one would be."""
    if torch.is_tensor(tensor) and as_numpy:
        return tensor.numpy()
    return tensor


def install() -> None:
    """Patch this process for megatron-core on CPU (idempotent)."""
    global _installed
    if _installed:
        return
    version = importlib.metadata.version("megatron-core")
    if version != MEGATRON_CORE_VERSION:
        raise RuntimeError(
            f"tests/megatron/cpu_shim.py was written for megatron-core {MEGATRON_CORE_VERSION}, found {version}"
        )
    cuda = torch.cuda
    cuda.current_device = lambda: "cpu"
    cuda.synchronize = lambda *args, **kwargs: None
    cuda.Stream = cuda.Event = _Dummy
    cuda.stream = lambda *args, **kwargs: contextlib.nullcontext()
    cuda.current_stream = lambda *args, **kwargs: _Dummy()
    cuda.get_rng_state = lambda *args, **kwargs: torch.get_rng_state()
    cuda.set_rng_state = lambda state, *args, **kwargs: torch.set_rng_state(state)
    cuda.manual_seed = torch.manual_seed
    from megatron.core.tensor_parallel import random as mrandom
    from megatron.core.transformer.moe import token_dispatcher

    token_dispatcher.maybe_move_tensor_to_cpu = _splits_to_host
    mrandom._get_cuda_rng_state = lambda *args, **kwargs: torch.get_rng_state()
    mrandom._set_cuda_rng_state = lambda state, *args, **kwargs: torch.set_rng_state(state)
    _CudaAsCpu().__enter__()
    _installed = True


class _InstallOnImport(importlib.abc.MetaPathFinder):
    """Installs the shim right after ``megatron.core`` is first imported in this process."""

    def find_spec(self, name, path, target=None):
        if name != "megatron.core":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            install()

        spec.loader.exec_module = exec_module
        return spec


def install_on_import() -> None:
    """Ray's ``worker_process_setup_hook``: processes that never import megatron-core stay untouched."""
    if "megatron.core" in sys.modules:
        install()
    elif not any(isinstance(f, _InstallOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _InstallOnImport())


def ray_runtime_env_hook(runtime_env: dict | None) -> dict:
    """Ray's ``RAY_RUNTIME_ENV_HOOK`` for a driver the tests start as a subprocess (``python -m
    verl.trainer.main_ppo``): its ``ray.init`` gets the hook above, as the test session's does."""
    return {**(runtime_env or {}), "worker_process_setup_hook": f"{__name__}.install_on_import"}
