"""Config sections shared by every trained model: optimizer, FSDP sharding, checkpoint contents."""

from __future__ import annotations

from dataclasses import dataclass, field

from verl.trainer.config.base import check, check_choice

CHECKPOINT_CONTENTS = ("model", "optimizer", "extra", "hf_model")


@dataclass
class OptimConfig:
    lr: float = 1e-6
    """Peak learning rate of AdamW."""
    lr_warmup_steps: int = -1
    """Linear warmup steps; negative means use lr_warmup_steps_ratio."""
    lr_warmup_steps_ratio: float = 0.0
    """Warmup steps as a fraction of total_training_steps (used when lr_warmup_steps < 0)."""
    min_lr_ratio: float | None = None
    """Floor of the cosine schedule as a fraction of lr (cosine only; null means 0)."""
    num_cycles: float = 0.5
    """Number of cosine half-waves after warmup (0.5 decays once from lr to the floor)."""
    warmup_style: str = "constant"
    """LR schedule after warmup: constant | cosine."""
    total_training_steps: int = -1
    """Set by the trainer at start-up from the data size and trainer.total_* keys."""
    weight_decay: float = 0.01
    """AdamW decoupled weight decay."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW beta1, beta2."""
    eps: float = 1e-8
    """AdamW epsilon."""

    def validate(self, path: str) -> None:
        check(self.lr >= 0, f"{path}.lr", "a non-negative number", self.lr)
        check_choice(self.warmup_style, ("constant", "cosine"), f"{path}.warmup_style")
        check(
            0 <= self.lr_warmup_steps_ratio <= 1,
            f"{path}.lr_warmup_steps_ratio",
            "a value in [0, 1]",
            self.lr_warmup_steps_ratio,
        )
        check(len(self.betas) == 2, f"{path}.betas", "two numbers", self.betas)


@dataclass
class WrapPolicyConfig:
    min_num_params: int = 0
    """Wrap (shard separately) submodules with at least this many parameters; 0 wraps each decoder layer."""


@dataclass
class FSDPConfig:
    wrap_policy: WrapPolicyConfig = field(default_factory=WrapPolicyConfig)
    """Which submodules become their own FSDP unit."""
    param_offload: bool = False
    """Keep parameters on CPU between uses (GPU only; no effect on CPU)."""
    optimizer_offload: bool = False
    """Keep optimizer state on CPU between steps (GPU only; no effect on CPU)."""
    offload_policy: bool = False
    """FSDP2 CPUOffloadPolicy for params, grads and optimizer during training (GPU only)."""
    reshard_after_forward: bool = True
    """Free gathered parameters after forward (saves memory, costs a second all-gather in backward)."""
    fsdp_size: int = -1
    """Ranks per FSDP shard group; -1 shards over all ranks of the role."""
    forward_prefetch: bool = False
    """Prefetch the next unit's all-gather during forward (FSDP1 option; accepted, FSDP2 prefetches itself)."""
    model_dtype: str | None = None
    """Parameter dtype of the master weights; null = fp32 (bf16 compute on GPU via mixed precision)."""


@dataclass
class CheckpointConfig:
    save_contents: list[str] = field(default_factory=lambda: ["model", "optimizer", "extra"])
    """What a checkpoint holds: model, optimizer, extra (lr scheduler, RNG), hf_model (a loadable HF dir)."""
    load_contents: list[str] = field(default_factory=lambda: ["model", "optimizer", "extra"])
    """What to restore on resume."""

    def validate(self, path: str) -> None:
        for key in ("save_contents", "load_contents"):
            for item in getattr(self, key):
                check_choice(item, CHECKPOINT_CONTENTS, f"{path}.{key}")
