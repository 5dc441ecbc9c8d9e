"""The backend-independent single controller: workers, worker groups, what groups are built from."""

from verl.single_controller.base.worker import Worker
from verl.single_controller.base.worker_group import ClassWithInitArgs, ResourcePool, WorkerGroup

__all__ = ["ClassWithInitArgs", "ResourcePool", "Worker", "WorkerGroup"]
