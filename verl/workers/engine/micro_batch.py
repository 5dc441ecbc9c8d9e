"""Splitting a rank's batch into micro-batches: a fixed row count or a token budget.

With ``use_dynamic_bsz`` the rows are packed into ``k`` micro-batches of similar token
counts, where ``k = ceil(tokens / max_token_len)`` is agreed across data-parallel ranks
(all ranks must run the same number of forward passes, or FSDP's collectives would wait
forever for the rank that ran out of micro-batches).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.distributed as dist

from verl.protocol import DataProto
from verl.utils.seqlen_balancing import balanced_partitions, equal_size_partitions, restore_order
from verl.workers.engine.base import MicroBatch
from verl.workers.vision import MULTI_MODAL_INPUTS, micro_batch_vision

# the partitioners live in verl.utils.seqlen_balancing; importers of this module still find them here
__all__ = ["balanced_partitions", "equal_size_partitions", "restore_order", "split_micro_batches"]


def split_micro_batches(
    data: DataProto,
    keys: list[str],
    micro_batch_size: int | None,
    use_dynamic_bsz: bool = False,
    max_token_len: int | None = None,
) -> tuple[list[MicroBatch], list[np.ndarray]]:
    """Micro-batches (dicts of the named tensors) and the row indices each one holds."""
    n = len(data)
    if use_dynamic_bsz:
        if not max_token_len or max_token_len <= 0:
            raise ValueError(f"use_dynamic_bsz needs a positive max_token_len, got {max_token_len}")
        tokens = data.batch["attention_mask"].sum(-1).tolist()
        groups = balanced_partitions(tokens, _agreed_count(math.ceil(sum(tokens) / max_token_len), n))
    else:
        size = micro_batch_size or n
        groups = [np.arange(i, min(i + size, n)) for i in range(0, n, size)]
    tensors = {k: data.batch[k] for k in keys}
    micro_batches = [{k: v[torch.as_tensor(idx)] for k, v in tensors.items()} for idx in groups]
    images = data.non_tensor_batch.get(MULTI_MODAL_INPUTS)
    if images is not None:  # a vision-language model's rows: their image inputs go with them
        for micro, idx in zip(micro_batches, groups):
            micro.update(micro_batch_vision(images[idx]))
    return micro_batches, groups


def _agreed_count(k: int, n_rows: int) -> int:
    k = max(1, min(k, n_rows))
    if dist.is_initialized() and dist.get_world_size() > 1:
        t = torch.tensor([k])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        k = int(t.item())
    return min(k, n_rows) if n_rows else 1
