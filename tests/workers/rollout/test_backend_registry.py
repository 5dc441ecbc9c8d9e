"""Rollout backends come from one registry: the config's names, the workers' classes, the checks."""

from __future__ import annotations

import shutil

import pytest

from tests.workers.rollout import toy_backend
from tests.workers.rollout.test_vllm_rollout import build_trainer
from verl.config.base import ConfigError
from verl.config.ppo_trainer import load_config
from verl.config.rollout_backends import ROLLOUT_BACKENDS, RolloutBackend, register_rollout_backend

PLUGIN = "actor_rollout_ref.model.external_lib=tests.workers.rollout.toy_backend"


def test_the_config_accepts_exactly_the_registered_names():
    assert {"hf", "vllm", "sglang"} <= set(ROLLOUT_BACKENDS)
    with pytest.raises(
        ConfigError, match=r"actor_rollout_ref.rollout.name: expected one of \[.*'hf'.*got 'nope'"
    ):
        load_config(["actor_rollout_ref.rollout.name=nope"])


def test_a_backends_own_check_runs_with_the_config():
    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.rollout\.tensor_model_parallel_size"):
        load_config(
            [
                "actor_rollout_ref.rollout.name=sglang",
                "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
            ]
        )


def test_a_name_cannot_be_registered_twice_for_another_backend():
    with pytest.raises(ValueError, match="'hf' is already registered"):
        register_rollout_backend(RolloutBackend("hf", "x:Y", "x:Z"))


@pytest.mark.usefixtures("ray_session", "builtin_assets")
def test_a_toy_backend_registered_by_a_plugin_runs_a_training_step():
    shutil.rmtree(toy_backend.trace_dir(), ignore_errors=True)
    trainer = build_trainer(["actor_rollout_ref.rollout.name=toy", "trainer.total_training_steps=1", PLUGIN])
    try:
        trainer.global_steps = 1
        metrics = trainer.train_step(next(trainer.batches))
    finally:
        trainer.close()
    traces = [
        line
        for path in toy_backend.trace_dir().glob("generate-*.txt")
        for line in path.read_text().splitlines()
    ]
    assert traces == ["32 rows, version 0"]  # 8 prompts x 4 samples, before the first update
    assert metrics["rollout/weight_sync_probe_gap"] < 1e-6  # the hf code scores like the trainer
    assert trainer.policy_version == 1
