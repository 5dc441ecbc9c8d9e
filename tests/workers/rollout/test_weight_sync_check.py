"""The weight-sync check: a sync that silently leaves the old weights in the engine stops the
run at the first step, naming the version and the phase (fault injected by a plugin)."""

from __future__ import annotations

import importlib.util

import pytest

from tests.workers.rollout.test_vllm_rollout import SMALL_RUN, build_trainer
from verl.single_controller import WorkerGroupError

BACKENDS = [
    "hf",
    pytest.param(
        "vllm",
        marks=[
            pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed"),
            pytest.mark.slow,
        ],
    ),
]


# First: the faulty runs below load a plugin, after which no worker process is kept, so this run
# starts in the processes an earlier test left and the hf case in the ones this run leaves.
@pytest.mark.usefixtures("ray_session", "builtin_assets")
def test_a_healthy_hf_sync_passes_the_check_every_step():
    trainer = build_trainer(["actor_rollout_ref.rollout.name=hf", "trainer.total_training_steps=2"])
    try:
        for step in (1, 2):
            trainer.global_steps = step
            metrics = trainer.train_step(next(trainer.batches))
            assert metrics["rollout/weight_sync_probe_gap"] < 1e-6  # hf runs the trainer's function
    finally:
        trainer.close()
    assert trainer.policy_version == 2


@pytest.mark.usefixtures("ray_session", "builtin_assets")
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_weight_sync_that_silently_fails_is_caught_at_the_first_step(backend):
    assert "actor_rollout_ref.rollout.name=vllm" in SMALL_RUN
    faulty = build_trainer(
        [
            f"actor_rollout_ref.rollout.name={backend}",
            "trainer.total_training_steps=2",
            # the engine loads the model itself: with the default dummy load, the sync at start-up
            # (random weights -> the actor's) is already caught, before the first step
            "actor_rollout_ref.rollout.load_format=auto",
            "actor_rollout_ref.model.external_lib=tests.workers.rollout.stale_sync_plugin",
        ]
    )
    try:
        faulty.global_steps = 1
        with pytest.raises(WorkerGroupError) as caught:
            faulty.train_step(next(faulty.batches))
    finally:
        faulty.close()
    message = str(caught.value) + "".join(getattr(caught.value, "__notes__", []))
    assert "weight sync to version 1 failed verification" in message
    assert "(in phase 'update_weights')" in message
