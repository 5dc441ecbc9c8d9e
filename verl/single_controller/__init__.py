"""The single controller: worker methods registered with dispatch modes, driven as groups.

The backend-independent parts live in ``verl.single_controller.base`` (``decorator``, ``worker``,
``worker_group``: verl's places), the Ray backend in ``verl.single_controller.ray``.
"""

from verl.single_controller.base.decorator import Dispatch, DispatchMode, Execute, MethodSpec, register
from verl.single_controller.base.worker import Worker
from verl.single_controller.base.worker_group import (
    ClassWithInitArgs,
    ResourcePool,
    WorkerDiedError,
    WorkerGroup,
    WorkerGroupError,
    WorkerGroupFuture,
    WorkerMethodError,
    WorkerTimeoutError,
)

__all__ = [
    "ClassWithInitArgs",
    "Dispatch",
    "DispatchMode",
    "Execute",
    "MethodSpec",
    "ResourcePool",
    "Worker",
    "WorkerDiedError",
    "WorkerGroup",
    "WorkerGroupError",
    "WorkerGroupFuture",
    "WorkerMethodError",
    "WorkerTimeoutError",
    "register",
]
