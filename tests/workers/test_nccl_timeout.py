"""``actor_rollout_ref.nccl_timeout`` is the timeout of the process group the workers join (the
critic may create the group its colocated roles share, so it gets the same timeout)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from verl.config.ppo_trainer import load_config
from verl.single_controller.base import worker as worker_module


class Joined(Exception):
    """Stops ``init_model`` right after it joined the process group."""


@pytest.fixture
def joined(monkeypatch) -> dict:
    seen: dict = {}

    def fake_init_process_group(**kwargs):
        seen.update(kwargs)
        raise Joined

    monkeypatch.setattr(worker_module.dist, "init_process_group", fake_init_process_group)
    monkeypatch.setattr(worker_module.dist, "is_initialized", lambda: False)
    monkeypatch.setenv("MASTER_PORT", "29999")
    monkeypatch.setenv("VERL_DEVICE", "cpu")
    return seen


def test_the_policy_worker_joins_with_nccl_timeout(joined):
    from verl.workers.actor_rollout_ref import ActorRolloutRefWorker

    config = load_config(["actor_rollout_ref.nccl_timeout=1234"])
    with pytest.raises(Joined):
        ActorRolloutRefWorker(config.actor_rollout_ref, role="ref").init_model()
    assert joined["timeout"] == timedelta(seconds=1234)
    assert joined["backend"] == "gloo"


def test_the_critic_joins_with_nccl_timeout(joined):
    from verl.trainer.ppo.builders import critic_worker

    config = load_config(["actor_rollout_ref.nccl_timeout=77", "algorithm.adv_estimator=gae"])
    with pytest.raises(Joined):
        critic_worker(config).instantiate().init_model()
    assert joined["timeout"] == timedelta(seconds=77)
