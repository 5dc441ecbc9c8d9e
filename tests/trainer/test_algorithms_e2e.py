"""Every estimator and policy loss runs end to end: each example script's CPU line (the
embedded default with the algorithm's keys) trains 2 real steps, shrunk to a small batch.
The scripts that test_learning.py trains for 40 steps are left to it (it saves ~40 s), and the
LoRA-on-vLLM script to test_vllm_lora.py."""

from __future__ import annotations

import math

import pytest

from tests.example_scripts import ENTRIES, REPO, SCRIPTS, script_command, trainer_class
from tests.trainer.test_learning import FAMILIES
from tests.trainer.test_vllm_learning import SCRIPT as VLLM_LEARNED
from tests.workers.rollout.test_vllm_lora import LORA_SCRIPT
from verl.config.ppo_trainer import load_config
from verl.trainer.main_ppo import run_ppo

SHORT = [
    "trainer.total_training_steps=2",
    "trainer.val_before_train=False",
    "trainer.logger=[console]",
    "data.train_batch_size=8",
    "data.val_max_samples=16",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.rollout.n=4",
]


LEARNED = {REPO / path for path in FAMILIES.values()} | {VLLM_LEARNED, LORA_SCRIPT}


def _cases() -> list:
    """The scripts as test cases, those whose CPU line starts a vLLM engine last and marked slow (left
    out of -m 'not slow'): a run with an engine leaves no worker process to reuse, so the run after it
    starts its workers afresh (15-20 s on two busy cores)."""
    cases = []
    for script in SCRIPTS:
        if script in LEARNED:
            continue
        _, overrides = script_command(script, "cpu")
        vllm = "actor_rollout_ref.rollout.name=vllm" in overrides
        marks = [pytest.mark.slow] if vllm else []
        cases.append((vllm, pytest.param(script, marks=marks, id=str(script.relative_to(REPO)))))
    return [case for _, case in sorted(cases, key=lambda case: case[0])]


@pytest.mark.usefixtures("ray_session", "builtin_assets")
@pytest.mark.parametrize("script", _cases())
def test_script_trains_two_steps(script):
    entry, overrides = script_command(script, "cpu")
    name, config_dir = ENTRIES[entry]
    config = load_config(SHORT + overrides, config_name=name, config_dir=config_dir)
    metrics = run_ppo(config, SHORT + overrides, trainer_cls=trainer_class(entry))

    assert metrics["training/global_step"] == 2
    expected = ["actor/pg_loss", "actor/grad_norm", "critic/score/mean", "critic/advantages/max"]
    if config.use_critic:
        expected += ["critic/vf_loss", "critic/values/mean"]
    if config.algorithm.use_kl_in_reward:
        expected += ["actor/reward_kl_penalty"]
    if config.actor_rollout_ref.actor.use_kl_loss:
        expected += ["actor/kl_loss"]
    if config.algorithm.filter_groups.enable:
        expected += ["train/num_gen_batches", "train/kept_group_ratio"]
    for key in expected:
        assert key in metrics, f"{script.name}: missing {key}"
        assert math.isfinite(metrics[key]), f"{script.name}: {key}={metrics[key]}"
    assert metrics["actor/grad_norm"] > 0, "the actor did not get a gradient"
    assert any(k.startswith("val-core/") for k in metrics), "no validation at the last step"
