"""Config sections shared by every trained model: optimizer, FSDP sharding, checkpoint contents."""

from __future__ import annotations

from dataclasses import dataclass, field

from verl.trainer.config.base import check, check_choice

CHECKPOINT_CONTENTS = ("model", "optimizer", "extra", "hf_model")
# fsdp_config.model_dtype names (verl's PrecisionType spellings) -> torch dtype attribute
MODEL_DTYPES = {
    "fp32": "float32",
    "float32": "float32",
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "float16": "float16",
}


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
    """verl: keep parameters on CPU between uses. No effect here (inert on every device)."""
    optimizer_offload: bool = False
    """verl: keep optimizer state on CPU between steps. No effect here (inert on every device)."""
    offload_policy: bool = False
    """verl: FSDP2 CPUOffloadPolicy. No effect here (inert on every device)."""
    reshard_after_forward: bool = True
    """Free gathered parameters after forward (saves memory, costs a second all-gather in backward)."""
    fsdp_size: int = -1
    """verl: ranks per FSDP shard group (HSDP). No effect here: every role shards over all its ranks."""
    forward_prefetch: bool = False
    """FSDP1 option; no effect here (FSDP2 prefetches by itself)."""
    model_dtype: str | None = None
    """Dtype the weights are held (and trained) in: fp32 | bf16 | fp16 (or float32, bfloat16, float16);
    null = fp32. On GPU the forward still computes in bf16 (FSDP2 mixed precision)."""

    def validate(self, path: str) -> None:
        if self.model_dtype is not None:
            check_choice(self.model_dtype, MODEL_DTYPES, f"{path}.model_dtype")


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
