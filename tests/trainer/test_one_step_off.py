"""``python -m verl.experimental.one_step_off_policy.main_ppo``: verl's one-step-off entry point is the
asynchronous trainer one version behind (its preset, verl's pool keys, the errors), and verl's own
one-step-off line (tests/trainer/config/verl_scripts/one_step_off/) trains two steps on CPU with the
real vLLM engine on a rollout process of its own: step 1's samples are on-policy, step 2's one
version old, as in verl's pipeline."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.trainer import verl_lines
from tests.trainer.test_vllm_learning import needs_vllm
from tests.trainer.verl_lines import swapped
from verl.config.base import ConfigError
from verl.config.ppo_trainer import load_config
from verl.experimental.one_step_off_policy.main_ppo import CONFIG_NAME, check_one_step_off

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests/trainer/config/verl_scripts/one_step_off/grpo_0.6b_gsm8k_fsdp2_2_6.sh"
ASYNC = ["trainer.mode=async", "actor_rollout_ref.rollout.calculate_log_probs=True"]


def script_args(script: Path) -> list[str]:
    return verl_lines.script_args(script, "verl.experimental.one_step_off_policy.main_ppo")


def test_the_preset_is_the_async_trainer_one_version_behind():
    config = load_config([], config_name=CONFIG_NAME)
    assert config.trainer.mode == "async" and not config.actor_rollout_ref.hybrid_engine
    assert config.async_training.max_staleness == 1 and not config.async_training.partial_rollout
    assert config.actor_rollout_ref.rollout.calculate_log_probs
    assert config.algorithm.rollout_correction.bypass_mode  # the rollout's log-probs are the old policy's
    megatron = load_config([], config_name="one_step_off_ppo_megatron_trainer")
    assert megatron.trainer.mode == "async" and megatron.actor_rollout_ref.actor.strategy == "megatron"


def test_verls_one_step_off_line_loads_with_its_pools():
    config = load_config(script_args(SCRIPT), config_name=CONFIG_NAME)
    check_one_step_off(config)
    assert (config.trainer.nnodes, config.trainer.n_gpus_per_node) == (1, 6)
    assert config.async_training.rollout_n_gpus == 2  # rollout.n_gpus_per_node
    assert config.actor_rollout_ref.rollout.tensor_model_parallel_size == 2
    assert config.actor_rollout_ref.rollout.name == "vllm"


@pytest.mark.parametrize(
    "overrides,key,config_name",
    [
        (["actor_rollout_ref.hybrid_engine=False"], "actor_rollout_ref.hybrid_engine", "ppo_trainer"),
        (["rollout.n_gpus_per_node=2"], "rollout.n_gpus_per_node", "ppo_trainer"),
        (["rollout.nnodes=2"], "rollout.nnodes", CONFIG_NAME),
        (
            ["rollout.n_gpus_per_node=2", "async_training.rollout_n_gpus=3"],
            "rollout.n_gpus_per_node",
            CONFIG_NAME,
        ),
        (["rollout.n_gpus_per_node=0"], "rollout.n_gpus_per_node", CONFIG_NAME),
    ],
    ids=["hybrid-off-in-sync", "pool-in-sync", "rollout-nodes", "two-sizes", "zero-devices"],
)
def test_a_bad_pool_is_refused_naming_the_key(overrides, key, config_name):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(overrides, config_name=config_name)


def test_the_same_pool_in_both_spellings_is_accepted():
    config = load_config([*ASYNC, "rollout.n_gpus_per_node=2", "async_training.rollout_n_gpus=2"])
    assert config.async_training.rollout_n_gpus == 2
    config = load_config([*ASYNC, "actor_rollout_ref.hybrid_engine=False", "rollout.nnodes=1"])
    assert config.trainer.mode == "async"


@pytest.mark.parametrize(
    "entry",
    [
        "verl.experimental.one_step_off_policy.main_ppo",
        "verl.experimental.fully_async_policy.fully_async_main",
    ],
)
def test_an_async_entry_point_refuses_the_synchronous_mode_in_one_line(entry):
    cmd = [sys.executable, "-m", entry, "trainer.mode=sync"]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stderr[-2000:]
    assert out.stderr.strip().splitlines()[-1].startswith("Error in the config: trainer.mode: expected async")


@needs_vllm
@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_verls_one_step_off_line_trains_two_steps_on_cpu(builtin_assets, tmp_path, monkeypatch):
    from verl.trainer.main_ppo import run_ppo

    monkeypatch.chdir(tmp_path)
    data = str(Path(builtin_assets["train"]).parent)
    lines = "\n".join(script_args(SCRIPT))
    overrides = [
        *swapped(lines, builtin_assets["model"], data),
        "trainer.n_gpus_per_node=1",  # a trainer process and a rollout process on two cores
        "rollout.n_gpus_per_node=1",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "trainer.total_training_steps=2",
        "trainer.logger=[file]",
    ]
    config = load_config(overrides, config_name=CONFIG_NAME)
    check_one_step_off(config)
    assert config.actor_rollout_ref.rollout.name == "vllm"
    metrics = run_ppo(config, overrides)
    assert metrics["training/global_step"] == 2
    rows = [json.loads(line) for line in (tmp_path / "logs/GRPO").glob("*/metrics.jsonl").__next__().open()]
    staleness = {row["step"]: row["async/staleness_max"] for row in rows if "async/staleness_max" in row}
    assert staleness == {1: 0, 2: 1}  # batch 2 was generated while batch 1 trained
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/kl_loss"):
        assert math.isfinite(metrics[key]), (key, metrics.get(key))


@pytest.mark.usefixtures("ray_session", "builtin_assets")
def test_one_step_off_in_server_mode_generates_each_batch_with_one_version():
    """verl's one-step-off with server-mode rollout: the weight sync waits for the batch in flight, so
    no response spans two versions, and each batch after the first is one version old."""
    from tests.trainer.fit import fit_trainer
    from verl.trainer.ppo.async_trainer import AsyncPPOTrainer

    steps = 3
    config = load_config(
        [
            "actor_rollout_ref.rollout.mode=async",
            f"trainer.total_training_steps={steps}",
            "trainer.val_before_train=False",
            "trainer.test_freq=-1",
            "trainer.logger=[console]",
            "trainer.n_gpus_per_node=1",
            "trainer.cpus_per_worker=1",  # a trainer process beside a rollout process on two cores
            "data.train_batch_size=8",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8",
            "actor_rollout_ref.rollout.n=2",
        ],
        config_name=CONFIG_NAME,
    )
    assert not config.async_training.partial_rollout
    trainer = fit_trainer(config, AsyncPPOTrainer)
    assert len(trainer.staleness_seen) == steps * 8 * 2
    assert max(trainer.version_spans_seen) == 0  # each response generated with one version
    assert sorted(set(trainer.staleness_seen)) == [
        0,
        1,
    ]  # the first batch on-policy, the later ones one behind
