"""Fault injection for the weight-sync check: a weight sync that silently does nothing.

Loaded into the workers with ``actor_rollout_ref.model.external_lib=tests.workers.rollout.stale_sync_plugin``:
every rollout backend then records the new version but keeps its old weights, the failure
mode users of other frameworks trained on for weeks without noticing.
"""

from __future__ import annotations

import os

from verl.workers.rollout.hf_rollout import HFRollout


def _keep_old_weights(self, named_tensors, version: int) -> None:
    for _ in named_tensors:  # consume the tensors as a real sync would, install none of them
        pass
    self.version = version


def _install() -> None:
    HFRollout.update_weights = _keep_old_weights
    from verl.workers.rollout.vllm_rollout import VLLMRollout  # imports no vllm until an engine starts

    VLLMRollout.update_weights = _keep_old_weights


# Only in worker processes (the worker group sets RANK): the config check imports this module in
# the driver too, which must keep working rollouts for the tests that run after it.
if "RANK" in os.environ:
    _install()
