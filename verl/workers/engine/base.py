"""``TrainEngine``: the narrow interface every role trains and infers through.

A worker (actor, critic, reference) never touches parallelism, precision or optimizers
directly. It hands the engine micro-batches and a function of ``(module, micro_batch)``:

* :meth:`TrainEngine.infer` runs the function without gradients and returns its outputs;
* :meth:`TrainEngine.train_step` runs it with gradients over all micro-batches of one
  mini-batch (gradient accumulation), clips, and steps the optimizer;
* :meth:`TrainEngine.full_state_dict` gathers full weights (for the rollout's weight sync
  and for exporting); :meth:`save` / :meth:`load` write and read sharded checkpoints.

Backends: :class:`verl.workers.engine.fsdp.FSDPEngine` (plain torch on one rank, FSDP2 on
several; gloo on CPU, nccl on CUDA) and :class:`verl.workers.engine.megatron.engine.MegatronEngine`
(megatron-core: tensor, pipeline and data parallel).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

MicroBatch = dict[str, torch.Tensor]
ForwardFn = Callable[[nn.Module, MicroBatch], dict[str, torch.Tensor]]
LossFn = Callable[[nn.Module, MicroBatch], tuple[torch.Tensor, dict[str, float]]]


class TrainEngine(ABC):
    """One model, its optimizer and LR schedule, on this rank's share of the devices."""

    module: nn.Module
    rows_group = None
    """Ranks that hold the same rows (one copy of the model split between them, e.g. Megatron's
    tensor x pipeline group): they gather their shares of a batch and work on it together. None:
    every rank works on its own rows."""
    replicas = 1
    """The size of :attr:`rows_group`."""
    packs_sequences = True
    """Whether ``use_remove_padding`` runs micro-batches packed (else padded: the same values)."""
    offloads_weights = False
    """Whether the weights live in host memory between calls (``param_offload``)."""

    @contextmanager
    def resident(self, optimizer: bool = False) -> Iterator[None]:
        """What the engine offloads (the weights; the optimizer state with ``optimizer``) on the
        device for this block; nothing to do for an engine that offloads nothing."""
        yield

    def weights_copy(self) -> list[torch.Tensor]:
        """A copy of this rank's parameters as they are now (in host memory where the engine offloads
        its weights): what :meth:`computing_with` computes with later."""
        with self.resident():
            return [
                p.detach().to("cpu" if self.offloads_weights else p.device, copy=True)
                for p in self.module.parameters()
            ]

    @contextmanager
    def computing_with(self, weights: list[torch.Tensor]) -> Iterator[None]:
        """Calls in this block compute with ``weights`` (from :meth:`weights_copy`) in place of the
        parameters, which are put back on exit; offloaded weights are brought to the device for the
        whole block, so the engine's calls inside it find the swapped ones."""
        with self.resident(), swapped_parameters(self.module, weights):
            yield

    def adapter_state_dict_on_cpu(self) -> dict[str, torch.Tensor]:
        """LoRA: the engine's ``adapter_tensors()`` on CPU (every rank takes part), for checkpoints
        and export."""
        return {name: tensor.cpu() for name, tensor in self.adapter_tensors()}

    @abstractmethod
    def infer(self, micro_batches: list[MicroBatch], forward_fn: ForwardFn) -> list[dict[str, torch.Tensor]]:
        """``forward_fn`` on each micro-batch under ``torch.no_grad()`` in eval mode."""

    @abstractmethod
    def train_step(
        self, micro_batches: list[MicroBatch], loss_fn: LossFn, loss_weights: list[float]
    ) -> dict[str, float]:
        """Accumulate ``weight * loss`` gradients over micro-batches, clip, step the optimizer.

        Returns the averaged loss metrics plus ``grad_norm`` and ``lr``. A non-finite gradient
        norm skips the optimizer step (``update_skipped`` = 1).
        """

    @abstractmethod
    def lr_scheduler_step(self) -> float:
        """Advance the LR schedule by one training step; returns the new learning rate."""

    @abstractmethod
    def full_state_dict(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full (unsharded) parameters and buffers, one tensor at a time, on every rank."""

    @abstractmethod
    def save(self, folder: str, contents: list[str]) -> None:
        """Write this rank's shard of ``contents`` (model, optimizer, extra) into ``folder``."""

    @abstractmethod
    def load(self, folder: str, contents: list[str]) -> None:
        """Restore what :meth:`save` wrote, on the same number of ranks (the driver checks it)."""

    def extra_state(self) -> dict[str, Any]:
        return {}

    @property
    def hf_config(self):
        """The Hugging Face config of the model trained."""
        return self.hf_module.config

    def data_parallel_rank(self) -> int:
        """This rank's index among the groups that hold different rows."""
        return dist.get_rank() if dist.is_initialized() else 0

    def parameter_count(self) -> int:
        """Parameters of the whole model."""
        return sum(p.numel() for p in self.module.parameters())


@contextmanager
def swapped_parameters(module: nn.Module, weights: list[torch.Tensor]) -> Iterator[None]:
    """Compute with ``weights`` (a copy of ``module.parameters()``, this rank's shards) in place of the
    module's own parameters, which are put back on exit."""
    params = list(module.parameters())
    own = [p.detach().clone() for p in params]
    with torch.no_grad():
        for param, kept in zip(params, weights, strict=True):
            param.copy_(kept)
    try:
        yield
    finally:
        with torch.no_grad():
            for param, mine in zip(params, own, strict=True):
                param.copy_(mine)
