"""``Rollout``: the narrow interface of every generation backend.

``generate_sequences(prompts) -> DataProto`` takes left-padded prompts (``input_ids``,
``attention_mask``, ``position_ids``; ``meta_info`` may carry ``do_sample``,
``validate``, ``temperature``, ``top_p``, ``top_k``, ``response_length``) and returns:

* ``prompts`` [B, P], ``responses`` [B, R] (right-padded), ``input_ids`` [B, P+R],
  ``attention_mask`` [B, P+R], ``position_ids`` [B, P+R], ``response_mask`` [B, R];
* ``rollout_log_probs`` [B, R]: log-probs of the sampled tokens under the weights that
  produced them (training generations only);
* ``response_versions`` [B, R] and ``policy_version`` [B]: the weight version behind each
  token (they differ inside a sequence when an update landed mid-generation).

``update_weights(named_tensors, version)`` installs new weights atomically (a generation
never runs on a half-updated model); ``sleep()`` / ``wake_up()`` free and restore device
memory between generations.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable

import torch

from verl.protocol import DataProto


class Rollout(ABC):
    version: int = 0

    @abstractmethod
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Generate one response per row of ``prompts``."""

    @abstractmethod
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Replace the weights with ``named_tensors`` and record ``version``."""

    def sleep(self) -> None:
        """Release device memory (no-op where there is nothing to release)."""

    def wake_up(self) -> None:
        """Reacquire device memory before generating."""

    def state_dict(self) -> dict:
        """State that determines future generations (the sampling RNG), for exact resume."""
        return {"version": self.version}

    def load_state_dict(self, state: dict) -> None:
        self.version = state["version"]
