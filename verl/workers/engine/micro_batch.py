"""Splitting a rank's batch into micro-batches: a fixed row count or a token budget.

With ``use_dynamic_bsz`` the rows are packed into ``k`` micro-batches of similar token
counts, where ``k = ceil(tokens / max_token_len)`` is agreed across data-parallel ranks
(all ranks must run the same number of forward passes, or FSDP's collectives would wait
forever for the rank that ran out of micro-batches).
"""

from __future__ import annotations

import heapq
import math

import numpy as np
import torch
import torch.distributed as dist

from verl.protocol import DataProto
from verl.workers.engine.base import MicroBatch
from verl.workers.vision import MULTI_MODAL_INPUTS, micro_batch_vision


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


def balanced_partitions(weights: list[float], k: int) -> list[np.ndarray]:
    """Greedy longest-first partition of row indices into ``k`` non-empty groups of similar weight."""
    k = max(1, min(k, len(weights)))
    heap = [(0.0, i) for i in range(k)]
    groups: list[list[int]] = [[] for _ in range(k)]
    for idx in sorted(range(len(weights)), key=lambda i: -weights[i]):
        load, g = heapq.heappop(heap)
        groups[g].append(idx)
        heapq.heappush(heap, (load + weights[idx], g))
    return [np.array(sorted(g), dtype=np.int64) for g in groups if g]


def restore_order(outputs: list[torch.Tensor], groups: list[np.ndarray]) -> torch.Tensor:
    """Concatenate per-micro-batch outputs back into the rows' original order."""
    merged = torch.cat(outputs, dim=0)
    order = torch.as_tensor(np.concatenate(groups))
    result = torch.empty_like(merged)
    result[order] = merged
    return result


def equal_size_partitions(weights: list[float], k: int) -> list[np.ndarray]:
    """``k`` groups of exactly ``len(weights) / k`` indices with similar total weight.

    Rows sorted by weight are dealt in snake order (0..k-1, k-1..0, ...), which keeps the
    counts equal (data-parallel chunks must be) and the sums close.
    """
    n = len(weights)
    if k <= 0 or n % k:
        raise ValueError(f"cannot split {n} rows into {k} equal groups")
    groups: list[list[int]] = [[] for _ in range(k)]
    for position, idx in enumerate(sorted(range(n), key=lambda i: -weights[i])):
        lap, offset = divmod(position, k)
        groups[offset if lap % 2 == 0 else k - 1 - offset].append(idx)
    return [np.array(sorted(g), dtype=np.int64) for g in groups]
