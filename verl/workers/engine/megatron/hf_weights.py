"""Hugging Face tensors into this rank's ``GPTModel`` shard, and full Hugging Face tensors back out.

:func:`load_hf_state` cuts this rank's share (tensor-parallel slice, pipeline stage's layers) out
of a full HF state dict. :func:`export_hf_state` yields the full HF-named tensors on every rank, one
parameter at a time (a layer's slices gathered over the tensor-parallel group, then broadcast from
its pipeline stage), so no rank ever holds a second whole copy of the model. The names and layouts
are :mod:`~verl.workers.engine.megatron.convert`'s.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from verl.workers.engine.megatron.convert import VALUE_HEAD, Entry, ValueHead, head_dim, padded_vocab

_LAYER = {  # the parameters of one decoder layer: megatron suffix -> (HF suffixes, kind, split)
    "input_layernorm.weight": (("input_layernorm.weight",), "same", None),
    "self_attention.linear_qkv.weight": (tuple(f"self_attn.{x}_proj.weight" for x in "qkv"), "qkv", 0),
    "self_attention.linear_qkv.bias": (tuple(f"self_attn.{x}_proj.bias" for x in "qkv"), "qkv", 0),
    "self_attention.q_layernorm.weight": (("self_attn.q_norm.weight",), "same", None),
    "self_attention.k_layernorm.weight": (("self_attn.k_norm.weight",), "same", None),
    "self_attention.linear_proj.weight": (("self_attn.o_proj.weight",), "same", 1),
    "pre_mlp_layernorm.weight": (("post_attention_layernorm.weight",), "same", None),
    "mlp.linear_fc1.weight": (("mlp.gate_proj.weight", "mlp.up_proj.weight"), "gate_up", 0),
    "mlp.linear_fc2.weight": (("mlp.down_proj.weight",), "same", 1),
}


def _layer_offset(model: nn.Module) -> int:
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    return get_transformer_layer_offset(model.config)


def entries(model: nn.Module, hf_config) -> list[Entry]:
    """This stage's parameters, in the model's order, with their HF tensors."""
    offset = _layer_offset(model)
    out = []
    for name, _ in model.named_parameters():
        if name == "embedding.word_embeddings.weight":
            out.append(Entry(name, ("model.embed_tokens.weight",), "vocab", 0))
        elif name == "decoder.final_layernorm.weight":
            out.append(Entry(name, ("model.norm.weight",), "same", None))
        elif name.startswith("output_layer."):
            value = isinstance(model.output_layer, ValueHead)
            suffix = name.split(".", 1)[1]
            hf = f"{VALUE_HEAD}.{suffix}" if value else "lm_head.weight"
            out.append(Entry(name, (hf,), "same", None) if value else Entry(name, (hf,), "vocab", 0))
        elif name.startswith("decoder.layers."):
            _, _, index, suffix = name.split(".", 3)
            hf_suffixes, kind, split = _LAYER[suffix]
            prefix = f"model.layers.{int(index) + offset}."
            out.append(Entry(name, tuple(prefix + s for s in hf_suffixes), kind, split))
        else:
            raise KeyError(f"the converter has no Hugging Face name for megatron parameter {name!r}")
    return out


def _groups(hf_config) -> tuple[int, int, int]:
    groups = hf_config.num_key_value_heads
    return groups, hf_config.num_attention_heads // groups, head_dim(hf_config)


def to_megatron(entry: Entry, tensors: list[torch.Tensor], hf_config, tp: int) -> list[torch.Tensor]:
    """The ``tp`` slices of one megatron parameter from its full HF tensors."""
    if entry.kind == "qkv":
        groups = hf_config.num_key_value_heads
        q, k, v = (t.reshape(groups, -1, *t.shape[1:]) for t in tensors)
        fused = torch.cat([q, k, v], dim=1)  # [groups, (heads per group + 2) * head dim, ...]
        return [s.reshape(-1, *s.shape[2:]) for s in fused.chunk(tp, dim=0)]
    if entry.kind == "gate_up":
        gate, up = (t.chunk(tp, dim=0) for t in tensors)
        return [torch.cat([g, u]) for g, u in zip(gate, up)]
    (tensor,) = tensors
    if entry.kind == "vocab":
        tensor = F.pad(tensor, (0, 0, 0, padded_vocab(hf_config, tp) - len(tensor)))
    return list(tensor.chunk(tp, dim=entry.split)) if entry.split is not None else [tensor] * tp


def to_hf(entry: Entry, slices: list[torch.Tensor], hf_config) -> list[torch.Tensor]:
    """The full HF tensors of one megatron parameter from its ``tp`` slices (inverse of :func:`to_megatron`)."""
    if entry.kind == "qkv":
        _, per, dim = _groups(hf_config)
        fused = torch.cat([s.reshape(-1, (per + 2) * dim, *s.shape[1:]) for s in slices])
        q, k, v = fused.split([per * dim, dim, dim], dim=1)
        return [t.reshape(-1, *t.shape[2:]) for t in (q, k, v)]
    if entry.kind == "gate_up":
        halves = [s.chunk(2) for s in slices]
        return [torch.cat([h[0] for h in halves]), torch.cat([h[1] for h in halves])]
    full = torch.cat(slices, dim=entry.split) if entry.split is not None else slices[0]
    return [full[: hf_config.vocab_size] if entry.kind == "vocab" else full]


def _with_tied_head(state: Mapping[str, torch.Tensor], hf_config) -> Mapping[str, torch.Tensor]:
    if "lm_head.weight" in state or "model.embed_tokens.weight" not in state:
        return state
    return {**state, "lm_head.weight": state["model.embed_tokens.weight"]}


def load_hf_state(model: nn.Module, hf_config, state: Mapping[str, torch.Tensor]) -> None:
    """Copy this rank's share of the full HF ``state`` into ``model``; every parameter must be filled."""
    from megatron.core import parallel_state as ps

    tp, rank = ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_rank()
    state = _with_tied_head(state, hf_config)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for entry in entries(model, hf_config):
            missing = [n for n in entry.hf_names if n not in state]
            if missing:
                raise KeyError(f"the Hugging Face weights lack {missing} (for megatron {entry.name})")
            mine = to_megatron(entry, [state[n] for n in entry.hf_names], hf_config, tp)[rank]
            params[entry.name].copy_(mine)


def _stage_entries(model: nn.Module, hf_config) -> list[list[tuple[Entry, list[tuple[tuple, torch.dtype]]]]]:
    """Every pipeline stage's entries with their HF tensors' shapes and dtypes (an all-gather)."""
    from megatron.core import parallel_state as ps

    tp = ps.get_tensor_model_parallel_world_size()
    params = dict(model.named_parameters())
    mine = []
    for entry in entries(model, hf_config):
        local = params[entry.name]
        full = to_hf(entry, [torch.empty_like(local, device="meta")] * tp, hf_config)
        mine.append((entry, [(tuple(t.shape), local.dtype) for t in full]))
    stages = [None] * ps.get_pipeline_model_parallel_world_size()
    dist.all_gather_object(stages, mine, group=ps.get_pipeline_model_parallel_group())
    return stages


def _gathered(param: torch.Tensor, entry: Entry) -> list[torch.Tensor]:
    from megatron.core import parallel_state as ps

    tp = ps.get_tensor_model_parallel_world_size()
    if tp == 1 or entry.split is None:
        return [param.detach()] * tp
    slices = [torch.empty_like(param) for _ in range(tp)]
    dist.all_gather(slices, param.detach().contiguous(), group=ps.get_tensor_model_parallel_group())
    return slices


def export_hf_state(model: nn.Module, hf_config) -> Iterator[tuple[str, torch.Tensor]]:
    """Full HF-named tensors, the same sequence on every rank (a tied model's ``lm_head.weight`` is
    the embedding, as transformers' state dict lists it)."""
    from megatron.core import parallel_state as ps

    group = ps.get_pipeline_model_parallel_group()
    stage_ranks = dist.get_process_group_ranks(group)
    me = ps.get_pipeline_model_parallel_rank()
    params = dict(model.named_parameters())
    tied = model.share_embeddings_and_output_weights
    seen: set[str] = set()
    for stage, stage_entries in enumerate(_stage_entries(model, hf_config)):
        for entry, metas in stage_entries:
            full = to_hf(entry, _gathered(params[entry.name], entry), hf_config) if stage == me else None
            for index, (name, (shape, dtype)) in enumerate(zip(entry.hf_names, metas)):
                if name in seen:  # the last stage's copy of tied embeddings
                    continue
                tensor = (
                    full[index].contiguous()
                    if full is not None
                    else torch.empty(shape, dtype=dtype, device=_device(params))
                )
                if len(stage_ranks) > 1:
                    dist.broadcast(tensor, src=stage_ranks[stage], group=group)
                seen.add(name)
                yield name, tensor
                if tied and name == "model.embed_tokens.weight":
                    seen.add("lm_head.weight")
                    yield "lm_head.weight", tensor


def _device(params: dict[str, torch.Tensor]) -> torch.device:
    return next(iter(params.values())).device
