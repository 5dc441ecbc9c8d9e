"""What a trainer's rollout source hands its rollout phase, and how the asynchronous trainer judges a
sample's age.

Both trainers run the same phases on a :class:`Draw` (``train_step(draw)``, ``rollout_phase(draw)``); only
the source differs. The synchronous trainer's draws are prompts whose responses the phase generates
now; the asynchronous trainer's are :class:`InFlight` generations requested ahead: a step batch, or with
streaming (:mod:`verl.trainer.ppo.sample_stream`) the units of ``data.gen_batch_size`` prompts that
finished first, joined.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from verl.protocol import DataProto


@dataclass(eq=False)  # compared by identity: two draws are never the same one
class Draw:
    """Draw number ``index`` of the rollout source (the step it trains, in the core loop) and its
    prompts' columns (``batch``; the responses are joined into it by the rollout phase)."""

    index: int
    batch: DataProto


@dataclass(eq=False)
class InFlight(Draw):
    """A generation requested ahead (the unit's number when streaming): besides the prompts' other
    columns, the future of the responses and what is needed to send it again."""

    future: Any
    weight_version: int = 0  # the policy version published when it was submitted
    prompts: DataProto | None = None  # what was sent, to send again after a rollout restart
    interrupted: bool = False  # a prefix to continue with the next version (partial_rollout_interrupt_at)
    prefix: DataProto | None = None  # the prefix the future's output continues
    parts: list[int] = field(default_factory=list)  # streaming: the units a step's batch joins, as taken


@dataclass
class Finished:
    """The future of a generation that already has its responses (kept in a checkpoint)."""

    output: DataProto

    def get(self, timeout_s: float | None = None) -> DataProto:
        return self.output

    def add_done_callback(self, fn: Callable[[Finished], None]) -> None:
        fn(self)  # done already


def sample_staleness(
    response_versions: torch.Tensor, current_version: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sample: staleness ``current_version - oldest token version`` and the version span
    (newest - oldest token version, > 0 when a weight update landed mid-sequence).
    ``response_versions`` is ``[B, R]`` with -1 on padding."""
    valid = response_versions >= 0
    big = torch.iinfo(response_versions.dtype).max
    oldest = torch.where(valid, response_versions, big).min(-1).values
    newest = response_versions.max(-1).values
    return current_version - oldest, newest - oldest


def isolate_rows(uids: np.ndarray, rows: torch.Tensor) -> np.ndarray:
    """A copy of ``uids`` where each row selected by the bool mask ``rows`` has a uid of its own
    (``<uid>/dropped-<row>``), so group estimators (grpo, rloo, ...) leave it out of the mean and
    std of the group it was sampled in. Rows stay in the batch: its size (which the
    mini-batches and the data-parallel split are sized by) does not change."""
    isolated = uids.copy()
    for row in torch.nonzero(rows).flatten().tolist():
        isolated[row] = f"{uids[row]}/dropped-{row}"
    return isolated


def check_staleness(
    batch: DataProto, policy_version: int, bound: int, drop_stale: bool, where: str
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """Each sample's staleness and version span (:func:`sample_staleness`) and the ``async/*`` metrics.
    A sample more than ``bound`` versions old fails the run, or with ``drop_stale`` is masked out of the
    loss and of its group's baseline (in place)."""
    staleness, span = sample_staleness(batch.batch["response_versions"], policy_version)
    stale = staleness > bound
    if stale.any():
        if not drop_stale:
            raise RuntimeError(
                f"{where}: {int(stale.sum())} samples are {int(staleness.max())} versions old, beyond "
                f"async_training.max_staleness={bound} (set async_training.drop_stale=True to mask them out instead)"
            )
        batch.batch["response_mask"][stale] = 0  # they count in no loss
        if "uid" in batch.non_tensor_batch:  # ... and in no group baseline of the rows kept
            batch.non_tensor_batch["uid"] = isolate_rows(batch.non_tensor_batch["uid"], stale)
    metrics = {
        "async/staleness_mean": float(staleness.float().mean()),
        "async/staleness_max": float(staleness.max()),
        "async/version_span_max": float(span.max()),
        "async/mid_sequence_update_frac": float((span > 0).float().mean()),
        "async/dropped_samples": float(stale.sum()),
        "async/policy_version": float(policy_version),
    }
    return staleness, span, metrics
