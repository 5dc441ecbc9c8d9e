"""Write the built-in files and models a config names, before a run starts (no-op for your own).

Each entry point calls the function for its config once, before any worker or rank starts: under
torchrun, rank 0 alone (a tiny model's warm-up trains in that one process).
"""

from __future__ import annotations

from typing import Any

from verl.builtin import task, tool_task, vision_task
from verl.builtin.warmup import ensure_builtin_model
from verl.config.distillation import teacher_plan
from verl.config.ppo_trainer import PPOTrainerConfig
from verl.config.presets import is_builtin_model_path
from verl.config.rm_trainer import RMTrainerConfig
from verl.config.sft_trainer import SFTTrainerConfig


def is_builtin_model(path: str) -> bool:
    """One of the models this package makes (the embedded default's, its teacher, the tool task's,
    the vision task's): :func:`verl.config.presets.is_builtin_model_path`."""
    return is_builtin_model_path(path)


def prepare_ppo_assets(config: PPOTrainerConfig) -> None:
    """The RL presets' task files and model (``ppo_trainer`` and ``tool_agent_trainer``)."""
    files = data_files(config.data)
    task.ensure_builtin_data(*files)
    ensure_builtin_model(config.actor_rollout_ref.model.path)
    if config.distillation.enabled:
        for teacher in teacher_plan(config.distillation):
            ensure_builtin_model(teacher.model_path)
    tool_task.ensure_tool_task_data(*files)
    tool_task.ensure_tool_task_model(config.actor_rollout_ref.model.path)
    vision_task.ensure_vision_task_data(*files)
    vision_task.ensure_vision_model(config.actor_rollout_ref.model.path)


def prepare_sft_assets(config: SFTTrainerConfig) -> None:
    """The SFT trainer's built-in chats and model."""
    task.ensure_builtin_sft_data(*data_files(config.data))
    ensure_builtin_model(config.model.path)


def prepare_preference_assets(config: RMTrainerConfig) -> None:
    """The reward-model trainer's built-in preference pairs and model."""
    task.ensure_builtin_preference_data(*data_files(config.data))
    ensure_builtin_model(config.model.path)


def data_files(data: Any) -> list[str]:
    """``data.train_files`` and ``data.val_files`` as one flat list of paths (each may be a list or null)."""
    files = [f for f in (data.train_files, data.val_files) if f]
    return [str(p) for f in files for p in ([f] if isinstance(f, str) else f)]
