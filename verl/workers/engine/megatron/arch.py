"""Hugging Face architectures -> megatron-core ``GPTModel``: the split checks, the config, the model.

A small converter of our own rather than a bridge (``mbridge``, ``megatron-bridge``): the families it
knows are one table (:mod:`.families`, the MoE ones in :mod:`.moe`).

The model is built from megatron-core's *local* layer spec (plain PyTorch, no Transformer Engine),
which runs on CPUs and on GPUs without extra packages.

Vocabulary padding: megatron-core splits the vocabulary evenly over tensor-parallel ranks, so a
vocabulary that ``tp`` does not divide is padded to the next multiple (:func:`padded_vocab_size`).
The padded embedding and output rows are zero, their logits are pinned to ``PADDED_LOGIT`` (so they
carry no probability and no gradient), and :mod:`.weights` strips them again on export.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch
from torch import nn

from verl.config.base import ConfigError
from verl.workers.engine.megatron.families import UnsupportedModelError, family, head_dim, qkv_bias
from verl.workers.engine.megatron.moe import check_experts, define_missing_te_gemm, moe_fields
from verl.workers.engine.megatron.overrides import apply_transformer_overrides

if TYPE_CHECKING:
    from megatron.core.transformer import TransformerConfig

logger = logging.getLogger(__name__)

PADDED_LOGIT = -10000.0
"""The logit of a padded vocabulary row: ``exp`` of it is 0 in every float format (megatron-core
masks attention scores with the same value), and unlike ``-inf`` it keeps ``p * log p`` finite."""


def rope_parameters(hf_config) -> dict:
    """transformers 5 keeps rotary settings in ``rope_parameters``; older configs at the top level
    (``rope_theta``, ``rope_scaling``)."""
    params = dict(
        getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {}
    )
    params.setdefault("rope_theta", getattr(hf_config, "rope_theta", None) or 10000.0)
    params.setdefault("rope_type", params.get("type", "default"))
    return params


def _rope_kwargs(hf_config) -> dict:
    """``GPTModel``'s rotary arguments. megatron-core implements Llama 3.1's scaling with its fixed
    constants only, so other constants (and other rope types) are refused."""
    params = rope_parameters(hf_config)
    kwargs = dict(position_embedding_type="rope", rotary_base=float(params["rope_theta"]))
    rope_type = params["rope_type"]
    if rope_type == "default":
        return kwargs
    constants = (
        params.get("low_freq_factor"),
        params.get("high_freq_factor"),
        params.get("original_max_position_embeddings"),
    )
    if rope_type == "llama3" and constants == (1, 4, 8192):
        return {**kwargs, "rope_scaling": True, "rope_scaling_factor": float(params.get("factor", 8.0))}
    raise UnsupportedModelError(
        f"the Megatron engine cannot convert rotary scaling {params} of {hf_config.model_type}; it knows "
        "rope_type default and llama3 (low_freq_factor 1, high_freq_factor 4, original 8192 positions)"
    )


def padded_vocab_size(hf_config, tp: int) -> int:
    """The vocabulary rounded up to a multiple of ``tp`` (megatron-core splits it evenly)."""
    return -(-hf_config.vocab_size // tp) * tp


def check_parallel(
    hf_config, tp: int, pp: int, key: str = "megatron", ep: int = 1, etp: int | None = None
) -> None:
    """Refuse, before anything is built, a model the converter does not know or a split it cannot
    make; ``key`` names the config section holding the parallel sizes (``ep``, ``etp``: expert
    model and expert tensor parallel sizes, None: ``tp``)."""
    family(hf_config)
    check_experts(hf_config, tp, ep, tp if etp is None else etp, key)
    _rope_kwargs(hf_config)
    if getattr(hf_config, "mlp_bias", False):
        raise UnsupportedModelError(
            f"{hf_config.model_type} with mlp_bias=True: the converter knows bias-free MLPs"
        )
    heads, groups = hf_config.num_attention_heads, hf_config.num_key_value_heads
    for what, count in (("attention heads", heads), ("key/value heads", groups)):
        if count % tp:
            raise ConfigError(
                f"{key}.tensor_model_parallel_size: expected a divisor of the model's {count} {what} "
                f"({heads} attention heads, {groups} key/value heads), got {tp}"
            )
    layers = hf_config.num_hidden_layers
    if pp > layers or layers % pp:
        raise ConfigError(
            f"{key}.pipeline_model_parallel_size: expected a divisor of the model's {layers} layers "
            f"(each stage holds the same number), got {pp}"
        )


def transformer_config(
    hf_config, *, tp: int, pp: int, dtype: torch.dtype, overrides: dict | None = None, **parallel
) -> TransformerConfig:
    """megatron-core's ``TransformerConfig`` for ``hf_config`` split ``tp`` x ``pp`` in ``dtype``.

    ``parallel``: more ``TransformerConfig`` fields; ``sequence_parallel`` is turned off (with a
    warning), the local layer spec has none. ``overrides`` (verl's
    ``megatron.override_transformer_config``) apply last; a null value keeps the default, an unknown
    key is a :class:`ConfigError` naming it. :func:`.weights.load_hf_state` then overwrites every
    parameter and checks that none is left out."""
    from megatron.core.transformer import TransformerConfig

    fields = dict(
        num_layers=hf_config.num_hidden_layers,
        hidden_size=hf_config.hidden_size,
        num_attention_heads=hf_config.num_attention_heads,
        num_query_groups=hf_config.num_key_value_heads,
        kv_channels=head_dim(hf_config),
        ffn_hidden_size=hf_config.intermediate_size,
        normalization="RMSNorm",
        layernorm_epsilon=hf_config.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=nn.functional.silu,
        add_bias_linear=False,
        add_qkv_bias=qkv_bias(hf_config),
        qk_layernorm=family(hf_config).qk_layernorm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        use_cpu_initialization=not torch.cuda.is_available(),
        # initialisation stays on although load_hf_state overwrites every weight: megatron-core marks the
        # tensor-parallel weights (what the gradient norm and the optimizer read) only while initialising
        **parallel,
    )
    fields.update(moe_fields(hf_config))
    apply_transformer_overrides(fields, overrides or {}, TransformerConfig.__dataclass_fields__)
    return TransformerConfig(**fields)


class ValueHead(nn.Module):
    """The critic's head in place of the output layer: one value per position, whole on every
    tensor-parallel rank (one output column cannot be split).

    It accepts the call ``GPTModel`` makes to its output layer and returns ``(values, None)``. Every
    rank computes the same values from the same (replicated) hidden states, so the gradient each
    rank sends back is already the full one -- no all-reduce, unlike a column-parallel layer."""

    def __init__(self, hidden: int, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(1, hidden))
        self.bias = nn.Parameter(torch.empty(1)) if bias else None

    def forward(self, hidden_states, weight=None, runtime_gather_output=None):
        return nn.functional.linear(hidden_states, self.weight, self.bias), None


def _mask_padded_vocab(vocab: int, padded: int):
    """A forward hook for the output layer that pins the padded vocabulary's logits to
    ``PADDED_LOGIT``; the logits are this rank's slice, or all of them when gathered."""

    def hook(module, args, output):
        logits, bias = output
        width = logits.shape[-1]
        start = 0 if width == padded else module.tp_group.rank() * width
        ids = torch.arange(start, start + width, device=logits.device)
        return logits.masked_fill(ids >= vocab, PADDED_LOGIT), bias

    return hook


def _decoder_spec(config: TransformerConfig):
    """The local (non-TE) layer spec; with dense layers among the MoE ones (``moe_layer_freq``), one
    spec per layer of this pipeline stage."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_block import (
        LayerNormImpl,
        TransformerBlockSubmodules,
        get_num_layers_to_build,
    )
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    def layer_spec(num_experts: int | None):
        # RMSNorm named explicitly: left unnamed, the spec picks apex's LayerNorm where apex is installed.
        return get_gpt_layer_local_spec(
            num_experts=num_experts,
            moe_grouped_gemm=False,
            qk_layernorm=config.qk_layernorm,
            normalization="RMSNorm",
        )

    pattern = config.moe_layer_freq
    if not config.num_moe_experts or not isinstance(pattern, list) or all(pattern):
        return layer_spec(config.num_moe_experts)
    first = get_transformer_layer_offset(config)
    here = pattern[first : first + get_num_layers_to_build(config)]
    return TransformerBlockSubmodules(
        layer_specs=[layer_spec(config.num_moe_experts if is_moe else None) for is_moe in here],
        layer_norm=LayerNormImpl,  # the final norm, as megatron-core picks it for a single layer spec
    )


def build_model(
    hf_config, config: TransformerConfig, *, pre_process: bool, post_process: bool, value_head: bool = False
) -> nn.Module:
    """This pipeline stage's ``GPTModel``; ``value_head``: the critic's model (a :class:`ValueHead`
    instead of the output layer, giving ``[b, s, 1]``). Weights are left to :func:`.weights.load_hf_state`."""
    from megatron.core.models.gpt import GPTModel

    tp = config.tensor_model_parallel_size
    padded = padded_vocab_size(hf_config, tp)
    if config.num_moe_experts:
        define_missing_te_gemm()
    model = GPTModel(
        config,
        _decoder_spec(config),
        vocab_size=padded,
        max_sequence_length=hf_config.max_position_embeddings,
        pre_process=pre_process,
        post_process=post_process,
        share_embeddings_and_output_weights=bool(hf_config.tie_word_embeddings) and not value_head,
        **_rope_kwargs(hf_config),
    )
    if post_process and value_head:
        bias = bool(getattr(hf_config, "token_classification_bias", True))  # transformers' default: a bias
        model.output_layer = ValueHead(hf_config.hidden_size, bias).to(
            config.params_dtype
        )  # as the trunk (bf16 on a GPU)
    elif post_process and padded != hf_config.vocab_size:
        model.output_layer.register_forward_hook(_mask_padded_vocab(hf_config.vocab_size, padded))
    return model
