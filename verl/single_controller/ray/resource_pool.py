"""Resource pools: a set of Ray placement-group bundles, one per worker process.

``RayResourcePool(process_on_nodes=[n_per_node] * nnodes, use_gpu=...)`` reserves one
bundle per process (``{"GPU": 1, "CPU": c}`` with GPUs, ``{"CPU": c}`` without), one
placement group per node. ``ResourcePoolManager`` names pools and maps roles to them:
roles mapped to the same pool are colocated; roles on different pools are split.

With ``VERL_REUSE_WORKER_PROCESSES=1`` a driver that runs several trainings one after another (a
sweep in a notebook, a test session) keeps the worker processes of a finished run, with their
placement groups, and a later pool of the same shape starts its roles in them: the roles are
built anew, only the process start-up (Python, torch, imports: seconds per run on a CPU) is
saved. A process is kept only when its roles left it clean (see ``WorkerHost.release``).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group

__all__ = [
    "REUSE_ENV",
    "RayResourcePool",
    "ResourcePoolError",
    "ResourcePoolManager",
    "release_parked_workers",
    "reuse_enabled",
]

logger = logging.getLogger(__name__)

REUSE_ENV = "VERL_REUSE_WORKER_PROCESSES"

_PARKED: list[tuple[tuple, list[PlacementGroup], Any]] = []
"""Worker processes kept from finished runs: (pool shape, placement groups, hosts)."""


def reuse_enabled() -> bool:
    return os.environ.get(REUSE_ENV, "0") == "1"


def _ray_job() -> str:
    return ray.get_runtime_context().get_job_id() if ray.is_initialized() else ""


def release_parked_workers() -> int:
    """End the kept worker processes and give their bundles back; how many pools were kept."""
    _forget_other_sessions()
    count = len(_PARKED)
    while _PARKED:
        _, pgs, hosts = _PARKED.pop()
        hosts.kill()
        for pg in pgs:
            remove_placement_group(pg)
    return count


def _forget_other_sessions() -> None:
    """Kept processes belong to one Ray session; after ``ray.shutdown()`` they are gone already."""
    _PARKED[:] = [entry for entry in _PARKED if entry[0][0] == _ray_job()]


class ResourcePoolError(RuntimeError):
    """The cluster cannot provide what a pool asks for."""


class RayResourcePool:
    """Bundles for ``sum(process_on_nodes)`` worker processes.

    Args:
        process_on_nodes: worker processes per node (``[n_gpus_per_node] * nnodes``).
        use_gpu: one GPU per bundle; without GPUs the same code reserves CPU bundles.
        name_prefix: prefix of the placement groups' names (shown in the Ray dashboard).
        max_colocate_count: how many separately created worker groups may share each bundle.
        cpus_per_process: CPUs reserved per bundle (fractions allowed).
        size_key: the config key that sets the pool's size, named when the cluster cannot hold it.
    """

    def __init__(
        self,
        process_on_nodes: list[int],
        use_gpu: bool = True,
        name_prefix: str = "verl",
        max_colocate_count: int = 1,
        cpus_per_process: float = 1.0,
        size_key: str = "trainer.n_gpus_per_node",
    ) -> None:
        if not process_on_nodes or any(n <= 0 for n in process_on_nodes):
            raise ValueError(f"process_on_nodes must list a positive count per node, got {process_on_nodes}")
        self.process_on_nodes = list(process_on_nodes)
        self.use_gpu = use_gpu
        self.name_prefix = name_prefix
        self.max_colocate_count = max_colocate_count
        self.cpus_per_process = cpus_per_process
        self.size_key = size_key
        self._pgs: list[PlacementGroup] | None = None
        self._warm_hosts: Any = None  # kept processes this pool's first worker group starts in

    @property
    def world_size(self) -> int:
        return sum(self.process_on_nodes)

    def bundle(self) -> dict[str, float]:
        bundle = {"CPU": self.cpus_per_process}
        if self.use_gpu:
            bundle["GPU"] = 1
        return bundle

    def placement_groups(self, timeout_s: float = 120.0) -> list[PlacementGroup]:
        """Create (once) and wait for this pool's placement groups, one per node."""
        if self._pgs is None and reuse_enabled():
            self._take_parked()
        if self._pgs is None:
            release_parked_workers()  # their bundles may be the ones this pool needs
            self._check_cluster_can_fit()
            strategy = "STRICT_PACK" if len(self.process_on_nodes) > 1 else "PACK"
            self._pgs = [
                placement_group(
                    [self.bundle() for _ in range(n)], strategy=strategy, name=f"{self.name_prefix}_node{i}"
                )
                for i, n in enumerate(self.process_on_nodes)
            ]
            ready, _ = ray.wait(
                [pg.ready() for pg in self._pgs], num_returns=len(self._pgs), timeout=timeout_s
            )
            if len(ready) != len(self._pgs):
                self.release()
                raise ResourcePoolError(
                    f"resource pool {self.name_prefix!r}: placement groups for {self.process_on_nodes} x "
                    f"{self.bundle()} not ready after {timeout_s:.0f}s; available now: "
                    f"{ray.available_resources()}"
                )
        return self._pgs

    def bundle_slots(self) -> list[tuple[PlacementGroup, int]]:
        """``(placement_group, bundle_index)`` for each global rank, in rank order."""
        return [(pg, i) for pg, n in zip(self.placement_groups(), self.process_on_nodes) for i in range(n)]

    def release(self) -> None:
        """Remove the placement groups (their bundles go back to the cluster)."""
        if self._warm_hosts is not None:
            self._warm_hosts.kill()
            self._warm_hosts = None
        for pg in self._pgs or []:
            remove_placement_group(pg)
        self._pgs = None

    # ------------------------------------------------------------------ process reuse
    def shape(self) -> tuple:
        """What a kept process must match to host this pool's ranks (in this Ray session)."""
        return (
            _ray_job(),
            tuple(self.process_on_nodes),
            self.use_gpu,
            self.cpus_per_process,
            self.max_colocate_count,
        )

    def can_park(self) -> bool:
        """Whether this pool's processes may be kept for a later run (one group per bundle)."""
        return reuse_enabled() and self._pgs is not None and self.max_colocate_count == 1

    def park(self, hosts: Any) -> None:
        """Keep ``hosts`` (released, alive) and this pool's placement groups for a later pool of the
        same shape; this pool no longer owns them."""
        _PARKED.append((self.shape(), self._pgs, hosts))
        self._pgs = None
        logger.info("pool %r: %d worker processes kept for the next run", self.name_prefix, self.world_size)

    def take_warm_hosts(self) -> Any:
        """Kept processes this pool took over (once), or None."""
        hosts, self._warm_hosts = self._warm_hosts, None
        return hosts

    def _take_parked(self) -> None:
        _forget_other_sessions()
        for i, (shape, pgs, hosts) in enumerate(_PARKED):
            if shape == self.shape():
                del _PARKED[i]
                self._pgs, self._warm_hosts = pgs, hosts
                return

    def _check_cluster_can_fit(self) -> None:
        total = ray.cluster_resources()
        need_cpu = self.cpus_per_process * self.world_size
        if total.get("CPU", 0) < need_cpu:
            raise ResourcePoolError(
                f"resource pool {self.name_prefix!r} needs {need_cpu:g} CPUs "
                f"({self.world_size} processes x {self.cpus_per_process:g}) but the Ray cluster has "
                f"{total.get('CPU', 0):g}; lower {self.size_key} or the CPUs per process"
            )
        if self.use_gpu and total.get("GPU", 0) < self.world_size:
            raise ResourcePoolError(
                f"resource pool {self.name_prefix!r} needs {self.world_size} GPUs but the Ray cluster has "
                f"{total.get('GPU', 0):g}; set trainer.device=cpu or a smaller {self.size_key}"
            )


@dataclass
class ResourcePoolManager:
    """Named pools and which role runs on which pool.

    ``resource_pool_spec``: pool name -> processes per node, e.g. ``{"global_pool": [2]}``.
    ``mapping``: role name -> pool name, e.g. ``{"actor_rollout": "global_pool", "critic": "global_pool"}``.
    """

    resource_pool_spec: dict[str, list[int]]
    mapping: dict[str, str]
    use_gpu: bool = True
    cpus_per_process: float = 1.0
    pools: dict[str, RayResourcePool] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for role, pool in self.mapping.items():
            if pool not in self.resource_pool_spec:
                raise ValueError(
                    f"role {role!r} is mapped to unknown pool {pool!r}; pools: {list(self.resource_pool_spec)}"
                )

    def create_resource_pools(self) -> dict[str, RayResourcePool]:
        for name, process_on_nodes in self.resource_pool_spec.items():
            if name not in self.pools:
                self.pools[name] = RayResourcePool(
                    process_on_nodes,
                    use_gpu=self.use_gpu,
                    name_prefix=name,
                    cpus_per_process=self.cpus_per_process,
                )
        return self.pools

    def get_resource_pool(self, role: str) -> RayResourcePool:
        if role not in self.mapping:
            raise KeyError(f"role {role!r} has no resource pool; mapped roles: {list(self.mapping)}")
        return self.create_resource_pools()[self.mapping[role]]

    def roles_by_pool(self) -> dict[str, list[str]]:
        """Pool name -> the roles colocated on it, in mapping order."""
        grouped: dict[str, list[str]] = {}
        for role, pool in self.mapping.items():
            grouped.setdefault(pool, []).append(role)
        return grouped

    def release(self) -> None:
        for pool in self.pools.values():
            pool.release()
