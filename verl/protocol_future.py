"""``DataProtoFuture``: a batch still being computed by a worker group, as Ray object references.

The driver can hand such a future on (to :meth:`DataProtoFuture.chunk` it for the next group's
ranks) without fetching the data; :meth:`DataProtoFuture.get` fetches the parts, concatenates
them and takes this future's share.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray
import torch
from tensordict import TensorDict

__all__ = ["DataProtoFuture"]


def concat_parts(parts: list[Any]) -> Any:
    """One batch from the parts a worker group returned: a ``DataProto``'s own ``concat`` (its class,
    so a subclass stays itself), or TensorDicts concatenated along the rows."""
    if not parts:
        raise ValueError("a DataProtoFuture with no parts has nothing to collect")
    if isinstance(parts[0], TensorDict):
        return torch.cat(parts, dim=0)
    return type(parts[0]).concat(parts)


def _nth_chunk(data: Any, index: int, chunks: int) -> Any:
    return data.chunk(chunks=chunks)[index]


@dataclass
class DataProtoFuture:
    """``futures``: the parts' Ray ``ObjectRef``s in rank order; ``collect_fn`` turns the fetched parts
    into one batch; ``dispatch_fn``, if set, then takes this future's share of it."""

    collect_fn: Callable[[list[Any]], Any]
    futures: list[ray.ObjectRef]
    dispatch_fn: Callable[[Any], Any] | None = None

    @staticmethod
    def concat(data: list[ray.ObjectRef]) -> DataProtoFuture:
        """The future of the concatenation of the batches ``data`` refers to."""
        return DataProtoFuture(collect_fn=concat_parts, futures=list(data))

    def chunk(self, chunks: int) -> list[DataProtoFuture]:
        """``chunks`` futures, the ``i``-th of which gets the ``i``-th equal part of this one's batch."""
        return [
            DataProtoFuture(
                collect_fn=self.collect_fn,
                futures=self.futures,
                dispatch_fn=functools.partial(_nth_chunk, index=i, chunks=chunks),
            )
            for i in range(chunks)
        ]

    def get(self) -> Any:
        """Wait for every part and return the batch (this future's share of it, after ``chunk``)."""
        output = self.collect_fn(ray.get(self.futures))
        return output if self.dispatch_fn is None else self.dispatch_fn(output)
