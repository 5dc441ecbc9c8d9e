"""Write the built-in files and models a config names, before a run starts (no-op for your own).

Each entry point calls the function for its config once, before any worker or rank starts: under
torchrun, rank 0 alone (a tiny model's warm-up trains in that one process).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from verl.builtin import task, tool_task, vision_task
from verl.builtin.warmup import TEACHER_MODEL_PATH, ensure_builtin_model
from verl.config.distillation import teacher_plan
from verl.config.ppo_trainer import PPOTrainerConfig
from verl.config.rm_trainer import RMTrainerConfig
from verl.config.sft_trainer import SFTTrainerConfig
from verl.utils.cache import resolve_cache_path


def is_builtin_model(path: str) -> bool:
    """The embedded default's model (or its teacher), or the tool task's."""
    resolved = Path(path).expanduser().resolve()
    builtin = (
        task.builtin_model_dir(),
        resolve_cache_path(TEACHER_MODEL_PATH),
        tool_task.tool_model_dir(),
        vision_task.vision_model_dir(),
    )
    return resolved in [folder.resolve() for folder in builtin]


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
