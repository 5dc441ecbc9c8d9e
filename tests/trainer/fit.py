"""A whole training run inside the test process: build the trainer, fit, always close the workers."""

from __future__ import annotations

from verl.config.ppo_trainer import PPOTrainerConfig
from verl.trainer.ppo.ray_trainer import RayPPOTrainer


def fit_trainer(config: PPOTrainerConfig, trainer_cls: type = RayPPOTrainer) -> RayPPOTrainer:
    """The trainer after ``fit`` (its ``validator.history`` holds every validation)."""
    trainer = trainer_cls(config)
    try:
        trainer.init_workers()
        trainer.fit()
    finally:
        trainer.close()
    return trainer
