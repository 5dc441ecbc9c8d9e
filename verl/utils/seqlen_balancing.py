"""Splitting rows into groups of similar total length (verl's ``verl.utils.seqlen_balancing``).

Two partitioners do the work (the training engine's micro-batches use them too,
:mod:`verl.workers.engine.micro_batch`):

* :func:`balanced_partitions`: greedy longest-first (each row, longest first, goes to the lightest
  group); group sizes may differ.
* :func:`equal_size_partitions`: rows sorted by weight dealt in snake order, so every group holds
  exactly ``n / k`` rows (data-parallel chunks must) with similar sums.

verl's own entry points sit on top: :func:`get_seqlen_balanced_partitions`,
:func:`rearrange_micro_batches` (micro-batches under a token budget) and :func:`get_reverse_idx`
(the permutation that puts the micro-batches' rows back in order). verl partitions with
Karmarkar-Karp; the greedy partitions here balance about as well and are what this project's
engine uses, so the same rows land together either way.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

__all__ = ["balanced_partitions", "calculate_workload", "ceildiv", "equal_size_partitions"]
__all__ += ["get_reverse_idx", "get_seqlen_balanced_partitions", "rearrange_micro_batches", "restore_order"]


def balanced_partitions(weights: Sequence[float], k: int) -> list[np.ndarray]:
    """Greedy longest-first partition of row indices into ``k`` non-empty groups of similar weight."""
    k = max(1, min(k, len(weights)))
    heap = [(0.0, i) for i in range(k)]
    groups: list[list[int]] = [[] for _ in range(k)]
    for idx in sorted(range(len(weights)), key=lambda i: -weights[i]):
        load, g = heapq.heappop(heap)
        groups[g].append(idx)
        heapq.heappush(heap, (load + weights[idx], g))
    return [np.array(sorted(g), dtype=np.int64) for g in groups if g]


def equal_size_partitions(weights: Sequence[float], k: int) -> list[np.ndarray]:
    """``k`` groups of exactly ``len(weights) / k`` indices with similar total weight.

    Rows sorted by weight are dealt in snake order (0..k-1, k-1..0, ...), which keeps the
    counts equal and the sums close.
    """
    n = len(weights)
    if k <= 0 or n % k:
        raise ValueError(f"cannot split {n} rows into {k} equal groups")
    groups: list[list[int]] = [[] for _ in range(k)]
    for position, idx in enumerate(sorted(range(n), key=lambda i: -weights[i])):
        lap, offset = divmod(position, k)
        groups[offset if lap % 2 == 0 else k - 1 - offset].append(idx)
    return [np.array(sorted(g), dtype=np.int64) for g in groups]


def restore_order(outputs: list[torch.Tensor], groups: Sequence[Sequence[int]]) -> torch.Tensor:
    """Concatenate per-group outputs back into the rows' original order."""
    merged = torch.cat(outputs, dim=0)
    order = torch.as_tensor(np.concatenate([np.asarray(g, dtype=np.int64) for g in groups]))
    result = torch.empty_like(merged)
    result[order] = merged
    return result


def get_seqlen_balanced_partitions(
    seqlen_list: Sequence[int], k_partitions: int, equal_size: bool
) -> list[list[int]]:
    """``k_partitions`` lists of row indices (each sorted, none empty, together every row once) whose
    sums of ``seqlen_list`` are close; with ``equal_size`` each holds ``len / k_partitions`` rows."""
    if len(seqlen_list) < k_partitions:
        raise ValueError(f"cannot split {len(seqlen_list)} rows into {k_partitions} non-empty partitions")
    split = equal_size_partitions if equal_size else balanced_partitions
    partitions = [group.tolist() for group in split(list(seqlen_list), k_partitions)]
    if len(partitions) != k_partitions:  # only when rows of weight 0 all landed in one group
        raise ValueError(
            f"balanced {len(seqlen_list)} rows into {len(partitions)} partitions, not {k_partitions}: "
            "rows of length 0 cannot be spread; drop them first"
        )
    return partitions


def ceildiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for integers."""
    return -(a // -b)


def calculate_workload(seqlen: torch.Tensor) -> torch.Tensor:
    """Relative cost of a forward over sequences of these lengths: ``24576 s + s^2`` (verl's
    estimate for a 7B dense model: ``12 h^2 s + 2 h s^2`` with ``h = 4096``, divided by ``2 h``)."""
    return 24576 * seqlen + seqlen**2


def rearrange_micro_batches(
    batch: Any,
    max_token_len: int,
    dp_group: dist.ProcessGroup | None = None,
    num_batches_divided_by: int | None = None,
    same_micro_num_in_dp: bool = True,
    min_num_micro_batch: int | None = None,
    use_dynamic_bsz_balance: bool = True,
) -> tuple[list[Any], list[list[int]]]:
    """Micro-batches of ``batch`` (a TensorDict or a dict of tensors with ``attention_mask``) holding
    at most about ``max_token_len`` tokens each, and the row indices each one took.

    The count is ``ceil(tokens / max_token_len)`` (at least ``min_num_micro_batch``, the maximum over
    ``dp_group`` when ``same_micro_num_in_dp`` so every rank runs as many forwards, rounded up to a
    multiple of ``num_batches_divided_by``); rows are balanced by :func:`calculate_workload`. With
    ``use_dynamic_bsz_balance`` the heaviest micro-batches run in the middle and the lightest at
    both ends (shorter pipeline warm-up and cool-down). :func:`get_reverse_idx` of the concatenated
    indices restores the original order."""
    lengths = batch["attention_mask"].sum(dim=1)
    if max_token_len < batch["attention_mask"].shape[-1]:
        raise ValueError(
            f"max_token_len={max_token_len} is below the padded sequence length "
            f"{batch['attention_mask'].shape[-1]}; one row must fit in a micro-batch"
        )
    count = _micro_batch_count(lengths, max_token_len, dp_group, same_micro_num_in_dp, min_num_micro_batch)
    if num_batches_divided_by is not None:
        count = ceildiv(count, num_batches_divided_by) * num_batches_divided_by
    if count > len(lengths):
        raise ValueError(f"{count} micro-batches asked for a batch of only {len(lengths)} rows")
    workloads = calculate_workload(lengths).tolist()
    partitions = get_seqlen_balanced_partitions(workloads, count, equal_size=False)
    if use_dynamic_bsz_balance:
        partitions.sort(key=lambda part: (sum(workloads[i] for i in part), part[0]), reverse=True)
        partitions = partitions[::2][::-1] + partitions[1::2]
    return [_select(batch, part) for part in partitions], partitions


def _micro_batch_count(
    lengths: torch.Tensor,
    max_token_len: int,
    dp_group: dist.ProcessGroup | None,
    same_micro_num_in_dp: bool,
    min_num_micro_batch: int | None,
) -> int:
    count = min(len(lengths), ceildiv(int(lengths.sum()), max_token_len))
    count = max(count, min_num_micro_batch or 0, 1)
    if dist.is_initialized() and same_micro_num_in_dp:
        agreed = torch.tensor([count], device=lengths.device)
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=dp_group)
        count = int(agreed.item())
    return count


def _select(batch: Any, rows: list[int]) -> Any:
    index = torch.as_tensor(rows, dtype=torch.long)
    if isinstance(batch, Mapping):
        return {key: value[index] for key, value in batch.items()}
    return batch[index]  # a TensorDict


def get_reverse_idx(idx_map: Sequence[int]) -> list[int]:
    """The inverse permutation: ``out[idx_map[i]] = i``."""
    reverse = [0] * len(idx_map)
    for i, idx in enumerate(idx_map):
        reverse[idx] = i
    return reverse
