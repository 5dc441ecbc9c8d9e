"""Ulysses sequence parallelism (``ulysses_sequence_parallel_size=N``): each packed sequence split
over ``N`` ranks, for sequences too long for one device.

The world's ranks form groups of ``N`` consecutive ranks. A group works as one data-parallel rank:
its ranks gather their shares of the batch (:func:`gather_group_batch`), so all hold the same
rows and walk the same micro-batches, and each keeps the outputs of its own share at the end
(:func:`own_share`). Inside a forward (:func:`sequence_parallel`), the packed row of a micro-batch
(:mod:`verl.workers.packing`) is padded to a multiple of ``N`` and each rank runs ``1/N`` of its
tokens through the model. Everything but attention is per token. Attention needs every token of a
sequence: an all-to-all turns "my tokens, all heads" into "all tokens, my heads", attention runs
on ``H/N`` heads with the packed row's ``cu_seqlens``, and a second all-to-all turns it back.
The outputs at the response positions are gathered from the group, so every rank computes the
same loss; each rank's backward starts from the outputs it owns and the all-to-alls carry the
gradients of the other ranks' tokens back to them. The group's gradient is the sum over its
ranks, which the engine's mean over every rank would divide by the group size: the worker scales
the group's loss by it (its metrics stay as they are). The SFT trainer's loss is a sum over
tokens, so there each rank sums its own slice's instead (:func:`local_outputs_at`): the group's
losses add up to the row's, and no full-vocabulary logits cross ranks.

Needs ``use_remove_padding=True`` and query heads (and key/value heads, else they are repeated
to the query heads first) divisible by ``N``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from verl.protocol import DataProto
from verl.utils.ulysses import SeqAllToAll, set_ulysses_sequence_parallel_group


@dataclass
class _Active:
    group: dist.ProcessGroup
    size: int
    rank: int
    cu_seqlens: torch.Tensor | None = None
    max_seqlen: int = 0


_ACTIVE: _Active | None = None


def build_groups(size: int, key: str) -> dist.ProcessGroup | None:
    """The group of ``size`` consecutive ranks this rank belongs to (every rank creates every
    group, as ``torch.distributed`` asks); None for ``size == 1``. ``key`` names the setting in errors."""
    if size == 1:
        return None
    world = dist.get_world_size() if dist.is_initialized() else 1
    if world % size:
        raise ValueError(f"{key}: expected a divisor of this role's {world} ranks, got {size}")
    mine = None
    for start in range(0, world, size):
        group = dist.new_group(list(range(start, start + size)))
        if start <= dist.get_rank() < start + size:
            mine = group
    return mine


@contextlib.contextmanager
def sequence_parallel(group: dist.ProcessGroup | None) -> Iterator[None]:
    """Within the block, packed forwards split their sequences over ``group`` (nothing with None)."""
    global _ACTIVE
    if group is None:
        yield
        return
    previous = _ACTIVE
    _ACTIVE = _Active(group, dist.get_world_size(group), dist.get_rank(group))
    set_ulysses_sequence_parallel_group(group)  # verl's helpers (verl.utils.ulysses) see it too
    try:
        yield
    finally:
        _ACTIVE = previous
        set_ulysses_sequence_parallel_group(previous.group if previous is not None else None)


def active() -> bool:
    return _ACTIVE is not None


# ---------------------------------------------------------------------- the batch of a group
def gather_group_batch(data: DataProto, group: dist.ProcessGroup | None) -> DataProto:
    """The rows of every rank of ``group``, in rank order (this rank's share unchanged without one)."""
    if group is None:
        return data
    shares: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(shares, data, group=group)
    return DataProto.concat(shares)


def own_share(out: DataProto, group: dist.ProcessGroup | None) -> DataProto:
    """This rank's rows of a result computed on :func:`gather_group_batch`'s rows."""
    if group is None:
        return out
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    return out.chunk(size)[rank]


# ---------------------------------------------------------------------- gathering outputs (autograd)
class _GatherRows(torch.autograd.Function):
    """Every rank's rows (their counts may differ), concatenated in rank order. Every rank then
    computes the same loss from them, so the gradient of a rank's own rows is its slice of the
    gradient (no sum over ranks)."""

    @staticmethod
    def forward(ctx, x, group):
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        counts = torch.tensor([x.shape[0]], dtype=torch.int64)
        all_counts = [torch.zeros_like(counts) for _ in range(size)]
        dist.all_gather(all_counts, counts, group=group)
        counts_list = [int(c) for c in all_counts]
        longest = max(counts_list)
        padded = F.pad(x, (0, 0, 0, longest - x.shape[0])).contiguous()
        parts = [torch.empty_like(padded) for _ in range(size)]
        dist.all_gather(parts, padded, group=group)
        ctx.start = sum(counts_list[:rank])
        ctx.count = x.shape[0]
        return torch.cat([part[:n] for part, n in zip(parts, counts_list)])

    @staticmethod
    def backward(ctx, grad):
        return grad[ctx.start : ctx.start + ctx.count], None


# ---------------------------------------------------------------------- the forward
def outputs_at(module, packed, index: torch.Tensor, causal_lm: bool) -> torch.Tensor:
    """:func:`verl.workers.packing.outputs_at` with the packed row split over the active group:
    ``[*index.shape, C]`` on every rank of it (each rank computes its slice's, then they gather)."""
    flat = index.flatten()
    outputs, _, share = _forward_share(module, packed, flat, causal_lm)
    gathered = _GatherRows.apply(outputs, _ACTIVE.group)
    # rank j's rows are the positions inside its slice, in their original order
    owners = torch.div(flat, share, rounding_mode="floor")
    order = torch.cat([torch.nonzero(owners == j).flatten() for j in range(_ACTIVE.size)])
    result = gathered.new_zeros(len(flat), gathered.shape[-1]).index_copy(0, order, gathered)
    return result.view(*index.shape, -1)


def local_outputs_at(
    module, packed, index: torch.Tensor, causal_lm: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The outputs at the positions of the 1-D ``index`` that fall in this rank's slice of the row,
    and the mask of those positions over ``index``. A loss summed over them on each rank sums to the
    whole row's over the group, with no outputs gathered (an SFT loss over every token of a long
    sequence would otherwise gather its full-vocabulary logits to every rank)."""
    outputs, mine, _ = _forward_share(module, packed, index, causal_lm)
    return outputs, mine


def _forward_share(module, packed, index: torch.Tensor, causal_lm: bool):
    """Run this rank's share of the packed row (padded to a multiple of the group's size); the
    outputs at the positions of the 1-D ``index`` inside it, which of ``index`` they are, the share."""
    state = _ACTIVE
    size, rank = state.size, state.rank
    total = packed.input_ids.shape[1]
    share = -(-total // size)
    pad = share * size - total
    ids = F.pad(packed.input_ids, (0, pad))
    positions = F.pad(packed.position_ids, (0, pad))
    cu = packed.cu_seqlens
    if pad:  # the pad tokens form a sequence of their own, attended to by nothing else
        cu = torch.cat([cu, cu.new_tensor([total + pad])])
    state.cu_seqlens, state.max_seqlen = cu, max(packed.max_seqlen, pad)
    lo = rank * share
    mine = (index >= lo) & (index < lo + share)
    kwargs = {
        "input_ids": ids[:, lo : lo + share],
        "position_ids": positions[:, lo : lo + share],
        "cu_seq_lens_q": cu,
        "cu_seq_lens_k": cu,
        "max_length_q": state.max_seqlen,
        "max_length_k": state.max_seqlen,
        "use_cache": False,
    }
    local = index[mine] - lo
    if causal_lm:
        outputs = module(**kwargs, logits_to_keep=local).logits[0]
    else:
        outputs = module(**kwargs).logits[0][local]
    return outputs, mine, share


def attention(inner, query, key, value, scaling):
    """Run ``inner`` (packed attention over whole sequences) on this rank's share of the heads:
    ``query`` ``[1, H, T/N, D]`` and ``key``/``value`` ``[1, H_kv, T/N, D]`` hold this rank's
    tokens; returns ``[1, T/N, H, D]``."""
    state = _ACTIVE
    size = state.size
    heads, kv_heads = query.shape[1], key.shape[1]
    if heads % size:
        raise ValueError(
            f"ulysses_sequence_parallel_size={size}: the model's {heads} attention heads are not divisible by it"
        )
    if kv_heads % size:  # repeat the shared key/value heads to one per query head
        key, value = (t.repeat_interleave(heads // kv_heads, dim=1) for t in (key, value))
    # [1, heads, my tokens, D] -> [1, my heads, all tokens, D]
    query, key, value = (SeqAllToAll.apply(state.group, t, 1, 2) for t in (query, key, value))
    out = inner(
        query, key, value, state.cu_seqlens, state.max_seqlen, scaling
    )  # [1, all tokens, my heads, D]
    return SeqAllToAll.apply(state.group, out, 1, 2)  # [1, my tokens, heads, D]
