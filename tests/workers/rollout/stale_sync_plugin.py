"""Fault injection for the weight-sync check: a weight sync that silently does nothing.

Loaded into the workers with ``actor_rollout_ref.model.external_lib=tests.workers.rollout.stale_sync_plugin``:
every rollout backend then records the new version but keeps its old weights, the failure
mode users of other frameworks trained on for weeks without noticing.
"""

from __future__ import annotations

from verl.workers.rollout.hf_rollout import HFRollout


def _keep_old_weights(self, named_tensors, version: int) -> None:
    for _ in named_tensors:  # consume the tensors as a real sync would, install none of them
        pass
    self.version = version


HFRollout.update_weights = _keep_old_weights
try:
    from verl.workers.rollout.vllm_rollout import VLLMRollout

    VLLMRollout.update_weights = _keep_old_weights
except ImportError:  # pragma: no cover - vllm is optional
    pass
