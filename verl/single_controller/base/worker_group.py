"""``WorkerGroup``: the driver's handle on the ranks of one role, and what it is built from.

Every method of the role's worker class decorated with ``@register`` becomes a method of
the group: ``wg.compute_log_prob(batch)`` splits ``batch`` with the method's dispatch mode,
calls the ranks, waits (with a timeout) and collects the results. ``blocking=False``
returns a :class:`WorkerGroupFuture` instead; ``future.get()`` waits and collects.

:class:`ClassWithInitArgs` (a worker class and its constructor's arguments) and
:class:`ResourcePool` (processes per node) are what a backend builds a group from. Backends
(Ray today) implement :meth:`WorkerGroup._submit` and :meth:`WorkerGroup._wait`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from verl.single_controller.base.decorator import Execute, MethodSpec, get_method_spec

__all__ = [
    "ClassWithInitArgs",
    "ResourcePool",
    "WorkerDiedError",
    "WorkerGroup",
    "WorkerGroupError",
    "WorkerGroupFuture",
    "WorkerMethodError",
    "WorkerTimeoutError",
]


class ClassWithInitArgs:
    """A worker class and the arguments to construct it with, later and elsewhere."""

    def __init__(self, cls: type, *args: Any, **kwargs: Any) -> None:
        self.cls = cls
        self.args = args
        self.kwargs = kwargs

    def __call__(self) -> Any:
        """Construct the worker here, in this process."""
        return self.cls(*self.args, **self.kwargs)

    instantiate = __call__


class ResourcePool:
    """How many processes a group runs on each node.

    Args:
        process_on_nodes: processes per node (``[n_gpus_per_node] * nnodes``).
        max_colocate_count: how many separately created groups may share each process slot.
        n_gpus_per_node: devices per node.
    """

    def __init__(
        self,
        process_on_nodes: list[int] | None = None,
        max_colocate_count: int = 10,
        n_gpus_per_node: int = 8,
    ) -> None:
        self.process_on_nodes = [] if process_on_nodes is None else list(process_on_nodes)
        self.max_colocate_count = max_colocate_count
        self.n_gpus_per_node = n_gpus_per_node

    @property
    def store(self) -> list[int]:
        """The processes per node (verl's name)."""
        return self.process_on_nodes

    def __call__(self) -> list[int]:
        return self.process_on_nodes

    def add_node(self, process_count: int) -> None:
        self.process_on_nodes.append(process_count)

    @property
    def world_size(self) -> int:
        """The number of processes over all nodes."""
        return sum(self.process_on_nodes)

    def local_world_size_list(self) -> list[int]:
        """For each global rank, the number of processes on its node."""
        return [n for n in self.process_on_nodes for _ in range(n)]

    def local_rank_list(self) -> list[int]:
        """For each global rank, its index on its node."""
        return [i for n in self.process_on_nodes for i in range(n)]


class WorkerGroupError(RuntimeError):
    """A remote call on a worker group failed; the message names role, rank and method."""


class WorkerDiedError(WorkerGroupError):
    """A worker process died (killed, out of memory, segfault) during a call."""


class WorkerMethodError(WorkerGroupError):
    """A worker method raised an exception."""


class WorkerTimeoutError(WorkerGroupError):
    """A worker did not answer within the call's timeout."""


class WorkerGroupFuture:
    """The pending result of a non-blocking worker-group call."""

    def __init__(
        self, group: WorkerGroup, method: str, handles: list[tuple[int, Any]], finish: Callable
    ) -> None:
        self._group = group
        self._method = method
        self._handles = handles  # (rank, backend handle)
        self._finish = finish
        self._done = False
        self._result: Any = None

    def get(self, timeout_s: float | None = None) -> Any:
        """Wait for every called rank (at most ``timeout_s``, default the group's) and collect."""
        if not self._done:
            timeout = self._group.call_timeout_s if timeout_s is None else timeout_s
            outputs = self._group._wait(self._method, self._handles, timeout)
            self._result = self._finish(outputs)
            self._done = True
        return self._result

    def handles(self) -> list[Any]:
        """The backend's raw handles (Ray ``ObjectRef``s), in rank order."""
        return [h for _, h in self._handles]


class WorkerGroup:
    """Ranks of one role; registered worker methods are bound as methods of this object."""

    def __init__(self, role: str, world_size: int, call_timeout_s: float = 3600.0) -> None:
        self.role = role
        self._world_size = world_size
        self.call_timeout_s = call_timeout_s
        # mesh name -> each rank's data-parallel rank / whether it is collected (verl's n-d dispatch)
        self._dispatch_info: dict[str, list[int]] = {}
        self._collect_info: dict[str, list[bool]] = {}

    @property
    def world_size(self) -> int:
        """The number of ranks."""
        return self._world_size

    def _bind_registered_methods(self, worker_cls: type) -> list[str]:
        names = []
        for name in dir(worker_cls):
            spec = get_method_spec(getattr(worker_cls, name, None))
            if spec is None:
                continue
            if hasattr(self, name):
                raise AttributeError(
                    f"{worker_cls.__name__}.{name} is registered but clashes with WorkerGroup.{name}; rename it"
                )
            setattr(self, name, functools.partial(self._call_registered, name, spec))
            names.append(name)
        return names

    def _call_registered(
        self, method: str, spec: MethodSpec, *args: Any, blocking: bool | None = None, **kwargs: Any
    ):
        args, kwargs = _materialize(method, spec, args, kwargs)
        calls, state = spec.dispatch_mode.split(self, args, kwargs)
        if spec.execute_mode is Execute.RANK_ZERO:
            calls = [calls[0]] + [None] * (self.world_size - 1)
        ranks = [rank for rank, call in enumerate(calls) if call is not None]
        handles = self._submit(method, [(rank, calls[rank]) for rank in ranks])

        def finish(outputs: list[Any]) -> Any:
            if spec.execute_mode is Execute.RANK_ZERO:
                return outputs[0]
            return spec.dispatch_mode.collect(outputs, state)

        future = WorkerGroupFuture(self, method, list(zip(ranks, handles)), finish)
        blocking = spec.blocking if blocking is None else blocking
        return future.get() if blocking else future

    # verl's calls of any worker method by name, registered or not
    def execute_all_sync(self, method_name: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Call ``method_name`` on every rank and wait (with the group's timeout); the results in
        rank order. When every argument is a list with one entry per rank, rank ``r`` gets entry
        ``r`` of each; otherwise every rank gets the same arguments."""
        handles = self._submit(method_name, self._all_rank_calls(args, kwargs))
        future = WorkerGroupFuture(self, method_name, list(enumerate(handles)), lambda outputs: outputs)
        return future.get()

    def execute_all_async(self, method_name: str, *args: Any, **kwargs: Any) -> list[Any]:
        """As :meth:`execute_all_sync` without waiting: the backend's handles (Ray ``ObjectRef``s)."""
        return self._submit(method_name, self._all_rank_calls(args, kwargs))

    execute_all = execute_all_async

    def execute_rank_zero_sync(self, method_name: str, *args: Any, **kwargs: Any) -> Any:
        """Call ``method_name`` on rank 0 and wait; its result."""
        handles = self._submit(method_name, [(0, (args, kwargs))])
        return WorkerGroupFuture(self, method_name, [(0, handles[0])], lambda outputs: outputs[0]).get()

    def execute_rank_zero_async(self, method_name: str, *args: Any, **kwargs: Any) -> Any:
        """As :meth:`execute_rank_zero_sync` without waiting: the backend's handle."""
        return self._submit(method_name, [(0, (args, kwargs))])[0]

    execute_rank_zero = execute_rank_zero_async

    def _all_rank_calls(self, args: tuple, kwargs: dict) -> list[tuple[int, tuple[tuple, dict]]]:
        values = [*args, *kwargs.values()]
        per_rank = bool(values) and all(isinstance(v, list) and len(v) == self.world_size for v in values)
        if per_rank:
            return [
                (r, (tuple(a[r] for a in args), {k: v[r] for k, v in kwargs.items()}))
                for r in range(self.world_size)
            ]
        return [(r, (args, kwargs)) for r in range(self.world_size)]

    # Backends implement these two.
    def _submit(self, method: str, rank_calls: list[tuple[int, tuple[tuple, dict]]]) -> list[Any]:
        raise NotImplementedError

    def _wait(self, method: str, handles: list[tuple[int, Any]], timeout_s: float) -> list[Any]:
        raise NotImplementedError


def _materialize(method: str, spec: MethodSpec, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Wait for the pending results of earlier non-blocking calls among the arguments."""

    def get(value: Any) -> Any:
        if not isinstance(value, WorkerGroupFuture):
            return value
        if not spec.materialize_futures:
            raise TypeError(f"{method}() is registered with materialize_futures=False: pass future.get()")
        return value.get()

    return tuple(get(a) for a in args), {k: get(v) for k, v in kwargs.items()}
