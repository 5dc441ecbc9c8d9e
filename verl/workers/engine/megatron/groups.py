"""The processes' groups of the Megatron engine: ``torch.distributed`` (even on one rank) and
megatron-core's tensor / pipeline / data-parallel groups built on it, once per process group."""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from verl.config.base import ConfigError

if TYPE_CHECKING:
    from verl.config.megatron import MegatronConfig


def check_device(device: torch.device, key: str) -> None:
    """megatron-core 0.16 calls CUDA unconditionally in a few places (rotary tables, pipeline
    buffers, the optimizer): without a GPU it cannot run as it is. The tests run it on CPU behind a
    shim of their own (tests/megatron/cpu_shim.py), which answers ``torch.cuda.current_device()``."""
    if device.type == "cuda":
        return
    try:
        torch.cuda.current_device()
    except (AssertionError, RuntimeError) as error:
        raise ConfigError(
            f"{key}: the Megatron engine needs a CUDA GPU (megatron-core calls CUDA even for CPU tensors: "
            f"{error}); on CPU use strategy=fsdp"
        ) from None


def ensure_process_group(device: torch.device) -> None:
    """megatron-core needs ``torch.distributed`` even on one rank (the worker starts none there)."""
    if dist.is_initialized():
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=0,
        world_size=1,
    )


_GROUPS_OF = None
"""The process group megatron-core's groups were made in (a run in a reused process makes a new one)."""


def expert_sizes(megatron: MegatronConfig) -> tuple[int, int]:
    """(expert model, expert tensor) parallel sizes; the latter null means the tensor-parallel size,
    as in megatron-core."""
    etp = megatron.expert_tensor_parallel_size
    return megatron.expert_model_parallel_size, megatron.tensor_model_parallel_size if etp is None else etp


def init_model_parallel(megatron: MegatronConfig, key: str) -> None:
    """megatron-core's groups for this process (once; colocated roles must agree on the sizes)."""
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel

    tp, pp = megatron.tensor_model_parallel_size, megatron.pipeline_model_parallel_size
    ep, etp = expert_sizes(megatron)
    world = dist.get_world_size()
    if world % (tp * pp):
        raise ValueError(
            f"{key}: tensor_model_parallel_size x pipeline_model_parallel_size = {tp} x {pp} must divide "
            f"the role's {world} ranks"
        )
    if world % (etp * ep * pp):
        raise ValueError(
            f"{key}: expert_tensor_parallel_size x expert_model_parallel_size x pipeline_model_parallel_size "
            f"= {etp} x {ep} x {pp} must divide the role's {world} ranks"
        )
    global _GROUPS_OF
    if ps.model_parallel_is_initialized() and _GROUPS_OF is not dist.group.WORLD:
        ps.destroy_model_parallel()  # groups of an earlier run's process group (a reused worker process)
    if ps.model_parallel_is_initialized():
        have = (
            ps.get_tensor_model_parallel_world_size(),
            ps.get_pipeline_model_parallel_world_size(),
            ps.get_expert_model_parallel_world_size(),
            ps.get_expert_tensor_parallel_world_size(),
        )
        if have != (tp, pp, ep, etp):
            raise ValueError(
                f"{key}: (tensor, pipeline, expert, expert tensor) parallel sizes {(tp, pp, ep, etp)} differ "
                f"from {have} of a role in the same processes; colocated roles share one layout"
            )
        return
    ps.initialize_model_parallel(
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        expert_model_parallel_size=ep,
        expert_tensor_parallel_size=etp,
    )
    _GROUPS_OF = dist.group.WORLD
    tensor_parallel.model_parallel_cuda_manual_seed(megatron.seed)
