"""Worker groups on Ray: one host actor per rank, holding one or several roles (verl's
``verl.single_controller.ray.base``: pools, classes with their arguments, groups, colocation).

Every rank of a pool is a Ray actor (a :class:`WorkerHost`) pinned to one bundle of the
pool's placement group. The host constructs the workers of the roles it carries, so roles
created together with :func:`create_colocated_worker_groups` share one process per device
(the "hybrid engine": actor, rollout and reference share memory), while the driver still
sees one :class:`RayWorkerGroup` per role. Roles on different pools are split placement.
verl's spelling of colocation works too::

    cls = create_colocated_worker_cls({"actor": RayClassWithInitArgs(A), "critic": RayClassWithInitArgs(C)})
    roles = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=cls).spawn(prefix_set={"actor", "critic"})

This module calls the ranks and collects their results; the processes themselves (start, set-up,
keep or kill) are :mod:`verl.single_controller.ray.worker_host`'s part.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from verl.protocol import DataProto
from verl.single_controller.base.worker_group import (
    WorkerDiedError,
    WorkerGroup,
    WorkerGroupError,
    WorkerMethodError,
    WorkerTimeoutError,
)
from verl.single_controller.ray.resource_pool import RayResourcePool, ResourcePoolManager
from verl.single_controller.ray.worker_host import (
    Hosts,
    RayClassWithInitArgs,
    WorkerHost,
    first_line,
    set_up,
    set_up_or_kill,
    start_hosts,
)
from verl.utils import stacks

logger = logging.getLogger(__name__)

PEER_GRACE_S = 60.0
"""After one rank raises, how long the other ranks get to reveal that one of them died (Ray
declares a lost node dead after its health checks fail, some seconds later)."""

GROUP_ENV = frozenset({"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"})
"""Environment variables the group sets on every rank; ``worker_env`` may not override them."""

__all__ = [
    "RayClassWithInitArgs",
    "RayResourcePool",
    "RayWorkerGroup",
    "ResourcePoolManager",
    "WorkerHost",
    "create_colocated_worker_cls",
    "create_colocated_worker_cls_fused",
    "create_colocated_worker_groups",
]


class ColocatedClasses(RayClassWithInitArgs):
    """Several roles to build in one process per rank (what :func:`create_colocated_worker_cls` returns)."""

    def __init__(self, class_dict: dict[str, RayClassWithInitArgs]) -> None:
        super().__init__(None)
        self.class_dict = dict(class_dict)

    def __call__(self) -> Any:
        raise TypeError("colocated roles are built by RayWorkerGroup(ray_cls_with_init=...), not called")


def create_colocated_worker_cls(class_dict: dict[str, RayClassWithInitArgs]) -> ColocatedClasses:
    """verl's colocation: roles that share one process per rank. Build the group with
    ``RayWorkerGroup(resource_pool=pool, ray_cls_with_init=<this>)``, then ``.spawn(prefix_set=roles)``
    gives one group per role (as :func:`create_colocated_worker_groups` does in one call)."""
    if not class_dict:
        raise ValueError("create_colocated_worker_cls needs at least one role")
    return ColocatedClasses(class_dict)


create_colocated_worker_cls_fused = create_colocated_worker_cls


class RayWorkerGroup(WorkerGroup):
    """The ranks of one role on Ray. Built by :func:`create_colocated_worker_groups` or directly,
    with verl's arguments (``role`` names the group in errors; it defaults to ``name_prefix``)::

        RayWorkerGroup(resource_pool=pool, ray_cls_with_init=RayClassWithInitArgs(MyWorker, cfg), role="actor")

    verl's arguments this backend cannot honour (``bin_pack=False``, ``detached=True``, attaching to
    existing actors by ``worker_names``/``worker_handles``, an ``npu`` device, profiling options) are
    refused with an error naming them. ``ray_wait_register_center_timeout`` bounds the ranks' start.
    """

    def __init__(
        self,
        resource_pool: RayResourcePool | None = None,
        ray_cls_with_init: RayClassWithInitArgs | None = None,
        bin_pack: bool = True,
        name_prefix: str | None = None,
        detached: bool = False,
        worker_names: list[str] | None = None,
        worker_handles: list[Any] | None = None,
        ray_wait_register_center_timeout: float = 300,
        *,
        role: str | None = None,
        call_timeout_s: float = 3600.0,
        max_concurrency: int = 1,
        device_name: str | None = None,
        worker_env: dict[str, str] | None = None,
        _hosts: Hosts | None = None,
        _worker_cls: type | None = None,
        **kwargs: Any,
    ) -> None:
        role = role or name_prefix or "worker"
        self._role_groups: dict[str, RayWorkerGroup] = {}
        if _hosts is None:
            if resource_pool is None or ray_cls_with_init is None:
                raise ValueError("RayWorkerGroup needs a resource_pool and a ray_cls_with_init")
            _refuse_unsupported(
                resource_pool, bin_pack, detached, worker_names, worker_handles, device_name, kwargs
            )
            class_dict = (
                ray_cls_with_init.class_dict
                if isinstance(ray_cls_with_init, ColocatedClasses)
                else {role: ray_cls_with_init}
            )
            groups = create_colocated_worker_groups(
                resource_pool,
                class_dict,
                call_timeout_s=call_timeout_s,
                max_concurrency=max_concurrency,
                setup_timeout_s=ray_wait_register_center_timeout,
                worker_env=worker_env,
            )
            _hosts = next(iter(groups.values()))._hosts
            if isinstance(ray_cls_with_init, ColocatedClasses):
                self._role_groups, role = groups, "+".join(groups)
            else:
                _worker_cls = ray_cls_with_init.cls
        super().__init__(role, len(_hosts.actors), call_timeout_s)
        self._hosts = _hosts
        self.method_names = self._bind_registered_methods(_worker_cls) if _worker_cls is not None else []
        for prefix, group in self._role_groups.items():  # verl's colocated group: "<role>_<method>"
            for name in group.method_names:
                setattr(self, f"{prefix}_{name}", getattr(group, name))

    def spawn(self, prefix_set: Iterable[str]) -> dict[str, RayWorkerGroup]:
        """The group of each role of a colocated group (built from :func:`create_colocated_worker_cls`);
        they all drive the same processes."""
        if not self._role_groups:
            raise TypeError(
                f"spawn() needs a group built from create_colocated_worker_cls; {self.role!r} holds one role"
            )
        unknown = sorted(set(prefix_set) - set(self._role_groups))
        if unknown:
            raise KeyError(f"spawn(): no role(s) {unknown} in this group; it holds {list(self._role_groups)}")
        return {prefix: self._role_groups[prefix] for prefix in prefix_set}

    def fuse(self, prefix_set: Iterable[str]) -> None:
        """verl's other access to the roles of a colocated group: ``group.<role>`` is that role's group."""
        for prefix, group in self.spawn(prefix_set).items():
            setattr(self, prefix, group)

    @property
    def workers(self) -> list[Any]:
        """The Ray actor handles, in rank order."""
        return self._hosts.actors

    @property
    def pids(self) -> list[int]:
        return self._hosts.pids

    def shutdown(self) -> None:
        """End this group's processes (and so every role colocated on them); with
        ``VERL_REUSE_WORKER_PROCESSES=1`` clean ones are kept for a later run instead."""
        self._hosts.close()

    def dump_stacks(self, ranks: list[int] | None = None) -> dict[int, str]:
        """The Python stack of every thread of each rank's process (all ranks by default), taken
        by a signal, so it works while the rank is stuck in a call."""
        ranks = range(self.world_size) if ranks is None else ranks
        return {r: stacks.dump_remote(self._hosts.pids[r], self._hosts.node_ids[r]) for r in ranks}

    def _submit(self, method: str, rank_calls: list[tuple[int, tuple[tuple, dict]]]) -> list[Any]:
        if not self._hosts.alive:
            raise WorkerDiedError(f"role {self.role!r}: cannot call {method}(), the group was shut down")
        role, method = self._target(method)
        rank_calls = _put_shared_args(rank_calls)
        refs = [self._hosts.actors[rank].call.remote(role, method, *a, **k) for rank, (a, k) in rank_calls]
        self._hosts.last_call.update((rank, ref) for (rank, _), ref in zip(rank_calls, refs))
        return refs

    def _target(self, method: str) -> tuple[str, str]:
        """The role and method a call names: a colocated group's calls are ``"<role>_<method>"``."""
        if not self._role_groups:
            return self.role, method
        for prefix in self._role_groups:
            if method.startswith(f"{prefix}_"):
                return prefix, method.removeprefix(f"{prefix}_")
        raise AttributeError(
            f"{method!r}: name a method of this colocated group as '<role>_<method>', "
            f"with a role of {list(self._role_groups)}"
        )

    def _wait(self, method: str, handles: list[tuple[int, Any]], timeout_s: float) -> list[Any]:
        try:
            return self._collect(method, handles, timeout_s)
        except WorkerGroupError:
            self._hosts.failed = True
            raise

    def _collect(self, method: str, handles: list[tuple[int, Any]], timeout_s: float) -> list[Any]:
        """Collect results in rank order; the first failure anywhere is raised at once."""
        rank_of = {ref: rank for rank, ref in handles}
        results: dict[int, Any] = {}
        pending = [ref for _, ref in handles]
        deadline = time.monotonic() + timeout_s
        while pending:
            remaining = deadline - time.monotonic()
            ready, pending = ray.wait(pending, num_returns=1, timeout=max(remaining, 0))
            if not ready:
                late = sorted(rank_of[r] for r in pending)
                dumps = "".join(
                    f"\n--- role {self.role!r} rank {rank} (pid {self._hosts.pids[rank]}) ---\n{text}"
                    for rank, text in self.dump_stacks(late).items()
                )
                raise WorkerTimeoutError(
                    f"role {self.role!r} rank(s) {late} did not finish {method}() within {timeout_s:.0f}s; "
                    f"where they are now:{dumps}"
                )
            for ref in ready:
                try:
                    results[rank_of[ref]] = self._get_one(ref, rank_of[ref], method)
                except WorkerMethodError as error:
                    raise self._dead_peer(method, pending, rank_of) or error from error
        return [results[rank] for rank, _ in handles]

    def _dead_peer(self, method: str, pending: list[Any], rank_of: dict[Any, int]) -> WorkerDiedError | None:
        """When one rank raised, the root cause is often another rank that died (its peers' collectives
        then fail first: "connection closed by peer"). Give the other ranks :data:`PEER_GRACE_S` to
        show it; a dead one is reported instead of the symptom."""
        deadline = time.monotonic() + PEER_GRACE_S
        while pending and time.monotonic() < deadline:
            ready, pending = ray.wait(pending, num_returns=1, timeout=max(deadline - time.monotonic(), 0))
            for ref in ready:
                try:
                    self._get_one(ref, rank_of[ref], method)
                except WorkerDiedError as died:
                    return died
                except WorkerGroupError:
                    continue
        return None

    def _get_one(self, ref: Any, rank: int, method: str) -> Any:
        try:
            return ray.get(ref, timeout=60)
        except RayTaskError as e:
            raise WorkerMethodError(f"role {self.role!r} rank {rank} raised in {method}():\n{e}") from e
        except RayActorError as e:
            raise WorkerDiedError(
                f"role {self.role!r} rank {rank} (node {self._hosts.node_ids[rank]}, pid {self._hosts.pids[rank]}): "
                f"worker process died during {method}() ({first_line(e)})"
            ) from e
        except GetTimeoutError as e:  # ready but not fetchable: treat like a lost worker
            raise WorkerTimeoutError(
                f"role {self.role!r} rank {rank}: result of {method}() unreachable"
            ) from e


def create_colocated_worker_groups(
    resource_pool: RayResourcePool,
    class_dict: dict[str, RayClassWithInitArgs],
    call_timeout_s: float = 3600.0,
    max_concurrency: int = 1,
    setup_timeout_s: float = 600.0,
    worker_env: dict[str, str] | None = None,
) -> dict[str, RayWorkerGroup]:
    """Start one process per bundle of ``resource_pool`` holding every role of ``class_dict``.

    Returns one worker group per role; all of them drive the same processes. With
    ``VERL_REUSE_WORKER_PROCESSES=1`` a CPU pool's ranks start in processes a finished run left
    (any pool shape), where there are some. ``worker_env``: more environment variables for every
    rank (their processes are then never kept for a later run, which would inherit them).
    """
    for role, spec in class_dict.items():
        spec.check_startable(role)
    clash = sorted(GROUP_ENV & set(worker_env or {}))
    if clash:
        raise ValueError(f"worker_env may not set {clash}: the worker group sets them on every rank")
    keepable = resource_pool.keeps_processes() and not worker_env
    resource_pool.claim_share()
    try:
        actors, processes, kept = _start(
            resource_pool, class_dict, max_concurrency, keepable, setup_timeout_s, worker_env
        )
    except BaseException:
        resource_pool.release_share()
        raise
    hosts = Hosts(actors, processes, keepable, max_concurrency, pool=resource_pool)
    placement = ", ".join(f"rank {r}: node {node[:12]} pid {pid}" for r, (pid, node) in enumerate(processes))
    reused = f" ({kept} kept processes)" if kept else ""
    logger.info("roles %s placed%s: %s", "+".join(class_dict), reused, placement)
    return {
        role: RayWorkerGroup(role=role, call_timeout_s=call_timeout_s, _hosts=hosts, _worker_cls=spec.cls)
        for role, spec in class_dict.items()
    }


def _start(
    resource_pool: RayResourcePool,
    class_dict: dict[str, RayClassWithInitArgs],
    max_concurrency: int,
    keepable: bool,
    setup_timeout_s: float,
    worker_env: dict[str, str] | None,
) -> tuple[list[Any], list[tuple[int, str]], int]:
    """The host actors, their (pid, node id) and how many are kept processes; killed on failure."""
    actors, kept = start_hosts(resource_pool, max_concurrency, keepable, take_kept=True)
    try:
        processes = set_up(actors, resource_pool, keepable, class_dict, setup_timeout_s, worker_env)
    except WorkerDiedError:
        Hosts(actors, []).kill()
        if not kept:
            raise
        # a kept process died since: start new ones
        actors, kept = start_hosts(resource_pool, max_concurrency, keepable, take_kept=False)
        processes = set_up_or_kill(actors, resource_pool, keepable, class_dict, setup_timeout_s, worker_env)
    except BaseException:  # no group holds these processes yet: nothing else would end them
        Hosts(actors, []).kill()
        raise
    return actors, processes, kept


def _refuse_unsupported(
    pool: RayResourcePool,
    bin_pack: bool,
    detached: bool,
    worker_names: list[str] | None,
    worker_handles: list[Any] | None,
    device_name: str | None,
    kwargs: dict[str, Any],
) -> None:
    """Raise on verl arguments of ``RayWorkerGroup`` this backend cannot honour, naming each."""
    refused = []
    if not bin_pack:
        refused.append("bin_pack=False (each node's bundles are always packed on that node)")
    if detached:
        refused.append("detached=True (a group's processes end with the driver)")
    if worker_names is not None or worker_handles is not None:
        refused.append("worker_names/worker_handles (attaching to existing actors)")
    if device_name not in (None, "cuda", "cpu"):
        refused.append(f"device_name={device_name!r} (cuda or cpu)")
    if device_name == "cpu" and pool.use_gpu:
        refused.append("device_name='cpu' on a pool of GPU bundles (use RayResourcePool(use_gpu=False))")
    if kwargs.pop("use_gpu", pool.use_gpu) != pool.use_gpu:
        refused.append(f"use_gpu different from the pool's ({pool.use_gpu})")
    for key in ("profile_steps", "worker_nsight_options", "master_addr", "master_port"):
        if kwargs.pop(key, None) is not None:
            refused.append(f"{key} (not supported)")
    refused += [f"{key} (unknown argument)" for key in kwargs]
    if refused:
        raise ValueError("RayWorkerGroup cannot honour: " + "; ".join(refused))


def _put_shared_args(
    rank_calls: list[tuple[int, tuple[tuple, dict]]],
) -> list[tuple[int, tuple[tuple, dict]]]:
    """Put a large argument sent to several ranks into the object store once, not once per rank."""
    if len(rank_calls) < 2:
        return rank_calls
    seen: dict[int, Any] = {}
    counts: dict[int, int] = {}
    for _, (args, kwargs) in rank_calls:
        for value in (*args, *kwargs.values()):
            counts[id(value)] = counts.get(id(value), 0) + 1

    def shared(value: Any) -> Any:
        if counts[id(value)] < 2 or not _is_large(value):
            return value
        if id(value) not in seen:
            seen[id(value)] = ray.put(value)
        return seen[id(value)]

    return [
        (rank, (tuple(shared(a) for a in args), {k: shared(v) for k, v in kwargs.items()}))
        for rank, (args, kwargs) in rank_calls
    ]


def _is_large(value: Any) -> bool:
    if isinstance(value, DataProto):
        return True
    nbytes = getattr(value, "nbytes", None)
    if nbytes is None and hasattr(value, "element_size"):
        nbytes = value.element_size() * value.numel()
    return bool(nbytes and nbytes > 100_000)
