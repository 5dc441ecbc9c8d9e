"""The Hugging Face families the Megatron converter knows, and what tells their layouts apart.

The dense families verl users train (Qwen2/2.5, Qwen3, Llama, Mistral) share one layout -- RMSNorm,
rotary positions, grouped-query attention, SwiGLU -- and differ only in a QKV bias and per-head q/k
norms, so one small table describes them; the MoE families (:mod:`.moe`) add experts to it. Each is
known as a causal LM and as the one-label token classifier a critic uses (same trunk, a ``score`` head
``[1, hidden]`` instead of ``lm_head``). No megatron-core import here.
"""

from __future__ import annotations

from dataclasses import dataclass

from verl.utils.errors import UserInputError


class UnsupportedModelError(UserInputError, ValueError):
    """The Hugging Face model is not one the Megatron converter knows."""

    kind = "model"


@dataclass(frozen=True)
class Family:
    """What tells one dense family's layout from another's."""

    name: str
    """The class-name prefix in transformers (``Qwen2`` -> ``Qwen2ForCausalLM``)."""
    qkv_bias: bool | str
    """Whether q/k/v projections have a bias, or the config flag that says (``attention_bias``;
    Qwen2-MoE's ``qkv_bias``)."""
    qk_layernorm: bool
    """Per-head RMSNorm of queries and keys before rotary (Qwen3's ``q_norm``/``k_norm``)."""
    moe: bool = False
    """The MLPs are top-k mixtures of SwiGLU experts (``mlp.gate`` router, ``mlp.experts``)."""


FAMILIES = {
    "qwen2": Family("Qwen2", qkv_bias=True, qk_layernorm=False),
    "qwen3": Family("Qwen3", qkv_bias="attention_bias", qk_layernorm=True),
    "llama": Family("Llama", qkv_bias="attention_bias", qk_layernorm=False),
    "mistral": Family("Mistral", qkv_bias=False, qk_layernorm=False),
    "qwen3_moe": Family("Qwen3Moe", qkv_bias="attention_bias", qk_layernorm=True, moe=True),
    "mixtral": Family("Mixtral", qkv_bias=False, qk_layernorm=False, moe=True),
    "qwen2_moe": Family("Qwen2Moe", qkv_bias="qkv_bias", qk_layernorm=False, moe=True),
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


def qkv_bias(hf_config) -> bool:
    """Qwen2 always has a QKV bias, Mistral never; the others as their config's flag says."""
    fixed = family(hf_config).qkv_bias
    return bool(getattr(hf_config, fixed, False)) if isinstance(fixed, str) else fixed


def head_dim(hf_config) -> int:
    """Qwen3 (and some Llamas) set ``head_dim`` apart from ``hidden_size / heads``."""
    return getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
