"""What a resolved config asks of this project that it cannot do: refused when a run starts.

``--cfg job`` prints the config a machine with the hardware would run, so a key of verl's scripts
resolves whenever its value makes sense (:func:`~verl.config.ppo_trainer.to_typed_config` checks
that). What this project lacks (a feature it does not implement, a device it does not run on, a
layout its engines cannot hold) is refused only when a run starts: :func:`refuse_at_start_up` raises
a :class:`~verl.config.base.ConfigError` whose one line names the key, its value and what it needs.

``to_typed_config`` (the entry points' ``main``) and ``load_config`` run it by default; the
``--cfg job`` path (:func:`verl.config.cli.prepare_argv`) turns it off. Each check lives next to the
section it reads and is listed once in :data:`START_UP_CHECKS`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from verl.config.async_training import refuse_async_pools
from verl.config.base import ConfigError, check
from verl.config.megatron import refuse_megatron_not_yet
from verl.config.rollout_backends import refuse_rollout_backend, tensor_parallel_size
from verl.config.verl_extras import refuse_features

DEVICES_HERE = ("auto", "cuda", "cpu")
"""The values of ``trainer.device`` this project runs on; verl's ``npu`` (Ascend) resolves, and is
refused at start-up."""


def refuse_device(config: Any) -> None:
    """``trainer.device=npu``: verl runs on Ascend NPUs (torch_npu); this project on CUDA or CPU."""
    device = config.trainer.device
    if device not in DEVICES_HERE:
        raise ConfigError(
            f"trainer.device={device!r}: this project runs on NVIDIA GPUs (cuda) or on CPU, not on "
            f"{device.upper()} devices (Ascend with torch_npu for npu); set trainer.device=auto, cuda or cpu"
        )


def refuse_uneven_batches(config: Any) -> None:
    """The rollout's batch (``train_batch_size x rollout.n`` rows) splits evenly over the trainer's
    ranks, and each mini-batch over the actor's data-parallel ranks (the world over tensor x pipeline
    x context parallel, or over the Ulysses size, as verl's workers divide it): this project does not
    pad an uneven batch nor train uneven shards, as verl can."""
    trainer, data = config.trainer, config.data
    actor, n = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout.n
    world = trainer.n_gpus_per_node * trainer.nnodes
    if (data.train_batch_size * n) % world:
        raise ConfigError(
            f"data.train_batch_size={data.train_batch_size}: its {data.train_batch_size * n} rows (x rollout.n) "
            f"do not split evenly over the {world} ranks (trainer.n_gpus_per_node x trainer.nnodes); this "
            "project splits each batch evenly and does not pad an uneven one"
        )
    dp, shared = config.actor_data_parallel_size()
    if (actor.ppo_mini_batch_size * n) % dp:
        raise ConfigError(
            f"actor_rollout_ref.actor.ppo_mini_batch_size={actor.ppo_mini_batch_size}: its "
            f"{actor.ppo_mini_batch_size * n} rows (x rollout.n) do not split evenly over the actor's {dp} "
            f"data-parallel ranks (trainer.n_gpus_per_node x trainer.nnodes over {shared}); this project "
            "trains even shards only"
        )


def refuse_rollout_layout(config: Any) -> None:
    """An engine spans ``tensor_model_parallel_size`` consecutive ranks of the rollout's pool: the size
    divides the pool's ranks."""
    size = tensor_parallel_size(config.actor_rollout_ref.rollout)
    trainer = config.trainer
    if trainer.mode == "async":
        ranks, where = config.async_training.rollout_n_gpus * trainer.nnodes, "async_training.rollout_n_gpus"
    else:
        ranks, where = trainer.n_gpus_per_node * trainer.nnodes, "trainer.n_gpus_per_node"
    check(
        ranks % size == 0,
        "actor_rollout_ref.rollout.tensor_model_parallel_size",
        f"a divisor of the rollout's {ranks} ranks ({where} x trainer.nnodes)",
        size,
    )


START_UP_CHECKS: tuple[Callable[[Any], None], ...] = (
    refuse_device,
    refuse_rollout_backend,
    refuse_rollout_layout,
    refuse_features,
    refuse_megatron_not_yet,
    refuse_async_pools,
    refuse_uneven_batches,
)
"""Each raises a ConfigError naming the first key of its kind that this project cannot run."""


def refuse_at_start_up(config: Any) -> None:
    """Refuse, in one line naming the key, the first thing in ``config`` this project cannot run."""
    for refuse in START_UP_CHECKS:
        refuse(config)


__all__ = ["DEVICES_HERE", "START_UP_CHECKS", "refuse_at_start_up"]
