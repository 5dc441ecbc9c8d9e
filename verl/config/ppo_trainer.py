"""The root of the one config schema, its Hydra registration, loading and validation.

The schema is the dataclasses below, with verl's defaults; ``verl/trainer/config/ppo_trainer.yaml``
(verl's location) composes it, and ``preset/embedded.yaml`` holds the embedded default's CPU sizes
(:mod:`verl.config.presets` says when they apply). Hydra runs in struct mode, so an override of a key
the schema does not know fails with an error that names the key.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from verl.config.actor import ActorRolloutRefConfig
from verl.config.algorithm import SUM_PI_SQUARED_ESTIMATORS, AlgorithmConfig, RolloutCorrectionConfig
from verl.config.async_training import (
    AsyncTrainingConfig,
    RolloutPoolConfig,
    check_gen_batch_size,
    check_hybrid_engine,
)
from verl.config.base import BaseConfig, ConfigError, check, check_ranges
from verl.config.compat import (
    check_known_keys,
    convert_verl_keys,
    normalize_overrides,
    refuse_unsupported,
)
from verl.config.critic import CriticConfig
from verl.config.data import DataConfig
from verl.config.distillation import DistillationConfig, check_distillation
from verl.config.hydra_schema import compose_on_schema, on_schema, register_schema
from verl.config.megatron import MEGATRON, check_megatron_roles
from verl.config.presets import with_preset
from verl.config.reward import CustomRewardFunctionConfig, RewardModelConfig
from verl.config.reward_verl import RewardConfig
from verl.config.start_up import refuse_at_start_up
from verl.config.trainer import RayInitConfig, TrainerConfig
from verl.config.verl_extras import check_verl_extras

logger = logging.getLogger(__name__)

CONFIG_DIR = str(Path(__file__).parent.parent / "trainer" / "config")
"""Where the presets (``ppo_trainer.yaml``, ...) live: verl's ``pkg://verl.trainer.config``."""


@dataclass
class PPOTrainerConfig(BaseConfig):
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
    reward: RewardConfig = field(default_factory=RewardConfig)
    """verl 0.9's spelling of the reward keys; converted onto reward_model.* / custom_reward_function.*."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """Advantage estimator and KL handling."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Loop length, devices, logging, checkpoints."""
    ray_init: RayInitConfig = field(default_factory=RayInitConfig)
    """How Ray is started."""
    async_training: AsyncTrainingConfig = field(default_factory=AsyncTrainingConfig)
    """The asynchronous trainer (trainer.mode=async)."""
    rollout: RolloutPoolConfig = field(default_factory=RolloutPoolConfig)
    """verl's rollout pool of the asynchronous entry points (nnodes, n_gpus_per_node); async only."""
    distillation: DistillationConfig = field(default_factory=DistillationConfig)
    """On-policy distillation from teacher models (verl's keys)."""
    verl_extras: dict[str, Any] = field(default_factory=dict)
    """Keys of verl 0.9.1's config this schema lacks, as given on the command line (filled there:
    ``key=value`` lands here); each is converted, refused or noted at start-up
    (:mod:`verl.config.verl_extras`)."""

    @property
    def use_critic(self) -> bool:
        """``critic.enable`` when set, else whether the estimator needs values (GAE), as in verl."""
        if self.critic.enable is not None:
            return self.critic.enable
        return self.algorithm.adv_estimator == "gae"

    @property
    def use_reference(self) -> bool:
        return self.algorithm.use_kl_in_reward or self.actor_rollout_ref.actor.use_kl_loss

    def validate(self) -> None:
        check_ranges(self)
        for section in fields(self):
            value = getattr(self, section.name)
            if hasattr(value, "validate"):
                value.validate(section.name)
        refuse_unsupported(self)
        check_hybrid_engine(self)
        check_gen_batch_size(self)
        check(
            self.critic.enable is not False or self.algorithm.adv_estimator != "gae",
            "critic.enable",
            "null or True with algorithm.adv_estimator=gae (GAE's advantages need the critic's values)",
            self.critic.enable,
        )
        self._check_batch_sizes()
        self._check_sequence_parallel()
        check_megatron_roles(self)
        check_distillation(self)
        self._check_sampling()
        self._check_agent_loop()
        if self.trainer.mode == "async":
            self._check_async()
        check(
            self.algorithm.adv_estimator not in SUM_PI_SQUARED_ESTIMATORS
            or self.actor_rollout_ref.actor.calculate_sum_pi_squared,
            "actor_rollout_ref.actor.calculate_sum_pi_squared",
            f"True with algorithm.adv_estimator={self.algorithm.adv_estimator} (it weighs paths by the "
            "actor's sum_pi_squared)",
            self.actor_rollout_ref.actor.calculate_sum_pi_squared,
        )
        correction, loss_mode = (
            self.algorithm.rollout_correction,
            self.actor_rollout_ref.actor.policy_loss.loss_mode,
        )
        check(
            not correction.bypass_mode or loss_mode == "vanilla",
            "actor_rollout_ref.actor.policy_loss.loss_mode",
            "vanilla with algorithm.rollout_correction.bypass_mode=True (bypass mode has its own loss, chosen by "
            "rollout_correction.loss_type: ppo_clip or reinforce)",
            loss_mode,
        )
        check(
            not correction.bypass_mode or self.actor_rollout_ref.rollout.calculate_log_probs,
            "actor_rollout_ref.rollout.calculate_log_probs",
            "True with algorithm.rollout_correction.bypass_mode=True (the rollout's log-probs replace old_log_probs)",
            self.actor_rollout_ref.rollout.calculate_log_probs,
        )
        cap = self.actor_rollout_ref.actor.tis_imp_ratio_cap
        check(
            cap <= 0 or self.actor_rollout_ref.rollout.calculate_log_probs,
            "actor_rollout_ref.actor.tis_imp_ratio_cap",
            "-1 unless actor_rollout_ref.rollout.calculate_log_probs=True (TIS needs the rollout's log-probs)",
            cap,
        )

    @property
    def uses_judge(self) -> bool:
        """A generative reward model: ``reward_model.rollout.name`` set and a custom function that asks
        it. As in verl, with a custom function the function scores; without one the reward model is
        a score head (``rollout.name`` is then verl's engine for it, inert here)."""
        rm = self.reward_model
        return rm.enable and rm.rollout.name is not None and self.custom_reward_function.path is not None

    def _check_reward_model(self) -> None:
        rm = self.reward_model
        if self.uses_judge:
            check(
                rm.rollout.tensor_model_parallel_size == 1,
                "reward_model.rollout.tensor_model_parallel_size",
                "1 (one judge engine per rank for now)",
                rm.rollout.tensor_model_parallel_size,
            )
            check(
                rm.reward_manager != "batch",
                "reward_model.reward_manager",
                "naive or dapo with a generative reward model (its calls get reward_router_address per row)",
                rm.reward_manager,
            )
            return
        if rm.enable and not self.data.return_raw_chat:
            # verl's dataset always carries the chat messages (raw_prompt); the reward model reads them
            logger.warning(
                "config note: data.return_raw_chat=False -> True: the reward model reads the chat "
                "messages, which verl's dataset always carries"
            )
            self.data.return_raw_chat = True

    def _check_agent_loop(self) -> None:
        rollout = self.actor_rollout_ref.rollout
        self._check_reward_model()
        check(
            not rollout.multi_turn.enable or self.data.return_raw_chat,
            "data.return_raw_chat",
            "True with actor_rollout_ref.rollout.multi_turn.enable=True (agent loops start from the chat messages)",
            self.data.return_raw_chat,
        )

    def _check_sampling(self) -> None:
        rollout, estimator = self.actor_rollout_ref.rollout, self.algorithm.adv_estimator
        if estimator not in GROUP_BASELINE_ESTIMATORS:
            return
        why = (
            f"with algorithm.adv_estimator={estimator}: greedy decoding makes the responses to a prompt "
            "identical to each other (and to ReMax's greedy baseline), so every advantage is 0 and "
            "nothing is trained"
        )
        prefix = "actor_rollout_ref.rollout"
        check(
            rollout.temperature > 0,
            f"{prefix}.temperature",
            f"a positive temperature {why}",
            rollout.temperature,
        )
        check(rollout.do_sample, f"{prefix}.do_sample", f"True {why}", rollout.do_sample)

    def _check_async(self) -> None:
        rollout, at = self.actor_rollout_ref.rollout, self.async_training.partial_rollout_interrupt_at
        check(
            at is None
            or (
                self.async_training.partial_rollout
                and rollout.mode == "sync"
                and at < rollout.response_length
            ),
            "async_training.partial_rollout_interrupt_at",
            f"null, or below rollout.response_length ({rollout.response_length}) with partial_rollout=True and "
            "rollout.mode=sync (a batch generated in two calls; a server takes each version as it comes)",
            at,
        )
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
        """A mini-batch within the batch (how the batch's rows split over the ranks is checked at
        start-up: :func:`verl.config.start_up.refuse_uneven_batches`)."""
        actor, bsz = self.actor_rollout_ref.actor, self.data.train_batch_size
        check(
            actor.ppo_mini_batch_size <= bsz,
            "actor_rollout_ref.actor.ppo_mini_batch_size",
            f"at most data.train_batch_size ({bsz})",
            actor.ppo_mini_batch_size,
        )

    def actor_data_parallel_size(self) -> tuple[int, str]:
        """The actor's data-parallel ranks (those holding different rows) and what divides the world
        into them: Megatron's tensor x pipeline x context parallel sizes, or the Ulysses size."""
        actor = self.actor_rollout_ref.actor
        world = self.trainer.n_gpus_per_node * self.trainer.nnodes
        if actor.strategy == MEGATRON:
            m = actor.megatron
            shared = m.tensor_model_parallel_size * m.pipeline_model_parallel_size * m.context_parallel_size
            return max(1, world // shared), "tensor x pipeline x context parallel"
        return max(1, world // actor.ulysses_sequence_parallel_size), "ulysses_sequence_parallel_size"

    def _check_sequence_parallel(self) -> None:
        arr = self.actor_rollout_ref
        size = arr.actor.ulysses_sequence_parallel_size
        key = "actor_rollout_ref.actor.ulysses_sequence_parallel_size"
        check(size >= 1, key, "a positive number of ranks (a divisor of the actor's rank count)", size)
        check(
            size == 1 or arr.model.use_remove_padding,
            key,
            "1 unless actor_rollout_ref.model.use_remove_padding=True (sequences are split as packed rows)",
            size,
        )
        check(
            arr.ref.ulysses_sequence_parallel_size == size,
            "actor_rollout_ref.ref.ulysses_sequence_parallel_size",
            f"the actor's ({size}): the reference runs in the actor's processes and groups",
            arr.ref.ulysses_sequence_parallel_size,
        )


# estimators whose baseline comes from the other responses to the same prompt (or, for ReMax, from
# a greedy response): with greedy sampling their advantages are all 0
GROUP_BASELINE_ESTIMATORS = (
    "grpo",
    "grpo_vectorized",
    "grpo_passk",
    "gdpo",
    "rloo",
    "rloo_vectorized",
    "opo",
    "gpg",
    "reinforce_plus_plus_baseline",
    "optimal_token_baseline",
    "tir_optimal_token_baseline",
    "remax",
)

register_schema("ppo_trainer", PPOTrainerConfig)


def to_typed_config(cfg: DictConfig, start_up: bool = True) -> PPOTrainerConfig:
    """Check for keys added with ``+`` that the schema lacks, resolve interpolations, build the
    dataclasses (type-checked by OmegaConf), convert verl's deprecated spellings (logged), validate.
    A config plain Hydra composed without the schema registered is merged onto it first
    (:func:`~verl.config.hydra_schema.on_schema`). With ``start_up`` (a run starting; not ``--cfg
    job``), what this project cannot run is refused too (:mod:`verl.config.start_up`)."""
    cfg = on_schema(cfg, PPOTrainerConfig)
    check_known_keys(cfg)
    typed = OmegaConf.to_object(cfg)
    if not isinstance(typed, PPOTrainerConfig):
        raise ConfigError(f"expected a ppo_trainer config, got {type(typed).__name__}")
    for note in convert_verl_keys(typed) + check_verl_extras(typed):
        logger.warning("config note: converted %s", note)
    share_rollout_correction(typed)
    typed.validate()
    if start_up:
        refuse_at_start_up(typed)
    return typed


def share_rollout_correction(config: PPOTrainerConfig) -> None:
    """Copy ``algorithm.rollout_correction`` into ``actor.policy_loss.rollout_correction``, where the
    actor's bypass-mode loss reads it (verl's trainer does the same); a different value set there
    by hand is refused rather than overwritten."""
    policy_loss = config.actor_rollout_ref.actor.policy_loss
    source = config.algorithm.rollout_correction
    check(
        policy_loss.rollout_correction in (RolloutCorrectionConfig(), source),
        "actor_rollout_ref.actor.policy_loss.rollout_correction",
        "unset (it is copied from algorithm.rollout_correction; set that instead)",
        policy_loss.rollout_correction,
    )
    policy_loss.rollout_correction = replace(source)


def load_config(
    overrides: list[str] | None = None,
    config_name: str = "ppo_trainer",
    config_dir: str | None = None,
    start_up: bool = True,
) -> PPOTrainerConfig:
    """Compose the config as ``main_ppo`` would (for scripts, recipes and tests), with the sizes preset
    its rule picks (:mod:`verl.config.presets`); ``start_up=False`` resolves it as ``--cfg job``
    does, without the start-up refusals."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    overrides = normalize_overrides(list(overrides or []), PPOTrainerConfig)
    with initialize_config_dir(config_dir=config_dir or CONFIG_DIR, version_base=None):
        overrides, cfg = compose_on_schema(
            overrides, lambda given: compose(config_name=config_name, overrides=given)
        )
        chosen = with_preset(overrides, cfg)
        if chosen != overrides:
            cfg = compose(config_name=config_name, overrides=chosen)
    return to_typed_config(cfg, start_up=start_up)


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
