"""Config sections shared by every trained model: optimizer, FSDP sharding, checkpoint contents."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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

CHECKPOINT_CONTENTS = ("model", "optimizer", "extra", "hf_model")
LR_SCHEDULER_TYPES = ("constant", "cosine")
LR_DECAY_STYLES = ("constant", "linear", "cosine", "inverse_square_root")
MEGATRON_OPTIM_KEYS = (
    "lr_decay_style",
    "lr_decay_steps",
    "min_lr",
    "lr_warmup_init",
    "weight_decay_incr_style",
    "lr_wsd_decay_style",
    "lr_wsd_decay_steps",
    "use_checkpoint_opt_param_scheduler",
)
"""verl's ``optim=megatron`` keys, which its FSDP optimizer config does not have."""
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
class OptimConfig(BaseConfig):
    lr: float = ranged(1e-6, NON_NEGATIVE)
    """Peak learning rate of AdamW."""
    lr_warmup_steps: int = ranged(-1, at_least(-1))
    """Linear warmup steps; -1 means use lr_warmup_steps_ratio."""
    lr_warmup_steps_ratio: float = ranged(0.0, FRACTION)
    """Warmup steps as a fraction of total_training_steps (used when lr_warmup_steps < 0)."""
    min_lr_ratio: float | None = ranged(None, FRACTION)
    """Floor of the cosine schedule as a fraction of lr (cosine only; null means 0)."""
    num_cycles: float = ranged(0.5, NON_NEGATIVE)
    """Number of cosine half-waves after warmup (0.5 decays once from lr to the floor)."""
    lr_scheduler_type: str = "constant"
    """LR schedule after warmup: constant | cosine."""
    warmup_style: str | None = None
    """Deprecated spelling of lr_scheduler_type (verl < 0.6); when set, converted onto it at start-up."""
    clip_grad: float = ranged(1.0, POSITIVE)
    """verl 0.9's spelling of the gradient-norm clip; converted onto the section's grad_clip at start-up
    (the one set away from the default 1.0 wins; both set to different values is refused)."""
    total_training_steps: int = ranged(-1, at_least(1, also=(-1,)))
    """Set by the trainer at start-up from the data size and trainer.total_* keys."""
    weight_decay: float = ranged(0.01, NON_NEGATIVE)
    """AdamW decoupled weight decay."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW beta1, beta2."""
    eps: float = ranged(1e-8, POSITIVE)
    """AdamW epsilon."""
    # verl's optim=megatron keys (megatron-core's OptimizerParamScheduler); any engine reads them
    lr_decay_style: str = "constant"
    """verl's Megatron schedule after warmup: constant | linear | cosine | inverse_square_root, from lr down
    to min_lr over lr_decay_steps. Away from constant it replaces lr_scheduler_type (both set: refused)."""
    lr_decay_steps: int | None = ranged(None, at_least(1))
    """Steps from the start to the end of lr_decay_style's decay (null: total_training_steps); min_lr after."""
    min_lr: float = ranged(0.0, NON_NEGATIVE)
    """The floor of lr_decay_style's decay (absolute, not a ratio; no effect with constant, as in verl)."""
    lr_warmup_init: float = ranged(0.0, NON_NEGATIVE)
    """The learning rate warmup starts from (absolute; verl's Megatron schedule). 0: from 0, as
    lr_scheduler_type's warmup."""
    weight_decay_incr_style: str = "constant"
    """verl's Megatron weight-decay schedule: only constant (weight_decay throughout) is implemented."""
    lr_wsd_decay_style: str = "exponential"
    """verl: the decay of Megatron's warmup-stable-decay style, which verl's lr_decay_style list does not
    offer. No effect here."""
    lr_wsd_decay_steps: int | None = ranged(None, at_least(1))
    """verl: see lr_wsd_decay_style. No effect here."""
    override_optimizer_config: dict[str, Any] | None = field(default_factory=dict)
    """strategy=megatron: entries set on megatron-core's OptimizerConfig (an unknown field is an error
    naming it; Transformer Engine's precision-aware optimizer, and the host-offload knobs on a CPU
    device, have no effect, with a warning). Other engines: must stay empty (torch's AdamW is built
    from the keys above)."""
    use_checkpoint_opt_param_scheduler: bool = False
    """verl: take the schedule's settings from the checkpoint. No effect here: a resumed run follows
    the config's schedule at the checkpoint's step (the same values when the config is unchanged)."""

    def megatron_schedule(self) -> bool:
        """Whether the LR follows verl's Megatron schedule (lr_decay_style, lr_warmup_init, min_lr)."""
        return self.lr_decay_style != "constant" or self.lr_warmup_init != 0.0

    def validate(self, path: str, strategy: str | None = None) -> None:
        """``strategy``: the role's engine; verl's Megatron optimizer keys set under another engine
        are refused, as verl's FSDP optimizer config refuses them (None: any engine, the SFT trainer)."""
        check_ranges(self, path)
        if strategy not in (None, "megatron"):
            defaults = OptimConfig()
            for name in MEGATRON_OPTIM_KEYS:
                if getattr(self, name) != getattr(defaults, name):
                    raise ConfigError(
                        f"{path}.{name}: a key of verl's Megatron optimizer (strategy=megatron); with "
                        f"strategy={strategy} use lr_scheduler_type, min_lr_ratio and lr_warmup_steps"
                    )
        check(
            strategy in (None, "megatron") or not self.override_optimizer_config,
            f"{path}.override_optimizer_config",
            f"null or {{}} with strategy={strategy} (torch's AdamW is built from the optim keys alone)",
            self.override_optimizer_config,
        )
        check_choice(self.lr_decay_style, LR_DECAY_STYLES, f"{path}.lr_decay_style")
        check_choice(self.weight_decay_incr_style, ("constant",), f"{path}.weight_decay_incr_style")
        check(
            not (self.megatron_schedule() and self.lr_scheduler_type != "constant"),
            f"{path}.lr_scheduler_type",
            "constant when lr_decay_style or lr_warmup_init set verl's Megatron schedule (one schedule at a time)",
            self.lr_scheduler_type,
        )
        if self.warmup_style is not None:  # first: a bad value has been converted onto lr_scheduler_type
            check_choice(self.warmup_style, LR_SCHEDULER_TYPES, f"{path}.warmup_style")
        check_choice(self.lr_scheduler_type, LR_SCHEDULER_TYPES, f"{path}.lr_scheduler_type")
        check(
            len(self.betas) == 2 and all(0 <= beta < 1 for beta in self.betas),
            f"{path}.betas",
            "two numbers in [0, 1)",
            self.betas,
        )


@dataclass
class WrapPolicyConfig(BaseConfig):
    min_num_params: int = ranged(0, NON_NEGATIVE)
    """Wrap (shard separately) submodules with at least this many parameters; 0 wraps each decoder layer."""


@dataclass
class MixedPrecisionConfig(BaseConfig):
    param_dtype: str = "bf16"
    """GPU: dtype FSDP2 gathers the weights in for forward and backward (the compute dtype): bf16 | fp32
    (fp16 is refused: it needs loss scaling, not implemented). On CPU only with ``cpu_autocast``
    (else CPU computes in fp32 or model_dtype)."""
    reduce_dtype: str = "fp32"
    """GPU: dtype gradients are reduced across ranks in (fp32 | bf16 | fp16). No effect on CPU."""
    buffer_dtype: str = "fp32"
    """GPU: dtype the floating-point buffers (e.g. rotary inv_freq) are held in. No effect on CPU."""
    cpu_autocast: bool = False
    """Not in verl. CPU: run forward and backward under ``torch.autocast("cpu", param_dtype)``, so
    matrix products compute in bf16 while the weights, gradients and optimizer state stay fp32 (what
    FSDP2's mixed precision does on GPU). Off by default: CPU runs compute in fp32, where the ``hf``
    rollout's log-probs equal the trainer's within 1e-5 (bit for bit on some CPUs). On a CPU with
    bf16 instructions (AVX512-BF16, AMX) it cuts the update's time severalfold. Needs
    param_dtype=bf16. No effect on GPU."""

    def validate(self, path: str) -> None:
        for key in ("param_dtype", "reduce_dtype", "buffer_dtype"):
            check_choice(getattr(self, key), MODEL_DTYPES, f"{path}.{key}")
        check(
            MODEL_DTYPES[self.param_dtype] != "float16",
            f"{path}.param_dtype",
            "bf16 or fp32 (fp16 compute needs loss scaling, which this engine does not implement)",
            self.param_dtype,
        )
        check(
            not self.cpu_autocast or MODEL_DTYPES[self.param_dtype] == "bfloat16",
            f"{path}.param_dtype",
            "bf16 with cpu_autocast=True (autocast to fp32 would change nothing)",
            self.param_dtype,
        )


@dataclass
class FSDPConfig(BaseConfig):
    wrap_policy: WrapPolicyConfig = field(default_factory=WrapPolicyConfig)
    """Which submodules become their own FSDP unit."""
    param_offload: bool = False
    """Keep the weights (and gradients) in host memory between uses: loaded onto the GPU for each
    forward pass, update or weight sync, moved back after it. GPU only (inert on CPU)."""
    optimizer_offload: bool = False
    """Keep the optimizer state in host memory between updates. GPU only (inert on CPU)."""
    offload_policy: bool = False
    """verl: FSDP2 CPUOffloadPolicy. No effect here (inert on every device)."""
    reshard_after_forward: bool = True
    """Free gathered parameters after forward (saves memory, costs a second all-gather in backward).
    A trained model on a single rank keeps them until backward regardless (nothing is sharded)."""
    fsdp_size: int = ranged(-1, at_least(1, also=(-1,)))
    """verl: ranks per FSDP shard group (HSDP). No effect here: every role shards over all its ranks."""
    forward_prefetch: bool = False
    """FSDP1 option; no effect here (FSDP2 prefetches by itself)."""
    model_dtype: str | None = None
    """Dtype the weights are held (and trained) in: fp32 | bf16 | fp16 (or float32, bfloat16, float16);
    null = fp32. On GPU the forward computes in mixed_precision.param_dtype (FSDP2 mixed precision), on
    CPU too with mixed_precision.cpu_autocast."""
    mixed_precision: MixedPrecisionConfig = field(default_factory=MixedPrecisionConfig)
    """GPU compute, gradient-reduction and buffer dtypes (verl's defaults when unset: bf16, fp32, fp32)."""
    use_orig_params: bool = False
    """FSDP1 option; no effect here (FSDP2 always trains the original parameters)."""
    ulysses_sequence_parallel_size: int = ranged(1, POSITIVE)
    """The SFT trainer's sequence-parallel size (verl 0.9's engine spelling): each packed row split over
    this many ranks, a group of them training on the same rows; needs model.use_remove_padding=True.
    RL roles: above 1 it is converted onto the role's ulysses_sequence_parallel_size (noted at start-up)."""

    def validate(self, path: str) -> None:
        check_ranges(self, path)
        if self.model_dtype is not None:
            check_choice(self.model_dtype, MODEL_DTYPES, f"{path}.model_dtype")
        self.mixed_precision.validate(f"{path}.mixed_precision")


@dataclass
class CheckpointConfig(BaseConfig):
    save_contents: list[str] = field(default_factory=lambda: ["model", "optimizer", "extra"])
    """What a checkpoint holds: model, optimizer, extra (lr scheduler, RNG), hf_model (a loadable HF dir)."""
    load_contents: list[str] = field(default_factory=lambda: ["model", "optimizer", "extra"])
    """What to restore on resume."""
    strict: bool = True
    """verl (Megatron only): validate the HF weight export through mbridge. No effect here (inert on every
    device: the FSDP export writes the model's own state dict)."""

    def validate(self, path: str) -> None:
        for key in ("save_contents", "load_contents"):
            for item in getattr(self, key):
                check_choice(item, CHECKPOINT_CONTENTS, f"{path}.{key}")
