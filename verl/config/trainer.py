"""The ``trainer`` and ``ray_init`` sections: loop length, devices, logging, checkpoints."""

from __future__ import annotations

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

LOGGERS = ("console", "file", "tensorboard", "wandb", "mlflow")


@dataclass
class TrainerConfig(BaseConfig):
    mode: str = "sync"
    """sync (the hybrid engine: rollout and actor share devices and take turns) | async (rollout on
    its own pool, generating ahead of the trainer; see the async_training section)."""
    balance_batch: bool = True
    """Reorder rows so every data-parallel rank gets a similar number of tokens."""
    total_epochs: int = ranged(30, at_least(1))
    """Passes over the training data."""
    total_training_steps: int | None = ranged(None, at_least(1))
    """Stop after this many steps (overrides total_epochs when set)."""
    project_name: str = "verl_examples"
    """Project name for loggers and the checkpoint dir."""
    experiment_name: str = "gsm8k"
    """Run name for loggers and the checkpoint dir."""
    logger: Any = field(default_factory=lambda: ["console", "wandb"])
    """Loggers: a list of console, file, tensorboard, wandb, mlflow, or one name (trainer.logger=console)."""
    log_val_generations: int = ranged(0, NON_NEGATIVE)
    """Validation samples (input, output, score) to log each validation."""
    rollout_data_dir: str | None = None
    """Dump each step's rollouts as jsonl here (null: no dump)."""
    validation_data_dir: str | None = None
    """Dump validation generations as jsonl here (null: no dump)."""
    nnodes: int = ranged(1, at_least(1))
    """Nodes of the Ray cluster used for the actor/rollout/ref pool."""
    n_gpus_per_node: int = ranged(8, at_least(1))
    """Devices per node; on CPU, the number of worker processes (ranks) per node."""
    device: str = "auto"
    """auto (cuda if available, else cpu) | cuda | cpu. verl's npu (Ascend) resolves and is refused
    when a run starts."""
    cpus_per_worker: float = ranged(1.0, POSITIVE)
    """CPU cores reserved per worker process (on CPU, also its torch thread count)."""
    save_freq: int = ranged(-1, at_least(-1))
    """Save a checkpoint every N steps (-1: never, except as asked by other options)."""
    resume_mode: str = "auto"
    """auto (resume from the latest checkpoint if any) | disable | resume_path."""
    resume_from_path: str | None = None
    """Checkpoint dir (global_step_N) to resume from when resume_mode=resume_path."""
    val_before_train: bool = True
    """Validate once before the first step."""
    val_only: bool = False
    """Only validate, then exit."""
    test_freq: int = ranged(-1, at_least(-1))
    """Validate every N steps and after the last one; -1 (or 0): never during training, only before it
    (``val_before_train``), as in verl."""
    critic_warmup: int = ranged(0, NON_NEGATIVE)
    """Steps that train only the critic before the actor starts updating."""
    skip_on_policy_old_log_prob: bool = True
    """Skip the old-log-prob forward when the update is provably on-policy (sync trainer, one PPO epoch,
    one mini-batch per step, and nothing but the loss reads old_log_probs): the update's own forward
    gives them (a PPO ratio of exactly 1, as the separate pass would give). False: always recompute, as
    verl does. See docs/algorithms.md."""
    default_hdfs_dir: str | None = None
    """Remote copy of checkpoints (not supported: must stay null)."""
    del_local_ckpt_after_load: bool = False
    """Delete the local checkpoint after resuming from it (refused: without HDFS it is the only copy)."""
    default_local_dir: str = "checkpoints/${trainer.project_name}/${trainer.experiment_name}"
    """Where checkpoints go (global_step_N/ below it)."""
    max_actor_ckpt_to_keep: int | None = ranged(None, NON_NEGATIVE)
    """Keep at most this many actor checkpoints (null: all)."""
    max_critic_ckpt_to_keep: int | None = ranged(None, NON_NEGATIVE)
    """Keep at most this many critic checkpoints (null: all)."""
    max_restarts: int = ranged(0, NON_NEGATIVE)
    """When a worker dies or hangs: rebuild the worker groups and resume from the last
    checkpoint, at most this many times (0: fail at once). Needs save_freq > 0 to lose little."""
    max_consecutive_nan_steps: int = ranged(5, at_least(1))
    """Stop with an error after this many steps in a row whose update was skipped for a
    non-finite loss or gradient norm (each skip is a warning and counts in training/nan_skipped_steps)."""
    ray_wait_register_center_timeout: int = ranged(300, POSITIVE)
    """Seconds to wait for worker processes to start."""
    worker_call_timeout_s: float = ranged(3600.0, POSITIVE)
    """Seconds a single worker-group call may take before the run fails with a timeout error (holding the late ranks' stacks)."""
    step_timeout_s: float | None = ranged(7200.0, POSITIVE)
    """Seconds without a finished training step after which every process's stack is printed and the run exits non-zero (null: off)."""
    seed: int = ranged(1, NON_NEGATIVE)
    """Seed of the driver's RNGs (python, numpy, torch)."""
    profile_steps: Any = None
    """Steps to profile (not supported yet: accepted, listed as inert at start-up)."""
    use_legacy_worker_impl: str = "auto"
    """verl's choice between its two worker implementations (auto | enable | disable); inert here
    (one worker per role)."""

    def __post_init__(self) -> None:
        # verl's scripts write both trainer.logger=console and trainer.logger=[console,wandb]
        if isinstance(self.logger, str):
            self.logger = [self.logger]

    def validate(self, path: str) -> None:
        check_ranges(self, path)
        # verl's npu resolves; a device this project does not run on is refused at start-up
        check_choice(self.device, ("auto", "cuda", "cpu", "npu"), f"{path}.device")
        check_choice(self.mode, ("sync", "async"), f"{path}.mode")
        check_choice(self.resume_mode, ("auto", "disable", "resume_path"), f"{path}.resume_mode")
        check_choice(
            self.use_legacy_worker_impl, ("auto", "enable", "disable"), f"{path}.use_legacy_worker_impl"
        )
        if self.resume_mode == "resume_path":
            check(
                self.resume_from_path is not None,
                f"{path}.resume_from_path",
                "a checkpoint dir when resume_mode=resume_path",
                None,
            )
        check(
            isinstance(self.logger, list | tuple),
            f"{path}.logger",
            "a logger name or a list of names",
            self.logger,
        )
        for name in self.logger:
            check_choice(name, LOGGERS, f"{path}.logger")


@dataclass
class RayInitConfig(BaseConfig):
    num_cpus: int | None = ranged(None, at_least(1))
    """CPUs Ray may use on this machine (null: all)."""
    address: str | None = None
    """Address of an existing Ray cluster (null: start a local one)."""
    timeline_json_file: str | None = None
    """Write a Ray timeline trace here at the end."""
