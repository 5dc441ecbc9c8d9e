"""Ray backend of the single controller: resource pools and worker groups."""

from verl.single_controller.ray.base import (
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    ResourcePoolManager,
    WorkerHost,
    create_colocated_worker_cls,
    create_colocated_worker_cls_fused,
    create_colocated_worker_groups,
)
from verl.single_controller.ray.resource_pool import ResourcePoolError, release_parked_workers

__all__ = [
    "RayClassWithInitArgs",
    "RayResourcePool",
    "RayWorkerGroup",
    "ResourcePoolError",
    "ResourcePoolManager",
    "WorkerHost",
    "create_colocated_worker_cls",
    "create_colocated_worker_cls_fused",
    "create_colocated_worker_groups",
    "release_parked_workers",
]
