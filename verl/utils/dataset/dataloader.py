"""A data loader whose position can be saved and restored, so a resumed run sees the same batches.

Epoch ``e`` visits the rows in the order ``numpy.random.default_rng([seed, e]).permutation(n)``
(or ``0..n-1`` without shuffling), cut into consecutive batches. The state is just
``(epoch, batches_done)``: the permutation is re-derived from the seed, so a checkpoint is a
few integers and restoring it mid-epoch continues with the very next batch.

Iteration semantics (what a training loop relies on):

* ``iter(loader)`` yields the batches of the current epoch that have not been yielded yet;
  when they run out, the epoch counter advances and the next ``iter`` starts a new epoch;
* a batch counts as consumed when it is yielded, so a ``state_dict()`` taken while training on
  batch ``k`` resumes at batch ``k + 1``;
* breaking out of a loop keeps the position; only one iterator should be active at a time.

Everything runs in the calling process (no worker processes): prompts are only tokenised here,
and in-process loading is what makes the position exact.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from verl.utils.dataset.rl_dataset import collate_fn as default_collate

__all__ = ["StatefulDataLoader", "create_rl_dataloader"]

_CHECKED_KEYS = ("num_rows", "batch_size", "shuffle", "seed", "drop_last")


class StatefulDataLoader:
    """Batches of ``dataset`` in a seeded per-epoch order, with ``state_dict``/``load_state_dict``."""

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        shuffle: bool = True,
        seed: int | None = None,
        drop_last: bool = True,
        collate_fn: Callable[[list[Any]], Any] = default_collate,
    ) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.dataset, self.batch_size, self.shuffle = dataset, batch_size, shuffle
        self.seed = 1 if seed is None else int(seed)  # verl's fallback when data.seed is null
        self.drop_last, self.collate_fn = drop_last, collate_fn
        self.epoch = 0
        self.batches_done = 0

    def __len__(self) -> int:
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def order(self, epoch: int) -> np.ndarray:
        """Row indices in the order epoch ``epoch`` visits them."""
        n = len(self.dataset)
        if not self.shuffle:
            return np.arange(n)
        return np.random.default_rng([self.seed, epoch]).permutation(n)

    def __iter__(self) -> Iterator[Any]:
        order = self.order(self.epoch)
        while self.batches_done < len(self):
            start = self.batches_done * self.batch_size
            indices = order[start : start + self.batch_size]
            self.batches_done += 1
            yield self.collate_fn([self.dataset[int(i)] for i in indices])
        self.epoch += 1
        self.batches_done = 0

    def state_dict(self) -> dict[str, Any]:
        """Position (epoch, batches already yielded) plus the settings that define the order."""
        return {
            "epoch": self.epoch,
            "batches_done": self.batches_done,
            "num_rows": len(self.dataset),
            "batch_size": self.batch_size,
            "shuffle": self.shuffle,
            "seed": self.seed,
            "drop_last": self.drop_last,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``; refuses a state taken with other data or settings, since the
        batches would silently differ."""
        mine = self.state_dict()
        for key in _CHECKED_KEYS:
            if key in state and state[key] != mine[key]:
                raise ValueError(
                    f"data loader state was saved with {key}={state[key]!r} but this loader has {mine[key]!r}; "
                    "resuming would not reproduce the same batches"
                )
        if not 0 <= int(state["batches_done"]) <= len(self):
            raise ValueError(
                f"data loader state has batches_done={state['batches_done']}, outside 0..{len(self)}"
            )
        self.epoch = int(state["epoch"])
        self.batches_done = int(state["batches_done"])


def create_rl_dataloader(
    dataset: Any,
    batch_size: int,
    shuffle: bool,
    seed: int | None,
    drop_last: bool,
    collate_fn: Callable[[list[Any]], Any] = default_collate,
) -> StatefulDataLoader:
    """The loader the trainer iterates (train: ``drop_last=True``; validation: ``False``). With
    ``drop_last`` and fewer rows than ``batch_size`` it has no batch (``len() == 0``): check that."""
    return StatefulDataLoader(
        dataset, batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last, collate_fn=collate_fn
    )
