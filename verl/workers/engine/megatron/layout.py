"""Which megatron parameter holds which Hugging Face tensors, and how (no megatron-core needed).

Every megatron parameter is a *slot*: the HF tensors it is made of, how they are fused, and the
dimension tensor parallelism splits. A parameter passes through one intermediate form, the *full*
tensor (what a single rank would hold with ``tp=1``), so each layout rule is written once:

* ``linear_qkv``: rows grouped by key/value head group -- each group's query heads, then its key
  head, then its value head; the ``T`` tensor-parallel ranks hold consecutive groups;
* ``linear_fc1``: ``[gate; up]``; rank ``r`` holds ``[gate rows of r; up rows of r]`` (so gathering
  the ranks' slices is not a plain concatenation);
* ``linear_proj``, ``linear_fc2``: split by columns (input features);
* embedding, output layer: split by vocabulary rows, padded to a multiple of ``T`` (zero rows, see
  :mod:`.arch`), the padding dropped on export;
* norms, a MoE router (and the critic's value head): whole on every rank;
* a MoE layer's experts: transformers 5 fuses them into ``mlp.experts.gate_up_proj`` ``[E, 2F, H]``
  (each expert's ``[gate; up]``) and ``mlp.experts.down_proj`` ``[E, H, F]``; megatron-core holds
  ``E / EP`` local experts per expert-parallel rank (``local_experts.<i>`` is global expert
  ``ep_rank * E / EP + i``), each whole (:mod:`.arch` refuses expert tensor parallelism). Such a
  slot stands for the stack of the rank's local experts. A shared expert (Qwen2-MoE's
  ``mlp.shared_expert``) is a SwiGLU like a dense MLP, its sigmoid gate ``[1, H]`` whole on every rank.

:mod:`.weights` moves the tensors between a rank's ``GPTModel`` shard and full HF state dicts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from verl.workers.engine.megatron.arch import padded_vocab_size
from verl.workers.engine.megatron.families import family, head_dim, qkv_bias
from verl.workers.engine.megatron.moe import experts

FIRST, LAST = -1, -2
"""The ``layer`` of a slot on the first stage (embedding) and on the last (final norm, head)."""
EMBED, LM_HEAD, SCORE = "model.embed_tokens.weight", "lm_head.weight", "score"


@dataclass(frozen=True)
class Slot:
    """One megatron parameter and the HF tensors it holds."""

    suffix: str
    """Its name in ``GPTModel``, after ``decoder.layers.<local index>.`` for a layer's parameters."""
    layer: int
    """The global layer index, or :data:`FIRST` / :data:`LAST` for the stage that holds it."""
    hf: tuple[str, ...]
    kind: str
    """plain | qkv (q, k, v fused by group) | gate_up (gate, up stacked) | vocab (rows padded)."""
    split: int | None
    """The dimension tensor parallelism splits (None: whole on every rank)."""
    shape: tuple[int, ...]
    """The full tensor's shape (``tp=1``, vocabulary padded)."""
    export: bool = True
    """False for a tied output layer: its tensor is the embedding's, exported once."""
    experts: int = 0
    """A MoE layer's experts stacked (the HF tensor's first dimension): the megatron parameters are the
    rank's local experts, each whole; 0: one parameter."""

    def local_name(self, offset: int) -> str:
        """The parameter's name on a stage whose first layer is ``offset``; for experts, the name of
        the stack (``...mlp.experts.<suffix>``, a key of full state dicts, not a parameter)."""
        return f"decoder.layers.{self.layer - offset}.{self.suffix}" if self.layer >= 0 else self.suffix

    def expert_name(self, offset: int, local: int) -> str:
        """The parameter of local expert ``local`` (an experts slot)."""
        return self.local_name(offset).replace("mlp.experts.", f"mlp.experts.local_experts.{local}.")


def _layer_slots(hf_config, layer: int) -> list[Slot]:
    """One decoder layer's slots, in the order of the HF state dict where fusing allows."""
    h, d = hf_config.hidden_size, head_dim(hf_config)
    heads, groups = hf_config.num_attention_heads, hf_config.num_key_value_heads
    qkv_rows = (heads + 2 * groups) * d
    bias, qk_norm = qkv_bias(hf_config), family(hf_config).qk_layernorm
    qkv = [f"self_attn.{x}_proj" for x in "qkv"]
    table = [  # (megatron suffix, HF suffixes, kind, split, full shape, present)
        ("self_attention.linear_qkv.weight", [a + ".weight" for a in qkv], "qkv", 0, (qkv_rows, h), True),
        ("self_attention.linear_qkv.bias", [a + ".bias" for a in qkv], "qkv", 0, (qkv_rows,), bias),
        ("self_attention.linear_proj.weight", ["self_attn.o_proj.weight"], "plain", 1, (h, heads * d), True),
        ("self_attention.q_layernorm.weight", ["self_attn.q_norm.weight"], "plain", None, (d,), qk_norm),
        ("self_attention.k_layernorm.weight", ["self_attn.k_norm.weight"], "plain", None, (d,), qk_norm),
    ]
    norms = [
        ("input_layernorm.weight", ["input_layernorm.weight"], "plain", None, (h,), True),
        ("pre_mlp_layernorm.weight", ["post_attention_layernorm.weight"], "plain", None, (h,), True),
    ]
    prefix = f"model.layers.{layer}."

    def made(rows):
        return [
            Slot(suffix, layer, tuple(prefix + n for n in hf), kind, split, shape)
            for suffix, hf, kind, split, shape, present in rows
            if present
        ]

    return made(table) + _mlp_slots(hf_config, layer, prefix) + made(norms)


def _mlp_slots(hf_config, layer: int, prefix: str) -> list[Slot]:
    """A layer's MLP: SwiGLU, or a MoE layer's router and experts (and its gated shared expert)."""
    h, moe = hf_config.hidden_size, experts(hf_config)
    if moe is None or not moe.layers[layer]:
        return _swiglu_slots(layer, prefix + "mlp.", "mlp.", h, hf_config.intermediate_size)
    e, f = moe.count, moe.ffn
    fc1, fc2 = (prefix + "mlp.experts.gate_up_proj",), (prefix + "mlp.experts.down_proj",)
    out = [
        Slot("mlp.experts.linear_fc1.weight", layer, fc1, "gate_up", 0, (e, 2 * f, h), experts=e),
        Slot("mlp.experts.linear_fc2.weight", layer, fc2, "plain", 1, (e, h, f), experts=e),
        Slot("mlp.router.weight", layer, (prefix + "mlp.gate.weight",), "plain", None, (e, h)),
    ]
    if moe.shared_ffn:
        out += _swiglu_slots(layer, prefix + "mlp.shared_expert.", "mlp.shared_experts.", h, moe.shared_ffn)
        gate = (prefix + "mlp.shared_expert_gate.weight",)
        out.append(Slot("mlp.shared_experts.gate_weight", layer, gate, "plain", None, (1, h)))
    return out


def _swiglu_slots(layer: int, hf: str, megatron: str, h: int, f: int) -> list[Slot]:
    """A SwiGLU MLP of intermediate size ``f``: HF's ``<hf>gate_proj/up_proj/down_proj`` as
    megatron's ``<megatron>linear_fc1/linear_fc2``."""
    gate_up = (hf + "gate_proj.weight", hf + "up_proj.weight")
    return [
        Slot(megatron + "linear_fc1.weight", layer, gate_up, "gate_up", 0, (2 * f, h)),
        Slot(megatron + "linear_fc2.weight", layer, (hf + "down_proj.weight",), "plain", 1, (h, f)),
    ]


def slots(hf_config, value_head: bool = False, tp: int = 1) -> list[Slot]:
    """Every megatron parameter of the whole model, in export order."""
    h, vocab = hf_config.hidden_size, padded_vocab_size(hf_config, tp)
    out = [Slot("embedding.word_embeddings.weight", FIRST, (EMBED,), "vocab", 0, (vocab, h))]
    for layer in range(hf_config.num_hidden_layers):
        out += _layer_slots(hf_config, layer)
    out.append(Slot("decoder.final_layernorm.weight", LAST, ("model.norm.weight",), "plain", None, (h,)))
    if value_head:
        out.append(Slot("output_layer.weight", LAST, (f"{SCORE}.weight",), "plain", None, (1, h)))
        if getattr(hf_config, "token_classification_bias", True):
            out.append(Slot("output_layer.bias", LAST, (f"{SCORE}.bias",), "plain", None, (1,)))
    else:
        tied = bool(hf_config.tie_word_embeddings)
        hf = (EMBED,) if tied else (LM_HEAD,)
        out.append(Slot("output_layer.weight", LAST, hf, "vocab", 0, (vocab, h), export=not tied))
    return out


def hf_names(hf_config, value_head: bool = False) -> list[str]:
    """The HF tensors :func:`export_hf_state` yields, in its order (no ``lm_head.weight`` when tied)."""
    return [name for slot in slots(hf_config, value_head) if slot.export for name in slot.hf]


# ---------------------------------------------------------------------------- layouts
def _to_full(slot: Slot, tensors: list[torch.Tensor], hf_config) -> torch.Tensor:
    """The full megatron tensor from the slot's HF tensors."""
    if slot.experts:  # HF's fused tensor already stacks each expert's [gate; up] or down rows
        return tensors[0]
    if slot.kind == "qkv":
        groups = hf_config.num_key_value_heads
        q, k, v = (t.reshape(groups, -1, *t.shape[1:]) for t in tensors)
        return torch.cat([q, k, v], dim=1).reshape(slot.shape)
    if slot.kind == "gate_up":
        return torch.cat(tensors)
    (tensor,) = tensors
    if slot.kind == "vocab" and tensor.shape[0] < slot.shape[0]:
        padding = tensor.new_zeros(slot.shape[0] - tensor.shape[0], *tensor.shape[1:])
        return torch.cat([tensor, padding])
    return tensor


def _to_hf(slot: Slot, full: torch.Tensor, hf_config) -> list[torch.Tensor]:
    """The slot's HF tensors from its full megatron tensor (inverse of :func:`_to_full`)."""
    if slot.experts:
        return [full]
    if slot.kind == "qkv":
        groups, d = hf_config.num_key_value_heads, head_dim(hf_config)
        per_group = hf_config.num_attention_heads // groups
        grouped = full.reshape(groups, (per_group + 2) * d, *full.shape[1:])
        q, k, v = grouped.split([per_group * d, d, d], dim=1)
        return [t.reshape(-1, *t.shape[2:]).contiguous() for t in (q, k, v)]
    if slot.kind == "gate_up":
        return [t.contiguous() for t in full.chunk(2)]
    if slot.kind == "vocab":
        return [full[: hf_config.vocab_size]]
    return [full]


def _shard(slot: Slot, full: torch.Tensor, tp: int, rank: int) -> torch.Tensor:
    """Rank ``rank``'s slice of a full tensor."""
    if slot.split is None or tp == 1:
        return full
    if slot.kind == "gate_up":
        gate, up = full.chunk(2)
        return torch.cat([gate.chunk(tp)[rank], up.chunk(tp)[rank]])
    return full.chunk(tp, dim=slot.split)[rank]


def _unshard(slot: Slot, pieces: list[torch.Tensor]) -> torch.Tensor:
    """The full tensor from every rank's slice (inverse of :func:`_shard`)."""
    if slot.kind == "gate_up":
        halves = [p.chunk(2) for p in pieces]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves])
    return torch.cat(pieces, dim=slot.split)


def unshard(slot: Slot, pieces: list[torch.Tensor]) -> torch.Tensor:
    """The full tensor from the slices of tensor-parallel ranks ``0..T-1`` (rank order); a slot
    kept whole on every rank takes the first. For readers of saved shards (the model merger)."""
    return pieces[0] if slot.split is None or len(pieces) == 1 else _unshard(slot, pieces)


def megatron_to_hf(
    full: Mapping[str, torch.Tensor], hf_config, value_head: bool = False
) -> dict[str, torch.Tensor]:
    """The HF state dict from full megatron tensors named as a one-stage model names them (layers
    numbered over the whole model, vocabulary padded or not): the names and tensors of the HF
    module's ``state_dict()``, a tied ``lm_head.weight`` included, as the same tensor as the
    embedding -- what transformers lists. Raises ``KeyError`` naming the absent megatron tensors."""
    wanted = [slot for slot in slots(hf_config, value_head) if slot.export]
    missing = [slot.local_name(0) for slot in wanted if slot.local_name(0) not in full]
    if missing:
        raise KeyError(f"megatron tensors absent: {missing}")
    out: dict[str, torch.Tensor] = {}
    for slot in wanted:
        out.update(zip(slot.hf, _to_hf(slot, full[slot.local_name(0)], hf_config)))
    if hf_config.tie_word_embeddings and not value_head:
        out[LM_HEAD] = out[EMBED]
    return out
