"""The shipped YAMLs load, and every example script's command (GPU and CPU line) is a valid
config; together the scripts cover every registered estimator and policy loss."""

from __future__ import annotations

import functools

import pytest

from tests.example_scripts import ENTRIES, REPO, SCRIPTS, load_script_config
from verl.algorithms.advantages import ADV_ESTIMATOR_REGISTRY
from verl.algorithms.policy_losses import POLICY_LOSS_REGISTRY
from verl.config.base import ConfigError
from verl.config.ppo_trainer import load_config


@functools.cache
def cpu_config(script):
    """The script's CPU line as a config: loaded once for both tests that read it."""
    return load_script_config(script, "cpu")


def test_there_are_example_scripts():
    assert len(SCRIPTS) >= 10, SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(REPO)))
@pytest.mark.parametrize("mode", ["gpu", "cpu"])
def test_example_script_is_a_valid_config(script, mode):
    config, overrides = cpu_config(script) if mode == "cpu" else load_script_config(script)
    if mode == "gpu":
        assert config.actor_rollout_ref.model.path == "Qwen/Qwen2.5-0.5B-Instruct"
        assert config.data.train_files.endswith("gsm8k/train.parquet")
        assert config.trainer.n_gpus_per_node == 1
    else:  # the embedded default: the script adds only algorithm (rollout engine, LoRA) keys
        assert config.data.train_files.endswith("arith/train.parquet")
        lora = ("actor_rollout_ref.model.lora_", "actor_rollout_ref.model.target_modules")
        allowed = ("algorithm.", "actor_rollout_ref.actor.", "actor_rollout_ref.rollout.", *lora)
        assert all(o.split("=")[0].startswith(allowed) for o in overrides)


# Registered (verl 0.9.1's set, checked by tests/trainer/ppo/test_verl091_parity.py) but not a
# loss_mode a script sets: bypass_mode is chosen through algorithm.rollout_correction.bypass_mode.
NOT_RUNNABLE = {"bypass_mode"}


def test_scripts_cover_every_estimator_and_loss():
    estimators, losses = set(), set()
    for script in SCRIPTS:
        config, _ = cpu_config(script)
        estimators.add(config.algorithm.adv_estimator)
        losses.add(config.actor_rollout_ref.actor.policy_loss.loss_mode)
    assert estimators == set(ADV_ESTIMATOR_REGISTRY) - NOT_RUNNABLE
    assert losses == set(POLICY_LOSS_REGISTRY) - NOT_RUNNABLE


def test_extra_arguments_override_the_script():
    config, _ = load_script_config(
        REPO / "examples/grpo_trainer/run_qwen2.5-0.5b_gsm8k.sh", "cpu", "data.max_response_length=6"
    )
    assert config.data.max_response_length == 6


def test_dapo_yaml_composes_the_standard_config():
    config = load_config([], config_name="dapo_trainer", config_dir=ENTRIES["recipe.dapo.main_dapo"][1])
    default = load_config([])
    assert config.algorithm.filter_groups.enable and config.algorithm.filter_groups.metric == "acc"
    assert config.actor_rollout_ref.actor.clip_ratio_high > config.actor_rollout_ref.actor.clip_ratio_low
    assert config.reward_model.reward_manager == "dapo" and config.reward_model.overlong_buffer.enable
    # everything DAPO does not set is the embedded default's
    assert config.data.train_files == default.data.train_files
    assert config.actor_rollout_ref.rollout.n == default.actor_rollout_ref.rollout.n


def test_a_bad_key_in_a_recipe_config_is_named():
    with pytest.raises(Exception, match=r"filter_groups\.metricc"):
        load_config(
            ["algorithm.filter_groups.metricc=acc"],
            config_name="dapo_trainer",
            config_dir=ENTRIES["recipe.dapo.main_dapo"][1],
        )
    with pytest.raises(ConfigError, match=r"algorithm\.filter_groups\.metric"):
        load_config(
            ["algorithm.filter_groups.metric=null"],
            config_name="dapo_trainer",
            config_dir=ENTRIES["recipe.dapo.main_dapo"][1],
        )
