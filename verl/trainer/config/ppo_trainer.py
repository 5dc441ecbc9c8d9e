"""The root of the one config schema, its Hydra registration, loading and validation.

The schema is the dataclasses below; ``ppo_trainer.yaml`` (next to this file) is the
embedded-default preset on top of it. Hydra runs in struct mode, so an override of a key
the schema does not know fails with an error that names the key.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from verl.trainer.config.actor import ActorRolloutRefConfig
from verl.trainer.config.algorithm import AlgorithmConfig
from verl.trainer.config.async_training import AsyncTrainingConfig
from verl.trainer.config.base import ConfigError, check
from verl.trainer.config.critic import CriticConfig
from verl.trainer.config.data import DataConfig
from verl.trainer.config.reward import CustomRewardFunctionConfig, RewardModelConfig
from verl.trainer.config.trainer import RayInitConfig, TrainerConfig

logger = logging.getLogger(__name__)

CONFIG_DIR = str(Path(__file__).parent)
SCHEMA_NAME = "ppo_trainer_schema"


@dataclass
class PPOTrainerConfig:
    data: DataConfig = field(default_factory=DataConfig)
    """Datasets and prompt handling."""
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    """The policy: model, actor training, rollout, reference."""
    critic: CriticConfig = field(default_factory=CriticConfig)
    """The value model (GAE only)."""
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    """Reward manager and the optional reward-model worker."""
    custom_reward_function: CustomRewardFunctionConfig = field(default_factory=CustomRewardFunctionConfig)
    """A user scorer that replaces the built-in ones."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """Advantage estimator and KL handling."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Loop length, devices, logging, checkpoints."""
    ray_init: RayInitConfig = field(default_factory=RayInitConfig)
    """How Ray is started."""
    async_training: AsyncTrainingConfig = field(default_factory=AsyncTrainingConfig)
    """The asynchronous trainer (trainer.mode=async)."""

    @property
    def use_critic(self) -> bool:
        return self.algorithm.adv_estimator == "gae"

    @property
    def use_reference(self) -> bool:
        return self.algorithm.use_kl_in_reward or self.actor_rollout_ref.actor.use_kl_loss

    def validate(self) -> None:
        for section in fields(self):
            value = getattr(self, section.name)
            if hasattr(value, "validate"):
                value.validate(section.name)
        self._check_batch_sizes()
        if self.trainer.mode == "async":
            self._check_async()
        cap = self.actor_rollout_ref.actor.tis_imp_ratio_cap
        check(
            cap <= 0 or self.actor_rollout_ref.rollout.calculate_log_probs,
            "actor_rollout_ref.actor.tis_imp_ratio_cap",
            "-1 unless actor_rollout_ref.rollout.calculate_log_probs=True (TIS needs the rollout's log-probs)",
            cap,
        )

    def _check_async(self) -> None:
        check(
            self.actor_rollout_ref.rollout.calculate_log_probs,
            "actor_rollout_ref.rollout.calculate_log_probs",
            "True with trainer.mode=async (the off-policy correction needs the behaviour log-probs)",
            False,
        )
        check(
            self.algorithm.adv_estimator != "remax",
            "algorithm.adv_estimator",
            "not remax with trainer.mode=async (its greedy baseline rollout is synchronous)",
            "remax",
        )

    def _check_batch_sizes(self) -> None:
        actor, rollout = self.actor_rollout_ref.actor, self.actor_rollout_ref.rollout
        world = self.trainer.n_gpus_per_node * self.trainer.nnodes
        bsz = self.data.train_batch_size
        check(
            actor.ppo_mini_batch_size <= bsz,
            "actor_rollout_ref.actor.ppo_mini_batch_size",
            f"at most data.train_batch_size ({bsz})",
            actor.ppo_mini_batch_size,
        )
        check(
            (bsz * rollout.n) % world == 0,
            "data.train_batch_size",
            f"train_batch_size x rollout.n divisible by the {world} ranks",
            bsz,
        )
        check(
            (actor.ppo_mini_batch_size * rollout.n) % world == 0,
            "actor_rollout_ref.actor.ppo_mini_batch_size",
            f"ppo_mini_batch_size x rollout.n divisible by the {world} ranks",
            actor.ppo_mini_batch_size,
        )


ConfigStore.instance().store(name=SCHEMA_NAME, node=PPOTrainerConfig)


def to_typed_config(cfg: DictConfig) -> PPOTrainerConfig:
    """Resolve interpolations, build the dataclasses (type-checked by OmegaConf) and validate."""
    typed = OmegaConf.to_object(cfg)
    if not isinstance(typed, PPOTrainerConfig):
        raise ConfigError(f"expected a ppo_trainer config, got {type(typed).__name__}")
    typed.validate()
    return typed


def load_config(
    overrides: list[str] | None = None, config_name: str = "ppo_trainer", config_dir: str | None = None
) -> PPOTrainerConfig:
    """Compose the config as ``main_ppo`` would (for scripts, recipes and tests)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config_dir or CONFIG_DIR, version_base=None):
        cfg = compose(config_name=config_name, overrides=list(overrides or []))
    return to_typed_config(cfg)


GPU_ONLY_KEYS = (
    "actor_rollout_ref.model.use_remove_padding",
    "actor_rollout_ref.model.enable_activation_offload",
    "actor_rollout_ref.model.use_liger",
    "actor_rollout_ref.model.use_fused_kernels",
    "actor_rollout_ref.actor.use_torch_compile",
    "actor_rollout_ref.actor.fsdp_config.param_offload",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload",
    "actor_rollout_ref.actor.fsdp_config.offload_policy",
    "actor_rollout_ref.ref.fsdp_config.param_offload",
    "actor_rollout_ref.rollout.dtype",
    "critic.model.use_remove_padding",
    "critic.model.fsdp_config.param_offload",
    "critic.model.fsdp_config.optimizer_offload",
)
ENGINE_ONLY_KEYS = (  # read by vllm/sglang only
    "actor_rollout_ref.rollout.gpu_memory_utilization",
    "actor_rollout_ref.rollout.enforce_eager",
    "actor_rollout_ref.rollout.free_cache_engine",
    "actor_rollout_ref.rollout.load_format",
    "actor_rollout_ref.rollout.layered_summon",
    "actor_rollout_ref.rollout.tensor_model_parallel_size",
    "actor_rollout_ref.rollout.max_num_batched_tokens",
    "actor_rollout_ref.rollout.max_model_len",
    "actor_rollout_ref.rollout.disable_log_stats",
    "actor_rollout_ref.rollout.enable_chunked_prefill",
    "actor_rollout_ref.rollout.engine_kwargs",
)
ALWAYS_INERT_KEYS = (
    "data.use_shm",
    "data.dataloader_num_workers",
    "data.filter_overlong_prompts_workers",
    "data.return_raw_input_ids",
    "data.image_key",
    "data.video_key",
    "data.return_multi_modal_inputs",
    "actor_rollout_ref.actor.fsdp_config.forward_prefetch",
    "trainer.profile_steps",
)


def inert_keys(config: PPOTrainerConfig, device: str, overrides: list[str]) -> list[str]:
    """Keys the user set (on the command line) that have no effect with this backend and device."""
    inert = set(ALWAYS_INERT_KEYS)
    if device == "cpu":
        inert.update(GPU_ONLY_KEYS)
    if config.actor_rollout_ref.rollout.name == "hf":
        inert.update(ENGINE_ONLY_KEYS)
    given = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
    return sorted(k for k in inert if k in given or any(k.startswith(g + ".") for g in given))


def flatten(config: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a.b.c": value}`` for every leaf of a config dataclass."""
    out: dict[str, Any] = {}
    for f in fields(config):
        value = getattr(config, f.name)
        key = f"{prefix}{f.name}"
        if is_dataclass(value):
            out.update(flatten(value, key + "."))
        else:
            out[key] = value
    return out
