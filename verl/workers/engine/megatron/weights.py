"""Full Hugging Face state dicts into a rank's ``GPTModel`` shard, and full HF tensors back out.

Which parameter holds which HF tensors, and how they are fused and split over tensor parallelism, is
:mod:`.layout`'s (its *slots* and their *full* tensors); this module moves the tensors.

Pipeline stages number their layers from 0; megatron-core's ``get_transformer_layer_offset`` gives a
stage's first global layer. :func:`export_hf_state` walks the global list of slots (from the HF config
alone) on every rank, so all ranks join the same collectives in the same order: the owning stage
gathers a slot's slices over its tensor-parallel group, broadcasts the full tensor over the pipeline
group, and every rank yields its HF tensors -- one parameter in flight at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import torch
import torch.distributed as dist
from torch import nn

from verl.workers.engine.megatron.arch import ValueHead
from verl.workers.engine.megatron.layout import (
    EMBED,
    FIRST,
    LAST,
    LM_HEAD,
    SCORE,
    Slot,
    _shard,
    _to_full,
    _to_hf,
    _unshard,
    hf_names,
    megatron_to_hf,
    slots,
    unshard,
)

__all__ = [  # the layout's names stay importable from here
    "EMBED",
    "FIRST",
    "LAST",
    "LM_HEAD",
    "SCORE",
    "Slot",
    "export_hf_state",
    "export_slots",
    "hf_names",
    "load_hf_state",
    "megatron_to_hf",
    "slots",
    "unshard",
]


# ---------------------------------------------------------------------------- load
def _layer_offset(model: nn.Module, pp_rank: int | None = None) -> int:
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    return get_transformer_layer_offset(model.config, pp_rank=pp_rank)


def _local_slots(model: nn.Module, all_slots: list[Slot]) -> dict[str, tuple[Slot, int | None]]:
    """This stage's parameters by local name: their slot, and for a local expert its global index.
    A tied output layer has a parameter only on a last stage that lacks the embedding (megatron-core
    keeps a copy there)."""
    from megatron.core import parallel_state as ps

    offset, count = _layer_offset(model), len(model.decoder.layers)
    ep, ep_rank = ps.get_expert_model_parallel_world_size(), ps.get_expert_model_parallel_rank()
    out = {}
    for slot in all_slots:
        if slot.layer >= 0:
            here = offset <= slot.layer < offset + count
        elif slot.layer == FIRST:
            here = model.pre_process
        else:
            here = model.post_process and (slot.export or not model.pre_process)
        if here and slot.experts:
            per_rank = slot.experts // ep
            for local in range(per_rank):
                out[slot.expert_name(offset, local)] = (slot, ep_rank * per_rank + local)
        elif here:
            out[slot.local_name(offset)] = (slot, None)
    return out


def _check_names(state: Mapping[str, torch.Tensor], hf_config, value_head: bool) -> None:
    """Every HF tensor of the model present, none unknown (a tied model's ``lm_head.weight`` may
    be listed: transformers' state dict names the shared tensor twice)."""
    expected = set(hf_names(hf_config, value_head))
    optional = {LM_HEAD} if hf_config.tie_word_embeddings and not value_head else set()
    missing = sorted(expected - set(state))
    extra = sorted(set(state) - expected - optional)
    if missing or extra:
        raise KeyError(
            f"the Hugging Face state dict does not match {hf_config.model_type} "
            f"({'value head' if value_head else 'causal LM'}): missing {missing}, unexpected {extra}"
        )


def load_hf_state(model: nn.Module, hf_config, state: Mapping[str, torch.Tensor]) -> None:
    """Copy this rank's share of the full HF ``state`` (``module.state_dict()`` of a transformers
    causal LM or one-label token classifier) into ``model``. Raises ``KeyError`` naming the HF
    tensors missing or unexpected, or the megatron parameters without a source."""
    from megatron.core import parallel_state as ps

    value_head = f"{SCORE}.weight" in state
    if model.post_process and value_head != isinstance(model.output_layer, ValueHead):
        raise KeyError(
            f"the model was built with value_head={not value_head}, the state dict has the other head"
        )
    _check_names(state, hf_config, value_head)
    tp, rank = ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_rank()
    local = _local_slots(model, slots(hf_config, value_head, tp))
    params = dict(model.named_parameters())
    unfilled, unknown = sorted(set(params) - set(local)), sorted(set(local) - set(params))
    if unfilled or unknown:
        raise KeyError(
            f"megatron parameters without an HF source: {unfilled}; expected but absent: {unknown}"
        )
    with torch.no_grad():
        for name, (slot, expert) in local.items():
            full = _to_full(slot, [state[n] for n in slot.hf], hf_config)
            params[name].copy_(_shard(slot, full, tp, rank) if expert is None else full[expert])


# ---------------------------------------------------------------------------- export
def _owner(slot: Slot, model: nn.Module, pp: int) -> int:
    """The pipeline rank that holds the slot."""
    if slot.layer == FIRST:
        return 0
    if slot.layer == LAST:
        return pp - 1
    return max(r for r in range(pp) if _layer_offset(model, pp_rank=r) <= slot.layer)


def _has_value_head(model: nn.Module) -> bool:
    """Whether the model is a critic's; only the last stage can tell, so the pipeline group agrees."""
    from megatron.core import parallel_state as ps

    device = next(model.parameters()).device
    flag = torch.tensor(
        [float(model.post_process and isinstance(model.output_layer, ValueHead))], device=device
    )
    if ps.get_pipeline_model_parallel_world_size() > 1:
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=ps.get_pipeline_model_parallel_group())
    return bool(flag.item())


def _all_gather(local: torch.Tensor, group) -> list[torch.Tensor]:
    pieces = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
    dist.all_gather(pieces, local.detach().contiguous(), group=group)
    return pieces


def _gather(slot: Slot, local: torch.Tensor) -> torch.Tensor:
    """The full tensor from this tensor-parallel group's slices."""
    from megatron.core import parallel_state as ps

    if slot.split is None or ps.get_tensor_model_parallel_world_size() == 1:
        return local.detach()
    return _unshard(slot, _all_gather(local, ps.get_tensor_model_parallel_group()))


def _gather_experts(slot: Slot, params: dict, offset: int) -> torch.Tensor:
    """The full ``[E, ...]`` stack of an experts slot: the local stacks gathered over the
    expert-parallel group."""
    from megatron.core import parallel_state as ps

    ep = ps.get_expert_model_parallel_world_size()
    local = torch.stack([params[slot.expert_name(offset, i)] for i in range(slot.experts // ep)])
    if ep == 1:
        return local.detach()
    return torch.cat(_all_gather(local, ps.get_expert_model_parallel_group()))


def export_hf_state(
    model: nn.Module,
    hf_config,
    value_head: bool | None = None,
    merged: Callable[[str, torch.Tensor], torch.Tensor] | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Full HF-named tensors (:func:`hf_names`' order), the same sequence on every rank; every rank
    of the model-parallel group must consume the whole iterator (it runs collectives).

    ``value_head``: whether ``model`` is a critic's (None: asked of the last stage, one all-reduce).
    ``merged``: ``(name, local tensor) -> local tensor`` applied before the gather (LoRA folds its
    adapters in)."""
    from megatron.core import parallel_state as ps

    if value_head is None:
        value_head = _has_value_head(model)
    tp = ps.get_tensor_model_parallel_world_size()
    for slot, full in export_slots(model, slots(hf_config, value_head, tp), merged):
        yield from zip(slot.hf, _to_hf(slot, full, hf_config))


def export_slots(
    model: nn.Module, wanted: list[Slot], merged: Callable[[str, torch.Tensor], torch.Tensor] | None = None
) -> Iterator[tuple[Slot, torch.Tensor]]:
    """Each exported slot of ``wanted`` (global, in order) with its full tensor, on every rank: the
    owning stage gathers it over tensor (or expert) parallelism and broadcasts it over the pipeline."""
    from megatron.core import parallel_state as ps

    pp = ps.get_pipeline_model_parallel_world_size()
    me, group = ps.get_pipeline_model_parallel_rank(), ps.get_pipeline_model_parallel_group()
    stage_ranks = dist.get_process_group_ranks(group) if pp > 1 else [dist.get_rank()]
    params = dict(model.named_parameters())
    any_param = next(iter(params.values()))
    offset = _layer_offset(model)
    for slot in wanted:
        if not slot.export:
            continue
        owner = _owner(slot, model, pp)
        if owner == me and slot.experts:
            full = _gather_experts(slot, params, offset).contiguous()
        elif owner == me:
            name = slot.local_name(offset)
            local = merged(name, params[name]) if merged else params[name]
            full = _gather(slot, local).contiguous()
        else:
            full = torch.empty(slot.shape, dtype=any_param.dtype, device=any_param.device)
        if pp > 1:
            dist.broadcast(full, src=stage_ranks[owner], group=group)
        yield slot, full
