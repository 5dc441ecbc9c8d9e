"""A worker set-up that fails (here: a model plugin that raises while the workers load the model)
gives its placement groups back at once, so a restart or the next trainer finds the CPUs free."""

from __future__ import annotations

import time

import pytest
import ray
from ray.util.placement_group import PlacementGroup, remove_placement_group

from verl.config.ppo_trainer import load_config
from verl.single_controller import WorkerGroupError
from verl.single_controller.ray import release_parked_workers
from verl.single_controller.ray.resource_pool import REUSE_ENV
from verl.trainer.main_ppo import run_ppo
from verl.trainer.ppo.async_trainer import AsyncPPOTrainer
from verl.trainer.ppo.ray_trainer import RayPPOTrainer

MODES = {
    "sync": ["trainer.n_gpus_per_node=2"],  # one pool of 2 processes: both CPUs of the test Ray
    "async": [  # a trainer pool and a rollout pool, 1 process each
        "trainer.n_gpus_per_node=1",
        "trainer.mode=async",
        "actor_rollout_ref.rollout.calculate_log_probs=True",
    ],
}
COMMON = [
    "trainer.cpus_per_worker=1",
    "trainer.logger=[console]",
    "trainer.val_before_train=False",
    "data.train_batch_size=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.rollout.n=2",
]
BROKEN_PLUGIN = "actor_rollout_ref.model.external_lib=tests.trainer.failing_model_plugin"


def live_placement_groups() -> set[str]:
    return {pg_id for pg_id, info in ray.util.placement_group_table().items() if info["state"] != "REMOVED"}


def remove_placement_groups(pg_ids: set[str]) -> None:
    """Leave the shared test Ray clean even when the code under test leaked (a failing run)."""
    for pg_id in pg_ids:
        remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(pg_id))))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_failed_worker_setup_frees_its_placement_groups_for_the_restart_and_the_next_run(
    ray_session, builtin_assets, mode, monkeypatch
):
    monkeypatch.setenv(REUSE_ENV, "0")  # every bundle must be given back, none kept for reuse
    release_parked_workers()
    before = live_placement_groups()
    failing = [*MODES[mode], *COMMON, "trainer.max_restarts=1", BROKEN_PLUGIN]
    start = time.monotonic()
    try:
        # the restart rebuilds the workers at once (it does not wait for the first attempt's
        # bundles) and fails the same way; the last attempt's error is raised
        with pytest.raises(WorkerGroupError, match="fails on purpose"):
            run_ppo(load_config(failing), failing)
        assert time.monotonic() - start < 100
        assert live_placement_groups() == before
    finally:
        remove_placement_groups(live_placement_groups() - before)

    healthy = [*MODES[mode], *COMMON]
    trainer = (AsyncPPOTrainer if mode == "async" else RayPPOTrainer)(load_config(healthy))
    start = time.monotonic()
    try:
        trainer.init_workers()
        assert time.monotonic() - start < 60
    finally:
        trainer.close()
    assert live_placement_groups() == before
