"""Hugging Face models <-> megatron-core ``GPTModel`` shards: the architectures, the layouts, the names.

A small converter of our own rather than a bridge (``mbridge``, ``megatron-bridge``): the dense
families verl users train share one layout (Qwen2/2.5, Qwen3, Llama, Mistral: RMSNorm, rotary
positions, grouped-query attention, SwiGLU), so one table of names and four layout rules cover them,
with nothing to install and no version pins against transformers (both bridges needed patches or a
newer Python here).

Layouts under tensor parallelism (``T`` ranks, rank ``r``):

* ``linear_qkv``: one matrix, rows grouped by key/value head group: for each group its query heads,
  then its key head, then its value head; rank ``r`` holds groups ``r G/T .. (r+1) G/T - 1``;
* ``linear_fc1``: ``[gate; up]``, rank ``r`` holding ``[gate rows of r; up rows of r]``;
* ``linear_proj`` and ``linear_fc2``: split by columns (input features);
* embedding and output layer: split by vocabulary rows; norms and the critic's value head: whole.

Pipeline stages number their layers from 0; megatron-core's layer offset gives the global index.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from verl.config.base import ConfigError

FAMILIES = {"qwen2": "Qwen2", "qwen3": "Qwen3", "llama": "Llama", "mistral": "Mistral"}
"""``config.model_type`` of the families the converter knows (causal LM and token classifier)."""
VALUE_HEAD = "score"
"""The critic's head in Hugging Face's token classifier: ``score.weight`` ``[1, hidden]`` (and bias)."""


@dataclass(frozen=True)
class Entry:
    """One megatron parameter and the Hugging Face tensors it is made of."""

    name: str
    hf_names: tuple[str, ...]
    kind: str
    """same (one tensor) | vocab (one tensor, rows padded to the padded vocabulary) | qkv | gate_up."""
    split: int | None
    """The dimension tensor parallelism splits (None: every rank holds it whole)."""


def check_architecture(hf_config, key: str) -> None:
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in FAMILIES:
        known = ", ".join(f"{name} ({t})" for t, name in FAMILIES.items())
        archs = getattr(hf_config, "architectures", None) or [model_type]
        raise ConfigError(
            f"{key}: the Megatron engine cannot convert {', '.join(map(str, archs))} (model_type {model_type!r}); "
            f"it knows {known}, as causal LMs or one-label token classifiers; use strategy=fsdp for others"
        )


def check_parallel(hf_config, tp: int, pp: int, key: str) -> None:
    """Sizes the model can be split by; errors name the key and say what divides what."""
    check_architecture(hf_config, key)
    heads, groups = hf_config.num_attention_heads, hf_config.num_key_value_heads
    for what, count in (("attention heads", heads), ("key/value heads", groups)):
        if count % tp:
            raise ConfigError(
                f"{key}.tensor_model_parallel_size={tp} must divide the model's {count} {what} "
                f"({hf_config.model_type}: {heads} heads, {groups} key/value heads)"
            )
    layers = hf_config.num_hidden_layers
    if layers % pp:
        raise ConfigError(
            f"{key}.pipeline_model_parallel_size={pp} must divide the model's {layers} layers (each stage holds "
            "the same number)"
        )


def padded_vocab(hf_config, tp: int) -> int:
    """The vocabulary rounded up to a multiple of ``tp`` (each rank holds as many rows). The padding
    rows are zero in the weights, masked out of the logits (:class:`~.engine.StageModule`) and
    stripped from exported weights."""
    return -(-hf_config.vocab_size // tp) * tp


def head_dim(hf_config) -> int:
    return getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads


def rope_theta(hf_config) -> float:
    """transformers 5 keeps it in ``rope_parameters``; older configs at the top level."""
    params = getattr(hf_config, "rope_parameters", None) or {}
    return float(params.get("rope_theta") or getattr(hf_config, "rope_theta", None) or 10000.0)


def _qkv_bias(hf_config) -> bool:
    return hf_config.model_type == "qwen2" or bool(getattr(hf_config, "attention_bias", False))


def transformer_config(hf_config, *, tp: int, pp: int, dtype: torch.dtype, overrides: dict, **parallel):
    """megatron-core's ``TransformerConfig`` of the model, split ``tp`` x ``pp``; ``overrides``
    (``megatron.override_transformer_config``) last, an unknown key an error that names it."""
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
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        add_qkv_bias=_qkv_bias(hf_config),
        qk_layernorm=hf_config.model_type == "qwen3",
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        use_cpu_initialization=True,  # the weights are overwritten by the converted ones anyway
        **parallel,
    )
    known = set(TransformerConfig.__dataclass_fields__)
    for name, value in overrides.items():
        if name not in known:
            raise ConfigError(
                f"override_transformer_config.{name}: not a field of megatron-core's TransformerConfig"
            )
        if value is not None:
            fields[name] = value
    fields.pop("attention_backend", None)  # the local layer spec has one attention (no Transformer Engine)
    return TransformerConfig(**fields)


class ValueHead(nn.Module):
    """The critic's head, whole on every rank: one value per position, called as megatron-core calls
    its output layer. Under sequence parallelism its input is this rank's slice of the sequence,
    gathered first."""

    def __init__(self, hidden: int, bias: bool, sequence_parallel: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1, hidden))
        self.bias = nn.Parameter(torch.zeros(1)) if bias else None
        self.sequence_parallel = sequence_parallel

    def forward(self, hidden, weight=None, runtime_gather_output=None):
        if self.sequence_parallel:
            from megatron.core.tensor_parallel.mappings import gather_from_sequence_parallel_region

            hidden = gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=False)
        return nn.functional.linear(hidden, self.weight, self.bias), None


def build_model(
    hf_config, config, *, pre_process: bool, post_process: bool, value_head: bool = False
) -> nn.Module:
    """This pipeline stage's ``GPTModel`` (local layer spec); ``value_head``: the critic's head."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    model = GPTModel(
        config,
        get_gpt_layer_local_spec(qk_layernorm=config.qk_layernorm),
        vocab_size=padded_vocab(hf_config, config.tensor_model_parallel_size),
        max_sequence_length=hf_config.max_position_embeddings,
        pre_process=pre_process,
        post_process=post_process,
        share_embeddings_and_output_weights=bool(hf_config.tie_word_embeddings) and not value_head,
        position_embedding_type="rope",
        rotary_base=rope_theta(hf_config),
    )
    if value_head and post_process:
        bias = bool(getattr(hf_config, "token_classification_bias", True))  # transformers: a bias unless told
        model.output_layer = ValueHead(hf_config.hidden_size, bias, config.sequence_parallel)
    return model
