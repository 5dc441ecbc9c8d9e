"""A recipe written the way verl's are (tests/recipe/verl_style_dapo.py: a ``RayPPOTrainer``
subclass with its own ``fit()``, roles mapped to worker classes and pools) runs on the project and
learns the embedded default task."""

from __future__ import annotations

import pytest

from tests.recipe.verl_style_dapo import DynamicSamplingTrainer, build_trainer
from tests.trainer.test_learning import ACC
from verl.config.ppo_trainer import load_config

STEPS = 48
TEST_FREQ = 8
MIN_GAIN = 0.3
"""The issue's bar for a recipe that learns: +0.3 greedy accuracy over the first validation."""


@pytest.fixture(scope="module")
def recipe_run(ray_session, builtin_assets) -> DynamicSamplingTrainer:
    config = load_config(
        [
            f"trainer.total_training_steps={STEPS}",
            f"trainer.test_freq={TEST_FREQ}",
            "trainer.logger=[console]",
            "trainer.save_freq=-1",
            "data.val_max_samples=200",
        ]
    )
    trainer = build_trainer(config)
    try:
        trainer.init_workers()
        trainer.fit()
        trainer.rollout_versions = trainer.actor_rollout_wg.get_version()
    finally:
        trainer.close()
    return trainer


@pytest.mark.slow
def test_a_verl_style_recipe_with_its_own_fit_learns_the_default_task(recipe_run):
    history = [(step, metrics[ACC]) for step, metrics in recipe_run.validator.history]
    print(f"verl-style DAPO recipe: {history}")
    assert [step for step, _ in history] == list(range(0, STEPS + 1, TEST_FREQ))
    best = max(acc for step, acc in history if step >= STEPS // 2)
    assert best >= history[0][1] + MIN_GAIN, history


@pytest.mark.slow
def test_the_recipes_dynamic_sampling_dropped_groups_and_the_rollout_followed_the_actor(recipe_run):
    # some draws held groups without signal (all right or all wrong): the filter was exercised
    assert len(recipe_run.kept_ratios) == STEPS
    assert min(recipe_run.kept_ratios) < 1.0
    # the recipe never synced weights itself: the hybrid engine did before each generation
    assert min(recipe_run.rollout_versions) >= STEPS - 1, recipe_run.rollout_versions
