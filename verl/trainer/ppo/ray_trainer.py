"""The synchronous PPO/GRPO dataflow, driven from one process (the single controller).

One training step, in the order of the algorithm box::

    batch  <- next prompts, each repeated rollout.n times with a shared uid
    gen            responses <- rollout(prompts)                       (worker group)
    reward         token_level_scores <- reward_fn(responses)          (driver, process pool)
    old_log_prob   old_log_probs <- actor(responses)                   (worker group)
    ref            ref_log_prob <- reference(responses)                (if KL is used)
    teacher        teacher_log_probs <- teachers(responses)            (if distilling)
    values         values <- critic(responses)                         (if GAE)
    adv            token_level_rewards, advantages, returns            (driver, pure functions)
    update_critic  critic PPO epochs                                   (if GAE)
    update_actor   actor PPO epochs                                    (after critic_warmup)
    update_weights actor -> rollout weights as version v+1, verified   (after an actor update)

Each phase is one short method below, timed under its name (``timing_s/<phase>``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig

from verl.algorithms.advantages import compute_advantage, compute_advantage_for, compute_response_mask
from verl.algorithms.kl import apply_kl_penalty, get_kl_controller
from verl.config.ppo_trainer import PPOTrainerConfig, to_typed_config
from verl.protocol import DataProto
from verl.single_controller.ray import RayWorkerGroup, ResourcePoolManager
from verl.trainer.ppo import builders, checkpoint, generation_dump
from verl.trainer.ppo.dataloaders import build_dataloaders
from verl.trainer.ppo.generations import Draw
from verl.trainer.ppo.metric_utils import (
    compute_data_metrics,
    compute_throughput_metrics,
    compute_timing_metrics,
)
from verl.trainer.ppo.old_log_probs import rollout_trainer_gap, update_is_on_policy
from verl.trainer.ppo.phases import PHASES, timed
from verl.trainer.ppo.prompts import PROMPT_KEYS, attach_responses, pop_prompts, repeat_prompts
from verl.trainer.ppo.recipe_surface import (
    RolloutWeights,
    check_data_sources,
    refuse_unsupported_arguments,
)
from verl.trainer.ppo.reward_model import ModelScoredReward
from verl.trainer.ppo.role_mapping import build_mapped_worker_groups
from verl.trainer.ppo.teachers import Teachers
from verl.trainer.ppo.utils import Role, need_critic, need_reference_policy
from verl.trainer.ppo.validation import Validator
from verl.trainer.ppo.watchdog import StepWatchdog
from verl.utils.metric import reduce_metrics
from verl.utils.progress import StepProgress
from verl.workers.engine.lora import uses_lora
from verl.workers.engine.micro_batch import equal_size_partitions
from verl.workers.reward_manager.loader import load_reward_manager
from verl.workers.rollout.client import RolloutClient
from verl.workers.vision import image_columns

logger = logging.getLogger(__name__)

__all__ = [
    "RayPPOTrainer",
    "ResourcePoolManager",
    "Role",
    "apply_kl_penalty",
    "compute_advantage",
    "compute_response_mask",
]


class RayPPOTrainer:
    """Holds the data, the reward functions and the worker groups; ``fit()`` runs the loop.

    Built from the config alone (``RayPPOTrainer(config)``: the parts come from the config), or as a
    verl recipe builds it: ``RayPPOTrainer(config, tokenizer, role_worker_mapping,
    resource_pool_manager, reward_fn=..., val_reward_fn=...)``, with ``config`` a typed config or
    Hydra's ``DictConfig``. A recipe that overrides :meth:`fit` finds verl's attributes
    (``actor_rollout_wg``, ``ref_policy_wg``, ``critic_wg``, ``train_dataloader``, ``global_steps``,
    ``use_critic``, ...) and step helpers (``_compute_old_log_prob``, ``_update_actor``,
    ``_balance_batch``, ``_validate``, ``_save_checkpoint``, ...) with verl's meanings.
    """

    def __init__(
        self,
        config: PPOTrainerConfig | DictConfig,
        tokenizer: Any = None,
        role_worker_mapping: dict[Role, Any] | None = None,
        resource_pool_manager: Any = None,
        ray_worker_group_cls: type = RayWorkerGroup,
        processor: Any = None,
        reward_fn: Any = None,
        val_reward_fn: Any = None,
        train_dataset: Any = None,
        val_dataset: Any = None,
        collate_fn: Any = None,
        train_sampler: Any = None,
        device_name: str | None = None,
    ) -> None:
        if (role_worker_mapping is None) != (resource_pool_manager is None):
            raise ValueError(
                "role_worker_mapping and resource_pool_manager go together: give both or neither"
            )
        config = config if isinstance(config, PPOTrainerConfig) else to_typed_config(config)
        refuse_unsupported_arguments(ray_worker_group_cls, train_sampler, config.data.shuffle)
        self.config = config
        # workers may run in another directory (or on another node): they get absolute paths
        config.trainer.default_local_dir = os.path.abspath(
            os.path.expanduser(config.trainer.default_local_dir)
        )
        self.role_worker_mapping = role_worker_mapping
        self.resource_pool_manager = resource_pool_manager
        self.ray_worker_group_cls = ray_worker_group_cls
        self.device = self.device_name = device_name or builders.resolve_device(config)
        self.tokenizer = tokenizer if tokenizer is not None else builders.build_tokenizer(config)
        self.processor = processor
        self.data = build_dataloaders(config, self.tokenizer, train_dataset, val_dataset, collate_fn)
        self.train_dataloader, self.val_dataloader = self.data.train, self.data.val
        self.total_training_steps = builders.total_training_steps(config, len(self.data.train))
        builders.set_total_steps(config, self.total_training_steps)
        self.reward_fn = reward_fn or load_reward_manager(config, self.tokenizer, num_examine=0)
        self.val_reward_fn = val_reward_fn or load_reward_manager(config, self.tokenizer, num_examine=1)
        if not config.reward_model.enable:  # with a reward model, rule scorers are not needed
            check_data_sources(self.reward_fn, self.data.train.dataset)
            check_data_sources(self.val_reward_fn, self.data.val_dataset)
        self.tracker = builders.build_tracker(config)
        self.kl_ctrl = self.kl_ctrl_in_reward = get_kl_controller(config.algorithm.kl_ctrl)
        self.update_is_on_policy = update_is_on_policy(config)
        # verl's names for what the config asks for
        self.hybrid_engine = True
        self.use_critic = need_critic(config)
        self.use_reference_policy = need_reference_policy(config)
        self.use_rm = config.reward_model.enable
        self.ref_in_actor = uses_lora(config.actor_rollout_ref.model)
        self.async_rollout_mode = config.actor_rollout_ref.rollout.mode == "async"
        self.global_steps = 0
        self.policy_version = 0  # the weight version the rollout runs; the driver owns the counter
        self.epoch = 0
        self.nan_steps = {"consecutive": 0, "total": 0}
        self.wgs: dict = {}
        self.pools: list = []
        self.rollout_client: RolloutClient | None = None  # built with the worker groups
        self.teachers: Teachers | None = None  # distillation.enabled: built with the worker groups

    # ------------------------------------------------------------------ setup and teardown
    def init_workers(self) -> None:
        if self.role_worker_mapping is None:
            self.wgs, self.pools = builders.build_worker_groups(self.config, self.device)
        else:
            self.wgs, self.pools = build_mapped_worker_groups(
                self.config, self.device, self.role_worker_mapping, self.resource_pool_manager
            )
        self.actor_rollout_wg = self.wgs["actor_rollout"]
        self.critic_wg = self.wgs.get("critic")
        self.ref_policy_wg = self.wgs.get("ref", self.actor_rollout_wg) if self.use_reference_policy else None
        self.rm_wg = self.wgs.get("reward_model")
        self.teachers = Teachers.from_worker_groups(self.wgs, self.config.distillation.teacher_key)
        self.use_reward_model_scores()
        self.world_size = self.actor_rollout_wg.world_size
        self.rollout_client = builders.build_rollout_client(
            self.config, self.actor_rollout_wg, self.tokenizer
        )
        self.async_rollout_manager = self.rollout_client  # verl's name for what generates a batch
        self.checkpoint_manager = RolloutWeights(self)
        self.validator = Validator(
            self.config,
            self.tokenizer,
            self.rollout_client,
            self.val_reward_fn,
            self.tracker,
            self.data.val,
        )

    def use_reward_model_scores(self) -> None:
        """With a score-head reward model, every reward (training, validation, baselines) is scored
        by its worker group first; with a generative one, scorer calls get a judge server's address."""
        rm_wg = self.wgs.get("reward_model")
        if rm_wg is None:
            return
        if self.config.uses_judge:  # a judge: the custom function asks its servers
            addresses = list(rm_wg.server_address())
            self.reward_fn.judge_addresses = self.val_reward_fn.judge_addresses = addresses
            return
        self.reward_fn = ModelScoredReward(self.reward_fn, rm_wg)
        self.val_reward_fn = ModelScoredReward(self.val_reward_fn, rm_wg)

    def close(self) -> None:
        if self.rollout_client is not None:
            self.rollout_client.close()
        for fn in (self.reward_fn, self.val_reward_fn):
            if hasattr(fn, "close"):  # a recipe's reward function may hold nothing to release
                fn.close()
        for group in self.wgs.values():  # colocated groups share processes; killing twice is a no-op
            group.shutdown()
        for pool in self.pools:
            pool.release()
        self.tracker.finish()

    # ------------------------------------------------------------------ the loop
    def fit(self) -> dict[str, float]:
        """Train for ``total_training_steps``; returns the last step's metrics."""
        trainer = self.config.trainer
        self.batches = self._batches()
        resumed = self._load_checkpoint()
        if (trainer.val_before_train and not resumed) or trainer.val_only:
            self.tracker.log(self.validator.run(self.global_steps), step=self.global_steps)
        if trainer.val_only:
            return {}
        metrics: dict[str, float] = {}
        watchdog = StepWatchdog(trainer.step_timeout_s, self.wgs, self._position)
        with StepProgress(self.total_training_steps, initial_step=self.global_steps) as progress, watchdog:
            while self.global_steps < self.total_training_steps:
                self.global_steps += 1
                metrics = self.train_step(next(self.batches))
                metrics.update(self._check_nan_updates(metrics))
                metrics.update(self._maybe_validate())
                metrics.update(self._maybe_save_checkpoint())
                metrics.update({"training/global_step": self.global_steps, "training/epoch": self.epoch})
                self.tracker.log(metrics, step=self.global_steps)
                progress.update(metrics)
                watchdog.step_done()
        logger.info(self.validator.summary())
        return metrics

    def _position(self) -> str:
        return f"step {self.global_steps}, phase {' > '.join(PHASES) or 'between phases'}"

    def _batches(self) -> Iterator[Draw]:
        """The rollout source: the loader's batches, each the draw of the step about to run (its
        responses are generated in the rollout phase)."""
        return (Draw(self.global_steps, batch) for batch in self._prompt_batches())

    def _prompt_batches(self) -> Iterator[DataProto]:
        while True:
            for batch_dict in self.data.train:
                self.epoch = self.data.train.epoch
                yield DataProto.from_single_dict(batch_dict)

    def next_draw(self, draw: int) -> Draw:
        """A step's ``draw``-th draw (``draw`` >= 2), for a recipe that draws more than once per step
        (DAPO's dynamic sampling): the next batch, seeded apart from the step's first draw and from
        the other steps'."""
        nxt = next(self.batches)
        nxt.batch.meta_info["sampling_seed"] = self.global_steps + 1_000_000 * (draw - 1)
        return nxt

    def train_step(self, draw: Draw) -> dict[str, float]:
        timing: dict[str, float] = {}
        metrics: dict[str, float] = {}
        with timed("step", timing):
            batch = self.rollout_phase(draw, metrics, timing)
            generation_dump.dump_rollouts(
                batch, self.tokenizer, self.config.trainer.rollout_data_dir, self.global_steps
            )
            if self.config.trainer.balance_batch:
                self._balance_batch(batch, metrics)
            # bypass: the rollout's log-probs; on-policy: the update's own forward (ratio 1)
            if not (self.config.algorithm.rollout_correction.bypass_mode or self.update_is_on_policy):
                with timed("old_log_prob", timing):
                    self._old_log_prob_phase(batch, metrics)
            if self.use_reference_policy:
                with timed("ref", timing):
                    batch.union(self._compute_ref_log_prob(batch))
            if self.teachers is not None:
                with timed("teacher", timing):
                    batch.union(self.teachers.score(batch))
            if self.use_critic:
                with timed("values", timing):
                    batch.union(self._compute_values(batch))
            with timed("adv", timing):
                self._compute_advantage(batch, metrics)
            if self.use_critic:
                with timed("update_critic", timing):
                    metrics.update(reduce_metrics(self._update_critic(batch).meta_info["metrics"]))
            if self.global_steps > self.config.trainer.critic_warmup:
                with timed("update_actor", timing):
                    metrics.update(reduce_metrics(self._update_actor(batch).meta_info["metrics"]))
                with timed("update_weights", timing):
                    metrics.update(self.sync_weights())
        metrics.update(compute_data_metrics(batch, use_critic=self.use_critic))
        metrics.update(compute_timing_metrics(batch, timing))
        metrics.update(compute_throughput_metrics(batch, timing, self.world_size))
        return metrics

    # ------------------------------------------------------------------ phases
    def rollout_phase(self, draw: Draw, metrics: dict[str, float], timing: dict[str, float]) -> DataProto:
        """A draw in, scored responses out: its responses (:meth:`_generated`), then the reward. Recipes
        override this (e.g. DAPO keeps drawing (``next_draw``) until enough groups carry signal)."""
        batch = self._generated(draw, metrics, timing)
        with timed("reward", timing):
            self._compute_reward(batch, metrics)
        return batch

    def _generated(self, draw: Draw, metrics: dict[str, float], timing: dict[str, float]) -> DataProto:
        """The draw's prompts, repeated rollout.n times, with their responses generated now."""
        batch = draw.batch
        if self.config.algorithm.adv_estimator == "remax":
            with timed("gen_max", timing):
                self._reward_baselines(batch)
        batch = self._repeat_prompts(batch)
        with timed("gen", timing):
            return self._generate(batch, metrics)

    def sync_weights(self) -> dict[str, float]:
        """After an actor update, the colocated rollout takes the actor's weights as the next
        ``policy_version`` (each rank checks its engine with a probe; rank 0's timings are reported)."""
        self.policy_version += 1
        return self.actor_rollout_wg.update_weights(self.policy_version)[0]

    def _reward_baselines(self, batch: DataProto) -> None:
        """ReMax: the reward of one greedy response per prompt is that prompt's baseline."""
        prompts = batch.select(
            batch_keys=PROMPT_KEYS, non_tensor_batch_keys=image_columns(batch.non_tensor_batch)
        )
        prompts.meta_info.update(global_steps=self.global_steps, do_sample=False)
        greedy = self.rollout_client.generate_sequences(prompts)
        greedy.meta_info.pop("metrics", None)
        scored = batch.select(batch_keys=[]).union(greedy)
        batch.batch["reward_baselines"] = self.reward_fn(scored, return_dict=True)["reward_tensor"].sum(-1)

    def _repeat_prompts(self, batch: DataProto) -> DataProto:
        """Give each prompt a uid (deterministic: step and row) and repeat it rollout.n times."""
        return repeat_prompts(batch, str(self.global_steps), self.config.actor_rollout_ref.rollout.n)

    def _generate(self, batch: DataProto, metrics: dict[str, float]) -> DataProto:
        prompts = pop_prompts(batch, self.config.actor_rollout_ref.rollout.uses_agent_loop)
        # seeded by step (unless the caller chose): the same step samples the same tokens,
        # however it was reached (a resume, or an async batch regenerated after one)
        seed = batch.meta_info.pop("sampling_seed", self.global_steps)
        prompts.meta_info.update(global_steps=self.global_steps, do_sample=True, sampling_seed=seed)
        metrics.update(attach_responses(batch, self.rollout_client.generate_sequences(prompts)))
        batch.meta_info["temperature"] = self.config.actor_rollout_ref.rollout.temperature
        return batch

    def _balance_batch(
        self,
        batch: DataProto,
        metrics: dict[str, float] | None = None,
        logging_prefix: str = "global_seqlen",
        keep_minibatch: bool = False,
    ) -> None:
        """Reorder rows in place so each data-parallel rank gets a similar number of tokens (verl's
        helper; ``trainer.balance_batch`` decides whether the loop calls it). One rank keeps the order."""
        if keep_minibatch:
            raise NotImplementedError(
                "_balance_batch(keep_minibatch=True) is not supported; balance whole batches"
            )
        if self.world_size == 1:
            return
        lengths = batch.batch["attention_mask"].sum(-1).tolist()
        parts = equal_size_partitions(lengths, self.world_size)
        batch.reorder(torch.as_tensor(np.concatenate(parts)))
        if metrics is not None:
            tokens = [sum(lengths[i] for i in part) for part in parts]
            metrics.update({f"{logging_prefix}/min": min(tokens), f"{logging_prefix}/max": max(tokens)})

    def _compute_reward(self, batch: DataProto, metrics: dict[str, float]) -> None:
        result = self.reward_fn(batch, return_dict=True)
        batch.batch["token_level_scores"] = result["reward_tensor"]
        for key, values in result.get("reward_extra_info", {}).items():
            if len(values) == len(batch):
                batch.non_tensor_batch[key] = np.array(values, dtype=object)
        metrics.update(result.get("reward_metrics", {}))

    def _old_log_prob_phase(self, batch: DataProto, metrics: dict[str, float]) -> None:
        """``old_log_probs`` into ``batch``; the entropy and the rollout/trainer gap into ``metrics``."""
        out, _ = self._compute_old_log_prob(batch)
        entropys = out.batch.pop("entropys")
        mask = batch.batch["response_mask"].bool()
        metrics["actor/entropy"] = float(entropys[mask].mean()) if mask.any() else 0.0
        batch.union(out)
        if "rollout_log_probs" in batch.batch.keys():
            metrics.update(
                rollout_trainer_gap(batch.batch["rollout_log_probs"], batch.batch["old_log_probs"], mask)
            )

    # ------------------------------------------------------------------ verl's step helpers
    def _get_gen_batch(self, batch: DataProto) -> DataProto:
        """The prompts to generate from, popped from ``batch`` (with its row columns for agent loops)."""
        return pop_prompts(batch, self.config.actor_rollout_ref.rollout.uses_agent_loop)

    def _compute_old_log_prob(self, batch: DataProto) -> tuple[DataProto, float]:
        """``old_log_probs`` and ``entropys`` under the current actor, and the pass's MFU (not measured
        here: 0.0, as verl's legacy workers report)."""
        return self.actor_rollout_wg.compute_log_prob(batch), 0.0

    def _compute_ref_log_prob(self, batch: DataProto) -> DataProto:
        return self.ref_policy_wg.compute_ref_log_prob(batch)

    def _compute_values(self, batch: DataProto) -> DataProto:
        return self.critic_wg.compute_values(batch)

    def _update_actor(self, batch: DataProto) -> DataProto:
        """PPO epochs on the actor; its metrics in ``meta_info["metrics"]`` (one list entry per rank)."""
        batch.meta_info.setdefault("temperature", self.config.actor_rollout_ref.rollout.temperature)
        return self.actor_rollout_wg.update_actor(batch)

    def _update_critic(self, batch: DataProto) -> DataProto:
        return self.critic_wg.update_critic(batch)

    def _validate(self) -> dict[str, float]:
        """Generate for the validation set and score it; the metrics (``val-core/...``)."""
        return self.validator.run(self.global_steps)

    def _save_checkpoint(self) -> str:
        return self.save_checkpoint()

    def _compute_advantage(self, batch: DataProto, metrics: dict[str, float]) -> None:
        algo = self.config.algorithm
        if algo.use_kl_in_reward:
            _, kl_metrics = apply_kl_penalty(batch, self.kl_ctrl, algo.kl_penalty)
            metrics.update(kl_metrics)
        else:
            batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
        compute_advantage_for(batch, algo)
        metrics.update(batch.meta_info.pop("rollout_corr_metrics", {}))

    def _maybe_validate(self) -> dict[str, float]:
        """verl's rule: every ``test_freq`` steps and after the last one; never with ``test_freq <= 0``."""
        freq = self.config.trainer.test_freq
        last = self.global_steps == self.total_training_steps
        if freq > 0 and (self.global_steps % freq == 0 or last):
            with timed("testing", timing := {}):
                metrics = self.validator.run(self.global_steps)
            metrics["timing_s/testing"] = timing["testing"]
            return metrics
        return {}

    # ------------------------------------------------------------------ failures
    def _check_nan_updates(self, metrics: dict[str, float]) -> dict[str, float]:
        """Count steps whose update was skipped for a non-finite loss or gradient norm."""
        skipped = any(metrics.get(f"{role}/update_skipped", 0) > 0 for role in ("actor", "critic"))
        self.nan_steps["consecutive"] = self.nan_steps["consecutive"] + 1 if skipped else 0
        self.nan_steps["total"] += int(skipped)
        limit = self.config.trainer.max_consecutive_nan_steps
        if skipped:
            logger.warning(
                "step %d: non-finite loss or gradient norm, update skipped (%d in a row, limit %d)",
                self.global_steps,
                self.nan_steps["consecutive"],
                limit,
            )
        if self.nan_steps["consecutive"] >= limit:
            raise RuntimeError(
                f"{limit} steps in a row (up to step {self.global_steps}) had a non-finite loss or "
                f"gradient norm and were skipped (trainer.max_consecutive_nan_steps={limit}); check the "
                "rewards, the learning rate and the data of these steps"
            )
        return {"training/nan_skipped_steps": self.nan_steps["total"]}

    # ------------------------------------------------------------------ checkpoints
    def _maybe_save_checkpoint(self) -> dict[str, float]:
        freq = self.config.trainer.save_freq
        last = self.global_steps == self.total_training_steps
        if freq > 0 and (self.global_steps % freq == 0 or last):
            with timed("save_checkpoint", timing := {}):
                self.save_checkpoint()
            return {"timing_s/save_checkpoint": timing["save_checkpoint"]}
        return {}

    def checkpointer(self) -> checkpoint.Checkpointer:
        trainer = self.config.trainer
        keep = {"actor": trainer.max_actor_ckpt_to_keep, "critic": trainer.max_critic_ckpt_to_keep}
        return checkpoint.Checkpointer.for_run(trainer, self.world_size, keep)

    def save_checkpoint(self) -> str:
        """``global_step_N/{actor,critic,driver.pt}``, then the pointer (the commit), then rotation."""

        def write_parts(folder: str) -> None:
            self.actor_rollout_wg.save_checkpoint(os.path.join(folder, "actor"))
            if self.critic_wg is not None:
                self.critic_wg.save_checkpoint(os.path.join(folder, "critic"))

        return self.checkpointer().save(self.global_steps, write_parts, self._driver_state())

    def _driver_state(self) -> dict:
        return {
            "policy_version": self.policy_version,
            "dataloader": self.data.train.state_dict(),
            "kl_ctrl": self.kl_ctrl.state_dict(),
            "nan_steps": dict(self.nan_steps),
            "validation_history": list(self.validator.history),
        }

    def _load_checkpoint(self) -> bool:
        """Resume as ``trainer.resume_mode`` says; True when a checkpoint was loaded."""
        found = self.checkpointer().resume()
        if found is None:
            return False
        folder, state = found
        self.actor_rollout_wg.load_checkpoint(os.path.join(folder, "actor"))
        if self.critic_wg is not None:
            self.critic_wg.load_checkpoint(os.path.join(folder, "critic"))
        self.global_steps = state["global_steps"]
        self.policy_version = state.get(
            "policy_version", max(0, self.global_steps - self.config.trainer.critic_warmup)
        )
        self.data.train.load_state_dict(state["dataloader"])
        self.kl_ctrl.load_state_dict(state["kl_ctrl"])
        self.nan_steps = dict(state["nan_steps"])
        self.validator.history = list(state["validation_history"])
        checkpoint.set_rng_state(state["rng"])
        self._restore_driver_state(state)
        logger.info("resumed from %s (step %d)", folder, self.global_steps)
        return True

    def _restore_driver_state(self, state: dict) -> None:
        """What a subclass adds to :meth:`_driver_state` is restored here (nothing in sync)."""
