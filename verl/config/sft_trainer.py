"""The schema of ``python -m verl.trainer.sft_trainer`` (supervised fine-tuning).

The sections and keys are verl's SFT keys: ``data.*``, ``model.*``, ``engine.*`` (the FSDP
settings, or with ``engine=megatron`` the Megatron ones), ``optim.*``, ``checkpoint.*``,
``trainer.*``. The model, engine, optimizer and checkpoint sections are the ones RL uses
(:mod:`verl.config.actor`, :mod:`verl.config.engine`, :mod:`verl.config.megatron`);
the older ``fsdp_sft_trainer`` spellings (``model.partial_pretrain``, ``data.multiturn.*``,
``optim.warmup_steps_ratio``, ``optim.lr_scheduler``, ``data.micro_batch_size``) are converted at
start-up and logged. ``verl/trainer/config/sft_trainer.yaml`` is the embedded-default preset. The
``data.*`` section is :mod:`verl.config.sft_data`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields
from typing import Any

from omegaconf import DictConfig, OmegaConf

from verl.config.actor import ModelConfig
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
from verl.config.compat import check_known_keys
from verl.config.engine import CheckpointConfig, FSDPConfig, OptimConfig
from verl.config.hydra_schema import on_schema, register_schema
from verl.config.keypaths import get_key, is_schema_key, set_key
from verl.config.megatron import INERT_FIELDS, MEGATRON, STRATEGIES, MegatronConfig, refuse_not_yet
from verl.config.sft_data import TRUNCATIONS as TRUNCATIONS
from verl.config.sft_data import MultiturnConfig as MultiturnConfig
from verl.config.sft_data import SFTDataConfig
from verl.config.trainer import LOGGERS

logger = logging.getLogger(__name__)


@dataclass
class SFTModelConfig(ModelConfig):
    partial_pretrain: str | None = None
    """fsdp_sft_trainer's spelling of model.path (converted onto it when set)."""
    fsdp_config: FSDPConfig | None = None
    """fsdp_sft_trainer's spelling of the engine section (converted onto engine when set)."""


@dataclass
class SFTOptimConfig(OptimConfig):
    warmup_steps_ratio: float | None = ranged(None, FRACTION)
    """fsdp_sft_trainer's spelling of lr_warmup_steps_ratio (converted onto it when set)."""
    lr_scheduler: str | None = None
    """fsdp_sft_trainer's spelling of lr_scheduler_type (converted onto it when set)."""


@dataclass
class SFTTrainerSection(BaseConfig):
    default_local_dir: str = "checkpoints/${trainer.project_name}/${trainer.experiment_name}"
    """Checkpoint root: global_step_N/{model/, driver.pt} and latest_checkpointed_iteration.txt."""
    default_hdfs_dir: str | None = None
    """verl: copy checkpoints to HDFS. Must stay null (no HDFS client here)."""
    project_name: str = "gsm8k-sft"
    """Project name for loggers and the checkpoint dir."""
    experiment_name: str = "test"
    """Run name for loggers and the checkpoint dir."""
    total_epochs: int = ranged(4, at_least(1))
    """Passes over the training data."""
    total_training_steps: int | None = ranged(None, at_least(1))
    """Stop after this many optimizer steps (overrides total_epochs when set)."""
    logger: Any = field(default_factory=lambda: ["console", "wandb"])
    """Loggers: a list of console, file, tensorboard, wandb, mlflow, or one name."""
    seed: int = ranged(1, NON_NEGATIVE)
    """Seed of the data order and of torch (every rank the same)."""
    save_freq: int = ranged(-1, at_least(-1))
    """Save a checkpoint every N steps and after the last (-1: never)."""
    test_freq: int = ranged(-1, at_least(-1))
    """Compute the validation loss every N steps (-1: only before training and after the last step)."""
    val_before_train: bool = True
    """Compute the validation loss once before the first step (the 'before' of before-and-after)."""
    max_ckpt_to_keep: int | None = ranged(None, NON_NEGATIVE)
    """Keep only the newest N checkpoints (null: all)."""
    balance_batch: bool = True
    """Give every data-parallel rank a similar number of tokens (rows dealt by length)."""
    resume_mode: str = "auto"
    """auto (resume from the latest checkpoint if any) | disable | resume_path."""
    resume_from_path: str | None = None
    """Checkpoint dir (global_step_N) to resume from when resume_mode=resume_path."""
    device: str = "auto"
    """auto (cuda if available, else cpu) | cuda | cpu."""
    nnodes: int = ranged(1, at_least(1))
    """verl: nodes of the torchrun job. Informational here: the world size comes from torchrun's environment."""
    n_gpus_per_node: int = ranged(1, at_least(1))
    """verl: processes per node of the torchrun job. Informational here: the world size comes from torchrun."""
    profile_interval: list[int] = field(default_factory=lambda: [-1, -1])
    """verl: steps to profile. No effect here (no profiler hooks in the SFT loop)."""
    nccl_timeout: float = ranged(600.0, POSITIVE)
    """Seconds a collective may wait before the process group fails (instead of hanging)."""

    def validate(self, path: str) -> None:
        check_ranges(self, path)
        if isinstance(self.logger, str):
            self.logger = [self.logger]
        for name in self.logger:
            check_choice(name, LOGGERS, f"{path}.logger")
        check_choice(self.resume_mode, ("auto", "disable", "resume_path"), f"{path}.resume_mode")
        check_choice(self.device, ("auto", "cuda", "cpu"), f"{path}.device")
        check(
            self.default_hdfs_dir is None,
            f"{path}.default_hdfs_dir",
            "null (no HDFS client here; copy default_local_dir yourself)",
            self.default_hdfs_dir,
        )


@dataclass
class SFTEngineConfig(MegatronConfig, FSDPConfig):
    """verl's SFT ``engine`` section: the FSDP keys, and with ``engine=megatron`` (a config group, as in
    verl) the Megatron keys of :class:`~verl.config.megatron.MegatronConfig`."""

    strategy: str = "fsdp"
    """The engine: fsdp | fsdp2 (FSDP2) | megatron (megatron-core tensor / pipeline / data parallel; set by
    engine=megatron). Megatron needs a CUDA GPU."""

    def validate(self, path: str) -> None:
        check_choice(self.strategy, STRATEGIES, f"{path}.strategy")
        FSDPConfig.validate(self, path)
        if self.strategy == MEGATRON:
            MegatronConfig.validate(self, path)
            refuse_not_yet(self, path)

    def model_parallel_size(self) -> int:
        """Ranks that hold one copy of the model between them (Megatron's tensor x pipeline group,
        which trains on the same rows); 1 for FSDP."""
        if self.strategy != MEGATRON:
            return 1
        return self.tensor_model_parallel_size * self.pipeline_model_parallel_size

    def inert_fields(self) -> tuple[str, ...]:
        """The fields this strategy leaves unread: the Megatron ones under FSDP; under Megatron the FSDP
        ones but model_dtype (the dtype the CPU trains in) and those Megatron itself ignores."""
        megatron = {f.name for f in fields(MegatronConfig)}
        fsdp = {f.name for f in fields(FSDPConfig)}
        if self.strategy != MEGATRON:
            return tuple(sorted(megatron - fsdp))
        unread = fsdp - megatron - {"model_dtype", "ulysses_sequence_parallel_size"}
        return tuple(sorted(unread)) + INERT_FIELDS


@dataclass
class SFTTrainerConfig(BaseConfig):
    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    """Chats (or prompt/response pairs), batch sizes and tokenization."""
    model: SFTModelConfig = field(default_factory=SFTModelConfig)
    """The model to fine-tune (the RL policy's model keys)."""
    engine: SFTEngineConfig = field(default_factory=SFTEngineConfig)
    """FSDP sharding and dtypes (the RL roles' fsdp_config keys); engine=megatron: Megatron's keys (the RL
    roles' megatron section)."""
    optim: SFTOptimConfig = field(default_factory=SFTOptimConfig)
    """AdamW and the LR schedule (clip_grad is the gradient-norm clip)."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """What a checkpoint holds and what resume restores."""
    trainer: SFTTrainerSection = field(default_factory=SFTTrainerSection)
    """Loop length, devices, logging, checkpoints."""
    ulysses_sequence_parallel_size: int | None = ranged(None, at_least(1))
    """fsdp_sft_trainer's spelling of engine.ulysses_sequence_parallel_size (converted onto it when set)."""
    use_remove_padding: bool | None = None
    """fsdp_sft_trainer's spelling of model.use_remove_padding (converted onto it when set)."""

    def validate(self) -> None:
        check_ranges(self)
        for section in fields(self):
            value = getattr(self, section.name)
            if hasattr(value, "validate"):
                value.validate(section.name)
        self.optim.validate("optim", self.engine.strategy)  # verl's Megatron optimizer keys need its engine
        sp = self.engine.ulysses_sequence_parallel_size
        check(
            sp == 1 or self.model.use_remove_padding,
            "engine.ulysses_sequence_parallel_size",
            "1 unless model.use_remove_padding=True (sequences are split as packed rows)",
            sp,
        )
        if self.engine.strategy == MEGATRON:
            self._check_megatron()

    def _check_megatron(self) -> None:
        """What the Megatron engine cannot combine with (the same rules as RL's megatron roles)."""
        check(
            self.engine.ulysses_sequence_parallel_size == 1,
            "engine.ulysses_sequence_parallel_size",
            "1 with engine=megatron (Megatron splits activations with engine.sequence_parallel)",
            self.engine.ulysses_sequence_parallel_size,
        )
        check(
            not (self.model.lora_rank or self.model.lora_adapter_path),
            "model.lora_rank",
            "0 with engine=megatron (LoRA is not implemented on the Megatron engine; use engine=fsdp)",
            self.model.lora_rank,
        )

    def inert_keys(self) -> tuple[str, ...]:
        """The keys of this trainer accepted for verl's scripts that have no effect here (with the
        engine section's keys the chosen strategy does not read)."""
        engine = tuple(f"engine.{name}" for name in self.engine.inert_fields())
        read = MEGATRON_OFFLOAD_KEYS if self.engine.strategy == MEGATRON else ()
        return tuple(key for key in dict.fromkeys(SFT_INERT_KEYS + engine) if key not in read)


register_schema("sft_trainer", SFTTrainerConfig)


# fsdp_sft_trainer's spellings -> the keys read here
SFT_ALIASES = {
    "model.partial_pretrain": "model.path",
    "model.fsdp_config": "engine",
    "data.multiturn.messages_key": "data.messages_key",
    "data.multiturn.tools_key": "data.tools_key",
    "optim.warmup_steps_ratio": "optim.lr_warmup_steps_ratio",
    "optim.lr_scheduler": "optim.lr_scheduler_type",
    "optim.warmup_style": "optim.lr_scheduler_type",
    "ulysses_sequence_parallel_size": "engine.ulysses_sequence_parallel_size",
    "use_remove_padding": "model.use_remove_padding",
}


def convert_sft_aliases(config: SFTTrainerConfig) -> list[str]:
    """The old spellings of :data:`SFT_ALIASES` onto the keys read here (in place); a note for each."""
    notes = []
    for old, new in SFT_ALIASES.items():
        if not is_schema_key(type(config), old):  # e.g. data.multiturn in the reward-model trainer
            continue
        value = get_key(config, old)
        if value is None:
            continue
        set_key(config, new, value)
        set_key(config, old, None)
        notes.append(f"{old} -> {new}")
    return notes


MEGATRON_OFFLOAD_KEYS = ("engine.param_offload", "engine.optimizer_offload")
"""Inert with FSDP here (:data:`SFT_INERT_KEYS`), read by the Megatron engine."""
# accepted for verl's scripts, no effect here (each field's doc says why); noted when set
SFT_INERT_KEYS = (
    "data.pad_mode",
    "data.balance_dp_token",
    "data.use_shm",
    "data.num_workers",
    "trainer.nnodes",
    "trainer.n_gpus_per_node",
    "trainer.profile_interval",
    "model.enable_activation_offload",
    "model.use_liger",
    "model.use_fused_kernels",
    "model.use_shm",
    "model.torch_dtype",
    "checkpoint.strict",
    "engine.param_offload",
    "engine.optimizer_offload",
    "engine.offload_policy",
    "engine.fsdp_size",
    "engine.forward_prefetch",
    "engine.use_orig_params",
)


def inert_key_notes(config: SFTTrainerConfig) -> list[str]:
    """One note per key of :data:`SFT_INERT_KEYS` set away from its default."""
    default = type(config)()
    keys = [key for key in config.inert_keys() if is_schema_key(type(config), key)]
    if config.model.lora_rank == 0 and not config.model.lora_adapter_path:
        keys += ["model.lora_alpha", "model.target_modules", "model.exclude_modules"]  # LoRA is off
    return [
        f"{key}={get_key(config, key)!r} has no effect here (see its doc: --cfg job or verl/config)"
        for key in keys
        if get_key(config, key) != get_key(default, key)
    ]


def to_typed_sft_config(cfg: DictConfig, schema: type | None = None) -> SFTTrainerConfig:
    """Unknown ``+`` keys refused, interpolations resolved, aliases converted (logged), validated
    (``schema``: the expected config class, SFTTrainerConfig by default)."""
    schema = schema or SFTTrainerConfig
    cfg = on_schema(cfg, schema)
    check_known_keys(cfg)
    typed = OmegaConf.to_object(cfg)
    if not isinstance(typed, schema):
        raise ConfigError(f"expected a {schema.__name__}, got {type(typed).__name__}")
    for note in convert_sft_aliases(typed):
        logger.warning("config note: converted %s", note)
    typed.validate()
    for note in inert_key_notes(typed):
        logger.warning("config note: %s", note)
    return typed


def load_sft_config(
    overrides: list[str] | None = None,
    config_dir: str | None = None,
    config_name: str = "sft_trainer",
    schema: type | None = None,
) -> SFTTrainerConfig:
    """Compose the config as ``python -m verl.trainer.sft_trainer`` would (for scripts and tests);
    ``config_name`` / ``schema``: another preset and its schema (the reward-model trainer's)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from verl.config.compat import strip_schema_plus
    from verl.config.ppo_trainer import CONFIG_DIR

    schema = schema or SFTTrainerConfig
    GlobalHydra.instance().clear()
    overrides = strip_schema_plus(list(overrides or []), schema)
    with initialize_config_dir(config_dir=config_dir or CONFIG_DIR, version_base=None):
        cfg = compose(config_name=config_name, overrides=overrides)
    return to_typed_sft_config(cfg, schema)
