"""The ``async_training`` section: the asynchronous off-policy trainer (``trainer.mode=async``), and
the top-level ``rollout`` section of verl's asynchronous entry points (the rollout's own pool)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from verl.config.base import (
    FRACTION,
    NON_NEGATIVE,
    POSITIVE,
    BaseConfig,
    ConfigError,
    at_least,
    check,
    check_choice,
    check_ranges,
    ranged,
)
from verl.config.rollout_backends import tensor_parallel_size

WEIGHT_TRANSPORTS = ("object_store", "filesystem")


@dataclass
class AsyncTrainingConfig(BaseConfig):
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
    seeded run gives the same samples whatever the timing (rollout.mode=sync: up to max_staleness + 1
    versions are kept; rollout.mode=async: a weight sync waits for the batches in flight, as verl's
    one-step-off does in server mode)."""
    partial_rollout_interrupt_at: int | None = ranged(None, at_least(1))
    """With partial_rollout and rollout.mode=sync: a batch the schedule trains after the next weight sync
    is generated up to this response token with the version of its submission, then continued with the
    next version once it is published, so token versions change inside its responses whatever the
    timing, and a seeded run gives the same samples (:mod:`verl.trainer.ppo.partial_rollout`). Null: a
    sync lands wherever the decoding has got to (inside a response only if the rollout is still busy)."""
    weight_transport: str = "object_store"
    """How the actor publishes weights to the rollout: object_store (in memory through Ray) or
    filesystem (safetensors under weight_dir, for disaggregated machines)."""
    weight_dir: str | None = None
    """Directory for weight_transport=filesystem (shared by trainer and rollout machines)."""
    rollout_max_restarts: int = ranged(3, NON_NEGATIVE)
    """A rollout process that dies (killed, out of memory) is replaced this many times per run: the
    rollout pool restarts with the current weights and the generations it held are submitted again,
    while the trainer goes on (0: the run fails, as in the synchronous trainer)."""
    # ---- verl's fully-async keys (python -m verl.experimental.fully_async_policy.fully_async_main)
    staleness_threshold: float | None = ranged(None, NON_NEGATIVE)
    """verl's fully-async bound: between two weight syncs the rollout may submit (1 + this) x
    trigger_parameter_sync_step batches, counting those still unconsumed at the sync (in units of
    data.gen_batch_size prompts when streaming, else whole batches, rounded down); a consumed sample
    then lags by at most ceil(this) versions, which becomes max_staleness. Null: max_staleness alone decides (one batch per step ahead for each version)."""
    trigger_parameter_sync_step: int = ranged(1, at_least(1))
    """Actor updates (steps) per weight sync: the rollout gets a new version every this many steps."""
    require_batches: int = ranged(1, at_least(1))
    """With staleness_threshold: a step trains on require_batches x actor.ppo_mini_batch_size prompts
    (it sets data.train_batch_size, as verl's fully-async trainer ignores it)."""
    use_rollout_log_probs: bool = False
    """The rollout's log-probs are the old policy's (sets algorithm.rollout_correction.bypass_mode)."""
    compute_prox_log_prob: bool = False
    """verl's: with use_rollout_log_probs, the trainer still computes old_log_probs, with the weights of the
    last sync (what the rollout runs) also after the window's first update, and the rollout's log-probs
    go to the rollout correction (the decoupled loss); False: the rollout's are old_log_probs (bypass)."""
    use_trainer_do_validate: bool = False
    """verl validates on the trainer's devices with this; here validation runs on the rollout pool either way."""
    use_dynamic_resource_scheduling: bool = False
    """verl's hybrid replicas on the trainer's devices; not implemented (True is refused)."""
    dynamic_schedule_policy: str = "default"
    """Knob of verl's dynamic resource scheduling (no effect here)."""
    dynamic_schedule_deactivate_ratio: float = ranged(0.3, FRACTION)
    """Knob of verl's dynamic resource scheduling (no effect here)."""
    dynamic_schedule_enable_rebalance: bool = True
    """Knob of verl's dynamic resource scheduling (no effect here)."""
    concurrent_samples_per_replica: int = ranged(16, at_least(1))
    """verl's cap on requests per rollout replica; no effect here (the window bounds what is in flight)."""

    @property
    def lag_bound(self) -> float:
        """The ``t`` of the window rule: staleness_threshold, else max_staleness."""
        return self.max_staleness if self.staleness_threshold is None else self.staleness_threshold

    @property
    def window_batches(self) -> int:
        """Batches the rollout may have submitted since the last weight sync, counting those still
        unconsumed at it: ``floor((1 + t) x trigger_parameter_sync_step)``. With max_staleness m and one
        step per sync it is m + 1, the trainer.mode=async rule."""
        return self.window_units(1)

    def window_units(self, units_per_step: int) -> int:
        """The same window counted in generation requests of ``units_per_step`` per step (streaming,
        ``data.gen_batch_size``): ``floor((1 + t) x trigger_parameter_sync_step x units_per_step)``."""
        k = self.trigger_parameter_sync_step
        return max(1, math.floor((1 + self.lag_bound) * k * units_per_step + 1e-9))

    def validate(self, path: str) -> None:
        check_ranges(self, path)
        check_choice(self.weight_transport, WEIGHT_TRANSPORTS, f"{path}.weight_transport")
        check(
            self.weight_transport != "filesystem" or self.weight_dir is not None,
            f"{path}.weight_dir",
            "a directory when weight_transport=filesystem",
            self.weight_dir,
        )


@dataclass
class RolloutPoolConfig(BaseConfig):
    """verl's ``rollout.*`` of its one-step-off and fully-async configs: the devices the rollout gets
    beside the trainer's ``trainer.nnodes x trainer.n_gpus_per_node``. Read with trainer.mode=async only
    (``python -m verl.experimental.one_step_off_policy.main_ppo`` sets it); null leaves
    async_training.rollout_n_gpus in charge."""

    nnodes: int | None = ranged(None, at_least(1))
    """Nodes of the rollout pool; here it spans the trainer's nodes, so it must equal trainer.nnodes."""
    n_gpus_per_node: int | None = ranged(None, at_least(1))
    """Rollout processes (devices) per node; becomes async_training.rollout_n_gpus."""
    n: int | None = ranged(None, at_least(1))
    """Listed in verl's fully-async preset, read by neither (responses per prompt: actor_rollout_ref.rollout.n)."""
    total_rollout_steps: int | None = ranged(None, at_least(1))
    """verl's fully async: prompts to generate in all; becomes trainer.total_training_steps (this // the
    prompts a step trains on)."""
    total_epochs: int | None = ranged(None, at_least(1))
    """verl's fully async: passes over the data; becomes trainer.total_epochs."""
    test_freq: int | None = ranged(None, at_least(-1))
    """verl's fully async: validate every this many weight syncs; becomes trainer.test_freq (x
    trigger_parameter_sync_step steps)."""

    def validate(self, path: str) -> None:
        check_ranges(self, path)


ROLLOUT_POOL_KEYS = ("rollout.nnodes", "rollout.n_gpus_per_node")


def _convert_pool(config: Any) -> list[str]:
    """``rollout.n_gpus_per_node`` -> ``async_training.rollout_n_gpus`` (in place), after checking that
    the run is asynchronous and that the two spellings of the pool size agree; returns the notes for
    the start-up log (``rollout.nnodes`` is checked at start-up: :func:`refuse_async_pools`)."""
    pool, async_cfg, trainer = config.rollout, config.async_training, config.trainer
    pool.validate("rollout")  # before its values move
    for key in ROLLOUT_POOL_KEYS:
        value = getattr(pool, key.split(".")[1])
        check(
            value is None or trainer.mode == "async",
            key,
            "null with trainer.mode=sync (a rollout on devices of its own is the asynchronous trainer's: "
            "trainer.mode=async, or python -m verl.experimental.one_step_off_policy.main_ppo)",
            value,
        )
    if pool.n_gpus_per_node is None or pool.n_gpus_per_node == async_cfg.rollout_n_gpus:
        return []
    if async_cfg.rollout_n_gpus != AsyncTrainingConfig.rollout_n_gpus:
        raise ConfigError(
            f"rollout.n_gpus_per_node: {pool.n_gpus_per_node} disagrees with async_training.rollout_n_gpus="
            f"{async_cfg.rollout_n_gpus}; they are two spellings of one size, set one"
        )
    async_cfg.rollout_n_gpus = pool.n_gpus_per_node
    return [f"rollout.n_gpus_per_node={pool.n_gpus_per_node} -> async_training.rollout_n_gpus"]


def refuse_async_pools(config: Any) -> None:
    """At start-up, what the asynchronous trainer's pools cannot do here: a rollout pool on nodes of its
    own (``rollout.nnodes`` other than ``trainer.nnodes``), and ``partial_rollout`` with engines that
    span several ranks."""
    trainer, pool = config.trainer, config.rollout
    check(
        pool.nnodes in (None, trainer.nnodes),
        "rollout.nnodes",
        f"trainer.nnodes ({trainer.nnodes}): the rollout pool takes rollout.n_gpus_per_node devices on each "
        "of the trainer's nodes (a rollout pool on nodes of its own is not implemented here)",
        pool.nnodes,
    )
    size = tensor_parallel_size(config.actor_rollout_ref.rollout)
    check(
        size == 1 or trainer.mode != "async" or not config.async_training.partial_rollout,
        "async_training.partial_rollout",
        "False with a tensor-parallel rollout (every rank of an engine must install a published "
        "version before the same batch; a version swapped in at once could land between two batches "
        "on one rank and mid-batch on another)",
        True,
    )


def convert_async_keys(config: Any) -> list[str]:
    """verl's keys of its asynchronous entry points, in place: the rollout pool (:func:`_convert_pool`)
    and the fully-async keys (:func:`verl.config.fully_async.convert_fully_async`); the notes for the
    start-up log."""
    from verl.config.fully_async import convert_fully_async

    return _convert_pool(config) + convert_fully_async(config)


def units_per_step(config: Any) -> int:
    """Generation requests per step: ``train_batch_size // gen_batch_size`` when the asynchronous trainer
    streams (``data.gen_batch_size`` below ``data.train_batch_size``), else 1 (one request per step batch)."""
    data = config.data
    if config.trainer.mode != "async" or data.gen_batch_size is None:
        return 1
    return max(1, data.train_batch_size // data.gen_batch_size)


def check_gen_batch_size(config: Any) -> None:
    """Streaming (``data.gen_batch_size`` below ``data.train_batch_size``) splits each step batch into
    equal units and takes them as the servers finish them: the units must divide the batch, and the
    batched rollout (``rollout.mode=sync``) answers one call at a time, in order."""
    if units_per_step(config) == 1:
        return
    data = config.data
    check(
        data.train_batch_size % data.gen_batch_size == 0,
        "data.gen_batch_size",
        f"a divisor of data.train_batch_size={data.train_batch_size} (a step trains whole units)",
        data.gen_batch_size,
    )
    check(
        config.actor_rollout_ref.rollout.mode == "async",
        "actor_rollout_ref.rollout.mode",
        f"async with data.gen_batch_size={data.gen_batch_size} below data.train_batch_size (streaming "
        "requests go to the rollout servers; the batched rollout answers one call at a time)",
        config.actor_rollout_ref.rollout.mode,
    )


def check_hybrid_engine(config: Any) -> None:
    """``actor_rollout_ref.hybrid_engine=False`` (the rollout on devices of its own) is what the
    asynchronous trainer does; the synchronous one colocates actor, rollout and reference."""
    check(
        config.actor_rollout_ref.hybrid_engine or config.trainer.mode == "async",
        "actor_rollout_ref.hybrid_engine",
        "True with trainer.mode=sync (it colocates actor, rollout and reference); for a rollout on its own "
        "devices use trainer.mode=async or python -m verl.experimental.one_step_off_policy.main_ppo",
        False,
    )
