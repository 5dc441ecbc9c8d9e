"""The ``reward_model.*`` and ``custom_reward_function.*`` sections.

Keys and defaults are verl's (``ppo_trainer.yaml``, ``reward_model/reward_model.yaml`` and the
DAPO recipe's ``reward_model.overlong_buffer``). One section is this project's own:
``reward_model.scoring`` sizes the process pool that runs rule scorers with a per-call timeout
(see :mod:`verl.workers.reward_manager.pool`).

Rewards come from rule scorers (``reward_manager`` + ``custom_reward_function``) and, with
``reward_model.enable=True``, from a discriminative reward model run by its own worker group
(:mod:`verl.workers.reward_model`): colocated with the policy, or on its own pool
(``enable_resource_pool``). Without a custom function the model's score is the reward (as in
verl); with one, the function gets the score as ``extra_info["rm_score"]`` and returns the
reward. With ``rollout.name`` set as well as a custom function, the model is a generative judge
instead (verl's rule: with a custom function, the function scores): served by that inference
engine, and the function gets its address as ``reward_router_address``. The worker's keys are inert while ``enable=False``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from verl.config.base import (
    NON_NEGATIVE,
    POSITIVE,
    BaseConfig,
    at_least,
    check,
    check_choice,
    check_ranges,
    ranged,
)
from verl.config.engine import FSDPConfig
from verl.config.genrm import GenRMRolloutConfig
from verl.config.rollout_backends import ROLLOUT_BACKENDS

__all__ = [
    "CustomRewardFunctionConfig",
    "OverlongBufferConfig",
    "RewardModelConfig",
    "RewardModelModelConfig",
    "SandboxFusionConfig",
    "ScoringPoolConfig",
]


@dataclass
class RewardModelModelConfig(BaseConfig):
    input_tokenizer: str | None = None
    """Tokenizer that decodes the policy's responses before the reward model's chat template is
    applied; None: the policy's own tokenizer."""
    path: str = "~/models/FsfairX-LLaMA3-RM-v0.1"
    """Reward model: a Hugging Face sequence- or token-classification checkpoint with one label (its
    score head), read with its own tokenizer and chat template."""
    external_lib: str | None = None
    """Python module to import before loading the model (registers custom architectures)."""
    trust_remote_code: bool = False
    """Allow a model that ships Python code."""
    override_config: dict[str, Any] = field(default_factory=dict)
    """Entries that override the reward model's HF config."""
    use_shm: bool = False
    """verl: copy the model to /dev/shm before loading."""
    use_remove_padding: bool = False
    """verl: pack sequences without padding in the reward model's forward."""
    use_fused_kernels: bool = False
    """verl: fused kernels in the reward model's forward."""
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    """FSDP sharding of the reward-model worker."""


@dataclass
class SandboxFusionConfig(BaseConfig):
    url: str | None = None
    """Accepted for compatibility; no effect (no code-execution scorers ship here)."""
    max_concurrent: int = ranged(64, POSITIVE)
    """Accepted for compatibility; no effect."""
    memory_limit_mb: int = ranged(1024, POSITIVE)
    """Accepted for compatibility; no effect."""


@dataclass
class OverlongBufferConfig(BaseConfig):
    enable: bool = False
    """Penalise responses that run into the last `len` tokens before max_response_length (DAPO)."""
    len: int = ranged(0, NON_NEGATIVE)
    """Size of the soft buffer in tokens; the penalty grows linearly across it."""
    penalty_factor: float = ranged(0.0, NON_NEGATIVE)
    """Penalty at the very end of the buffer (the reward drops by up to this much)."""
    log: bool = False
    """Report overlong_reward and overlong per response in reward_extra_info."""

    def validate(self, path: str) -> None:
        check_ranges(self, path)
        check(
            not self.enable or self.len > 0,
            f"{path}.len",
            "a positive buffer length when enable=True",
            self.len,
        )


@dataclass
class ScoringPoolConfig(BaseConfig):
    num_workers: int = ranged(1, NON_NEGATIVE)
    """Scorer processes; 0 scores in the driver process (errors are still caught, timeouts are not enforced)."""
    timeout_s: float = ranged(10.0, POSITIVE)
    """Seconds one scorer call may take; a call past it scores 0, is counted in reward/timeouts, and its process is replaced."""


@dataclass
class RewardModelConfig(BaseConfig):
    enable: bool = False
    """Score responses with the reward model at model.path (its own worker group); False scores
    with the rule scorers / custom reward function only."""
    enable_resource_pool: bool = False
    """Put the reward model on a pool of its own (nnodes x n_gpus_per_node processes) instead of
    colocating it with the policy."""
    n_gpus_per_node: int = ranged(8, NON_NEGATIVE)
    """Devices (CPU: processes) per node of the reward model's own pool."""
    nnodes: int = ranged(0, NON_NEGATIVE)
    """Nodes of the reward model's own pool."""
    use_reward_loop: bool = True
    """verl 0.8: score in reward-loop workers. Here scoring always runs in the reward manager's
    process pool (reward_model.scoring), so this has no effect."""
    num_workers: int | None = ranged(None, NON_NEGATIVE)
    """verl: reward-loop workers scoring in parallel; converted to reward_model.scoring.num_workers."""
    reward_loop_source: str = "register"
    """verl: where the reward manager class comes from: register (by name; the only one supported)."""
    reward_loop_module_path: str | None = None
    """verl: file of a reward manager when reward_loop_source=importlib (refused)."""
    reward_loop_class_name: str | None = None
    """verl: class in that file when reward_loop_source=importlib (refused)."""
    rollout: GenRMRolloutConfig = field(default_factory=GenRMRolloutConfig)
    """verl: inference engine of a generative reward model (reward-model worker only)."""
    strategy: str = "fsdp"
    """Engine backend of the reward-model worker (inert: the FSDP2 engine always runs it)."""
    model: RewardModelModelConfig = field(default_factory=RewardModelModelConfig)
    """The reward model to load when enable=True."""
    micro_batch_size: int | None = ranged(None, POSITIVE)
    """Deprecated global micro-batch size; converted to micro_batch_size_per_gpu."""
    micro_batch_size_per_gpu: int | None = ranged(None, POSITIVE)
    """Rows per forward pass on one device (None: a rank's whole share at once)."""
    max_length: int | None = ranged(None, POSITIVE)
    """Most tokens of one re-templated conversation the reward model reads; a longer one keeps its
    last max_length tokens (the score head reads the last one) and is counted in
    reward_model/truncated (None: no limit)."""
    use_dynamic_bsz: bool = False
    """Group micro-batches by token count instead of row count."""
    forward_max_token_len_per_gpu: int = ranged(32768, POSITIVE)
    """Token budget of one micro-batch when use_dynamic_bsz=True."""
    ulysses_sequence_parallel_size: int = ranged(1, at_least(1))
    """Sequence-parallel size of the reward-model worker."""
    reward_manager: str = "naive"
    """Reward manager that turns responses into scores: naive | batch | dapo, or a registered name."""
    launch_reward_fn_async: bool = False
    """verl: compute rule rewards concurrently with the old-log-prob pass. No effect here: rewards are
    their own timed phase, scored in parallel by the process pool."""
    reward_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments for the reward manager's constructor (verl's overlong_buffer_cfg entry
    is converted to reward_model.overlong_buffer)."""
    sandbox_fusion: SandboxFusionConfig = field(default_factory=SandboxFusionConfig)
    """Remote code sandbox (verl); accepted for compatibility, no effect."""
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)
    """DAPO's soft overlong penalty (used by reward_manager=dapo)."""
    scoring: ScoringPoolConfig = field(default_factory=ScoringPoolConfig)
    """Process pool that runs the scorers with a per-call timeout."""

    def validate(self, path: str) -> None:
        check_ranges(self, path)
        check(
            bool(self.reward_manager), f"{path}.reward_manager", "a reward manager name", self.reward_manager
        )
        self.overlong_buffer.validate(f"{path}.overlong_buffer")
        if not self.enable:
            return
        if self.rollout.name is not None:
            check_choice(self.rollout.name, ROLLOUT_BACKENDS, f"{path}.rollout.name")
        if self.enable_resource_pool:
            for key in ("nnodes", "n_gpus_per_node"):
                value = getattr(self, key)
                check(value > 0, f"{path}.{key}", "a positive integer with enable_resource_pool=True", value)


@dataclass
class CustomRewardFunctionConfig(BaseConfig):
    path: str | None = None
    """Python file that defines your scorer; None uses the built-in scorers chosen by data_source."""
    name: str = "compute_score"
    """Function in that file, called as fn(data_source, solution_str, ground_truth, extra_info, **reward_kwargs)."""
    reward_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments passed to every call of the custom function."""

    def validate(self, path: str) -> None:
        if self.path is None:
            return
        check(
            os.path.isfile(os.path.expanduser(self.path)),
            f"{path}.path",
            "an existing Python file",
            self.path,
        )
        check(bool(self.name), f"{path}.name", "a function name", self.name)
