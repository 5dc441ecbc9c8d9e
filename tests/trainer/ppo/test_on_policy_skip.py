"""When the old-log-prob forward may be skipped: only when the update is provably on-policy and
nothing but the loss reads old_log_probs (the equality of the two paths is checked on a real run in
tests/trainer/test_pinned_metrics.py)."""

from __future__ import annotations

import pytest

from verl.algorithms.adv_registry import ADV_ESTIMATOR_REGISTRY
from verl.config.ppo_trainer import load_config
from verl.trainer.ppo.ray_trainer import update_is_on_policy


def _custom(*, token_level_rewards, response_mask, batch=None, **kwargs):
    return token_level_rewards, token_level_rewards


@pytest.fixture
def user_estimator(monkeypatch):
    """An estimator registered outside verl.algorithms, for this test only (other tests check
    that every registered estimator has an example script)."""
    monkeypatch.setitem(ADV_ESTIMATOR_REGISTRY, "test_estimator_reading_the_batch", _custom)


def test_the_embedded_default_is_on_policy():
    assert update_is_on_policy(load_config([]))


def test_rollout_log_probs_alone_do_not_keep_the_pass():
    """The rollout/trainer gap the pass reported comes from the update's own forward then."""
    assert update_is_on_policy(load_config(["actor_rollout_ref.rollout.calculate_log_probs=True"]))


@pytest.mark.parametrize(
    "override",
    [
        "trainer.skip_on_policy_old_log_prob=False",
        "actor_rollout_ref.actor.ppo_epochs=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=16",  # two optimizer steps per batch
        "algorithm.use_kl_in_reward=True",
        "algorithm.rollout_correction.rollout_is=token",
    ],
)
def test_anything_else_keeps_the_pass(override):
    assert not update_is_on_policy(load_config([override]))


def test_an_estimator_registered_elsewhere_keeps_the_pass(user_estimator):
    assert not update_is_on_policy(load_config(["algorithm.adv_estimator=test_estimator_reading_the_batch"]))


def test_estimators_that_read_old_log_probs_keep_the_pass():
    config = load_config(
        [
            "algorithm.adv_estimator=optimal_token_baseline",
            "actor_rollout_ref.actor.calculate_sum_pi_squared=True",
        ]
    )
    assert not update_is_on_policy(config)
