"""The single controller: worker methods registered with dispatch modes, driven as groups."""

from verl.single_controller.decorator import Dispatch, DispatchMode, Execute, MethodSpec, register
from verl.single_controller.worker import Worker
from verl.single_controller.worker_group import (
    WorkerDiedError,
    WorkerGroup,
    WorkerGroupError,
    WorkerGroupFuture,
    WorkerMethodError,
    WorkerTimeoutError,
)

__all__ = [
    "Dispatch",
    "DispatchMode",
    "Execute",
    "MethodSpec",
    "Worker",
    "WorkerDiedError",
    "WorkerGroup",
    "WorkerGroupError",
    "WorkerGroupFuture",
    "WorkerMethodError",
    "WorkerTimeoutError",
    "register",
]
