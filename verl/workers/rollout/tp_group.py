"""Tensor-parallel rollout engines (``rollout.tensor_model_parallel_size=T``): each group of ``T``
consecutive ranks of the rollout pool runs ONE engine, sharded over its ranks (verl's hybrid layout:
the actor's ranks host the engine's tensor-parallel ranks; ``world / T`` engines generate side by
side, the data-parallel replicas).

vLLM's ``external_launcher`` executor is how: every rank of a group holds an engine object that runs
its shard, and the group's engines stay in step because each submits the same requests in the same
order and samples with the same seed (SPMD), as torchrun-launched vLLM does. vLLM forms its
tensor-parallel groups from consecutive ranks of the ``torch.distributed`` world, the same groups as
:func:`engine_group`. So a group:

* gathers its ranks' prompts (:func:`gather_batch`), generates all of them on every rank and keeps
  this rank's rows (:func:`own_rows`): the worker's ``DP_COMPUTE_PROTO`` split is unchanged;
* seeds sampling alike on every rank (:func:`engine_seed`, the seed of the engine, not of the rank;
  a batch without a ``sampling_seed`` takes the first rank's draw);
* loads full tensors into every rank (vLLM's loaders keep each rank's shard), and checks the
  weight-sync probe on every rank.

Server mode (:mod:`verl.workers.rollout.tp_server`): the group's first rank fronts the server, the
others replay its engine calls.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from verl.config.rollout_backends import tensor_parallel_size
from verl.protocol import DataProto
from verl.workers.rollout.sampling import derived_seed

TP_KEY = "actor_rollout_ref.rollout.tensor_model_parallel_size"


def engine_seed(config: Any, rank: int) -> int:
    """The seed of the engine that ``rank`` belongs to: ``rollout.seed`` plus the engine's index.
    The same on every rank of an engine (their samplers must draw alike); ``seed + rank`` with one
    rank per engine."""
    return config.seed + rank // tensor_parallel_size(config)


@dataclass(frozen=True)
class EngineGroup:
    """The ranks of one engine and this rank's place among them."""

    group: dist.ProcessGroup
    size: int
    rank: int
    """This rank's place in the engine (0: the first rank, which fronts it in server mode)."""
    ranks: tuple[int, ...] = ()
    """The world ranks of the engine."""

    def clear_shared_memory(self) -> None:
        """Unlink this rank's segment of vLLM's CPU all-reduce (``/dev/shm/<id>-tp:<n>-[ranks]-cpushm_<rank>``).

        vLLM's CPU build names the segment after the group's ranks and a launcher id that is the
        same for every ``external_launcher`` engine, and creates it exclusively: a segment left by a
        killed worker makes every later engine on those ranks fail (``create shm in SHMManager
        failed. errno: 17``). Called before the engine starts (a stale one) and once it has started
        (every rank has mapped the segments by then, so nothing is left behind if the process is
        killed)."""
        tail = f"-[{'-'.join(map(str, self.ranks))}]-cpushm_{self.rank}"
        folder = "/dev/shm"
        if not os.path.isdir(folder):
            return
        for name in os.listdir(folder):
            if "-tp:" in name and name.endswith(tail):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(folder, name))


def engine_group(config: Any) -> EngineGroup | None:
    """This rank's engine group (every rank builds every group, as ``torch.distributed`` asks);
    None with one rank per engine."""
    size = tensor_parallel_size(config)
    if size == 1:
        return None
    world = dist.get_world_size() if dist.is_initialized() else 1
    if world % size:
        raise ValueError(
            f"{TP_KEY}: expected a divisor of the rollout's {world} ranks (trainer.n_gpus_per_node x "
            f"trainer.nnodes, or the rollout pool's size), got {size}"
        )
    mine, start = None, dist.get_rank() // size * size
    for first in range(0, world, size):
        group = dist.new_group(list(range(first, first + size)), backend="gloo")
        if first == start:
            mine = group
    return EngineGroup(mine, size, dist.get_rank() - start, tuple(range(start, start + size)))


def gather_batch(prompts: DataProto, group: EngineGroup, own_seed: int) -> tuple[DataProto, int]:
    """Every rank's prompts of the engine, in rank order, and the stream of the batch's sampling
    seed: its ``sampling_seed``, or (none given) a number the first rank draws from torch's RNG, so
    that every rank samples alike."""
    drawn = int(torch.randint(0, 2**31 - 1, (1,)))
    stream = prompts.meta_info.get("sampling_seed", drawn)
    shares: list = [None] * group.size
    dist.all_gather_object(shares, (prompts, stream), group=group.group)
    return DataProto.concat([share for share, _ in shares]), derived_seed(shares[0][1], own_seed)


def own_rows(out: DataProto, group: EngineGroup) -> DataProto:
    """This rank's rows of a result computed on :func:`gather_batch`'s rows (every rank of a
    group has as many: the dispatch pads the batch to a multiple of the world size)."""
    return out.chunk(group.size)[group.rank]


def gather_probes(token_ids: list[int], group: EngineGroup) -> list[list[int]]:
    """Every rank's weight-sync probe: each rank scores its own, so all submit all of them."""
    probes: list = [None] * group.size
    dist.all_gather_object(probes, list(token_ids), group=group.group)
    return probes
