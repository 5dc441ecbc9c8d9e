"""Hugging Face architectures -> megatron-core ``GPTModel``: the families the converter knows.

A small converter of our own rather than a bridge (``mbridge``, ``megatron-bridge``): the dense
families verl users train (Qwen2/2.5, Qwen3, Llama, Mistral) share one layout -- RMSNorm, rotary
positions, grouped-query attention, SwiGLU -- and differ only in a QKV bias and per-head q/k norms, so
one small table describes them. Each is known as a causal LM and as the one-label token classifier a
critic uses (same trunk, a ``score`` head ``[1, hidden]`` instead of ``lm_head``).

The mixture-of-experts families (Qwen3-MoE, Mixtral) replace every layer's MLP by a softmax top-k
router over SwiGLU experts: megatron-core's ``MoELayer`` with its sequential experts (no grouped GEMM
without Transformer Engine) and the all-to-all token dispatcher, the experts split over
``expert_model_parallel_size`` ranks and each expert over ``expert_tensor_parallel_size``.

The model is built from megatron-core's *local* layer spec (plain PyTorch, no Transformer Engine),
which runs on CPUs and on GPUs without extra packages.

Vocabulary padding: megatron-core splits the vocabulary evenly over tensor-parallel ranks, so a
vocabulary that ``tp`` does not divide is padded to the next multiple (:func:`padded_vocab_size`).
The padded embedding and output rows are zero, their logits are pinned to ``PADDED_LOGIT`` (so they
carry no probability and no gradient), and :mod:`.weights` strips them again on export.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from verl.config.base import ConfigError
from verl.utils.errors import UserInputError
from verl.workers.engine.megatron.overrides import apply_transformer_overrides

if TYPE_CHECKING:
    from megatron.core.transformer import TransformerConfig

logger = logging.getLogger(__name__)

PADDED_LOGIT = -10000.0
"""The logit of a padded vocabulary row: ``exp`` of it is 0 in every float format (megatron-core
masks attention scores with the same value), and unlike ``-inf`` it keeps ``p * log p`` finite."""


class UnsupportedModelError(UserInputError, ValueError):
    """The Hugging Face model is not one the Megatron converter knows."""

    kind = "model"


@dataclass(frozen=True)
class Family:
    """What tells one dense family's layout from another's."""

    name: str
    """The class-name prefix in transformers (``Qwen2`` -> ``Qwen2ForCausalLM``)."""
    qkv_bias: bool | None
    """Whether q/k/v projections have a bias (None: the config's ``attention_bias`` says)."""
    qk_layernorm: bool
    """Per-head RMSNorm of queries and keys before rotary (Qwen3's ``q_norm``/``k_norm``)."""
    moe: bool = False
    """Every layer's MLP is a top-k mixture of SwiGLU experts (``mlp.gate`` router, ``mlp.experts``)."""


FAMILIES = {
    "qwen2": Family("Qwen2", qkv_bias=True, qk_layernorm=False),
    "qwen3": Family("Qwen3", qkv_bias=None, qk_layernorm=True),
    "llama": Family("Llama", qkv_bias=None, qk_layernorm=False),
    "mistral": Family("Mistral", qkv_bias=False, qk_layernorm=False),
    "qwen3_moe": Family("Qwen3Moe", qkv_bias=None, qk_layernorm=True, moe=True),
    "mixtral": Family("Mixtral", qkv_bias=False, qk_layernorm=False, moe=True),
}
"""``config.model_type`` -> its family."""
HEADS = ("ForCausalLM", "ForTokenClassification")
KNOWN_ARCHITECTURES = tuple(f.name + head for f in FAMILIES.values() for head in HEADS)
"""Every ``config.architectures`` entry the converter accepts."""


def family(hf_config) -> Family:
    """The config's family; an :class:`UnsupportedModelError` naming it and the known ones otherwise."""
    model_type = getattr(hf_config, "model_type", None)
    archs = list(getattr(hf_config, "architectures", None) or [])
    unknown = [a for a in archs if a not in KNOWN_ARCHITECTURES]
    if model_type not in FAMILIES or unknown:
        named = ", ".join(unknown or archs) or "no architecture"
        raise UnsupportedModelError(
            f"the Megatron engine cannot convert {named} (model_type {model_type!r}); it knows "
            f"{', '.join(KNOWN_ARCHITECTURES)} (token classifiers with num_labels=1); use strategy=fsdp "
            "for other models"
        )
    return FAMILIES[model_type]


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


def experts(hf_config) -> Experts | None:
    """The experts of a MoE family's config; None for a dense model."""
    if not family(hf_config).moe:
        return None
    return Experts(
        count=getattr(hf_config, "num_experts", None) or hf_config.num_local_experts,
        top_k=hf_config.num_experts_per_tok,
        ffn=getattr(hf_config, "moe_intermediate_size", None) or hf_config.intermediate_size,
        normalized=bool(getattr(hf_config, "norm_topk_prob", True)),
        aux_loss_coeff=float(getattr(hf_config, "router_aux_loss_coef", 0.0) or 0.0),
    )


def head_dim(hf_config) -> int:
    """Qwen3 (and some Llamas) set ``head_dim`` apart from ``hidden_size / heads``."""
    return getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads


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
    _check_experts(hf_config, tp, ep, tp if etp is None else etp, key)
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


def _check_experts(hf_config, tp: int, ep: int, etp: int, key: str) -> None:
    moe = experts(hf_config)
    if moe is not None and tp > 1:
        raise ConfigError(
            f"{key}.tensor_model_parallel_size: expected 1 for the MoE model {hf_config.model_type}, got {tp}: "
            "megatron-core trains MoE layers under tensor parallelism only with sequence parallelism, which "
            "its local layer spec (no Transformer Engine) lacks; split the experts with "
            "expert_model_parallel_size and expert_tensor_parallel_size instead"
        )
    if moe is None:
        if ep > 1:
            raise ConfigError(
                f"{key}.expert_model_parallel_size: expected 1 for {hf_config.model_type}, a dense model "
                f"without experts, got {ep}"
            )
        return
    sparse = (
        getattr(hf_config, "decoder_sparse_step", 1),
        list(getattr(hf_config, "mlp_only_layers", []) or []),
    )
    if sparse != (1, []):
        raise UnsupportedModelError(
            f"{hf_config.model_type} with decoder_sparse_step={sparse[0]} and mlp_only_layers={sparse[1]}: "
            "the converter knows models whose every layer is a MoE layer (step 1, no dense layers)"
        )
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


def qkv_bias(hf_config) -> bool:
    """Qwen2 always has a QKV bias, Mistral never; Llama and Qwen3 as `attention_bias` says."""
    fixed = family(hf_config).qkv_bias
    return bool(getattr(hf_config, "attention_bias", False)) if fixed is None else fixed


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
    fields.update(_moe_fields(hf_config))
    apply_transformer_overrides(fields, overrides or {}, TransformerConfig.__dataclass_fields__)
    return TransformerConfig(**fields)


def _moe_fields(hf_config) -> dict:
    """``TransformerConfig`` fields of a MoE family (none for a dense model). The router is
    transformers': softmax over all experts then top-k (renormalised where the model says, which
    equals megatron-core's top-k-then-softmax); nothing dropped (no capacity factor). The
    load-balancing loss is off, as verl turns it off for RL; ``override_transformer_config.
    moe_router_load_balancing_type=aux_loss`` turns it on with the model's ``router_aux_loss_coef``."""
    moe = experts(hf_config)
    if moe is None:
        return {}
    return dict(
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


def _define_missing_te_gemm() -> None:
    """megatron-core 0.16.1's router reads ``moe_utils.te_general_gemm``, which that module defines
    only when Transformer Engine imports: without TE every MoE forward raised ``NameError``. None is
    the value its own check (``te_general_gemm is not None``) falls back on."""
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


def build_model(
    hf_config, config: TransformerConfig, *, pre_process: bool, post_process: bool, value_head: bool = False
) -> nn.Module:
    """This pipeline stage's ``GPTModel``; ``value_head``: the critic's model (a :class:`ValueHead`
    instead of the output layer, giving ``[b, s, 1]``). Weights are left to :func:`.weights.load_hf_state`."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    tp = config.tensor_model_parallel_size
    padded = padded_vocab_size(hf_config, tp)
    if config.num_moe_experts:
        _define_missing_te_gemm()
    model = GPTModel(
        config,
        # RMSNorm named explicitly: left unnamed, the spec picks apex's LayerNorm where apex is installed.
        get_gpt_layer_local_spec(
            num_experts=config.num_moe_experts,
            moe_grouped_gemm=False,
            qk_layernorm=config.qk_layernorm,
            normalization="RMSNorm",
        ),
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
