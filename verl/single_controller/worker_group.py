"""``WorkerGroup``: the driver's handle on the ranks of one role.

Every method of the role's worker class decorated with ``@register`` becomes a method of
the group: ``wg.compute_log_prob(batch)`` splits ``batch`` with the method's dispatch mode,
calls the ranks, waits (with a timeout) and collects the results. ``blocking=False``
returns a :class:`WorkerGroupFuture` instead; ``future.get()`` waits and collects.

Backends (Ray today) implement :meth:`WorkerGroup._submit` and :meth:`WorkerGroup._wait`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from verl.single_controller.decorator import Execute, MethodSpec, get_method_spec

__all__ = [
    "WorkerDiedError",
    "WorkerGroup",
    "WorkerGroupError",
    "WorkerGroupFuture",
    "WorkerMethodError",
    "WorkerTimeoutError",
]


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

    @property
    def world_size(self) -> int:
        return self._world_size

    def _bind_registered_methods(self, worker_cls: type) -> None:
        for name in dir(worker_cls):
            spec = get_method_spec(getattr(worker_cls, name, None))
            if spec is None:
                continue
            if hasattr(self, name):
                raise AttributeError(
                    f"{worker_cls.__name__}.{name} is registered but clashes with WorkerGroup.{name}; rename it"
                )
            setattr(self, name, functools.partial(self._call_registered, name, spec))

    def _call_registered(
        self, method: str, spec: MethodSpec, *args: Any, blocking: bool | None = None, **kwargs: Any
    ):
        calls, state = spec.dispatch_mode.split(self.world_size, args, kwargs)
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

    def execute_all(self, method: str, *args: Any, blocking: bool = True, **kwargs: Any):
        """Call any worker method on every rank with the same arguments; list of results."""
        handles = self._submit(method, [(rank, (args, kwargs)) for rank in range(self.world_size)])
        future = WorkerGroupFuture(self, method, list(enumerate(handles)), lambda outputs: outputs)
        return future.get() if blocking else future

    def execute_rank_zero(self, method: str, *args: Any, **kwargs: Any) -> Any:
        handles = self._submit(method, [(0, (args, kwargs))])
        return WorkerGroupFuture(self, method, [(0, handles[0])], lambda outputs: outputs[0]).get()

    # Backends implement these two.
    def _submit(self, method: str, rank_calls: list[tuple[int, tuple[tuple, dict]]]) -> list[Any]:
        raise NotImplementedError

    def _wait(self, method: str, handles: list[tuple[int, Any]], timeout_s: float) -> list[Any]:
        raise NotImplementedError
