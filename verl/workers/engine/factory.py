"""Which :class:`~verl.workers.engine.base.TrainEngine` a role trains with (its ``strategy``)."""

from __future__ import annotations

from typing import Any

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
    lora: Any = None,
    lora_key: str = "actor_rollout_ref.model",
) -> TrainEngine:
    """``strategy`` fsdp / fsdp2: :class:`~verl.workers.engine.fsdp.FSDPEngine` over ``fsdp``;
    megatron: :class:`~verl.workers.engine.megatron.engine.MegatronEngine` over ``megatron`` (``key``
    names that section in errors; its weights in ``megatron.dtype`` on a GPU, ``fsdp.model_dtype`` or
    fp32 on CPU). ``value_head``: the module is a critic's token classifier. ``lora``: the model
    section (``lora_key`` names it) whose LoRA keys the engine trains adapters for: peft's on FSDP,
    on megatron-core's linears on Megatron; None: every weight trains."""
    from verl.workers.engine.fsdp import FSDPEngine, torch_dtype

    if strategy == MEGATRON:
        from verl.config.megatron import megatron_lora_targets
        from verl.workers.engine.megatron.engine import MegatronEngine
        from verl.workers.engine.megatron.lora import LoraSettings

        dtype = megatron.dtype if device.type == "cuda" else fsdp.model_dtype or "fp32"
        settings = None
        if lora is not None:
            targets = megatron_lora_targets(lora.target_modules, f"{lora_key}.target_modules")
            settings = LoraSettings(lora.lora_rank, lora.lora_alpha, targets, lora_key)
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
            lora=settings,
        )
    if lora is not None:
        from verl.workers.engine.lora import apply_lora

        module = apply_lora(module, lora)
    return FSDPEngine(
        module, device, fsdp, optim=optim, grad_clip=grad_clip, gradient_checkpointing=gradient_checkpointing
    )
