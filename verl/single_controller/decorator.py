"""How a worker method's call is split over a group's ranks and how results come back.

A worker method decorated with ``@register(dispatch_mode=..., execute_mode=...)`` becomes a
method of its worker group on the driver. This one file defines every dispatch mode:

==================  =====================================================  =======================================
mode                split (driver -> ranks)                                collect (ranks -> driver)
==================  =====================================================  =======================================
ONE_TO_ALL          every rank gets the same arguments                     list of every rank's result
ALL_TO_ALL          each argument is a list with one entry per rank        list of every rank's result
DP_COMPUTE          same as ALL_TO_ALL (the caller already split the data) list of every rank's result
DP_COMPUTE_PROTO    each DataProto argument is padded to a multiple of     the ranks' DataProtos concatenated in
                    the rank count and chunked; other arguments are        rank order, padding removed
                    broadcast
RANK_ZERO           only rank 0 is called, with the arguments as given     rank 0's result
==================  =====================================================  =======================================

``Execute.ALL`` runs the split on every rank; ``Execute.RANK_ZERO`` calls rank 0 only and
returns its result unwrapped. New modes are added with :meth:`Dispatch.register`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from verl.protocol import DataProto

__all__ = ["Dispatch", "DispatchMode", "Execute", "MethodSpec", "get_method_spec", "register"]

# Per-rank arguments: ``None`` means "do not call this rank".
RankCalls = list[tuple[tuple, dict] | None]
SplitFn = Callable[[int, tuple, dict], tuple[RankCalls, Any]]
CollectFn = Callable[[list[Any], Any], Any]


@dataclass(frozen=True)
class DispatchMode:
    """A named pair of functions: ``split(world_size, args, kwargs) -> (per_rank_calls, state)``
    and ``collect(outputs_of_called_ranks, state) -> result``."""

    name: str
    split: SplitFn
    collect: CollectFn

    def __repr__(self) -> str:
        return f"Dispatch.{self.name}"


def _collect_list(outputs: list[Any], _state: Any) -> list[Any]:
    return outputs


def _split_one_to_all(world_size: int, args: tuple, kwargs: dict) -> tuple[RankCalls, None]:
    return [(args, kwargs)] * world_size, None


def _split_all_to_all(world_size: int, args: tuple, kwargs: dict) -> tuple[RankCalls, None]:
    named = [(f"argument {i}", a) for i, a in enumerate(args)] + [
        (f"argument {k!r}", v) for k, v in kwargs.items()
    ]
    for label, value in named:
        if not isinstance(value, list | tuple) or len(value) != world_size:
            got = (
                f"{type(value).__name__} of length {len(value)}"
                if hasattr(value, "__len__")
                else type(value).__name__
            )
            raise ValueError(f"{label} must be a list with one entry per rank ({world_size}), got {got}")
    calls = [
        (tuple(a[rank] for a in args), {k: v[rank] for k, v in kwargs.items()}) for rank in range(world_size)
    ]
    return calls, None


def _split_dp_proto(world_size: int, args: tuple, kwargs: dict) -> tuple[RankCalls, int]:
    pad_sizes = set()

    def chunk(value: Any) -> list[Any]:
        if not isinstance(value, DataProto):
            return [value] * world_size
        padded, pad = value.pad_to_divisor(world_size)
        pad_sizes.add(pad)
        return padded.chunk(world_size)

    split_args = [chunk(a) for a in args]
    split_kwargs = {k: chunk(v) for k, v in kwargs.items()}
    if not pad_sizes:
        raise ValueError("DP_COMPUTE_PROTO needs at least one DataProto argument")
    if len(pad_sizes) > 1:
        raise ValueError("DP_COMPUTE_PROTO: all DataProto arguments must have the same length")
    calls = [
        (tuple(a[rank] for a in split_args), {k: v[rank] for k, v in split_kwargs.items()})
        for rank in range(world_size)
    ]
    return calls, pad_sizes.pop()


def _collect_dp_proto(outputs: list[Any], pad_size: int) -> DataProto:
    for rank, out in enumerate(outputs):
        if not isinstance(out, DataProto):
            raise TypeError(
                f"DP_COMPUTE_PROTO: rank {rank} returned {type(out).__name__}, expected DataProto"
            )
    return DataProto.concat(outputs).unpad(pad_size)


def _split_rank_zero(world_size: int, args: tuple, kwargs: dict) -> tuple[RankCalls, None]:
    return [(args, kwargs)] + [None] * (world_size - 1), None


def _collect_first(outputs: list[Any], _state: Any) -> Any:
    return outputs[0]


class Dispatch:
    """The registry of dispatch modes; each mode is also a class attribute (``Dispatch.ONE_TO_ALL``)."""

    ONE_TO_ALL = DispatchMode("ONE_TO_ALL", _split_one_to_all, _collect_list)
    ALL_TO_ALL = DispatchMode("ALL_TO_ALL", _split_all_to_all, _collect_list)
    DP_COMPUTE = DispatchMode("DP_COMPUTE", _split_all_to_all, _collect_list)
    DP_COMPUTE_PROTO = DispatchMode("DP_COMPUTE_PROTO", _split_dp_proto, _collect_dp_proto)
    RANK_ZERO = DispatchMode("RANK_ZERO", _split_rank_zero, _collect_first)

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


_SPEC_ATTR = "__verl_method_spec__"


def register(
    dispatch_mode: DispatchMode = Dispatch.ALL_TO_ALL,
    execute_mode: Execute = Execute.ALL,
    blocking: bool = True,
) -> Callable[[Callable], Callable]:
    """Expose a worker method on its worker group, with how to split and collect its calls."""
    if not isinstance(dispatch_mode, DispatchMode):
        raise TypeError(f"dispatch_mode must be a Dispatch.<MODE>, got {dispatch_mode!r}")
    if not isinstance(execute_mode, Execute):
        raise TypeError(f"execute_mode must be an Execute member, got {execute_mode!r}")

    def decorate(func: Callable) -> Callable:
        setattr(func, _SPEC_ATTR, MethodSpec(dispatch_mode, execute_mode, blocking))
        return func

    return decorate


def get_method_spec(func: Callable) -> MethodSpec | None:
    """The spec set by ``@register`` on ``func``, or ``None``."""
    return getattr(func, _SPEC_ATTR, None)
