"""Ray backend of the single controller: resource pools and worker groups."""

from verl.single_controller.ray.resource_pool import (
    RayResourcePool,
    ResourcePoolError,
    ResourcePoolManager,
    release_parked_workers,
)
from verl.single_controller.ray.worker_group import (
    RayClassWithInitArgs,
    RayWorkerGroup,
    WorkerHost,
    create_colocated_worker_groups,
)

__all__ = [
    "RayClassWithInitArgs",
    "RayResourcePool",
    "RayWorkerGroup",
    "ResourcePoolError",
    "ResourcePoolManager",
    "WorkerHost",
    "create_colocated_worker_groups",
    "release_parked_workers",
]
