"""The Megatron engine's offload keys: ``param_offload``, ``grad_offload`` and ``optimizer_offload``.

What is offloaded is a tensor's whole *storage*: its bytes are copied into a separate host tensor
(pinned on a GPU) and the device storage is freed with ``untyped_storage().resize_(0)``; restoring
allocates the storage again and copies the bytes back. Every tensor viewing that storage stays the
same Python object with the same shape, so megatron-core's contiguous buffers keep working: the
parameters of its ``DistributedDataParallel`` are views into each ``_ParamAndGradBuffer.param_data``,
their ``main_grad`` views into ``grad_data``, and the distributed optimizer's fp32 shards may be views
of the parameters. Offloading by storage frees each buffer once, whatever views it.

The same copies happen on a CPU device (the storage is freed, the bytes sit in another host tensor),
so a CPU test runs this exact code path: while offloaded the storages have size 0, and code that
touched one would fail. Only two steps are GPU-only: pinning the host copy and
``torch.cuda.empty_cache()`` (which hands the freed memory back to the driver, e.g. for a colocated
rollout engine); on CPU they are skipped.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

WEIGHTS, GRADS, OPTIMIZER = "weights", "grads", "optimizer"


@dataclass
class _Parked:
    """One freed storage: its size, and its bytes in host memory (None: restored as zeros)."""

    storage: torch.UntypedStorage
    nbytes: int
    host: torch.Tensor | None


def _bytes_of(storage: torch.UntypedStorage) -> torch.Tensor:
    """The whole storage as one flat uint8 tensor (a view: no copy)."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def device_storages(tensors: Iterable[torch.Tensor], device: torch.device) -> list[torch.UntypedStorage]:
    """The distinct non-empty storages under ``tensors`` that live on ``device``'s kind (host tensors
    on a GPU run, e.g. Adam's step counts, are left alone)."""
    seen: dict[int, torch.UntypedStorage] = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        if tensor.device.type == device.type and storage.nbytes() > 0:
            seen.setdefault(storage.data_ptr(), storage)
    return list(seen.values())


def park(storages: list[torch.UntypedStorage], keep: bool = True) -> list[_Parked]:
    """Copy each storage's bytes into a new host tensor (``keep``; else drop them) and free it."""
    parked = []
    for storage in storages:
        host = None
        if keep:
            pin = storage.device.type == "cuda"
            host = torch.empty(storage.nbytes(), dtype=torch.uint8, pin_memory=pin)
            host.copy_(_bytes_of(storage))  # blocking: the bytes are in host memory before the free
        parked.append(_Parked(storage, storage.nbytes(), host))
        storage.resize_(0)
    return parked


def unpark(parked: list[_Parked]) -> None:
    """Allocate each storage again and copy its bytes back (zeros where none were kept)."""
    for entry in parked:
        entry.storage.resize_(entry.nbytes)
        data = _bytes_of(entry.storage)
        if entry.host is None:
            data.zero_()
        else:
            data.copy_(entry.host, non_blocking=True)  # ordered before any use on the same stream


def _optimizer_tensors(optimizer) -> Iterator[torch.Tensor]:
    """The torch optimizers' parameters (megatron's fp32 main weights or shards of them) and state
    tensors (Adam's moments), in every part of a megatron (chained) optimizer."""
    for part in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(part, "optimizer", None)  # None: a rank with no parameters in this part
        if inner is None:
            continue
        for group in inner.param_groups:
            yield from group["params"]
        for state in inner.state.values():
            yield from (value for value in state.values() if isinstance(value, torch.Tensor))


class Offload:
    """Which of the engine's tensors live in host memory between calls, and :meth:`resident` to bring
    them back for one.

    * ``weights`` (``param_offload``): every parameter's storage (the DDP param buffers, or each
      parameter of an inference-only model). Kept bytes.
    * ``grads`` (``grad_offload``): the DDP grad buffers. Their bytes are dropped, not copied: every
      update starts by zeroing them, so they come back as zeros.
    * ``optimizer`` (``optimizer_offload``): the optimizer's state and its fp32 main weights, less any
      storage of the model's own parameters (an fp32 model's main weights are views of them, which
      ``weights`` owns). Collected again at every offload: Adam creates its state at the first step
      and a checkpoint load replaces it.
    """

    def __init__(
        self,
        module: nn.Module,
        optimizer,
        device: torch.device,
        weights: bool,
        grads: bool,
        optimizer_state: bool,
    ) -> None:
        self.module, self.optimizer, self.device = module, optimizer, device
        has_buffers = hasattr(module, "expert_parallel_buffers")  # megatron's DDP (a trained model)
        self.enabled = {
            WEIGHTS: weights,
            GRADS: grads and optimizer is not None and has_buffers,
            OPTIMIZER: optimizer_state and optimizer is not None,
        }
        self._parked: dict[str, list[_Parked]] = {}
        self._depth = dict.fromkeys(self.enabled, 0)
        self._resident_weights: set[int] = set()
        """The data pointers of the offloaded weights' storages while a block holds them."""
        self._offload([kind for kind, on in self.enabled.items() if on])

    def host_bytes(self, kind: str) -> int:
        """Bytes of ``kind`` (weights, grads, optimizer) held in host memory now: 0 while resident."""
        return sum(entry.host.numel() for entry in self._parked.get(kind, []) if entry.host is not None)

    def outliving(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor``, copied if it views an offloaded weight's storage: what a caller keeps of
        ``full_state_dict`` must stay valid after the block frees that storage again."""
        if tensor.untyped_storage().data_ptr() in self._resident_weights:
            return tensor.clone()
        return tensor

    def _storages(self, kind: str) -> list[torch.UntypedStorage]:
        if kind == WEIGHTS:
            return device_storages(self.module.parameters(), self.device)
        if kind == GRADS:
            buffers = self.module.buffers + self.module.expert_parallel_buffers
            return device_storages((buffer.grad_data for buffer in buffers), self.device)
        model = {s.data_ptr() for s in device_storages(self.module.parameters(), self.device)}
        state = device_storages(_optimizer_tensors(self.optimizer), self.device)
        return [s for s in state if s.data_ptr() not in model]

    def _offload(self, kinds: list[str]) -> None:
        # the optimizer first: telling its storages from the model's needs the weights still resident
        for kind in sorted(kinds, key=(OPTIMIZER, GRADS, WEIGHTS).index):
            self._parked[kind] = park(self._storages(kind), keep=kind != GRADS)
        if kinds and self.device.type == "cuda":
            torch.cuda.empty_cache()

    @contextlib.contextmanager
    def resident(self, grads: bool = False, optimizer: bool = False) -> Iterator[None]:
        """The weights on the device for this block (and the grad buffers with ``grads``, the optimizer
        state with ``optimizer``); what is offloaded goes back to host memory after it. Nested blocks
        move nothing that an outer block already brought."""
        asked = {WEIGHTS: True, GRADS: grads, OPTIMIZER: optimizer}
        kinds = [kind for kind in (WEIGHTS, GRADS, OPTIMIZER) if asked[kind] and self.enabled[kind]]
        for kind in kinds:
            self._depth[kind] += 1
            if self._depth[kind] == 1:
                parked = self._parked.pop(kind)
                unpark(parked)
                if kind == WEIGHTS:
                    self._resident_weights = {entry.storage.data_ptr() for entry in parked}
        try:
            yield
        finally:
            done = []
            for kind in kinds:
                self._depth[kind] -= 1
                if self._depth[kind] == 0:
                    done.append(kind)
            if WEIGHTS in done:
                self._resident_weights = set()
            self._offload(done)
