"""``Worker``: the base class of every role (actor, rollout, reference, critic, reward model).

A worker learns its place in the group from environment variables that the worker group
sets before constructing it (the same ones ``torchrun`` uses, so a worker also runs
under ``torchrun`` or as a plain single process):

``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` and
``VERL_DEVICE`` (``cuda`` or ``cpu``: what the worker's resource bundle holds).
"""

from __future__ import annotations

import datetime
import os
import socket

import torch
import torch.distributed as dist

__all__ = ["Worker", "find_free_port", "node_ip_address"]


def find_free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def node_ip_address() -> str:
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except ImportError:  # pragma: no cover - ray is a core dependency
        pass
    return "127.0.0.1"


class Worker:
    """Rank, world size, rendezvous address and device of this process in its group."""

    def __init__(self) -> None:
        self.rank = int(os.environ.get("RANK", "0"))
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.master_addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
        self.master_port = os.environ.get("MASTER_PORT", "")
        default_device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device_type = os.environ.get("VERL_DEVICE", default_device)

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
