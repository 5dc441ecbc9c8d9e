"""Which :class:`~verl.workers.engine.base.TrainEngine` a role trains with (its ``strategy``)."""

from __future__ import annotations

import torch
from torch import nn

from verl.config.engine import FSDPConfig, OptimConfig
from verl.workers.engine.base import TrainEngine

MEGATRON = "megatron"


def reads_hf_weights(role) -> bool:
    """Whether a role's engine takes its weights from the Hugging Face model (``role``: an actor,
    reference or critic section): not a Megatron one with ``megatron.use_dist_checkpointing``, which
    fills them from the distributed checkpoint, so its HF module is built without them."""
    return not (role.strategy == MEGATRON and role.megatron.use_dist_checkpointing)


def build_engine(
    strategy: str,
    module: nn.Module,
    device: torch.device,
    fsdp: FSDPConfig,
    megatron,
    key: str,
    optim: OptimConfig | None = None,
    grad_clip: float = 1.0,
    gradient_checkpointing: bool = False,
    value_head: bool = False,
) -> TrainEngine:
    """``strategy`` fsdp / fsdp2: :class:`~verl.workers.engine.fsdp.FSDPEngine` over ``fsdp``;
    megatron: :class:`~verl.workers.engine.megatron.engine.MegatronEngine` over ``megatron`` (``key``
    names that section in errors; its weights in ``megatron.dtype`` on a GPU, ``fsdp.model_dtype`` or
    fp32 on CPU). ``value_head``: the module is a critic's token classifier."""
    from verl.workers.engine.fsdp import FSDPEngine, torch_dtype

    if strategy == MEGATRON:
        from verl.workers.engine.megatron.engine import MegatronEngine

        dtype = megatron.dtype if device.type == "cuda" else fsdp.model_dtype or "fp32"
        return MegatronEngine(
            module,
            device,
            megatron,
            key,
            dtype=torch_dtype(dtype),
            optim=optim,
            grad_clip=grad_clip,
            value_head=value_head,
            gradient_checkpointing=gradient_checkpointing,
        )
    return FSDPEngine(
        module, device, fsdp, optim=optim, grad_clip=grad_clip, gradient_checkpointing=gradient_checkpointing
    )
