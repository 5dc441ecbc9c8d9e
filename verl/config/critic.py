"""The ``critic`` section: the value model used by GAE/PPO."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import II

from verl.config.actor import LOSS_AGG_MODES
from verl.config.base import POSITIVE, BaseConfig, at_least, check, check_choice, check_ranges, ranged
from verl.config.engine import CheckpointConfig, FSDPConfig, OptimConfig
from verl.config.megatron import STRATEGIES, MegatronConfig, critic_megatron


def _critic_optim() -> OptimConfig:
    return OptimConfig(lr=1e-5)


@dataclass
class CriticModelConfig(BaseConfig):
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
class CriticConfig(BaseConfig):
    rollout_n: int = ranged(II("actor_rollout_ref.rollout.n"), at_least(1))
    """Responses per prompt (to turn ppo_mini_batch_size into rows)."""
    strategy: str = "fsdp"
    """Training backend: fsdp | fsdp2 (both the FSDP2 engine) | megatron (the megatron-core engine,
    configured by critic.megatron) | veomni (runs on the FSDP2 engine). Chosen apart from the actor's,
    as in verl; model_engine=megatron (or veomni) sets both."""
    enable: bool | None = None
    """Whether a critic is trained: null = only when the estimator needs values (gae); True forces one
    (it learns the returns; advantages still come from the estimator); False with gae is refused."""
    optim: OptimConfig = field(default_factory=_critic_optim)
    """Optimizer and LR schedule of the critic."""
    model: CriticModelConfig = field(default_factory=CriticModelConfig)
    """The value model."""
    ppo_mini_batch_size: int = ranged(II("actor_rollout_ref.actor.ppo_mini_batch_size"), POSITIVE)
    """Prompts per critic optimizer step."""
    ppo_micro_batch_size: int | None = ranged(None, POSITIVE)
    """Deprecated global micro batch size; converted at start-up to ppo_micro_batch_size_per_gpu (and
    forward_micro_batch_size_per_gpu) = ppo_micro_batch_size // (nnodes x n_gpus_per_node), as verl does."""
    ppo_micro_batch_size_per_gpu: int | None = ranged(None, POSITIVE)
    """Rows per forward/backward on one rank."""
    forward_micro_batch_size: int | None = ranged(II("critic.ppo_micro_batch_size"), POSITIVE)
    """Deprecated global micro batch size of the value forward; converted at start-up to
    forward_micro_batch_size_per_gpu = forward_micro_batch_size // (nnodes x n_gpus_per_node)."""
    forward_micro_batch_size_per_gpu: int | None = ranged(II("critic.ppo_micro_batch_size_per_gpu"), POSITIVE)
    """Rows per value forward on one rank."""
    use_dynamic_bsz: bool = II("actor_rollout_ref.actor.use_dynamic_bsz")
    """Pack micro-batches by token count."""
    ppo_max_token_len_per_gpu: int = ranged(32768, POSITIVE)
    """Token budget of one training micro-batch."""
    forward_max_token_len_per_gpu: int = ranged(II("critic.ppo_max_token_len_per_gpu"), POSITIVE)
    """Token budget of one value forward."""
    ulysses_sequence_parallel_size: int = ranged(1, at_least(1))
    """Ulysses sequence parallelism: ranks that split each packed sequence between them (needs
    critic.model.use_remove_padding; a group of ranks works as one data-parallel rank)."""
    ppo_epochs: int = ranged(II("actor_rollout_ref.actor.ppo_epochs"), at_least(1))
    """Passes over the batch per training step."""
    shuffle: bool = II("actor_rollout_ref.actor.shuffle")
    """Shuffle rows before splitting into mini-batches."""
    grad_clip: float = ranged(1.0, POSITIVE)
    """Clip the global gradient norm to this value."""
    cliprange_value: float = ranged(0.5, POSITIVE)
    """Clip range of the value update around the old values."""
    loss_agg_mode: str = II("actor_rollout_ref.actor.loss_agg_mode")
    """How token losses are averaged (see actor.loss_agg_mode)."""
    loss_scale_factor: int | None = ranged(None, POSITIVE)
    """seq-mean-token-sum-norm: the constant divisor of the value loss (null: the padded response length)."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """What critic checkpoints contain."""
    megatron: MegatronConfig = field(default_factory=critic_megatron)
    """Megatron parallelism of the critic (strategy=megatron). verl's defaults, but the parallel sizes
    follow the actor's: the critic runs in the actor's processes, where megatron-core holds one layout."""

    def validate(self, path: str) -> None:
        check_ranges(self, path)
        check_choice(self.strategy, STRATEGIES, f"{path}.strategy")
        check_choice(self.loss_agg_mode, LOSS_AGG_MODES, f"{path}.loss_agg_mode")
        sp = self.ulysses_sequence_parallel_size
        check(
            sp == 1 or self.model.use_remove_padding,
            f"{path}.ulysses_sequence_parallel_size",
            f"1 unless {path}.model.use_remove_padding=True (sequences are split as packed rows)",
            sp,
        )
        self.model.fsdp_config.validate(f"{path}.model.fsdp_config")
        self.megatron.validate(f"{path}.megatron")
        self.optim.validate(f"{path}.optim", self.strategy)
        self.checkpoint.validate(f"{path}.checkpoint")
