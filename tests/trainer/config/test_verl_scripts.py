"""Launch lines written the way verl's example scripts are (verl_scripts/*.sh, one per algorithm
family) resolve through the config: every key is accepted, deprecated ones are converted as verl
converts them, keys without effect are listed once as inert, nothing is dropped silently."""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path

import pytest

from verl.config.notes import log_config_notes
from verl.config.ppo_trainer import load_config

HERE = Path(__file__).resolve().parent / "verl_scripts"
SCRIPTS = sorted(HERE.glob("*.sh"))


def script_overrides(script: Path, *args: str) -> list[str]:
    """The key=value arguments ``script`` passes to main_ppo (its python replaced by printf)."""
    env = {**os.environ, "PYTHON": "printf %s\\n", "MODEL": "/models/qwen", "DATA": "/data/gsm8k"}
    out = subprocess.run(["bash", str(script), *args], env=env, capture_output=True, text=True, check=True)
    lines = out.stdout.splitlines()
    assert lines[:2] == ["-m", "verl.trainer.main_ppo"], lines[:3]
    return lines[2:]


def test_one_script_per_algorithm_family():
    assert {p.stem for p in SCRIPTS} == {"grpo", "ppo_gae", "reinforce_plus_plus", "rloo", "remax"}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_script_resolves_and_notes_its_inert_keys(script, caplog):
    overrides = script_overrides(script)
    with caplog.at_level(logging.WARNING):
        config = load_config(overrides)
        notes = log_config_notes(config, "cpu", overrides)
    assert config.algorithm.adv_estimator == script.stem.replace("ppo_gae", "gae")
    assert config.trainer.logger and all(isinstance(name, str) for name in config.trainer.logger)
    assert config.actor_rollout_ref.model.path == "/models/qwen"
    inert = next((n for n in notes if "no effect" in n), "")
    given = {o.split("=", 1)[0].lstrip("+") for o in overrides}
    if "actor_rollout_ref.actor.use_torch_compile" in given:
        assert "actor_rollout_ref.actor.use_torch_compile" in inert, notes
    if "actor_rollout_ref.model.use_remove_padding" in given:  # packing takes effect
        assert "actor_rollout_ref.model.use_remove_padding" not in inert, notes
        assert config.actor_rollout_ref.model.use_remove_padding


def test_grpo_script_keys_take_verl_meaning():
    config = load_config(script_overrides(HERE / "grpo.sh", "trainer.n_gpus_per_node=2"))
    actor, ref, rollout = (getattr(config.actor_rollout_ref, k) for k in ("actor", "ref", "rollout"))
    # global micro-batch sizes are divided over the ranks (verl's fsdp_workers)
    assert actor.ppo_micro_batch_size_per_gpu == 4
    assert rollout.log_prob_micro_batch_size_per_gpu == ref.log_prob_micro_batch_size_per_gpu == 8
    # the verl 0.9 reward block lands on the keys this project reads
    assert config.custom_reward_function.path.endswith("verl_scripts/reward_fn.py")
    assert config.reward_model.reward_manager == "naive"
    assert config.reward_model.scoring.num_workers == 2
    assert config.trainer.logger == ["console"]
    assert config.trainer.rollout_data_dir.endswith("grpo/rollouts")
    # a + addition to a key the schema has, and to a free-form dict
    assert config.actor_rollout_ref.model.torch_dtype == "bfloat16"
    assert config.actor_rollout_ref.model.override_config == {"attn_implementation": "sdpa"}


def test_ppo_script_legacy_reward_model_block():
    overrides = script_overrides(HERE / "ppo_gae.sh")
    config = load_config(overrides)
    assert config.use_critic
    assert config.critic.ppo_micro_batch_size_per_gpu == config.critic.forward_micro_batch_size_per_gpu == 8
    assert config.reward_model.scoring.num_workers == 1
    assert config.trainer.logger == ["console", "file"]
    (inert,) = [n for n in log_config_notes(config, "cuda", overrides) if "no effect" in n]
    for key in (
        "reward_model.use_reward_loop",
        "reward_model.model.use_remove_padding",
        "reward_model.model.fsdp_config.param_offload",
        "reward_model.rollout.name",
    ):
        assert key in inert
    assert "critic.model.fsdp_config.param_offload" not in inert  # offloading works on a GPU
    (on_cpu,) = [n for n in log_config_notes(config, "cpu", overrides) if "no effect" in n]
    assert "critic.model.fsdp_config.param_offload" in on_cpu


def test_scripts_pass_extra_arguments_last():
    config = load_config(script_overrides(HERE / "remax.sh", "data.max_response_length=6"))
    assert config.data.max_response_length == 6
