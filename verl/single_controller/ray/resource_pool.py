"""Resource pools: a set of Ray placement-group bundles, one per worker process.

``RayResourcePool(process_on_nodes=[n_per_node] * nnodes, use_gpu=...)`` reserves one
bundle per process (``{"GPU": 1, "CPU": c}`` with GPUs, ``{"CPU": c}`` without), one
placement group per node. ``ResourcePoolManager`` names pools and maps roles to them:
roles mapped to the same pool are colocated; roles on different pools are split.

With ``VERL_REUSE_WORKER_PROCESSES=1`` a driver that runs several trainings one after another (a
sweep in a notebook, a test session) keeps the worker processes of a finished CPU run, and a later
pool of any shape starts its ranks in them (a kept process on the node of each bundle): the roles
are built anew, only the process start-up (Python, torch, imports: seconds per run on a CPU) is
saved. A process is kept only when its roles left it clean (see ``WorkerHost.release``). So that a
kept process holds no CPUs while it waits, the ranks of such a pool run beside its bundles on the
same nodes (``num_cpus=0``, pinned to the bundle's node) while the bundles reserve the CPUs; GPU
pools always run their ranks inside their bundles (the GPU a rank sees comes from its bundle).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.placement_group import (
    PlacementGroup,
    placement_group,
    placement_group_table,
    remove_placement_group,
)

from verl.single_controller.base.worker_group import ResourcePool

__all__ = [
    "MAX_KEPT_PROCESSES",
    "REUSE_ENV",
    "KeptProcess",
    "RayResourcePool",
    "ResourcePoolError",
    "ResourcePoolManager",
    "keep_processes",
    "release_parked_workers",
    "reuse_enabled",
    "take_kept_process",
]

logger = logging.getLogger(__name__)

REUSE_ENV = "VERL_REUSE_WORKER_PROCESSES"

MAX_KEPT_PROCESSES = 4
"""Kept processes at most (the oldest end first): each holds no CPU but its imports' memory."""


@dataclass
class KeptProcess:
    """A released worker process waiting for a later run (in the Ray session ``job``)."""

    job: str
    node_id: str
    max_concurrency: int  # fixed when Ray starts the actor: only a pool asking the same may take it
    actor: Any
    pid: int


_KEPT: list[KeptProcess] = []


def reuse_enabled() -> bool:
    return os.environ.get(REUSE_ENV, "0") == "1"


def _ray_job() -> str:
    return ray.get_runtime_context().get_job_id() if ray.is_initialized() else ""


def release_parked_workers() -> int:
    """End the kept worker processes; how many there were."""
    _forget_other_sessions()
    count = len(_KEPT)
    while _KEPT:
        ray.kill(_KEPT.pop().actor, no_restart=True)
    return count


def keep_processes(actors: list[Any], pids: list[int], node_ids: list[str], max_concurrency: int) -> None:
    """Keep released host actors for a later pool; past :data:`MAX_KEPT_PROCESSES` the oldest end."""
    _forget_other_sessions()
    job = _ray_job()
    # newest first is taken first: in reverse, so that a pool of the same shape gets each rank's process back
    kept = [KeptProcess(job, n, max_concurrency, a, p) for a, p, n in zip(actors, pids, node_ids)]
    _KEPT.extend(reversed(kept))
    while len(_KEPT) > MAX_KEPT_PROCESSES:
        ray.kill(_KEPT.pop(0).actor, no_restart=True)
    logger.info("%d worker processes kept for the next run", len(actors))


def take_kept_process(node_id: str, max_concurrency: int) -> KeptProcess | None:
    """A kept process on ``node_id`` started with ``max_concurrency`` (the newest), or None."""
    _forget_other_sessions()
    for i in reversed(range(len(_KEPT))):
        if _KEPT[i].node_id == node_id and _KEPT[i].max_concurrency == max_concurrency:
            return _KEPT.pop(i)
    return None


def _forget_other_sessions() -> None:
    """Kept processes belong to one Ray session; after ``ray.shutdown()`` they are gone already."""
    _KEPT[:] = [kept for kept in _KEPT if kept.job == _ray_job()]


class ResourcePoolError(RuntimeError):
    """The cluster cannot provide what a pool asks for."""


class RayResourcePool(ResourcePool):
    """Bundles for ``sum(process_on_nodes)`` worker processes.

    Args:
        process_on_nodes: worker processes per node (``[n_gpus_per_node] * nnodes``).
        use_gpu: one GPU per bundle; without GPUs the same code reserves CPU bundles.
        name_prefix: prefix of the placement groups' names (shown in the Ray dashboard).
        max_colocate_count: how many separately created worker groups may share each bundle (each
            takes that share of its CPUs and GPU). Default 1 (verl's is 10): roles meant to share a
            process are colocated in one group (``create_colocated_worker_groups``).
        detached: verl's detached placement groups; not supported (must be ``False``).
        accelerator_type: a custom Ray resource (``ray start --resources``) that every bundle's node
            must have: pins the pool to those nodes.
        cpus_per_process: CPUs reserved per bundle (fractions allowed).
        size_key: the config key that sets the pool's size, named when the cluster cannot hold it.
    """

    def __init__(
        self,
        process_on_nodes: list[int] | None = None,
        use_gpu: bool = True,
        name_prefix: str | None = None,
        max_colocate_count: int = 1,
        detached: bool = False,
        accelerator_type: str | None = None,
        cpus_per_process: float = 1.0,
        size_key: str = "trainer.n_gpus_per_node",
    ) -> None:
        if not process_on_nodes or any(n <= 0 for n in process_on_nodes):
            raise ValueError(f"process_on_nodes must list a positive count per node, got {process_on_nodes}")
        if detached:
            raise ValueError(
                "RayResourcePool(detached=True) is not supported: a pool's placement groups end with the driver"
            )
        if max_colocate_count < 1:
            raise ValueError(f"max_colocate_count must be at least 1, got {max_colocate_count}")
        super().__init__(process_on_nodes, max_colocate_count)
        self.use_gpu = use_gpu
        self.name_prefix = "verl" if name_prefix is None else name_prefix
        self.detached = detached
        self.accelerator_type = accelerator_type
        self.cpus_per_process = cpus_per_process
        self.size_key = size_key
        self._pgs: list[PlacementGroup] | None = None
        self._groups_placed = 0

    def claim_share(self) -> None:
        """Take one of the ``max_colocate_count`` shares of every bundle for a new group of processes."""
        if self._groups_placed >= self.max_colocate_count:
            raise ResourcePoolError(
                f"resource pool {self.name_prefix!r} already holds {self._groups_placed} worker group(s), its "
                f"max_colocate_count; pass RayResourcePool(max_colocate_count=...) for more groups on it, or "
                f"colocate the roles in one process (create_colocated_worker_cls)"
            )
        self._groups_placed += 1

    def release_share(self) -> None:
        """A group's processes ended: their share of the bundles is free again."""
        self._groups_placed = max(0, self._groups_placed - 1)

    def bundle(self) -> dict[str, float]:
        bundle = {"CPU": self.cpus_per_process}
        if self.use_gpu:
            bundle["GPU"] = 1
        if self.accelerator_type is not None:
            bundle[self.accelerator_type] = 1e-4  # a token amount: only selects the nodes
        return bundle

    def placement_groups(self, timeout_s: float = 120.0) -> list[PlacementGroup]:
        """Create (once) and wait for this pool's placement groups, one per node."""
        if self._pgs is None:
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

    def bundle_nodes(self) -> list[str]:
        """The node id of each global rank's bundle, in rank order."""
        tables = [placement_group_table(pg)["bundles_to_node_id"] for pg in self.placement_groups()]
        return [tables[i][b] for i, n in enumerate(self.process_on_nodes) for b in range(n)]

    def release(self) -> None:
        """Remove the placement groups (their bundles go back to the cluster)."""
        for pg in self._pgs or []:
            remove_placement_group(pg)
        self._pgs = None

    # ------------------------------------------------------------------ process reuse
    def keeps_processes(self) -> bool:
        """Whether this pool's ranks run beside its bundles, so that their processes may outlive the
        pool and be kept for a later run (``VERL_REUSE_WORKER_PROCESSES=1``, CPU pools)."""
        return reuse_enabled() and not self.use_gpu

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

    def create_resource_pool(self) -> None:
        """verl's name: create the pools (once)."""
        self.create_resource_pools()

    @property
    def resource_pool_dict(self) -> dict[str, RayResourcePool]:
        """verl's name for :attr:`pools`."""
        return self.pools

    def get_n_gpus(self) -> int:
        """Processes over all pools (one device each on GPUs)."""
        return sum(sum(nodes) for nodes in self.resource_pool_spec.values())

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
