"""A DAPO-like recipe written the way verl recipes are written: a ``RayPPOTrainer`` subclass that
brings its own ``fit()``, and a ``main`` that maps roles to worker classes and pools.

It uses only verl's public names (``verl.DataProto``, ``RayPPOTrainer``, ``Role``,
``ResourcePoolManager``, ``compute_advantage``, ``compute_reward``, ``agg_loss``,
``reduce_metrics``, ``Tracking``, the fsdp workers) and the trainer's step helpers, so the same
file would drive verl. Dynamic sampling: groups whose responses all score the same carry no
signal and are dropped; batches are drawn until ``data.train_batch_size`` informative groups are
kept. ``python -m tests.recipe.verl_style_dapo`` runs it on the embedded default.
"""

from __future__ import annotations

import uuid

import numpy as np
import ray
import torch

from verl import DataProto
from verl.single_controller.ray import RayWorkerGroup, ResourcePoolManager
from verl.trainer.ppo.core_algos import agg_loss
from verl.trainer.ppo.metric_utils import compute_data_metrics
from verl.trainer.ppo.ray_trainer import RayPPOTrainer, compute_advantage, compute_response_mask
from verl.trainer.ppo.reward import compute_reward, load_reward_manager
from verl.trainer.ppo.utils import Role
from verl.utils.fs import copy_to_local
from verl.utils.metric import reduce_metrics
from verl.utils.tokenizer import hf_tokenizer
from verl.utils.tracking import Tracking
from verl.workers.fsdp_workers import ActorRolloutRefWorker


class DynamicSamplingTrainer(RayPPOTrainer):
    """PPO with DAPO's dynamic sampling, as a recipe overrides ``fit()``."""

    def fit(self) -> None:
        logger = Tracking(
            project_name=self.config.trainer.project_name,
            experiment_name=self.config.trainer.experiment_name,
            default_backend=self.config.trainer.logger,
        )
        self.global_steps = 0
        self._load_checkpoint()
        if self.val_reward_fn is not None and self.config.trainer.val_before_train:
            logger.log(data=self._validate(), step=self.global_steps)
        self.global_steps += 1
        self.kept_ratios: list[float] = []
        kept, draws = None, 0
        for _epoch in range(self.config.trainer.total_epochs):
            for batch_dict in self.train_dataloader:
                draws += 1
                new_batch = self._generate_and_score(DataProto.from_single_dict(batch_dict))
                informative = new_batch[self._informative_rows(new_batch)]
                kept = informative if kept is None else DataProto.concat([kept, informative])
                n = self.config.actor_rollout_ref.rollout.n
                if len(kept) < self.config.data.train_batch_size * n:
                    continue  # draw again: not enough groups carry a signal yet
                batch = kept[: self.config.data.train_batch_size * n]
                metrics = self._train_on(batch)
                metrics["train/num_gen_batches"] = draws
                self.kept_ratios.append(len(batch) / (draws * len(new_batch)))
                kept, draws = None, 0
                logger.log(data=metrics, step=self.global_steps)
                if self.global_steps >= self.total_training_steps:
                    return
                self.global_steps += 1

    def _generate_and_score(self, new_batch: DataProto) -> DataProto:
        n = self.config.actor_rollout_ref.rollout.n
        new_batch.non_tensor_batch["uid"] = np.array(
            [str(uuid.uuid4()) for _ in range(len(new_batch))], dtype=object
        )
        gen_batch = self._get_gen_batch(new_batch)
        gen_batch.meta_info["global_steps"] = self.global_steps
        gen_batch_output = self.actor_rollout_wg.generate_sequences(
            gen_batch.repeat(repeat_times=n, interleave=True)
        )
        gen_batch_output.meta_info.pop("metrics", None)
        new_batch = new_batch.repeat(repeat_times=n, interleave=True)
        new_batch = new_batch.union(gen_batch_output)
        if "response_mask" not in new_batch.batch.keys():
            new_batch.batch["response_mask"] = compute_response_mask(new_batch)
        reward_tensor, reward_extra_infos = compute_reward(new_batch, self.reward_fn)
        new_batch.batch["token_level_scores"] = reward_tensor
        new_batch.non_tensor_batch.update({k: np.array(v) for k, v in reward_extra_infos.items()})
        return new_batch

    @staticmethod
    def _informative_rows(batch: DataProto) -> np.ndarray:
        """Rows of the groups whose sequence rewards are not all equal."""
        scores = batch.batch["token_level_scores"].sum(-1).numpy()
        uids = batch.non_tensor_batch["uid"]
        spread = {uid: np.std(scores[uids == uid]) > 0 for uid in set(uids)}
        return np.flatnonzero([spread[uid] for uid in uids])

    def _train_on(self, batch: DataProto) -> dict[str, float]:
        metrics: dict[str, float] = {}
        self._balance_batch(batch, metrics=metrics)
        old_log_prob, _ = self._compute_old_log_prob(batch)
        actor_cfg = self.config.actor_rollout_ref.actor
        entropy = agg_loss(
            old_log_prob.batch["entropys"], batch.batch["response_mask"], actor_cfg.loss_agg_mode
        )
        metrics["actor/entropy"] = entropy.item()
        old_log_prob.batch.pop("entropys")
        batch = batch.union(old_log_prob)
        batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
        algo = self.config.algorithm
        batch = compute_advantage(
            batch,
            adv_estimator=algo.adv_estimator,
            gamma=algo.gamma,
            lam=algo.lam,
            num_repeat=self.config.actor_rollout_ref.rollout.n,
            norm_adv_by_std_in_grpo=algo.norm_adv_by_std_in_grpo,
            config=algo,
        )
        actor_output = self._update_actor(batch)
        metrics.update(reduce_metrics(actor_output.meta_info["metrics"]))
        test_freq = self.config.trainer.test_freq
        if test_freq > 0 and (
            self.global_steps % test_freq == 0 or self.global_steps == self.total_training_steps
        ):
            metrics.update(self._validate())
        save_freq = self.config.trainer.save_freq
        if save_freq > 0 and self.global_steps % save_freq == 0:
            self._save_checkpoint()
        metrics.update(compute_data_metrics(batch=batch, use_critic=self.use_critic))
        return metrics


def build_trainer(config, trainer_cls: type = DynamicSamplingTrainer) -> RayPPOTrainer:
    """What a verl recipe's ``TaskRunner.run`` does before ``init_workers()`` and ``fit()``."""
    tokenizer = hf_tokenizer(copy_to_local(config.actor_rollout_ref.model.path))
    role_worker_mapping = {Role.ActorRollout: ray.remote(ActorRolloutRefWorker)}
    resource_pool_spec = {"global_pool": [config.trainer.n_gpus_per_node] * config.trainer.nnodes}
    mapping = {Role.ActorRollout: "global_pool"}
    trainer = trainer_cls(
        config=config,
        tokenizer=tokenizer,
        role_worker_mapping=role_worker_mapping,
        resource_pool_manager=ResourcePoolManager(resource_pool_spec=resource_pool_spec, mapping=mapping),
        ray_worker_group_cls=RayWorkerGroup,
        reward_fn=load_reward_manager(config, tokenizer, num_examine=0),
        val_reward_fn=load_reward_manager(config, tokenizer, num_examine=1),
    )
    return trainer


def main() -> None:
    from verl.config.ppo_trainer import load_config

    config = load_config(["trainer.total_training_steps=16", "trainer.test_freq=4"])
    trainer = build_trainer(config)
    try:
        trainer.init_workers()
        trainer.fit()
    finally:
        trainer.close()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
