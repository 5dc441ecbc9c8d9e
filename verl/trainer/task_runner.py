"""verl's task runner (``verl.trainer.main_ppo.TaskRunner``): how a recipe's ``main_*.py`` maps roles
to worker classes and pools, builds the tokenizer, rewards and datasets, and runs the trainer.

A recipe subclasses :class:`TaskRunner` and overrides one step (``add_actor_rollout_worker`` to bring
its own worker, ``run`` to bring its own trainer class) and passes the class to
``verl.trainer.main_ppo.run_ppo(config, task_runner_class=...)``. verl runs the runner as a Ray actor
with a CPU of its own; here it runs in the driver process (a 2-core machine has no CPU to spare),
given as a plain class or as ``ray.remote(...)`` of one.
"""

from __future__ import annotations

from typing import Any

import ray
from torch.utils.data import RandomSampler, Sampler, SequentialSampler

from verl.config.ppo_trainer import PPOTrainerConfig, to_typed_config
from verl.single_controller.ray import RayWorkerGroup, ResourcePoolManager
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.trainer.ppo.reward import load_reward_manager
from verl.trainer.ppo.utils import Role, need_reference_policy
from verl.utils.dataset.rl_dataset import collate_fn
from verl.utils.dataset.rl_dataset import create_rl_dataset as _create_dataset
from verl.utils.dataset.vision import VisionProcessor, load_vision_processor
from verl.utils.fs import copy_to_local
from verl.utils.tokenizer import hf_tokenizer
from verl.workers.engine.lora import uses_lora
from verl.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker, RewardModelWorker

__all__ = ["TaskRunner", "create_rl_dataset", "create_rl_sampler"]

GLOBAL_POOL = "global_pool"
REWARD_POOL = "reward_pool"


def create_rl_dataset(
    data_paths: Any,
    data_config: Any,
    tokenizer: Any,
    processor: Any,
    is_train: bool = True,
    max_samples: int = -1,
) -> Any:
    """verl's: the dataset of ``data_paths`` (``RLHFDataset``, or ``data.custom_cls``). ``processor`` is
    the project's image processing for a vision-language model (``load_vision_processor``), or None."""
    if processor is not None and not isinstance(processor, VisionProcessor):
        raise TypeError(
            f"create_rl_dataset(processor={type(processor).__name__}): give the dataset the project's "
            "verl.utils.dataset.vision.load_vision_processor(model_path, tokenizer) (None for a text model)"
        )
    return _create_dataset(data_paths, data_config, tokenizer, max_samples, processor)


def create_rl_sampler(data_config: Any, dataset: Any) -> Sampler:
    """verl's: random order with ``data.shuffle``, else the rows in order (the trainer's loader then
    keeps its own seeded order for exact resume; see ``RayPPOTrainer(train_sampler=...)``)."""
    return RandomSampler(dataset) if data_config.shuffle else SequentialSampler(dataset)


class TaskRunner:
    """Builds what ``RayPPOTrainer`` needs from the config, then trains (verl's steps and names)."""

    def __init__(self) -> None:
        self.role_worker_mapping: dict[Role, Any] = {}
        self.mapping: dict[Role, str] = {}

    def add_actor_rollout_worker(self, config: PPOTrainerConfig) -> tuple[type, type]:
        """The policy's worker: actor, rollout (and the reference when one is needed and no separate
        reference worker is added); returns the worker class and the worker-group class."""
        self.role_worker_mapping[Role.ActorRollout] = ray.remote(ActorRolloutRefWorker)
        self.mapping[Role.ActorRollout] = GLOBAL_POOL
        return ActorRolloutRefWorker, RayWorkerGroup

    def add_critic_worker(self, config: PPOTrainerConfig) -> None:
        """Mapped always, built only when the estimator needs values (as in verl)."""
        self.role_worker_mapping[Role.Critic] = ray.remote(CriticWorker)
        self.mapping[Role.Critic] = GLOBAL_POOL

    def add_reward_model_worker(self, config: PPOTrainerConfig) -> None:
        if config.reward_model.enable:
            self.role_worker_mapping[Role.RewardModel] = ray.remote(RewardModelWorker)
            self.mapping[Role.RewardModel] = (
                REWARD_POOL if config.reward_model.enable_resource_pool else GLOBAL_POOL
            )

    def add_ref_policy_worker(self, config: PPOTrainerConfig, ref_policy_cls: type) -> None:
        """A reference worker of its own (with LoRA the reference is the actor without its adapters)."""
        if need_reference_policy(config) and not uses_lora(config.actor_rollout_ref.model):
            self.role_worker_mapping[Role.RefPolicy] = ray.remote(ref_policy_cls)
            self.mapping[Role.RefPolicy] = GLOBAL_POOL

    def init_resource_pool_mgr(self, config: PPOTrainerConfig) -> ResourcePoolManager:
        trainer, rm = config.trainer, config.reward_model
        spec = {GLOBAL_POOL: [trainer.n_gpus_per_node] * trainer.nnodes}
        if rm.enable_resource_pool:
            spec[REWARD_POOL] = [rm.n_gpus_per_node] * rm.nnodes
        return ResourcePoolManager(resource_pool_spec=spec, mapping=self.mapping)

    def run(self, config: Any) -> None:
        config = config if isinstance(config, PPOTrainerConfig) else to_typed_config(config)
        actor_rollout_cls, ray_worker_group_cls = self.add_actor_rollout_worker(config)
        self.add_critic_worker(config)
        self.add_reward_model_worker(config)
        self.add_ref_policy_worker(config, actor_rollout_cls)
        local_path = copy_to_local(config.actor_rollout_ref.model.path)
        trust_remote_code = config.data.trust_remote_code
        tokenizer = hf_tokenizer(local_path, trust_remote_code=trust_remote_code)
        processor = load_vision_processor(local_path, tokenizer)  # None for a text-only model
        data = config.data
        train_dataset = create_rl_dataset(
            data.train_files, data, tokenizer, processor, True, data.train_max_samples
        )
        val_dataset = create_rl_dataset(
            data.val_files, data, tokenizer, processor, False, data.val_max_samples
        )
        self.trainer = RayPPOTrainer(
            config=config,
            tokenizer=tokenizer,
            processor=processor,
            role_worker_mapping=self.role_worker_mapping,
            resource_pool_manager=self.init_resource_pool_mgr(config),
            ray_worker_group_cls=ray_worker_group_cls,
            reward_fn=load_reward_manager(config, tokenizer, num_examine=0),
            val_reward_fn=load_reward_manager(config, tokenizer, num_examine=1),
            train_dataset=train_dataset,
            val_dataset=val_dataset,
            collate_fn=collate_fn,
            train_sampler=create_rl_sampler(data, train_dataset),
        )
        try:
            self.trainer.init_workers()
            self.trainer.fit()
        finally:
            self.trainer.close()
