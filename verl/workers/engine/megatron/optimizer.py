"""The Megatron engine's training side: megatron-core's DDP around the model and its optimizer
(:func:`wrap_for_training`), and one clipped optimizer step (:func:`optimizer_step`).

The optimizer takes verl's ``optim`` section (Adam, its LR, betas, weight decay) and the
``override_optimizer_config`` keys last; no megatron-core import at module level.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from verl.config.engine import OptimConfig
from verl.workers.engine.megatron.overrides import optimizer_overrides

if TYPE_CHECKING:
    from verl.config.megatron import MegatronConfig


def wrap_for_training(
    model: nn.Module,
    config: Any,
    megatron: MegatronConfig,
    optim: OptimConfig,
    dtype: torch.dtype,
    grad_clip: float,
    device: torch.device,
    key: str,
) -> tuple[nn.Module, Any]:
    """``model`` in megatron-core's ``DistributedDataParallel`` (gradients reduced in fp32; sharded
    over the data-parallel ranks with ``use_distributed_optimizer``) and its optimizer; ``config``
    (the transformer config) learns how to finalize the gradients. ``key``: the ``megatron`` section
    the errors name."""
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    ddp = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, use_distributed_optimizer=megatron.use_distributed_optimizer
    )
    model = DistributedDataParallel(config=config, ddp_config=ddp, module=model)
    config.finalize_model_grads_func = finalize_model_grads
    low = dtype in (torch.bfloat16, torch.float16)
    overrides = optimizer_overrides(
        optim.override_optimizer_config,
        device,
        f"{key.removesuffix('.megatron')}.optim.override_optimizer_config",
    )
    base = dict(
        optimizer="adam",
        lr=optim.lr,
        weight_decay=optim.weight_decay,
        adam_beta1=optim.betas[0],
        adam_beta2=optim.betas[1],
        adam_eps=optim.eps,
        clip_grad=grad_clip,
        bf16=dtype == torch.bfloat16 and low,
        fp16=dtype == torch.float16,
        params_dtype=dtype,
        use_distributed_optimizer=megatron.use_distributed_optimizer,
    )
    opt = OptimizerConfig(**{**base, **overrides})  # verl's overrides apply last
    # ``{}``: weight decay on every parameter, as the FSDP engine (megatron's default skips biases
    # and norms); one set of algorithm semantics whichever engine trains
    return model, get_megatron_optimizer(opt, [model], config_overrides={})


def optimizer_step(optimizer: Any, grad_clip: float) -> tuple[float, bool]:
    """Clip to ``grad_clip`` and step, unless the gradient norm is not finite (then skip, and zero
    the gradients): the norm, and whether the step was skipped."""
    from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32

    parts = getattr(optimizer, "chained_optimizers", [optimizer])
    optimizer.prepare_grads()
    grad_norm = float(optimizer.get_grad_norm())
    if not math.isfinite(grad_norm):
        optimizer.zero_grad()
        return grad_norm, True
    for part in parts:
        params = part.get_parameters()
        if params and grad_clip > 0:
            clip_grad_by_total_norm_fp32(params, max_norm=grad_clip, total_norm=grad_norm)
    optimizer.step_with_ready_grads()
    return grad_norm, False
