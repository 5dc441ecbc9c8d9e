"""What a PPO run needs from the model folders it names, checked at start-up.

A mistake found here is one line naming the key to change (``Error in the model: ...``), in seconds,
instead of a worker's traceback once Ray has started and the models are placed: each teacher of
on-policy distillation, ``distillation.teacher_models.<name>.model_path``, is a model folder (or a hub
id, which the workers may download).

:func:`check_before_ray` runs before Ray starts.
"""

from __future__ import annotations

from verl.config.distillation import teacher_plan
from verl.config.ppo_trainer import PPOTrainerConfig
from verl.utils.model import check_model_dir


def check_before_ray(config: PPOTrainerConfig) -> None:
    """The teachers' folders."""
    check_teachers(config)


def check_teachers(config: PPOTrainerConfig) -> None:
    """Each teacher's ``model_path`` is a model folder (or a hub id)."""
    if not config.distillation.enabled:
        return
    for teacher in teacher_plan(config.distillation):
        check_model_dir(teacher.model_path, teacher.path_key)
