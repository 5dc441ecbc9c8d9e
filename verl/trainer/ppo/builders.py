"""Building the parts the PPO trainer drives, from the config.

Each function builds one part: the device, the tokenizer, the data loaders, the reward
functions, the worker groups (colocated on one pool: the hybrid engine), the tracker.
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import ray
import torch

from verl.config.actor import ActorRolloutRefConfig, ModelConfig
from verl.config.genrm import JUDGE_ROLLOUT_KEYS
from verl.config.ppo_trainer import PPOTrainerConfig
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, create_colocated_worker_groups
from verl.trainer.ppo.teachers import build_teacher_groups, teacher_group_names
from verl.utils.model import TokenizerSource, load_tokenizer_from, resolve_tokenizer_source
from verl.workers.rollout.client import RolloutClient, WorkerGroupClient

logger = logging.getLogger(__name__)


def init_ray(config: PPOTrainerConfig) -> None:
    if ray.is_initialized():
        return
    # Ray lowers worker priority (niceness 15) by default; here the workers do the heavy
    # compute while the driver mostly waits, so keep them at normal priority.
    os.environ.setdefault("RAY_worker_niceness", "0")
    pythonpath = os.pathsep.join(p for p in [os.getcwd(), os.environ.get("PYTHONPATH", "")] if p)
    env = {"TOKENIZERS_PARALLELISM": "true", "NCCL_DEBUG": "WARN", "PYTHONPATH": pythonpath}
    for key in ("VERL_CACHE_DIR", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if key in os.environ:
            env[key] = os.environ[key]
    ray.init(
        address=config.ray_init.address,
        num_cpus=config.ray_init.num_cpus,
        include_dashboard=False,
        runtime_env={"env_vars": env},
    )


def write_ray_timeline(config: PPOTrainerConfig) -> None:
    """``ray_init.timeline_json_file``: Ray's task timeline (chrome://tracing format), at the end."""
    path = config.ray_init.timeline_json_file
    if not path or not ray.is_initialized():
        return
    path = os.path.abspath(os.path.expanduser(path))
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        ray.timeline(filename=path)
    except OSError as error:  # written at the very end: a failure must not hide the run's result
        logger.warning("ray_init.timeline_json_file=%s: could not write the Ray timeline (%s)", path, error)
        return
    logger.info("wrote the Ray timeline to %s", path)


def resolve_device(config: PPOTrainerConfig) -> str:
    """``trainer.device``: ``auto`` is cuda when the Ray cluster (or this machine) has GPUs."""
    if config.trainer.device != "auto":
        return config.trainer.device
    gpus = ray.cluster_resources().get("GPU", 0) if ray.is_initialized() else torch.cuda.device_count()
    return "cuda" if gpus > 0 else "cpu"


def tokenizer_source(config: PPOTrainerConfig) -> TokenizerSource:
    """The policy's tokenizer settings; the driver and the policy workers both load from these."""
    data = config.data
    return resolve_tokenizer_source(config.actor_rollout_ref.model, data.tokenizer, data.trust_remote_code)


def build_tokenizer(config: PPOTrainerConfig):
    return load_tokenizer_from(tokenizer_source(config))


def total_training_steps(config: PPOTrainerConfig, steps_per_epoch: int) -> int:
    if config.trainer.total_training_steps is not None:
        return config.trainer.total_training_steps
    return steps_per_epoch * config.trainer.total_epochs


def set_total_steps(config: PPOTrainerConfig, total: int) -> None:
    """The LR schedules need the run length; verl injects it the same way."""
    config.actor_rollout_ref.actor.optim.total_training_steps = total
    config.critic.optim.total_training_steps = total


def build_worker_groups(
    config: PPOTrainerConfig, device: str
) -> tuple[dict[str, Any], list[RayResourcePool]]:
    """One pool of ``nnodes x n_gpus_per_node`` processes holding actor+rollout(+ref)(+critic)
    (+the reward model, unless it has a pool of its own)."""
    trainer = config.trainer
    global_pool = pool(
        [trainer.n_gpus_per_node] * trainer.nnodes,
        device,
        "global_pool",
        trainer.cpus_per_worker,
        "trainer.n_gpus_per_node",
    )
    role = "actor_rollout_ref" if config.use_reference else "actor_rollout"
    class_dict = {"actor_rollout": policy_worker(config, role)}
    if config.use_critic:
        class_dict["critic"] = critic_worker(config)
    if config.reward_model.enable and not config.reward_model.enable_resource_pool:
        class_dict["reward_model"] = reward_model_worker(config)
    groups: dict[str, Any] = {}
    pools = [global_pool]
    with released_on_failure(pools, groups):
        groups.update(
            create_colocated_worker_groups(
                global_pool,
                class_dict,
                call_timeout_s=trainer.worker_call_timeout_s,
                setup_timeout_s=trainer.ray_wait_register_center_timeout,
            )
        )
        groups.update(_reward_model_pool_groups(config, device, pools))
        groups.update(build_teacher_groups(config, device, pools, tokenizer_source(config)))
        for name in ("reward_model", "critic", "actor_rollout", *teacher_group_names(groups)):
            if name in groups:
                groups[name].init_model()
    return groups, pools


def pool(
    process_on_nodes: list[int], device: str, name: str, cpus_per_process: float, size_key: str
) -> RayResourcePool:
    """A pool of ``process_on_nodes[i]`` processes on node ``i``: GPU bundles on cuda, else CPU ones."""
    return RayResourcePool(
        list(process_on_nodes),
        use_gpu=device == "cuda",
        name_prefix=name,
        cpus_per_process=cpus_per_process,
        size_key=size_key,
    )


def _reward_model_pool_groups(config: PPOTrainerConfig, device: str, pools: list[RayResourcePool]) -> dict:
    """``reward_model.enable_resource_pool``: the reward model on a pool of its own
    (``reward_model.nnodes x n_gpus_per_node`` processes; appended to ``pools``)."""
    rm = config.reward_model
    if not (rm.enable and rm.enable_resource_pool):
        return {}
    trainer = config.trainer
    rm_pool = pool(
        [rm.n_gpus_per_node] * rm.nnodes,
        device,
        "reward_model_pool",
        trainer.cpus_per_worker,
        "reward_model.n_gpus_per_node",
    )
    pools.append(rm_pool)
    return create_colocated_worker_groups(
        rm_pool,
        {"reward_model": reward_model_worker(config)},
        call_timeout_s=trainer.worker_call_timeout_s,
        setup_timeout_s=trainer.ray_wait_register_center_timeout,
    )


def reward_model_worker(config: PPOTrainerConfig, cls: type | None = None) -> RayClassWithInitArgs:
    """A discriminative reward model (a scoring worker), or with ``reward_model.rollout.name`` a
    generative one: the judge model served by a rollout engine, like the policy in server mode.
    ``cls``: a recipe's worker class (verl's ``role_worker_mapping``) instead of the project's."""
    if config.uses_judge:
        from verl.workers.actor_rollout_ref import ActorRolloutRefWorker

        rm = config.reward_model
        source = TokenizerSource(
            path=rm.model.path, trust_remote_code=rm.model.trust_remote_code, key="reward_model.model.path"
        )
        return RayClassWithInitArgs(
            cls or ActorRolloutRefWorker, judge_config(config), role="rollout", tokenizer=source
        )
    from verl.workers.reward_model import RewardModelWorker

    return RayClassWithInitArgs(
        cls or RewardModelWorker,
        config.reward_model,
        policy_tokenizer=tokenizer_source(config),
        nccl_timeout_s=config.actor_rollout_ref.nccl_timeout,
    )


def judge_config(config: PPOTrainerConfig) -> ActorRolloutRefConfig:
    """The generative reward model as a rollout-only config: the model of ``reward_model.model``,
    the engine and sampling of ``reward_model.rollout`` (``JUDGE_ROLLOUT_KEYS``), always served
    (``mode=async``: custom reward functions send it chat requests over HTTP)."""
    rm = config.reward_model
    judge = copy.deepcopy(config.actor_rollout_ref)
    judge.model = ModelConfig(
        path=rm.model.path,
        trust_remote_code=rm.model.trust_remote_code,
        external_lib=rm.model.external_lib,
        override_config=dict(rm.model.override_config),
    )
    for key in JUDGE_ROLLOUT_KEYS:
        setattr(judge.rollout, key, getattr(rm.rollout, key))
    judge.rollout.mode = "async"
    judge.rollout.multi_turn.enable = False
    return judge


def critic_worker(config: PPOTrainerConfig, cls: type | None = None) -> RayClassWithInitArgs:
    from verl.workers.critic import CriticWorker

    return RayClassWithInitArgs(
        cls or CriticWorker, config.critic, nccl_timeout_s=config.actor_rollout_ref.nccl_timeout
    )


def policy_worker(config: PPOTrainerConfig, role: str, cls: type | None = None) -> RayClassWithInitArgs:
    from verl.workers.actor_rollout_ref import ActorRolloutRefWorker

    distill = config.distillation
    return RayClassWithInitArgs(
        cls or ActorRolloutRefWorker,
        config.actor_rollout_ref,
        role=role,
        tokenizer=tokenizer_source(config),
        distillation=distill.distillation_loss if distill.enabled and "actor" in role else None,
    )


@contextmanager
def released_on_failure(pools: list[RayResourcePool], groups: dict[str, Any]) -> Iterator[None]:
    """On a failure while the worker groups are built, shut down the groups made so far and
    release the pools, then re-raise. The trainer only learns of them once the builder
    returns, so it could not: a restart (``trainer.max_restarts``) would wait for bundles
    that nothing frees."""
    try:
        yield
    except BaseException:
        for group in groups.values():  # colocated groups share processes: killing twice is a no-op
            _quietly(group.shutdown, f"shutting down the {group.role!r} workers")
        for pool in pools:
            _quietly(pool.release, f"releasing resource pool {pool.name_prefix!r}")
        raise


def _quietly(cleanup: Any, what: str) -> None:
    """Run ``cleanup``; an error in it is logged, so it cannot hide the failure being raised."""
    try:
        cleanup()
    except Exception as error:
        logger.warning("after a failed worker set-up, %s failed too: %s", what, error)


def build_async_worker_groups(
    config: PPOTrainerConfig, device: str
) -> tuple[dict[str, Any], list[RayResourcePool]]:
    """Split placement for the async trainer: the actor (+ref, +critic) on a ``trainer_pool`` of
    ``nnodes x n_gpus_per_node`` processes; the rollout on its own ``rollout_pool`` of
    ``nnodes x async_training.rollout_n_gpus`` processes, which take a weight update while they
    generate (two calls at a time per process)."""
    trainer = config.trainer
    pools = []
    groups: dict[str, Any] = {}
    async_cfg = config.async_training
    rollout_cpus = async_cfg.rollout_cpus_per_worker or trainer.cpus_per_worker
    layouts = {
        "trainer_pool": (trainer.n_gpus_per_node, 1, trainer.cpus_per_worker, "trainer.n_gpus_per_node"),
        "rollout_pool": (
            async_cfg.rollout_n_gpus,
            _rollout_concurrency(config),
            rollout_cpus,
            "rollout.n_gpus_per_node (async_training.rollout_n_gpus)",
        ),
    }
    with released_on_failure(pools, groups):
        for name, (per_node, concurrency, cpus, size_key) in layouts.items():
            split_pool = pool([per_node] * trainer.nnodes, device, name, cpus, size_key)
            pools.append(split_pool)
            groups.update(
                create_colocated_worker_groups(
                    split_pool,
                    _async_class_dict(config, name),
                    call_timeout_s=trainer.worker_call_timeout_s,
                    max_concurrency=concurrency,
                    setup_timeout_s=trainer.ray_wait_register_center_timeout,
                )
            )
        groups.update(_reward_model_pool_groups(config, device, pools))
        groups.update(build_teacher_groups(config, device, pools, tokenizer_source(config)))
        for name in ("reward_model", "critic", "actor", "rollout", *teacher_group_names(groups)):
            if name in groups:
                groups[name].init_model()
    return groups, pools


def _rollout_concurrency(config: PPOTrainerConfig) -> int:
    """Calls at a time per rollout process: the generations the window lets queue, plus a thread
    free for the weight update."""
    return config.async_training.window_batches + 1


def restart_rollout_group(
    config: PPOTrainerConfig, groups: dict[str, Any], pools: list[RayResourcePool]
) -> Any:
    """The async trainer's rollout pool after one of its processes died: every process of the old
    group ended, new ones started on the same placement with the model loaded (``groups["rollout"]``
    replaced); the caller sends them the weights."""
    groups["rollout"].shutdown()
    rollout_pool = next(p for p in pools if p.name_prefix == "rollout_pool")
    trainer = config.trainer
    created = create_colocated_worker_groups(
        rollout_pool,
        _async_class_dict(config, "rollout_pool"),
        call_timeout_s=trainer.worker_call_timeout_s,
        max_concurrency=_rollout_concurrency(config),
        setup_timeout_s=trainer.ray_wait_register_center_timeout,
    )
    created["rollout"].init_model()
    groups["rollout"] = created["rollout"]
    return created["rollout"]


def _async_class_dict(config: PPOTrainerConfig, pool_name: str) -> dict[str, RayClassWithInitArgs]:
    """The roles of one pool of the async trainer: actor (+ref, +critic), or the rollout."""
    if pool_name == "rollout_pool":
        return {"rollout": policy_worker(config, "rollout")}
    role = "actor_ref" if config.use_reference else "actor"
    class_dict = {"actor": policy_worker(config, role)}
    if config.use_critic:
        class_dict["critic"] = critic_worker(config)
    if config.reward_model.enable and not config.reward_model.enable_resource_pool:
        class_dict["reward_model"] = reward_model_worker(config)
    return class_dict


def build_rollout_client(config: PPOTrainerConfig, rollout_wg: Any, tokenizer) -> RolloutClient:
    """What generates a batch: the rollout worker group (``rollout.mode=sync``, one batched call
    per step), or a client of the servers its ranks run (``async``, one request per sample or one
    agent loop per row)."""
    rollout = config.actor_rollout_ref.rollout
    if rollout.mode == "sync":
        return WorkerGroupClient(rollout_wg)
    if rollout.uses_agent_loop:  # one agent loop per row (multi-turn, tools, custom loops)
        from verl.experimental.agent_loop.manager import AgentLoopManager

        return AgentLoopManager(config, server_addresses(rollout_wg), tokenizer)
    from verl.utils.model import eos_token_ids
    from verl.workers.rollout.server_client import ServerRolloutClient

    eos = eos_token_ids(tokenizer, config.actor_rollout_ref.model.path)
    return ServerRolloutClient(server_addresses(rollout_wg), rollout, tokenizer.pad_token_id, eos)


def server_addresses(rollout_wg: Any) -> list[str]:
    """One address per engine: the ranks of a tensor-parallel engine but its first front none."""
    return [address for address in rollout_wg.server_address() if address is not None]


def build_tracker(config: PPOTrainerConfig):
    from verl.utils.tracking import Tracking

    trainer = config.trainer
    return Tracking(trainer.project_name, trainer.experiment_name, list(trainer.logger), config=config)
