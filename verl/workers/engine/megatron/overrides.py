"""verl's ``override_transformer_config`` and ``optim.override_optimizer_config`` onto megatron-core's
``TransformerConfig`` and ``OptimizerConfig``, less what this engine cannot honour.

Every entry must be a field of the megatron-core class (an unknown one is an error naming it). verl's
scripts for big and MoE models also switch on fused kernels of Transformer Engine or Apex (rotary,
softmax, gradient accumulation, grouped expert GEMMs, DeepEP's dispatcher, ...). The engine builds
megatron-core's *local* layer spec, which has none of them: these knobs change speed, never the
numbers, so each is set back to the path the local spec has (:data:`LOCAL_SPEC`) with one warning,
and the script runs. Likewise the optimizer's host-offload knobs on a CPU device, where the optimizer
state already lives in host memory, and the precision-aware optimizer, which needs Transformer
Engine's fused Adam (:data:`OPTIMIZER_OFF`)."""

from __future__ import annotations

import logging
from typing import Any

import torch

from verl.config.base import ConfigError

logger = logging.getLogger(__name__)

LOCAL_SPEC: dict[str, Any] = {
    "sequence_parallel": False,  # torch norms cannot split the sequence (memory only)
    "apply_rope_fusion": False,
    "masked_softmax_fusion": False,
    "bias_activation_fusion": False,
    "bias_dropout_fusion": False,
    "gradient_accumulation_fusion": False,
    "persist_layer_norm": False,
    "moe_grouped_gemm": False,  # sequential experts: the same products, one expert at a time
    "moe_permute_fusion": False,
    "moe_enable_deepep": False,
    "moe_token_dispatcher_type": "alltoall",  # the dispatcher that runs without DeepEP (flex needs it)
}
"""TransformerConfig fields the local layer spec runs only one way: name -> the value it takes."""


def apply_transformer_overrides(fields: dict, overrides: dict, known) -> None:
    """verl's ``override_transformer_config`` over ``fields`` (null: keep), then :data:`LOCAL_SPEC`."""
    for name, value in overrides.items():
        if name not in known:
            raise ConfigError(
                f"override_transformer_config.{name}: expected a field of megatron-core's TransformerConfig, "
                f"got an unknown key {name!r}"
            )
        if value is not None:
            fields[name] = value
    fields.pop("attention_backend", None)  # verl's configs name a TE backend here
    for name, local in LOCAL_SPEC.items():
        if name in fields and fields[name] not in (local, None):
            logger.warning(
                "%s=%r is set to %r: megatron-core's local layer spec (no Transformer Engine) has only that "
                "(speed or memory, not the values)",
                name,
                fields[name],
                local,
            )
            fields[name] = local


OPTIMIZER_OFF = {
    "use_precision_aware_optimizer": "it needs Transformer Engine's fused Adam (the state stays fp32)",
}
"""OptimizerConfig fields turned off on every device, and why."""
HOST_OFFLOAD = ("optimizer_cpu_offload", "overlap_cpu_optimizer_d2h_h2d")
"""OptimizerConfig fields that move the optimizer to host memory: nothing to move on a CPU device."""


def optimizer_overrides(overrides: dict | None, device: torch.device, key: str) -> dict[str, Any]:
    """The entries of ``optim.override_optimizer_config`` (``key``) megatron-core's OptimizerConfig
    gets: unknown fields refused by name, :data:`OPTIMIZER_OFF` and (on a CPU device) :data:`HOST_OFFLOAD`
    dropped with a warning."""
    from megatron.core.optimizer import OptimizerConfig

    out = {}
    for name, value in (overrides or {}).items():
        if name not in OptimizerConfig.__dataclass_fields__:
            raise ConfigError(
                f"{key}.{name}: expected a field of megatron-core's OptimizerConfig, got an unknown key {name!r}"
            )
        why = OPTIMIZER_OFF.get(name)
        if why is None and device.type == "cpu" and name in HOST_OFFLOAD:
            why = "on a CPU device the optimizer state is in host memory already"
        if why is not None and value:
            logger.warning("%s.%s=%r has no effect here: %s", key, name, value, why)
        elif value is not None:
            out[name] = value
    return out
