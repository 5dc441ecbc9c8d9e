"""How a worker method's call is split over a group's ranks and how results come back.

A worker method decorated with ``@register(dispatch_mode=..., execute_mode=...)`` becomes a
method of its worker group on the driver. This one file defines every dispatch mode:

===========================  ==============================================  ==================================
mode                         split (driver -> ranks)                         collect (ranks -> driver)
===========================  ==============================================  ==================================
ONE_TO_ALL                   every rank gets the same arguments              list of every rank's result
ALL_TO_ALL                   each argument is a list, one entry per rank     list of every rank's result
DP_COMPUTE                   same as ALL_TO_ALL (the caller split the data)  list of every rank's result
DP_COMPUTE_PROTO             each DataProto argument is padded to a          the ranks' DataProtos concatenated
                             multiple of the rank count and chunked; other   in rank order, padding removed
                             arguments are broadcast
DP_COMPUTE_PROTO_WITH_FUNC   the first argument (a function) is broadcast,   as DP_COMPUTE_PROTO
                             the rest split as DP_COMPUTE_PROTO
DP_COMPUTE_METRIC            as DP_COMPUTE_PROTO                             list of every rank's result
RANK_ZERO                    only rank 0 is called, with the arguments       rank 0's result
DIRECT_ROLLOUT_METHOD        not callable through the group (a method the    -
                             rollout engine calls on its own workers)
===========================  ==============================================  ==================================

``Execute.ALL`` runs the split on every rank; ``Execute.RANK_ZERO`` calls rank 0 only and
returns its result unwrapped. New modes: :meth:`Dispatch.register` (``split`` and ``collect``
below), or verl's forms, with ``dispatch_fn(group, *args, **kwargs) -> (args, kwargs)`` giving
one list entry per rank and ``collect_fn(group, outputs)``: ``register(dispatch_mode={"dispatch_fn":
f, "collect_fn": g})`` and :func:`register_dispatch_mode`. :func:`make_nd_compute_dataproto_dispatch_fn`
splits over the data-parallel ranks of a device mesh the workers describe themselves.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from verl.protocol import DataProto

__all__ = [
    "Dispatch",
    "DispatchMode",
    "Execute",
    "MethodSpec",
    "get_method_spec",
    "make_nd_compute_dataproto_dispatch_fn",
    "register",
    "register_dispatch_mode",
]


class Group(Protocol):
    """What a split sees of the worker group it dispatches for."""

    @property
    def world_size(self) -> int: ...


# Per-rank arguments: ``None`` means "do not call this rank".
RankCalls = list[tuple[tuple, dict] | None]
SplitFn = Callable[[Group, tuple, dict], tuple[RankCalls, Any]]
CollectFn = Callable[[list[Any], Any], Any]


@dataclass(frozen=True)
class DispatchMode:
    """A named pair of functions: ``split(group, args, kwargs) -> (per_rank_calls, state)`` and
    ``collect(outputs_of_called_ranks, state) -> result``."""

    name: str
    split: SplitFn
    collect: CollectFn

    def __repr__(self) -> str:
        return f"Dispatch.{self.name}"


def _collect_list(outputs: list[Any], _state: Any) -> list[Any]:
    return outputs


def _split_one_to_all(group: Group, args: tuple, kwargs: dict) -> tuple[RankCalls, None]:
    return [(args, kwargs)] * group.world_size, None


def _per_rank(n: int, args: tuple | list, kwargs: dict) -> list[tuple[tuple, dict]]:
    """Entry ``r`` of every list argument, for ``r`` in ``range(n)``; each must hold ``n`` entries."""
    named = [(f"argument {i}", a) for i, a in enumerate(args)] + [
        (f"argument {k!r}", v) for k, v in kwargs.items()
    ]
    for label, value in named:
        if not isinstance(value, list | tuple) or len(value) != n:
            got = (
                f"{type(value).__name__} of length {len(value)}"
                if hasattr(value, "__len__")
                else type(value).__name__
            )
            raise ValueError(f"{label} must be a list with one entry per rank ({n}), got {got}")
    return [(tuple(a[r] for a in args), {k: v[r] for k, v in kwargs.items()}) for r in range(n)]


def _split_all_to_all(group: Group, args: tuple, kwargs: dict) -> tuple[RankCalls, None]:
    return _per_rank(group.world_size, args, kwargs), None


def _pad_and_chunk(chunks: int, args: tuple, kwargs: dict, mode: str) -> tuple[list[tuple[tuple, dict]], int]:
    """Pad every DataProto argument to a multiple of ``chunks`` and cut it into ``chunks`` parts
    (other arguments go to every part unchanged); the parts' arguments and the pad size."""
    pad_sizes = set()

    def chunk(value: Any) -> list[Any]:
        if not isinstance(value, DataProto):
            return [value] * chunks
        padded, pad = value.pad_to_divisor(chunks)
        pad_sizes.add(pad)
        return padded.chunk(chunks)

    split_args = [chunk(a) for a in args]
    split_kwargs = {k: chunk(v) for k, v in kwargs.items()}
    if not pad_sizes:
        raise ValueError(f"{mode} needs at least one DataProto argument")
    if len(pad_sizes) > 1:
        raise ValueError(f"{mode}: all DataProto arguments must have the same length")
    return _per_rank(chunks, split_args, split_kwargs), pad_sizes.pop()


def _split_dp_proto(group: Group, args: tuple, kwargs: dict) -> tuple[RankCalls, int]:
    return _pad_and_chunk(group.world_size, args, kwargs, "DP_COMPUTE_PROTO")


def _split_dp_proto_with_func(group: Group, args: tuple, kwargs: dict) -> tuple[RankCalls, int]:
    if not args or not callable(args[0]):
        raise ValueError(
            "DP_COMPUTE_PROTO_WITH_FUNC: the first argument must be the function to run on each rank"
        )
    calls, pad = _pad_and_chunk(group.world_size, args[1:], kwargs, "DP_COMPUTE_PROTO_WITH_FUNC")
    return [((args[0], *a), k) for a, k in calls], pad


def _collect_dp_proto(outputs: list[Any], pad_size: int) -> DataProto:
    for rank, out in enumerate(outputs):
        if not isinstance(out, DataProto):
            raise TypeError(
                f"DP_COMPUTE_PROTO: rank {rank} returned {type(out).__name__}, expected DataProto"
            )
    return DataProto.concat(outputs).unpad(pad_size)


def _split_rank_zero(group: Group, args: tuple, kwargs: dict) -> tuple[RankCalls, None]:
    return [(args, kwargs)] + [None] * (group.world_size - 1), None


def _collect_first(outputs: list[Any], _state: Any) -> Any:
    return outputs[0]


def _refuse_direct_rollout(group: Group, args: tuple, kwargs: dict) -> tuple[RankCalls, None]:
    raise NotImplementedError(
        "a DIRECT_ROLLOUT_METHOD is called by the rollout engine on its workers, not through the worker group"
    )


class Dispatch:
    """The registry of dispatch modes; each mode is also a class attribute (``Dispatch.ONE_TO_ALL``)."""

    ONE_TO_ALL = DispatchMode("ONE_TO_ALL", _split_one_to_all, _collect_list)
    ALL_TO_ALL = DispatchMode("ALL_TO_ALL", _split_all_to_all, _collect_list)
    DP_COMPUTE = DispatchMode("DP_COMPUTE", _split_all_to_all, _collect_list)
    DP_COMPUTE_PROTO = DispatchMode("DP_COMPUTE_PROTO", _split_dp_proto, _collect_dp_proto)
    DP_COMPUTE_PROTO_WITH_FUNC = DispatchMode(
        "DP_COMPUTE_PROTO_WITH_FUNC", _split_dp_proto_with_func, _collect_dp_proto
    )
    DP_COMPUTE_METRIC = DispatchMode("DP_COMPUTE_METRIC", _split_dp_proto, _collect_list)
    RANK_ZERO = DispatchMode("RANK_ZERO", _split_rank_zero, _collect_first)
    DIRECT_ROLLOUT_METHOD = DispatchMode("DIRECT_ROLLOUT_METHOD", _refuse_direct_rollout, _collect_list)

    @classmethod
    def register(cls, name: str, split: SplitFn, collect: CollectFn) -> DispatchMode:
        """Add a new mode, reachable afterwards as ``Dispatch.<name>``."""
        if hasattr(cls, name):
            raise ValueError(f"dispatch mode {name!r} already exists")
        mode = DispatchMode(name, split, collect)
        setattr(cls, name, mode)
        return mode

    @classmethod
    def get(cls, name: str) -> DispatchMode:
        mode = getattr(cls, name, None)
        if not isinstance(mode, DispatchMode):
            raise KeyError(f"unknown dispatch mode {name!r}; known: {cls.names()}")
        return mode

    @classmethod
    def names(cls) -> list[str]:
        return sorted(k for k, v in vars(cls).items() if isinstance(v, DispatchMode))


def mode_from_functions(name: str, dispatch_fn: Callable, collect_fn: Callable) -> DispatchMode:
    """A mode from verl-style functions: ``dispatch_fn(group, *args, **kwargs)`` returns the
    arguments with one list entry per rank, ``collect_fn(group, outputs)`` the result."""

    def split(group: Group, args: tuple, kwargs: dict) -> tuple[RankCalls, Group]:
        per_rank_args, per_rank_kwargs = dispatch_fn(group, *args, **kwargs)
        return _per_rank(group.world_size, per_rank_args, per_rank_kwargs), group

    def collect(outputs: list[Any], group: Group) -> Any:
        return collect_fn(group, outputs)

    return DispatchMode(name, split, collect)


def register_dispatch_mode(
    dispatch_mode_name: str, dispatch_fn: Callable, collect_fn: Callable
) -> DispatchMode:
    """verl's way to add a mode from ``dispatch_fn``/``collect_fn`` (see :func:`mode_from_functions`)."""
    mode = mode_from_functions(dispatch_mode_name, dispatch_fn, collect_fn)
    return Dispatch.register(dispatch_mode_name, mode.split, mode.collect)


def make_nd_compute_dataproto_dispatch_fn(mesh_name: str) -> DispatchMode:
    """Split DataProto arguments over the data-parallel ranks of the device mesh ``mesh_name``.

    Each worker says, once, which data-parallel rank of that mesh it is and whether its output is
    collected (``Worker._register_dispatch_collect_info(mesh_name, dp_rank, is_collect)``; e.g. the
    tensor-parallel rank 0 of each dp group). The batch is padded and cut into one chunk per dp rank,
    every rank gets its dp rank's chunk, and the collected outputs are concatenated in dp-rank order.
    """
    name = f"ND_COMPUTE_PROTO[{mesh_name}]"

    def split(group: Group, args: tuple, kwargs: dict) -> tuple[RankCalls, tuple[list[int], list[bool], int]]:
        dp_ranks = _mesh_info(group, mesh_name, "_dispatch_info", "_query_dispatch_info")
        collects = _mesh_info(group, mesh_name, "_collect_info", "_query_collect_info")
        calls, pad = _pad_and_chunk(max(dp_ranks) + 1, args, kwargs, name)
        return [calls[dp] for dp in dp_ranks], (dp_ranks, collects, pad)

    def collect(outputs: list[Any], state: tuple[list[int], list[bool], int]) -> DataProto:
        dp_ranks, collects, pad = state
        by_dp: dict[int, Any] = {}
        for rank, (out, dp, collected) in enumerate(zip(outputs, dp_ranks, collects)):
            if collected and by_dp.setdefault(dp, out) is not out:
                raise ValueError(f"{name}: several ranks collect data-parallel rank {dp} (rank {rank} too)")
        missing = sorted(set(range(max(dp_ranks) + 1)) - set(by_dp))
        if missing:
            raise ValueError(f"{name}: no rank collects data-parallel rank(s) {missing}")
        return _collect_dp_proto([by_dp[dp] for dp in sorted(by_dp)], pad)

    return DispatchMode(name, split, collect)


def _mesh_info(group: Group, mesh_name: str, cache: str, query: str) -> list[Any]:
    """Each rank's registered value for ``mesh_name``, asked once per group and cached on it."""
    known = getattr(group, cache)
    if mesh_name not in known:
        if not hasattr(group, query):
            raise TypeError(f"dispatching over mesh {mesh_name!r} needs workers derived from Worker")
        known[mesh_name] = getattr(group, query)(mesh_name)
    return known[mesh_name]


class Execute(enum.Enum):
    """Which ranks run the method."""

    ALL = "all"
    RANK_ZERO = "rank_zero"


@dataclass(frozen=True)
class MethodSpec:
    """What ``@register`` attaches to a worker method."""

    dispatch_mode: DispatchMode
    execute_mode: Execute
    blocking: bool
    materialize_futures: bool = True


_SPEC_ATTR = "__verl_method_spec__"


def register(
    dispatch_mode: DispatchMode | dict[str, Callable] = Dispatch.ALL_TO_ALL,
    execute_mode: Execute = Execute.ALL,
    blocking: bool = True,
    materialize_futures: bool = True,
) -> Callable[[Callable], Callable]:
    """Expose a worker method on its worker group, with how to split and collect its calls.

    ``materialize_futures``: a pending result of an earlier non-blocking call passed as an argument
    is waited for on the driver first; with ``False`` passing one is an error.
    """
    if isinstance(dispatch_mode, dict):
        if set(dispatch_mode) != {"dispatch_fn", "collect_fn"}:
            raise ValueError(
                f"a dict dispatch_mode has the keys 'dispatch_fn' and 'collect_fn', got {sorted(dispatch_mode)}"
            )
        fn = dispatch_mode["dispatch_fn"]
        dispatch_mode = mode_from_functions(
            f"custom({getattr(fn, '__name__', type(fn).__name__)})", fn, dispatch_mode["collect_fn"]
        )
    if not isinstance(dispatch_mode, DispatchMode):
        raise TypeError(
            f"dispatch_mode must be a Dispatch.<MODE> or a dispatch_fn/collect_fn dict, got {dispatch_mode!r}"
        )
    if not isinstance(execute_mode, Execute):
        raise TypeError(f"execute_mode must be an Execute member, got {execute_mode!r}")
    spec = MethodSpec(dispatch_mode, execute_mode, blocking, materialize_futures)

    def decorate(func: Callable) -> Callable:
        setattr(func, _SPEC_ATTR, spec)
        return func

    return decorate


def get_method_spec(func: Callable) -> MethodSpec | None:
    """The spec set by ``@register`` on ``func``, or ``None``."""
    return getattr(func, _SPEC_ATTR, None)
