"""verl's fully-async keys onto the asynchronous trainer (``trainer.mode=async``).

verl's fully-async trainer streams samples from a rollouter on its own pool into a bounded queue;
its trainer takes ``require_batches x ppo_mini_batch_size`` prompts per local update, syncs the
weights every ``trigger_parameter_sync_step`` updates, and the rollouter may submit
``(1 + staleness_threshold) x`` a sync window's prompts per version, counting those still unconsumed
at the sync. Here the same bound drives the asynchronous trainer's producer, in units of
``data.gen_batch_size`` prompts when it streams (:mod:`verl.trainer.ppo.sample_stream`), else in whole
step batches (:attr:`~verl.config.async_training.AsyncTrainingConfig.window_batches`), so one implementation
serves ``trainer.mode=async``, verl's one-step-off entry point and this one. The keys that only
size verl's run are converted here (each conversion is one note in the start-up log):

* ``require_batches x actor.ppo_mini_batch_size`` -> ``data.train_batch_size``;
* ``rollout.total_rollout_steps`` (prompts) -> ``trainer.total_training_steps``;
* ``rollout.total_epochs`` -> ``trainer.total_epochs``;
* ``rollout.test_freq`` (syncs) -> ``trainer.test_freq`` (steps);
* ``use_rollout_log_probs`` -> ``algorithm.rollout_correction.bypass_mode``, unless
  ``compute_prox_log_prob``: then bypass mode is off and the trainer computes ``old_log_probs``
  with the weights of the last sync (kept by the actor for the window's later updates);
* ``staleness_threshold`` -> ``max_staleness = ceil(staleness_threshold)``, the lag a consumed
  sample may have in versions (checked on every sample).

``staleness_threshold`` set is what turns them on (verl's fully-async preset sets it); without it they
are refused away from their defaults, naming the key.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

from verl.config.base import ConfigError, check
from verl.config.keypaths import get_key

FULLY_ASYNC_ONLY = (
    "async_training.require_batches",
    "async_training.use_rollout_log_probs",
    "async_training.compute_prox_log_prob",
    "rollout.total_rollout_steps",
    "rollout.total_epochs",
    "rollout.test_freq",
)
"""Keys that only mean something with ``async_training.staleness_threshold`` set."""
INERT_KEYS = (
    "async_training.use_trainer_do_validate",
    "async_training.dynamic_schedule_policy",
    "async_training.dynamic_schedule_deactivate_ratio",
    "async_training.dynamic_schedule_enable_rebalance",
    "async_training.concurrent_samples_per_replica",
    "rollout.n",
)
"""verl's fully-async keys that have no effect here (listed once in the start-up log)."""


def convert_fully_async(config: Any) -> list[str]:
    """Check and convert (module doc); the notes."""
    cfg = config.async_training
    check(
        not cfg.use_dynamic_resource_scheduling,
        "async_training.use_dynamic_resource_scheduling",
        "False (verl's hybrid rollout replicas on the trainer's devices are not implemented)",
        True,
    )
    check(
        cfg.trigger_parameter_sync_step == 1 or config.trainer.mode == "async",
        "async_training.trigger_parameter_sync_step",
        "1 with trainer.mode=sync (the synchronous trainer syncs after every update)",
        cfg.trigger_parameter_sync_step,
    )
    _check_save_freq(config)
    if cfg.staleness_threshold is None:
        defaults = SimpleNamespace(async_training=type(cfg)(), rollout=type(config.rollout)())
        for key in FULLY_ASYNC_ONLY:
            check(
                get_key(config, key) == get_key(defaults, key),
                key,
                "its default unless async_training.staleness_threshold is set (verl's fully-async keys: "
                "python -m verl.experimental.fully_async_policy.fully_async_main)",
                get_key(config, key),
            )
        return []
    check(
        config.trainer.mode == "async",
        "async_training.staleness_threshold",
        "null with trainer.mode=sync (it bounds the asynchronous trainer's rollout)",
        cfg.staleness_threshold,
    )
    return _staleness(config) + _sizes(config) + _schedule(config)


def _check_save_freq(config: Any) -> None:
    """A checkpoint between two syncs would resume with the rollout on newer weights than the
    uninterrupted run had: saves fall on syncs."""
    k, freq = config.async_training.trigger_parameter_sync_step, config.trainer.save_freq
    check(
        freq <= 0 or freq % k == 0,
        "trainer.save_freq",
        f"a multiple of async_training.trigger_parameter_sync_step={k} (checkpoints fall on weight syncs)",
        freq,
    )


def _staleness(config: Any) -> list[str]:
    cfg = config.async_training
    lag = math.ceil(cfg.staleness_threshold - 1e-9)
    default = type(cfg)().max_staleness
    if cfg.max_staleness not in (default, lag):
        raise ConfigError(
            f"async_training.max_staleness: {cfg.max_staleness} disagrees with async_training.staleness_threshold="
            f"{cfg.staleness_threshold} (which allows a lag of {lag} versions); set one of the two"
        )
    cfg.max_staleness = lag
    notes = [
        f"async_training.staleness_threshold={cfg.staleness_threshold} -> async_training.max_staleness={lag}"
    ]
    bypass = not cfg.compute_prox_log_prob
    if cfg.use_rollout_log_probs and config.algorithm.rollout_correction.bypass_mode != bypass:
        config.algorithm.rollout_correction.bypass_mode = bypass
        key = "compute_prox_log_prob" if cfg.compute_prox_log_prob else "use_rollout_log_probs"
        notes.append(f"async_training.{key}=True -> algorithm.rollout_correction.bypass_mode={bypass}")
    return notes


def _sizes(config: Any) -> list[str]:
    cfg, pool = config.async_training, config.rollout
    prompts = cfg.require_batches * config.actor_rollout_ref.actor.ppo_mini_batch_size
    notes = []
    if config.data.train_batch_size != prompts:
        notes.append(
            f"async_training.require_batches={cfg.require_batches} x actor.ppo_mini_batch_size -> "
            f"data.train_batch_size={prompts} (was {config.data.train_batch_size})"
        )
        config.data.train_batch_size = prompts
    if pool.total_rollout_steps is not None:
        steps = pool.total_rollout_steps // prompts
        check(
            steps >= 1,
            "rollout.total_rollout_steps",
            f"at least the {prompts} prompts of one step",
            pool.total_rollout_steps,
        )
        config.trainer.total_training_steps = steps
        notes.append(
            f"rollout.total_rollout_steps={pool.total_rollout_steps} -> trainer.total_training_steps={steps}"
        )
    if pool.total_epochs is not None:
        config.trainer.total_epochs = pool.total_epochs
        notes.append(f"rollout.total_epochs={pool.total_epochs} -> trainer.total_epochs")
    return notes


def _schedule(config: Any) -> list[str]:
    pool, k = config.rollout, config.async_training.trigger_parameter_sync_step
    if pool.test_freq is None:
        return []
    freq = pool.test_freq * k if pool.test_freq > 0 else pool.test_freq
    config.trainer.test_freq = freq
    return [f"rollout.test_freq={pool.test_freq} (syncs) -> trainer.test_freq={freq} (steps)"]
