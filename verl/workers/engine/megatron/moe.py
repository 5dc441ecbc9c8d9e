"""The mixture-of-experts families (Qwen3-MoE, Mixtral, Qwen2-MoE) on megatron-core.

A MoE layer's MLP is a softmax top-k router over SwiGLU experts: megatron-core's ``MoELayer`` with its
sequential experts (no grouped GEMM without Transformer Engine) and the all-to-all token dispatcher,
the experts split over ``expert_model_parallel_size`` ranks. Qwen2-MoE adds a shared expert, an
always-on SwiGLU scaled by a sigmoid gate (megatron-core's gated ``SharedExpertMLP``); the Qwen
families may keep some layers dense (``mlp_only_layers``, ``decoder_sparse_step``), megatron-core's
``moe_layer_freq`` pattern. No megatron-core import at module level.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from verl.config.base import ConfigError
from verl.workers.engine.megatron.families import family


@dataclass(frozen=True)
class Experts:
    """A mixture-of-experts model's experts, as its Hugging Face config gives them."""

    count: int
    top_k: int
    ffn: int
    """Each expert's intermediate size."""
    normalized: bool
    """The top-k routing weights renormalised to sum to 1 (Mixtral always; Qwen3-MoE's
    ``norm_topk_prob``); otherwise they stay the softmax over all experts."""
    aux_loss_coeff: float
    """``router_aux_loss_coef``: the load-balancing loss's weight, where that loss is turned on."""
    layers: tuple[bool, ...]
    """Per layer, whether its MLP is a MoE layer (the others are dense SwiGLUs of ``intermediate_size``)."""
    shared_ffn: int = 0
    """The shared expert's intermediate size (Qwen2-MoE; its output scaled by a sigmoid gate); 0: none."""


def moe_layers(hf_config) -> tuple[bool, ...]:
    """Which layers are MoE layers, as transformers builds them: every ``decoder_sparse_step``-th one
    that ``mlp_only_layers`` does not name (every layer where the config has neither)."""
    step = getattr(hf_config, "decoder_sparse_step", None) or 1
    dense = set(getattr(hf_config, "mlp_only_layers", None) or [])
    return tuple(i not in dense and (i + 1) % step == 0 for i in range(hf_config.num_hidden_layers))


def experts(hf_config) -> Experts | None:
    """The experts of a MoE family's config; None for a dense model."""
    if not family(hf_config).moe:
        return None
    return Experts(
        layers=moe_layers(hf_config),
        shared_ffn=getattr(hf_config, "shared_expert_intermediate_size", None) or 0,
        count=getattr(hf_config, "num_experts", None) or hf_config.num_local_experts,
        top_k=hf_config.num_experts_per_tok,
        ffn=getattr(hf_config, "moe_intermediate_size", None) or hf_config.intermediate_size,
        normalized=bool(getattr(hf_config, "norm_topk_prob", True)),
        aux_loss_coeff=float(getattr(hf_config, "router_aux_loss_coef", 0.0) or 0.0),
    )


def check_experts(hf_config, tp: int, ep: int, etp: int, key: str) -> None:
    """Refuse, naming the key under ``key``, an expert split the engine cannot train: tensor
    parallelism on a MoE model, expert parallelism on a dense one, an expert count ``ep`` does not
    divide, and experts split inside (``etp`` > 1)."""
    moe = experts(hf_config)
    if moe is not None and tp > 1:
        raise ConfigError(
            f"{key}.tensor_model_parallel_size: expected 1 for the MoE model {hf_config.model_type}, got {tp}: "
            "megatron-core trains MoE layers under tensor parallelism only with sequence parallelism, which "
            "its local layer spec (no Transformer Engine) lacks; split the experts over ranks with "
            "expert_model_parallel_size instead"
        )
    if moe is None:
        if ep > 1:
            raise ConfigError(
                f"{key}.expert_model_parallel_size: expected 1 for {hf_config.model_type}, a dense model "
                f"without experts, got {ep}"
            )
        return
    if moe.count % ep:
        raise ConfigError(
            f"{key}.expert_model_parallel_size: expected a divisor of the model's {moe.count} experts, got {ep}"
        )
    if etp != 1:
        raise ConfigError(
            f"{key}.expert_tensor_parallel_size: expected 1 (or null with tensor_model_parallel_size=1), got "
            f"{etp}: with experts split 2 ways, megatron-core 0.16.1 updated some expert weights in the wrong "
            "direction here (off by twice the learning rate after one step, against a single rank), so whole "
            "experts per rank it is; split them over ranks with expert_model_parallel_size"
        )


def moe_fields(hf_config) -> dict:
    """``TransformerConfig`` fields of a MoE family (none for a dense model). The router is
    transformers': softmax over all experts then top-k (renormalised where the model says, which
    equals megatron-core's top-k-then-softmax); nothing dropped (no capacity factor); dense layers
    where the model has them (``moe_layer_freq``), a gated shared expert where it has one. The
    load-balancing loss is off, as verl turns it off for RL; ``override_transformer_config.
    moe_router_load_balancing_type=aux_loss`` turns it on with the model's ``router_aux_loss_coef``."""
    moe = experts(hf_config)
    if moe is None:
        return {}
    shared = dict(moe_shared_expert_intermediate_size=moe.shared_ffn, moe_shared_expert_gate=True)
    return dict(
        **(shared if moe.shared_ffn else {}),
        moe_layer_freq=[int(is_moe) for is_moe in moe.layers],
        num_moe_experts=moe.count,
        moe_router_topk=moe.top_k,
        moe_ffn_hidden_size=moe.ffn,
        moe_router_score_function="softmax",
        moe_router_pre_softmax=not moe.normalized,
        moe_token_dispatcher_type="alltoall",  # the one megatron-core dispatcher for varying lengths
        moe_grouped_gemm=False,  # grouped GEMM needs Transformer Engine
        moe_router_load_balancing_type="none",
        moe_aux_loss_coeff=moe.aux_loss_coeff,
    )


def define_missing_te_gemm() -> None:
    """megatron-core 0.16.1's router reads ``moe_utils.te_general_gemm``, which that module defines
    only when Transformer Engine imports: without TE every MoE forward raised ``NameError``. None is
    the value its own check (``te_general_gemm is not None``) falls back on."""
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


def router_losses(config: Any, micro_batches: int) -> dict[str, float]:
    """The MoE router's auxiliary losses of this step (``moe_load_balancing_loss``, ``moe_z_loss``
    where ``override_transformer_config`` turns them on), per MoE layer and micro-batch, averaged
    over the data-parallel ranks as megatron-core's trainer logs them; ``config``: the model's
    transformer config. Every rank calls this."""
    from megatron.core.transformer.moe import moe_utils

    tracker = moe_utils.get_moe_layer_wise_logging_tracker()
    if not config.num_moe_experts or not tracker:
        return {}
    moe_utils.reduce_aux_losses_tracker_across_ranks()
    pattern = config.moe_layer_freq  # a MoE family's config lists the MoE layers
    layers = sum(pattern) if isinstance(pattern, list) else config.num_layers
    out = {f"moe_{name}": float(v["values"].sum()) / (layers * micro_batches) for name, v in tracker.items()}
    moe_utils.clear_aux_losses_tracker()
    return out
