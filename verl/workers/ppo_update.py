"""The PPO update loop shared by the actor and the critic.

For each of ``ppo_epochs``: optionally shuffle the rank's rows, split them into
mini-batches (one optimizer step each), split every mini-batch into micro-batches
(gradient accumulation, each weighted by its share of the mini-batch's rows).

Every micro-batch also carries the counts of its whole mini-batch over all ranks
(:func:`mini_batch_counts`), so the losses normalise by the mini-batch, not the micro-batch
(verl 0.9.1's global-batch normalisation; see :mod:`verl.algorithms.actor_loss`): the loss
scale does not depend on ``ppo_micro_batch_size_per_gpu`` or on the number of ranks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from verl.protocol import DataProto
from verl.workers.engine.base import LossFn, TrainEngine
from verl.workers.engine.micro_batch import split_micro_batches


@dataclass(frozen=True)
class UpdateSpec:
    mini_batch_rows: int
    """Rows per optimizer step on this rank."""
    micro_batch_size: int | None
    use_dynamic_bsz: bool
    max_token_len: int
    epochs: int
    shuffle: bool
    replicas: int = 1
    """Ranks holding the same rows (a Ulysses sequence-parallel group)."""


def run_ppo_updates(
    engine: TrainEngine,
    data: DataProto,
    keys: list[str],
    spec: UpdateSpec,
    loss_fn: LossFn,
    generator: torch.Generator,
    on_step: Callable[[dict[str, float]], None] | None = None,
) -> dict[str, float]:
    """Run every optimizer step of one training step; returns metrics averaged over steps."""
    steps: list[dict[str, float]] = []
    for _ in range(spec.epochs):
        rows = data
        if spec.shuffle:
            rows = data.select_idxs(torch.randperm(len(data), generator=generator))
        for mini in rows.split(max(1, spec.mini_batch_rows)):
            micro_batches, groups = split_micro_batches(
                mini, keys, spec.micro_batch_size, spec.use_dynamic_bsz, spec.max_token_len
            )
            counts = mini_batch_counts(mini, spec.replicas)
            micro_batches = [{**micro, **counts} for micro in micro_batches]
            weights = [len(g) / len(mini) for g in groups]
            metrics = engine.train_step(micro_batches, loss_fn, weights)
            steps.append(metrics)
            if on_step is not None:
                on_step(metrics)
    return mean_over_ranks(average(steps))


def mini_batch_counts(mini: DataProto, replicas: int = 1) -> dict[str, torch.Tensor]:
    """``dp_size``, ``batch_num_tokens`` (valid response tokens, at least 1) and
    ``global_batch_size`` (rows) of a mini-batch, summed over data-parallel ranks (rows held by
    ``replicas`` ranks, a sequence-parallel group, count once and the group is one data-parallel
    rank); none without a ``response_mask``."""
    if "response_mask" not in mini.batch.keys():
        return {}
    counts = torch.tensor([float(mini.batch["response_mask"].sum()), float(len(mini))], dtype=torch.float64)
    dp_size = 1
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(counts)
        counts /= replicas
        dp_size = dist.get_world_size() // replicas
    tokens, rows = (round(v) for v in counts.tolist())
    return {
        "dp_size": torch.tensor(dp_size),
        "batch_num_tokens": torch.tensor(max(tokens, 1)),
        "global_batch_size": torch.tensor(rows),
    }


def average(items: list[dict[str, float]]) -> dict[str, float]:
    keys = sorted({k for item in items for k in item})
    return {k: sum(item[k] for item in items if k in item) / sum(k in item for item in items) for k in keys}


def mean_over_ranks(metrics: dict[str, float]) -> dict[str, float]:
    """Average each metric over data-parallel ranks (every rank must pass the same keys)."""
    if not (dist.is_initialized() and dist.get_world_size() > 1) or not metrics:
        return metrics
    keys = sorted(metrics)
    values = torch.tensor([metrics[k] for k in keys], dtype=torch.float64)
    dist.all_reduce(values)
    values /= dist.get_world_size()
    return dict(zip(keys, values.tolist()))


def rows_per_rank(prompts: int, n: int, world_size: int, key: str) -> int:
    """``prompts * n / world_size``: a per-prompt batch size turned into rows on one rank."""
    rows = prompts * n
    if rows % world_size:
        raise ValueError(
            f"{key}={prompts} x rollout.n={n} = {rows} rows is not divisible by {world_size} ranks"
        )
    return rows // world_size


def prefixed(
    metrics: dict[str, float], prefix: str, rename: dict[str, str] | None = None
) -> dict[str, float]:
    """Engine metric names (grad_norm, lr, ...) under ``prefix/``; names with a '/' are kept."""
    rename = rename or {}
    return {(k if "/" in k else f"{prefix}/{rename.get(k, k)}"): v for k, v in metrics.items()}
