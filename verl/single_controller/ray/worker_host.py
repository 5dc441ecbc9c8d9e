"""The rank processes of a worker group: the host actor that runs in each, and the driver's handle on them.

A :class:`WorkerHost` is the Ray actor of one rank: it takes the rank's environment, builds the
workers of the roles it carries and runs their methods. :class:`Hosts` is the driver's side of one
pool placement: :func:`start_hosts` starts (or takes kept) processes, :func:`set_up` gives them their
ranks and roles, and :meth:`Hosts.close` kills them or keeps clean ones for a later run. Calling the
roles' methods is :class:`~verl.single_controller.ray.base.RayWorkerGroup`'s part.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
from typing import Any

import ray
from ray.actor import ActorClass
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from verl.single_controller.base.worker import find_free_port, node_ip_address
from verl.single_controller.base.worker_group import (
    ClassWithInitArgs,
    WorkerDiedError,
    WorkerMethodError,
    WorkerTimeoutError,
)
from verl.single_controller.ray.resource_pool import (
    RayResourcePool,
    keep_processes,
    release_parked_workers,
    reuse_enabled,
    take_kept_process,
)
from verl.utils import stacks

logger = logging.getLogger(__name__)

RELEASE_TIMEOUT_S = 60.0
"""How long the ranks get to drop their roles before their processes are killed instead of kept."""

PROCESS_WIDE_THREADS = frozenset({"tqdm_monitor"})
"""Threads a library starts once per process and keeps (they hold no state of a run)."""

__all__ = [
    "Hosts",
    "RayClassWithInitArgs",
    "WorkerHost",
    "first_line",
    "set_up",
    "set_up_or_kill",
    "start_hosts",
]


class RayClassWithInitArgs(ClassWithInitArgs):
    """A worker class and the arguments to construct it with inside its host process.

    ``cls`` may be the plain class or, as verl users write it, the class decorated with
    ``@ray.remote``: the rank processes are started by the worker group, so the plain class is kept.
    """

    def __init__(self, cls: type | ActorClass, *args: Any, **kwargs: Any) -> None:
        super().__init__(_plain_class(cls), *args, **kwargs)
        self._options: dict[str, Any] = {}
        self._additional_resource: dict[str, Any] = {}

    def update_options(self, options: dict[str, Any]) -> None:
        """verl's Ray actor options for the rank processes; refused when a group is built from this
        (the group starts its processes with the pool's options)."""
        self._options.update(options)

    def set_additional_resource(self, additional_resource: dict[str, Any]) -> None:
        """verl's extra Ray resources per rank; refused when a group is built from this."""
        self._additional_resource = dict(additional_resource)

    def check_startable(self, role: str) -> None:
        """Refuse actor options the worker group cannot honour, naming them."""
        if self._options or self._additional_resource:
            raise ValueError(
                f"role {role!r}: Ray actor options {self._options or self._additional_resource} are not "
                "supported; a rank's resources come from its RayResourcePool bundle"
            )


def _plain_class(cls: type | ActorClass) -> type:
    if not isinstance(cls, ActorClass):
        return cls
    plain = cls.__ray_actor_class__
    if cls._default_options:
        raise ValueError(
            f"{plain.__name__} is declared with @ray.remote({cls._default_options}): a rank's resources come "
            "from its RayResourcePool bundle; declare it with a bare @ray.remote or none"
        )
    return plain


class WorkerHost:
    """The process of one rank: sets the rank's environment, then builds and serves its roles (a
    kept process serves the ranks of several runs one after another, see ``release``)."""

    def __init__(self) -> None:
        stacks.arm()  # a time-out anywhere can then show where this process is stuck
        self._workers: dict[str, Any] = {}

    def node_info(self) -> tuple[str, int]:
        return node_ip_address(), find_free_port()

    def setup(
        self, env: dict[str, str], num_threads: int, roles: dict[str, RayClassWithInitArgs]
    ) -> tuple[int, str]:
        """Take this run's rank (``env``: RANK, WORLD_SIZE, MASTER_ADDR, ...) and CPU share, then
        build its roles; the process id and node id."""
        os.environ.update(env)
        import torch

        torch.set_num_threads(max(1, num_threads))
        self._threads_before = {t.ident for t in threading.enumerate()}
        for role, spec in roles.items():
            self._workers[role] = spec()
        return os.getpid(), ray.get_runtime_context().get_node_id()

    def release(self) -> str:
        """Drop this process's roles so a later run can start its own here. Returns "" when the
        process is as clean as a fresh one (no role state, process group, child process, thread or
        model plugin left), else why not: the driver then kills it."""
        import psutil
        import torch
        import torch.distributed as dist

        from verl.utils.model import external_code_loaded

        kept = [role for role, worker in self._workers.items() if not _reusable(worker)]
        if kept:
            return f"roles {kept} keep state outside their worker objects"
        self._workers.clear()
        gc.collect()
        if dist.is_initialized():
            dist.destroy_process_group()
        if torch.cuda.is_initialized():
            torch.cuda.empty_cache()
        if external_code_loaded():
            return "a model plugin (model.external_lib) or remote model code was imported"
        children = [child.pid for child in psutil.Process().children(recursive=True)]
        if children:
            return f"child processes {children} are still running"
        # Ray runs a concurrent actor's calls (max_concurrency > 1) on threads of its own, which Python
        # lists as dummy threads: they belong to the actor and outlive every run, like the process
        threads = [
            t.name
            for t in threading.enumerate()
            if t.ident not in self._threads_before
            and t.name not in PROCESS_WIDE_THREADS
            and not isinstance(t, threading._DummyThread)
        ]
        if threads:
            return f"threads {threads} are still running"
        return ""

    def call(self, _verl_role: str, _verl_method: str, *args: Any, **kwargs: Any) -> Any:
        # Arguments travel as top-level task arguments so Ray resolves ObjectRefs among them.
        return getattr(self._workers[_verl_role], _verl_method)(*args, **kwargs)


def _reusable(worker: Any) -> bool:
    reusable = getattr(worker, "process_reusable", None)
    return bool(reusable is not None and reusable())


class Hosts:
    """The host actors of one pool placement, shared by the role groups colocated on them."""

    def __init__(
        self,
        actors: list[Any],
        processes: list[tuple[int, str]],
        keepable: bool = False,
        max_concurrency: int = 1,
        pool: RayResourcePool | None = None,
    ) -> None:
        self.actors = actors
        self.pids = [pid for pid, _ in processes]
        self.node_ids = [node for _, node in processes]
        self.keepable = keepable  # the processes run outside their pool's bundles (may outlive it)
        self.max_concurrency = max_concurrency
        self.alive = True
        self.last_call: dict[int, Any] = {}  # rank -> its latest call (each rank runs calls in order)
        self.failed = False  # a call failed or timed out: the processes are not kept
        self._pool = pool  # whose bundle share these processes hold (given back when they end)

    def kill(self) -> None:
        if self.alive:
            for actor in self.actors:
                ray.kill(actor, no_restart=True)
            self._ended()

    def _ended(self) -> None:
        self.alive = False
        if self._pool is not None:
            self._pool.release_share()

    def close(self) -> None:
        """End these processes, or keep them for a later run when the pool allows it and every rank
        released its roles cleanly (``VERL_REUSE_WORKER_PROCESSES=1``)."""
        if not self.alive:
            return
        if self.keepable and reuse_enabled() and self._idle():
            try:
                reasons = ray.get([a.release.remote() for a in self.actors], timeout=RELEASE_TIMEOUT_S)
            except Exception as error:  # a dead or stuck rank: nothing to keep
                reasons = [f"release failed ({first_line(error)})"]
            if not any(reasons):  # kept for a later run; this group is done with them
                keep_processes(self.actors, self.pids, self.node_ids, self.max_concurrency)
                self._ended()
                return
            logger.info("worker processes not kept: %s", "; ".join(r for r in reasons if r))
        self.kill()

    def _idle(self) -> bool:
        """No call failed and none is still running."""
        calls = list(self.last_call.values())
        done, _ = ray.wait(calls, num_returns=len(calls), timeout=0) if calls else ([], [])
        return not self.failed and len(done) == len(calls)


def start_hosts(
    resource_pool: RayResourcePool, max_concurrency: int, keepable: bool, take_kept: bool
) -> tuple[list[Any], int]:
    """One host actor per bundle of the pool, in rank order, and how many of them are kept processes.

    A rank runs in its bundle, or, ``keepable``, beside it on its node (holding no CPU itself, so
    that it can outlive the pool), in a kept process where one is waiting there."""
    slots = resource_pool.bundle_slots()
    if not reuse_enabled():
        release_parked_workers()  # reuse was turned off: nothing will take them any more
    nodes = resource_pool.bundle_nodes() if keepable else []
    share = 1.0 / resource_pool.max_colocate_count
    actors, kept = [], 0
    for rank, (pg, bundle_index) in enumerate(slots):
        if keepable:
            waiting = take_kept_process(nodes[rank], max_concurrency) if take_kept else None
            if waiting is not None:
                actors.append(waiting.actor)
                kept += 1
                continue
            options: dict[str, Any] = {
                "num_cpus": 0,
                "scheduling_strategy": NodeAffinitySchedulingStrategy(nodes[rank], soft=False),
            }
        else:
            options = {
                "num_cpus": resource_pool.cpus_per_process * share,
                "scheduling_strategy": PlacementGroupSchedulingStrategy(
                    pg, placement_group_bundle_index=bundle_index
                ),
            }
            if resource_pool.use_gpu:
                options["num_gpus"] = share
        actors.append(
            ray.remote(WorkerHost).options(**options, max_concurrency=max_concurrency, name=None).remote()
        )
    return actors, kept


def _rank_envs(resource_pool: RayResourcePool, keepable: bool) -> list[dict[str, str]]:
    """Each rank's place in the group, as environment variables (see ``verl.single_controller.base.worker``)."""
    world_size = resource_pool.world_size
    local_ranks, local_sizes = resource_pool.local_rank_list(), resource_pool.local_world_size_list()
    device = "cuda" if resource_pool.use_gpu else "cpu"
    envs = []
    for rank in range(world_size):
        env = {"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(local_ranks[rank])}
        env["LOCAL_WORLD_SIZE"] = str(local_sizes[rank])
        env["VERL_DEVICE"] = device
        if keepable and "OMP_NUM_THREADS" not in os.environ:
            # what Ray sets for an actor of this many CPUs (the rank holds none itself: see start_hosts)
            env["OMP_NUM_THREADS"] = str(_threads(resource_pool))
        envs.append(env)
    return envs


def _threads(resource_pool: RayResourcePool) -> int:
    return max(1, int(resource_pool.cpus_per_process / resource_pool.max_colocate_count))


def set_up_or_kill(
    actors: list[Any],
    resource_pool: RayResourcePool,
    keepable: bool,
    class_dict: dict[str, RayClassWithInitArgs],
    timeout_s: float,
    worker_env: dict[str, str] | None = None,
) -> list[tuple[int, str]]:
    try:
        return set_up(actors, resource_pool, keepable, class_dict, timeout_s, worker_env)
    except BaseException:  # no group holds these processes yet: nothing else would end them
        Hosts(actors, []).kill()
        raise


def set_up(
    actors: list[Any],
    resource_pool: RayResourcePool,
    keepable: bool,
    class_dict: dict[str, RayClassWithInitArgs],
    timeout_s: float,
    worker_env: dict[str, str] | None = None,
) -> list[tuple[int, str]]:
    """Give the host actors their ranks, the rendezvous address and ``worker_env`` and build their
    roles; their (process id, node id)."""
    master_addr, master_port = _get_or_die(
        actors[0].node_info.remote(), "node_info", 0, class_dict, timeout_s
    )
    rendezvous = {"MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port)}
    threads = _threads(resource_pool)
    setups = [
        actor.setup.remote({**(worker_env or {}), **env, **rendezvous}, threads, class_dict)
        for actor, env in zip(actors, _rank_envs(resource_pool, keepable))
    ]
    return [_get_or_die(ref, "__init__", rank, class_dict, timeout_s) for rank, ref in enumerate(setups)]


def _get_or_die(
    ref: Any, what: str, rank: int, class_dict: dict[str, RayClassWithInitArgs], timeout_s: float
) -> Any:
    roles = "+".join(class_dict)
    try:
        return ray.get(ref, timeout=timeout_s)
    except RayTaskError as e:
        raise WorkerMethodError(f"role {roles!r} rank {rank} failed in {what}:\n{e}") from e
    except RayActorError as e:
        raise WorkerDiedError(f"role {roles!r} rank {rank}: process died in {what} ({first_line(e)})") from e
    except GetTimeoutError as e:
        raise WorkerTimeoutError(
            f"role {roles!r} rank {rank}: {what} did not finish within {timeout_s:.0f}s"
        ) from e


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
