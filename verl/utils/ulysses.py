"""Ulysses sequence-parallel collectives (DeepSpeed-Ulysses, Jacobs et al. 2023, arXiv:2309.14509)
at verl's path, ``verl.utils.ulysses``.

A sequence-parallel group of ``N`` ranks splits each (packed) sequence into ``N`` slices. Before the
model, :func:`ulysses_pad_and_slice_inputs` pads the row to a multiple of ``N`` and keeps this
rank's slice; inside attention, :func:`gather_seq_scatter_heads` / :func:`gather_heads_scatter_seq`
(an all-to-all, :class:`SeqAllToAll`) trade "my tokens, all heads" for "all tokens, my heads" and
back; after the model, :func:`gather_outputs_and_unpad` joins the slices' outputs and drops the pad.

The group is this process's current one (:func:`set_ulysses_sequence_parallel_group`); the
project's own forward (:mod:`verl.workers.ulysses`) sets it for the duration of a
sequence-parallel block and uses the same all-to-all. Without a group every function here is the
identity, as in verl.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "Gather",
    "SeqAllToAll",
    "all_to_all_tensor",
    "gather_heads_scatter_seq",
    "gather_outputs_and_unpad",
]
__all__ += ["gather_seq_scatter_heads", "get_ulysses_sequence_parallel_group"]
__all__ += ["get_ulysses_sequence_parallel_rank", "get_ulysses_sequence_parallel_world_size"]
__all__ += ["set_ulysses_sequence_parallel_group", "slice_input_tensor", "ulysses_pad"]
__all__ += ["ulysses_pad_and_slice_inputs", "validate_ulysses_config"]

_GROUP: dist.ProcessGroup | None = None


def set_ulysses_sequence_parallel_group(group: dist.ProcessGroup | None) -> None:
    """Make ``group`` this process's sequence-parallel group (None: no sequence parallelism)."""
    global _GROUP
    _GROUP = group


def get_ulysses_sequence_parallel_group() -> dist.ProcessGroup | None:
    return _GROUP


def get_ulysses_sequence_parallel_world_size(group: dist.ProcessGroup | None = None) -> int:
    """Ranks in ``group`` (default: the current group); 1 without one."""
    group = group or _GROUP
    return dist.get_world_size(group) if group is not None else 1


def get_ulysses_sequence_parallel_rank(group: dist.ProcessGroup | None = None) -> int:
    """This rank's index in ``group`` (default: the current group); 0 without one."""
    group = group or _GROUP
    return dist.get_rank(group) if group is not None else 0


# ---------------------------------------------------------------------- all-to-all
def all_to_all_tensor(
    local_input: Tensor, scatter_dim: int, gather_dim: int, group: dist.ProcessGroup | None = None
) -> Tensor:
    """Split ``local_input`` into the group's ranks along ``scatter_dim``, send part ``j`` to rank
    ``j``, and join what arrives along ``gather_dim``."""
    group = group or _GROUP
    size = dist.get_world_size(group)
    sends = [part.contiguous() for part in torch.tensor_split(local_input, size, scatter_dim)]
    receives = [torch.empty_like(sends[0]) for _ in range(size)]
    dist.all_to_all(receives, sends, group=group)
    return torch.cat(receives, dim=gather_dim).contiguous()


class SeqAllToAll(torch.autograd.Function):
    """:func:`all_to_all_tensor` with autograd: the backward is the same exchange the other way."""

    @staticmethod
    def forward(ctx: Any, group: dist.ProcessGroup, local_input: Tensor, scatter_dim: int, gather_dim: int):
        ctx.group, ctx.dims = group, (scatter_dim, gather_dim)
        return all_to_all_tensor(local_input, scatter_dim, gather_dim, group)

    @staticmethod
    def backward(ctx: Any, grad: Tensor):
        scatter_dim, gather_dim = ctx.dims
        return None, all_to_all_tensor(grad, gather_dim, scatter_dim, ctx.group), None, None


def gather_seq_scatter_heads(
    x: Tensor, seq_dim: int, head_dim: int, unpadded_dim_size: int = 0, group: dist.ProcessGroup | None = None
) -> Tensor:
    """``[.., seq/N, .., heads, ..]`` -> ``[.., seq, .., heads/N, ..]``; with ``unpadded_dim_size``
    the padding added to make the sequence divisible by ``N`` is dropped again."""
    group = group or _GROUP
    if group is None:
        return x
    x = SeqAllToAll.apply(group, x, head_dim, seq_dim)
    if unpadded_dim_size and x.size(seq_dim) > unpadded_dim_size:
        x = x.narrow(seq_dim, 0, unpadded_dim_size)
    return x


def gather_heads_scatter_seq(
    x: Tensor, head_dim: int, seq_dim: int, group: dist.ProcessGroup | None = None
) -> Tensor:
    """``[.., seq, .., heads/N, ..]`` -> ``[.., seq/N, .., heads, ..]`` (the sequence padded with
    zeros to a multiple of ``N`` first)."""
    group = group or _GROUP
    if group is None:
        return x
    x = _pad_to_multiple(x, seq_dim, dist.get_world_size(group))
    return SeqAllToAll.apply(group, x, seq_dim, head_dim)


# ---------------------------------------------------------------------- gather
class Gather(torch.autograd.Function):
    """Every rank's ``local_tensor`` (same shapes), joined along ``gather_dim``. Backward: this rank's
    slice of the gradient, times the group's size with ``grad_scaler`` (each rank computes the same
    loss from the gathered outputs; the engine averages gradients over every rank)."""

    @staticmethod
    def forward(
        ctx: Any, group: dist.ProcessGroup, local_tensor: Tensor, gather_dim: int, grad_scaler: bool = True
    ):
        size = dist.get_world_size(group)
        ctx.rank, ctx.size, ctx.gather_dim, ctx.grad_scaler = (
            dist.get_rank(group),
            size,
            gather_dim,
            grad_scaler,
        )
        ctx.part = local_tensor.size(gather_dim)
        parts = [torch.empty_like(local_tensor) for _ in range(size)]
        dist.all_gather(parts, local_tensor.contiguous(), group=group)
        return torch.cat(parts, dim=gather_dim)

    @staticmethod
    def backward(ctx: Any, grad: Tensor):
        if ctx.grad_scaler:
            grad = grad * ctx.size
        mine = grad.narrow(ctx.gather_dim, ctx.rank * ctx.part, ctx.part).contiguous()
        return None, mine, None, None


def gather_outputs_and_unpad(
    x: Tensor,
    gather_dim: int,
    unpad_dim: int | None = None,
    padding_size: int = 0,
    grad_scaler: bool = True,
    group: dist.ProcessGroup | None = None,
) -> Tensor:
    """The group's slices of ``x`` joined along ``gather_dim`` (:class:`Gather`), then the last
    ``padding_size`` entries of ``unpad_dim`` dropped (the pad :func:`ulysses_pad` added). ``x``
    unchanged without a group."""
    group = group or _GROUP
    if group is None:
        return x
    x = Gather.apply(group, x, gather_dim, grad_scaler)
    if unpad_dim is not None and padding_size:
        x = x.narrow(unpad_dim, 0, x.size(unpad_dim) - padding_size)
    return x


# ---------------------------------------------------------------------- pad and slice
def _pad_to_multiple(x: Tensor, dim: int, multiple: int, value: float = 0) -> Tensor:
    missing = -x.size(dim) % multiple
    if not missing:
        return x
    pad = [0, 0] * (x.dim() - 1 - dim % x.dim()) + [0, missing]
    return F.pad(x, pad, value=value)


def slice_input_tensor(
    x: Tensor, dim: int, padding: bool = True, group: dist.ProcessGroup | None = None
) -> Tensor:
    """This rank's ``1/N`` slice of ``x`` along ``dim`` (padded with zeros to a multiple of ``N`` first
    with ``padding``)."""
    group = group or _GROUP
    size, rank = get_ulysses_sequence_parallel_world_size(group), get_ulysses_sequence_parallel_rank(group)
    if padding:
        x = _pad_to_multiple(x, dim, size)
    part = x.size(dim) // size
    return x.narrow(dim, rank * part, part).contiguous()


def ulysses_pad(
    input_ids_rmpad: Tensor, position_ids_rmpad: Tensor | None = None, sp_size: int = 1, pad_value: int = 0
) -> tuple[Tensor, Tensor | None, int]:
    """``input_ids_rmpad`` ``[1, T]`` padded with ``pad_value`` to a multiple of ``sp_size``, its
    position ids (``[1, T]``, or ``[C, 1, T]`` for M-RoPE) continued with ``0, 1, ...`` over the
    pad, and the pad's length."""
    if position_ids_rmpad is not None and input_ids_rmpad.size(-1) != position_ids_rmpad.size(-1):
        raise ValueError(
            f"input ids hold {input_ids_rmpad.size(-1)} tokens but position ids {position_ids_rmpad.size(-1)}"
        )
    if sp_size <= 1:
        return input_ids_rmpad, position_ids_rmpad, 0
    pad = -input_ids_rmpad.size(-1) % sp_size
    if pad:
        input_ids_rmpad = F.pad(input_ids_rmpad, (0, pad), value=pad_value)
        if position_ids_rmpad is not None:
            extra = torch.arange(pad, device=position_ids_rmpad.device, dtype=position_ids_rmpad.dtype)
            extra = extra.expand(*position_ids_rmpad.shape[:-1], pad)
            position_ids_rmpad = torch.cat([position_ids_rmpad, extra], dim=-1)
    return input_ids_rmpad, position_ids_rmpad, pad


def ulysses_pad_and_slice_inputs(
    input_ids_rmpad: Tensor,
    position_ids_rmpad: Tensor | None = None,
    sp_size: int = 1,
    skip_position_ids_rmpad: bool = False,
    pad_value: int = 0,
) -> tuple[Tensor, Tensor | None, int]:
    """:func:`ulysses_pad`, then this rank's slice of the ids (and of the position ids unless
    ``skip_position_ids_rmpad``): ``(ids, position_ids, pad_size)``, what a rank's forward takes."""
    if sp_size > 1 and get_ulysses_sequence_parallel_world_size() != sp_size:
        raise RuntimeError(
            f"sp_size={sp_size} but the current Ulysses group has "
            f"{get_ulysses_sequence_parallel_world_size()} ranks; call set_ulysses_sequence_parallel_group first"
        )
    ids, positions, pad = ulysses_pad(input_ids_rmpad, position_ids_rmpad, sp_size, pad_value)
    if sp_size <= 1:
        return ids, positions, pad
    ids = slice_input_tensor(ids, dim=1, padding=False)
    if positions is not None and not skip_position_ids_rmpad:
        positions = slice_input_tensor(positions, dim=-1, padding=False)
    return ids, positions, pad


def validate_ulysses_config(num_heads: int, ulysses_sequence_size: int) -> None:
    """Raise unless the attention heads divide evenly over the sequence-parallel ranks."""
    if ulysses_sequence_size > 1 and num_heads % ulysses_sequence_size:
        raise ValueError(
            f"ulysses_sequence_parallel_size={ulysses_sequence_size}: the model's {num_heads} attention "
            "heads are not divisible by it"
        )
