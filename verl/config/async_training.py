"""The ``async_training`` section: the asynchronous off-policy trainer (``trainer.mode=async``)."""

from __future__ import annotations

from dataclasses import dataclass

from verl.config.base import NON_NEGATIVE, POSITIVE, at_least, check, check_choice, check_ranges, ranged

WEIGHT_TRANSPORTS = ("object_store", "filesystem")


@dataclass
class AsyncTrainingConfig:
    max_staleness: int = ranged(1, NON_NEGATIVE)
    """How many policy versions a consumed sample may lag behind the weights being trained
    (0: on-policy; the run then equals the synchronous trainer). Generation for step s starts
    once version s-1-max_staleness is published, so the rollout works ahead of the trainer."""
    rollout_n_gpus: int = ranged(1, at_least(1))
    """Processes (devices) of the rollout pool, on each node; the trainer pool keeps
    trainer.n_gpus_per_node of its own."""
    rollout_cpus_per_worker: float | None = ranged(None, POSITIVE)
    """CPU cores (and torch threads, on CPU) of each rollout process (null: trainer.cpus_per_worker)."""
    drop_stale: bool = False
    """Mask out samples older than max_staleness instead of failing (the producer's throttle
    already prevents them; this guards against a lagging rollout)."""
    partial_rollout: bool = True
    """True: a weight update published while a batch is generated lands mid-batch (hf: between two
    decoding steps, so token versions change inside a sequence; vllm: between two engine calls).
    False: each batch is generated entirely with the weights published when it was submitted, so a
    seeded run gives the same samples whatever the timing (up to max_staleness + 1 versions are kept)."""
    weight_transport: str = "object_store"
    """How the actor publishes weights to the rollout: object_store (in memory through Ray) or
    filesystem (safetensors under weight_dir, for disaggregated machines)."""
    weight_dir: str | None = None
    """Directory for weight_transport=filesystem (shared by trainer and rollout machines)."""

    def validate(self, path: str) -> None:
        check_ranges(self, path)
        check_choice(self.weight_transport, WEIGHT_TRANSPORTS, f"{path}.weight_transport")
        check(
            self.weight_transport != "filesystem" or self.weight_dir is not None,
            f"{path}.weight_dir",
            "a directory when weight_transport=filesystem",
            self.weight_dir,
        )
