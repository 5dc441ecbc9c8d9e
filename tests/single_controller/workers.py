"""Small workers used by the single-controller tests (importable by Ray worker processes)."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from verl.protocol import DataProto
from verl.single_controller import Dispatch, Execute, Worker, register


class EchoWorker(Worker):
    def __init__(self, tag: str = "echo") -> None:
        super().__init__()
        self.tag = tag

    def process_reusable(self) -> bool:
        return True  # all its state is in this object: a later group may start in its process

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def whoami(self, suffix: str = "") -> tuple[int, int, str]:
        return self.rank, self.world_size, self.tag + suffix

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def add_rank(self, x: int) -> int:
        return x + self.rank

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def only_rank_zero(self, x: int) -> tuple[int, int]:
        return self.rank, x

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def broadcast_but_rank_zero(self, x: int) -> tuple[int, int]:
        return self.rank, x

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def double(self, data: DataProto) -> DataProto:
        out = DataProto.from_dict(
            {"y": data.batch["x"] * 2, "rank": torch.full((len(data),), self.rank)},
            {"uid": data.non_tensor_batch["uid"]},
        )
        return out

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def all_reduce_rank(self) -> float:
        self.init_process_group()
        t = torch.tensor([float(self.rank + 1)])
        dist.all_reduce(t)
        return float(t.item())

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sleep(self, seconds: float) -> int:
        time.sleep(seconds)
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def spin(self) -> int:
        _spin_forever_in_a_python_loop()
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def fail_on_rank(self, rank: int) -> int:
        if self.rank == rank:
            raise ValueError(f"boom on rank {rank}")
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def exit_on_rank(self, rank: int, delay_s: float = 0.5) -> int:
        time.sleep(delay_s)
        if self.rank == rank:
            os._exit(1)
        time.sleep(300)  # the other ranks stay busy, as in a collective waiting for the dead peer
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def bundle(self) -> str:
        import ray

        ctx = ray.get_runtime_context()
        return f"{ctx.get_placement_group_id()}:{ctx.get_assigned_resources()}"


def _spin_forever_in_a_python_loop() -> None:
    """A worker stuck in pure Python (the watchdog test looks for this name in its stack)."""
    x = 0
    while True:
        x += 1


class OtherRoleWorker(Worker):
    def process_reusable(self) -> bool:
        return True

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def role_name(self) -> str:
        return "other"
