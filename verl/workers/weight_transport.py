"""How one version of the policy's weights travels from the actor to the rollout engines.

Every path goes through one interface, :class:`WeightTransport`: the actor's rank 0 calls
``send(named_tensors, version)`` and gets a :class:`Parcel` (what it holds depends on the
transport: the tensors themselves, a Ray object reference, a file path); the rollout's ranks call
``receive(parcel)`` for the tensors, and the driver ``discard(parcel)`` once no one needs it.

* ``in_process``: the rollout lives in the actor's process (colocated, ``trainer.mode=sync``);
  the tensors stream from the actor's gather into the engine, one at a time, never copied whole.
* ``object_store``: split pools on the machines of one Ray cluster (``trainer.mode=async``); one
  CPU copy goes into Ray's shared-memory object store and every rollout rank reads it there.
* ``filesystem``: safetensors under ``async_training.weight_dir`` (a folder every machine mounts),
  written to a temporary name and renamed, so a reader never sees half a file.

NCCL broadcasts and CUDA IPC handles between GPU processes would be two more entries here.
"""

from __future__ import annotations

import os
import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

NamedTensors = Iterable[tuple[str, torch.Tensor]]
FILE_NAME = re.compile(r"policy_v(\d+)\.safetensors")


@dataclass
class Parcel:
    """One published version, as it travels from the actor to the rollout."""

    transport: str
    """The name of the transport that made it (and can open it)."""
    version: int
    """The policy version of the weights inside."""
    payload: Any
    """The tensors (in_process), a Ray object reference, or a file path."""
    sizes: list[int] = field(default_factory=list)
    """Bytes of each tensor sent (in_process: filled as the receiver consumes them)."""

    @property
    def megabytes(self) -> float:
        """The size of the weights, for the ``rollout/weight_sync_mb`` metric."""
        return sum(self.sizes) / 1e6


class WeightTransport(ABC):
    name: str

    @abstractmethod
    def send(self, named_tensors: NamedTensors, version: int) -> Parcel:
        """Package ``named_tensors`` as version ``version`` (on the actor's rank 0)."""

    @abstractmethod
    def receive(self, parcel: Parcel) -> NamedTensors:
        """The tensors of ``parcel`` (on a rollout rank)."""

    def discard(self, parcel: Parcel) -> None:
        """Every rollout rank holds ``parcel`` now: free what earlier versions left (the driver calls
        this; an object-store copy is freed by Ray once no one refers to it)."""


def _sizes(state: dict[str, torch.Tensor]) -> list[int]:
    return [t.numel() * t.element_size() for t in state.values()]


def _on_cpu(named_tensors: NamedTensors) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().cpu() for name, tensor in named_tensors}


class InProcess(WeightTransport):
    """The engine is in this process: the tensors pass as an iterator, consumed once."""

    name = "in_process"

    def send(self, named_tensors: NamedTensors, version: int) -> Parcel:
        parcel = Parcel(self.name, version, None)

        def counted() -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in named_tensors:
                parcel.sizes.append(tensor.numel() * tensor.element_size())
                yield name, tensor

        parcel.payload = counted()
        return parcel

    def receive(self, parcel: Parcel) -> NamedTensors:
        return parcel.payload


class ObjectStore(WeightTransport):
    """One CPU copy in Ray's object store; each rollout rank maps it from shared memory."""

    name = "object_store"

    def send(self, named_tensors: NamedTensors, version: int) -> Parcel:
        import ray

        state = _on_cpu(named_tensors)
        return Parcel(self.name, version, ray.put(state), _sizes(state))

    def receive(self, parcel: Parcel) -> NamedTensors:
        import ray

        return ray.get(parcel.payload).items()


class Filesystem(WeightTransport):
    """``policy_v<version>.safetensors`` in a shared folder, written atomically."""

    name = "filesystem"

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def send(self, named_tensors: NamedTensors, version: int) -> Parcel:
        from safetensors.torch import save_file

        state = _on_cpu(named_tensors)
        os.makedirs(self.folder, exist_ok=True)
        path = os.path.join(self.folder, f"policy_v{version}.safetensors")  # FILE_NAME
        tmp = f"{path}.tmp-{os.getpid()}"
        save_file({k: v.clone() for k, v in state.items()}, tmp)  # tied weights share storage
        os.replace(tmp, path)
        return Parcel(self.name, version, path, _sizes(state))

    def receive(self, parcel: Parcel) -> NamedTensors:
        from safetensors.torch import load_file

        return load_file(parcel.payload).items()

    def discard(self, parcel: Parcel) -> None:
        """Remove the older versions' files; the newest stays for a rollout that restarts."""
        for name in os.listdir(self.folder):
            match = FILE_NAME.fullmatch(name)
            if match and int(match.group(1)) < parcel.version:
                os.remove(os.path.join(self.folder, name))


def weight_transport(name: str, folder: str | None = None) -> WeightTransport:
    """The transport ``name`` (``async_training.weight_transport``, or ``in_process``)."""
    if name == Filesystem.name:
        if folder is None:
            raise ValueError("the filesystem weight transport needs async_training.weight_dir")
        return Filesystem(folder)
    transports = {InProcess.name: InProcess, ObjectStore.name: ObjectStore}
    if name not in transports:
        raise ValueError(
            f"unknown weight transport {name!r}; one of {sorted([*transports, Filesystem.name])}"
        )
    return transports[name]()


IN_PROCESS = InProcess()
"""The colocated path's transport (it keeps no state)."""


def transport_of(parcel: Parcel) -> WeightTransport:
    """The transport that opens (and discards) ``parcel``."""
    if parcel.transport == Filesystem.name:
        return Filesystem(os.path.dirname(parcel.payload))
    return weight_transport(parcel.transport)
