"""Published weights kept by version, for generations that must run on one exact version.

The asynchronous trainer with ``async_training.partial_rollout=False`` asks for every batch
to be generated entirely with the weights that were current when the batch was submitted
(``meta_info["weight_version"]``), so a seeded run gives the same samples whatever the
timing of the threads. Newer versions arrive while older batches still wait; they are kept
here, and a generation installs its own version right before it starts. The driver says
which versions can go (``keep_from``: the oldest version an in-flight batch still needs).
"""

from __future__ import annotations

import threading

import torch

from verl.protocol import DataProto
from verl.workers.rollout.base import Rollout


class StagedWeights:
    def __init__(self, rollout: Rollout) -> None:
        self.rollout = rollout
        self.versions: dict[int, dict[str, torch.Tensor]] = {}
        self._lock = threading.Lock()  # guards ``versions``
        self._generation = threading.Lock()  # install + generate, one batch at a time

    def add(self, weights: dict[str, torch.Tensor], version: int, keep_from: int) -> None:
        with self._lock:
            self.versions[version] = weights
            for old in [v for v in self.versions if v < keep_from]:
                del self.versions[old]

    def generate(self, prompts: DataProto) -> DataProto:
        """Install the version the batch asks for (the newest one for a request that names
        none, e.g. validation), then generate with it; no update lands mid-batch."""
        with self._generation:
            wanted = prompts.meta_info.get("weight_version")
            with self._lock:
                if wanted is None and self.versions:
                    wanted = max(self.versions)
                weights = self.versions.get(wanted)
            if wanted is not None and wanted != self.rollout.version:
                if weights is None:
                    raise RuntimeError(
                        f"a batch asks for weight version {wanted}, which the rollout does not hold "
                        f"(held: {sorted(self.versions)}, running: {self.rollout.version})"
                    )
                self.rollout.update_weights(weights.items(), wanted)
            return self.rollout.generate_sequences(prompts)
