"""``Worker``: the base class of every role (actor, rollout, reference, critic, reward model).

A worker learns its place in the group from environment variables that the worker group
sets before constructing it (the same ones ``torchrun`` uses, so a worker also runs
under ``torchrun`` or as a plain single process):

``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``
and ``VERL_DEVICE`` (``cuda`` or ``cpu``: what the worker's resource bundle holds).
"""

from __future__ import annotations

import datetime
import os
import socket
from collections.abc import Callable
from typing import Any

import ray
import torch
import torch.distributed as dist

from verl.single_controller.base.decorator import Dispatch, register

__all__ = ["Worker", "find_free_port", "node_ip_address"]


def find_free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def node_ip_address() -> str:
    if ray.is_initialized():
        return ray.util.get_node_ip_address()
    return "127.0.0.1"


class Worker:
    """Rank, world size, rendezvous address and device of this process in its group.

    Args:
        cuda_visible_devices: when given, this process's ``CUDA_VISIBLE_DEVICES`` (verl's way for a
            worker to see the same devices as another one on its node).
    """

    def __init__(self, cuda_visible_devices: str | None = None) -> None:
        if cuda_visible_devices is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = str(cuda_visible_devices)
        # verl's attribute names: recipes written for verl read them directly
        self._rank = int(os.environ.get("RANK", "0"))
        self._world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self._local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self._local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        self._master_addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
        self._master_port = os.environ.get("MASTER_PORT", "")
        default_device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device_type = os.environ.get("VERL_DEVICE", default_device)
        self._dispatch_dp_rank: dict[str, int] = {}
        self._collect_dp_rank: dict[str, bool] = {}

    @property
    def rank(self) -> int:
        """This worker's rank in its group."""
        return self._rank

    @property
    def world_size(self) -> int:
        """The number of ranks in the group."""
        return self._world_size

    @property
    def local_rank(self) -> int:
        return self._local_rank

    @property
    def master_addr(self) -> str:
        return self._master_addr

    @property
    def master_port(self) -> str:
        return self._master_port

    def get_master_addr_port(self) -> tuple[str, str]:
        """The group's rendezvous address and port (rank 0's node, a free port there)."""
        return self._master_addr, self._master_port

    def get_cuda_visible_devices(self) -> str:
        """This process's ``CUDA_VISIBLE_DEVICES``, or ``"not set"``."""
        return os.environ.get("CUDA_VISIBLE_DEVICES", "not set")

    def process_reusable(self) -> bool:
        """Whether a later run in the same driver may reuse this worker's process once this worker
        is dropped (``VERL_REUSE_WORKER_PROCESSES=1``). Off unless a role says so: it must keep all
        of its state in the worker object (no threads, child processes or patched modules left)."""
        return False

    @property
    def device(self) -> torch.device:
        if self.device_type == "cuda":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device(self.device_type)

    def init_process_group(self, timeout_s: float = 600.0) -> None:
        """Join the group's ``torch.distributed`` group (gloo on CPU, nccl on CUDA).

        Colocated roles share one process and therefore one process group: the first role
        to call this creates it, later calls are no-ops.
        """
        if dist.is_initialized() or (self.world_size == 1 and not self.master_port):
            return
        if self.device_type == "cuda":
            torch.cuda.set_device(self.local_rank if torch.cuda.device_count() > 1 else 0)
        backend = "nccl" if self.device_type == "cuda" else "gloo"
        dist.init_process_group(
            backend=backend,
            init_method=f"tcp://{self.master_addr}:{self.master_port}",
            rank=self.rank,
            world_size=self.world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )

    def get_pid(self) -> int:
        return os.getpid()

    # ------------------------------------------------------------------ verl's mesh dispatch
    def _register_dispatch_collect_info(self, mesh_name: str, dp_rank: int, is_collect: bool) -> None:
        """Say which data-parallel rank of mesh ``mesh_name`` this worker is, and whether its outputs
        are collected (see ``make_nd_compute_dataproto_dispatch_fn``)."""
        if mesh_name in self._dispatch_dp_rank:
            raise ValueError(f"mesh {mesh_name!r} is already registered on rank {self.rank}")
        self._dispatch_dp_rank[mesh_name] = dp_rank
        self._collect_dp_rank[mesh_name] = is_collect

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def _query_dispatch_info(self, mesh_name: str) -> int:
        return self._mesh_entry(self._dispatch_dp_rank, mesh_name)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def _query_collect_info(self, mesh_name: str) -> bool:
        return self._mesh_entry(self._collect_dp_rank, mesh_name)

    def _mesh_entry(self, table: dict[str, Any], mesh_name: str) -> Any:
        if mesh_name not in table:
            raise KeyError(
                f"{type(self).__name__} rank {self.rank} never called "
                f"_register_dispatch_collect_info({mesh_name!r}, ...); registered: {sorted(table)}"
            )
        return table[mesh_name]

    # ------------------------------------------------------------------ verl's function runners
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO_WITH_FUNC)
    def execute_with_func_generator(self, func: Callable, *args: Any, **kwargs: Any) -> Any:
        """Run ``func(self, *chunk_args)`` on each rank with its chunk of the DataProto arguments."""
        return func(self, *args, **kwargs)

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def execute_func_rank_zero(self, func: Callable, *args: Any, **kwargs: Any) -> Any:
        """Run ``func(*args, **kwargs)`` in rank 0's process."""
        return func(*args, **kwargs)
