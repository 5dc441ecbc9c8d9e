"""``optim.lr_scheduler_type`` (or verl's older ``optim.warmup_style``) picks the LR schedule."""

from __future__ import annotations

import math

import pytest

from verl.config.engine import OptimConfig
from verl.config.ppo_trainer import load_config
from verl.workers.engine.optim import lr_multiplier


def test_constant_schedule_warms_up_then_stays_at_lr():
    config = OptimConfig(lr_warmup_steps=4, total_training_steps=10)
    assert [lr_multiplier(s, config) for s in (0, 2, 4, 9)] == [0.0, 0.5, 1.0, 1.0]


def test_cosine_schedule_decays_to_the_floor():
    config = OptimConfig(lr_scheduler_type="cosine", min_lr_ratio=0.1, total_training_steps=10)
    assert lr_multiplier(0, config) == pytest.approx(1.0)
    assert lr_multiplier(5, config) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr_multiplier(10, config) == pytest.approx(0.1)


@pytest.mark.parametrize("key", ["lr_scheduler_type", "warmup_style"])
def test_either_spelling_reaches_the_schedule(key):
    config = load_config([f"actor_rollout_ref.actor.optim.{key}=cosine"]).actor_rollout_ref.actor.optim
    config.total_training_steps = 10
    assert lr_multiplier(10, config) == pytest.approx(0.0)
