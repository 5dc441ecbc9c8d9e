"""The ``critic`` section: the value model used by GAE/PPO."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import II

from verl.config.actor import LOSS_AGG_MODES
from verl.config.base import check, check_choice
from verl.config.engine import CheckpointConfig, FSDPConfig, OptimConfig


def _critic_optim() -> OptimConfig:
    return OptimConfig(lr=1e-5)


@dataclass
class CriticModelConfig:
    path: str = II("actor_rollout_ref.model.path")
    """Model the value network starts from (a value head is added on top)."""
    tokenizer_path: str = II("actor_rollout_ref.model.path")
    """Tokenizer of the critic (must match the actor's token ids)."""
    override_config: dict[str, Any] = field(default_factory=dict)
    """Entries that override the model's HF config."""
    external_lib: str | None = II("actor_rollout_ref.model.external_lib")
    """A module imported before loading the model."""
    enable_gradient_checkpointing: bool = True
    """Recompute activations in backward to save memory."""
    use_remove_padding: bool = False
    """Run the critic's forward/backward on sequences packed without pads (as the actor's)."""
    trust_remote_code: bool = False
    """Allow models that ship their own code."""
    gguf_file: str | None = II("actor_rollout_ref.model.gguf_file")
    """A GGUF file inside path to load weights from."""
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    """FSDP sharding and offload of the critic."""


@dataclass
class CriticConfig:
    rollout_n: int = II("actor_rollout_ref.rollout.n")
    """Responses per prompt (to turn ppo_mini_batch_size into rows)."""
    strategy: str = "fsdp"
    """Training backend: fsdp | fsdp2; both select the same engine (FSDP2)."""
    enable: bool | None = None
    """Whether a critic is trained: null = only when the estimator needs values (gae); True forces one
    (it learns the returns; advantages still come from the estimator); False with gae is refused."""
    optim: OptimConfig = field(default_factory=_critic_optim)
    """Optimizer and LR schedule of the critic."""
    model: CriticModelConfig = field(default_factory=CriticModelConfig)
    """The value model."""
    ppo_mini_batch_size: int = II("actor_rollout_ref.actor.ppo_mini_batch_size")
    """Prompts per critic optimizer step."""
    ppo_micro_batch_size: int | None = None
    """Deprecated global micro batch size; converted at start-up to ppo_micro_batch_size_per_gpu (and
    forward_micro_batch_size_per_gpu) = ppo_micro_batch_size // (nnodes x n_gpus_per_node), as verl does."""
    ppo_micro_batch_size_per_gpu: int | None = None
    """Rows per forward/backward on one rank."""
    forward_micro_batch_size: int | None = II("critic.ppo_micro_batch_size")
    """Deprecated global micro batch size of the value forward; converted at start-up to
    forward_micro_batch_size_per_gpu = forward_micro_batch_size // (nnodes x n_gpus_per_node)."""
    forward_micro_batch_size_per_gpu: int | None = II("critic.ppo_micro_batch_size_per_gpu")
    """Rows per value forward on one rank."""
    use_dynamic_bsz: bool = II("actor_rollout_ref.actor.use_dynamic_bsz")
    """Pack micro-batches by token count."""
    ppo_max_token_len_per_gpu: int = 32768
    """Token budget of one training micro-batch."""
    forward_max_token_len_per_gpu: int = II("critic.ppo_max_token_len_per_gpu")
    """Token budget of one value forward."""
    ulysses_sequence_parallel_size: int = 1
    """Ulysses sequence parallelism: ranks that split each packed sequence between them (needs
    critic.model.use_remove_padding; a group of ranks works as one data-parallel rank)."""
    ppo_epochs: int = II("actor_rollout_ref.actor.ppo_epochs")
    """Passes over the batch per training step."""
    shuffle: bool = II("actor_rollout_ref.actor.shuffle")
    """Shuffle rows before splitting into mini-batches."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value."""
    cliprange_value: float = 0.5
    """Clip range of the value update around the old values."""
    loss_agg_mode: str = II("actor_rollout_ref.actor.loss_agg_mode")
    """How token losses are averaged (see actor.loss_agg_mode)."""
    loss_scale_factor: int | None = None
    """seq-mean-token-sum-norm: the constant divisor of the value loss (null: the padded response length)."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """What critic checkpoints contain."""

    def validate(self, path: str) -> None:
        check_choice(self.strategy, ("fsdp", "fsdp2"), f"{path}.strategy")
        check_choice(self.loss_agg_mode, LOSS_AGG_MODES, f"{path}.loss_agg_mode")
        scale = self.loss_scale_factor
        check(scale is None or scale > 0, f"{path}.loss_scale_factor", "a positive number or null", scale)
        check(self.cliprange_value > 0, f"{path}.cliprange_value", "a positive number", self.cliprange_value)
        sp = self.ulysses_sequence_parallel_size
        check(sp >= 1, f"{path}.ulysses_sequence_parallel_size", "a positive number of ranks", sp)
        check(
            sp == 1 or self.model.use_remove_padding,
            f"{path}.ulysses_sequence_parallel_size",
            f"1 unless {path}.model.use_remove_padding=True (sequences are split as packed rows)",
            sp,
        )
        self.model.fsdp_config.validate(f"{path}.model.fsdp_config")
        self.optim.validate(f"{path}.optim")
        self.checkpoint.validate(f"{path}.checkpoint")
