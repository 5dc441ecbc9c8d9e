"""A rollout backend added from outside the package: what adding a backend takes.

One file (this one: the rollout class) and one registry line (the ``register_rollout_backend`` call
at the bottom). Loaded with ``actor_rollout_ref.model.external_lib=tests.workers.rollout.toy_backend``:
the driver imports it when it checks the config, and every worker before it builds its rollout.

The toy generates with the ``hf`` rollout's code and leaves a trace of each call in
``$VERL_CACHE_DIR/toy-backend/`` (one file per worker process), so a test can see that the
registry, not a fallback, chose it.
"""

from __future__ import annotations

import os
from pathlib import Path

from verl.config.rollout_backends import RolloutBackend, register_rollout_backend
from verl.protocol import DataProto
from verl.utils.cache import cache_dir
from verl.workers.rollout.hf_rollout import HFRollout


def trace_dir() -> Path:
    return cache_dir() / "toy-backend"


class ToyRollout(HFRollout):
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        out = super().generate_sequences(prompts)
        trace_dir().mkdir(parents=True, exist_ok=True)
        with open(trace_dir() / f"generate-{os.getpid()}.txt", "a") as trace:
            trace.write(f"{len(prompts)} rows, version {self.version}\n")
        return out


register_rollout_backend(
    RolloutBackend("toy", f"{__name__}:ToyRollout", "verl.workers.rollout.hf_engine:HFStepEngine")
)
