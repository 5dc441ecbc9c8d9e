"""Every key of verl's current configs is known here, and what this project cannot run resolves with
``--cfg job`` and is refused when the run starts, in one line naming the key and what it needs
(``verl/config/start_up.py``). The keys of verl's repository beyond 0.9.1's are recorded in
``verl/config/verl_head_keys.json`` (``verl_reference/record_verl_keys.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.trainer.config import main_ppo_in_process
from verl.config.base import ConfigError
from verl.config.keypaths import within_schema
from verl.config.notes import log_config_notes
from verl.config.ppo_trainer import PPOTrainerConfig, load_config
from verl.config.verl_extras import HEAD_KEYS_FILE, is_extra_key

HEAD = json.loads(HEAD_KEYS_FILE.read_text())
MIRROR = Path(os.environ.get("VERL_REPO", "/work/.mirror/volcengine+verl/repo"))
VERL_COMMIT = "b178a3cd56f58b2d502255daba591e92833930a7"
"""The commit of verl's repository the table was recorded at (as verl_current_lines.json's lines)."""
ACTOR = "actor_rollout_ref.actor"


def megatron(*overrides: str, start_up: bool = True) -> PPOTrainerConfig:
    return load_config(list(overrides), config_name="ppo_megatron_trainer", start_up=start_up)


# ---------------------------------------------------------------------------- verl's keys at its head
@pytest.mark.skipif(not MIRROR.is_dir(), reason=f"no copy of verl's repository at {MIRROR} (VERL_REPO)")
def test_the_head_table_is_both_generated_configs_at_the_commit_the_lines_come_from(tmp_path):
    paths = []
    for name in ("_generated_ppo_trainer.yaml", "_generated_ppo_megatron_trainer.yaml"):
        text = subprocess.run(
            ["git", "-C", str(MIRROR), "show", f"{VERL_COMMIT}:verl/trainer/config/{name}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        (tmp_path / name).write_text(text)
        paths.append(str(tmp_path / name))
    script = "tests/trainer/config/verl_reference/record_verl_keys.py"
    subprocess.run([sys.executable, script, *paths, str(tmp_path / "keys.json")], check=True)
    assert json.loads((tmp_path / "keys.json").read_text()) == HEAD


def test_every_head_key_the_schema_lacks_is_a_known_extra_key():
    lacking = [key for key in HEAD if not within_schema(PPOTrainerConfig, key)]
    assert len(lacking) > 150 and f"{ACTOR}.router_replay.mode" in lacking
    assert all(is_extra_key(key, PPOTrainerConfig) for key in lacking)


def test_the_reward_manager_sections_name_is_reward_model_reward_manager():
    assert load_config(["reward_manager.name=dapo"]).reward_model.reward_manager == "dapo"


@pytest.mark.parametrize(
    ("given", "reason"),
    [
        (f"{ACTOR}.router_replay.mode=R3", "router replay"),
        ("data.sampler.class_path=pkg://my.samplers", "custom samplers"),
        ("reward_manager.source=importlib", "looked up by name"),
        ("actor_rollout_ref.rollout.skip_rollout=True", "rollout-skipping"),
        ("critic.load_weight=False", "always loaded"),
        (f"{ACTOR}.use_prefix_grouper=True", "prefix grouper"),
        ("actor_rollout_ref.model.mtp.enable=True", "multi-token prediction"),
        ("actor_rollout_ref.rollout.data_parallel_size=2", "parallel inference engines"),
        (f"+{ACTOR}.fsdp_config.turbo_config.distributed.tensor_parallel_size=2", "turbo engine"),
    ],
)
def test_a_feature_key_resolves_and_is_refused_at_start_up_with_the_reason(given, reason):
    load_config([given], start_up=False)  # --cfg job
    with pytest.raises(ConfigError, match=reason) as error:
        load_config([given])
    assert str(error.value).startswith(given.split("=")[0].lstrip("+"))


@pytest.mark.parametrize(
    "given",
    [
        f"+{ACTOR}.fsdp_config.turbo_config=null",
        f"+{ACTOR}.fsdp_config.turbo_config={{}}",
        f"{ACTOR}.sum_pi_squared_checkpointing=True",
        "data.image_patch_size=16",
    ],
)
def test_a_knob_of_verls_implementation_or_section_left_empty_is_noted_as_having_no_effect(given):
    config = load_config([given])
    (note,) = [n for n in log_config_notes(config, "cuda", [given]) if "no effect" in n]
    assert given.split("=")[0].lstrip("+") in note


@pytest.mark.parametrize("key", ["sequence_parallel", "recompute_granularity", "moe_z_loss_coeff"])
def test_plus_on_a_key_of_a_free_form_section_is_accepted_as_verl_accepts_it(key):
    given = f"+{ACTOR}.megatron.override_transformer_config.{key}=full"
    config = megatron(given, start_up=False)
    assert config.actor_rollout_ref.actor.megatron.override_transformer_config[key] == "full"


# ---------------------------------------------------------------------------- refused at start-up
MEGATRON_CP = (
    "ppo_megatron_trainer",
    [f"{ACTOR}.megatron.context_parallel_size=2", "trainer.n_gpus_per_node=2"],
)


@pytest.mark.parametrize(
    ("config_name", "overrides", "first_words"),
    [
        ("ppo_trainer", ["trainer.device=npu"], "trainer.device='npu': this project runs on NVIDIA GPUs"),
        (
            "ppo_trainer",
            ["actor_rollout_ref.rollout.name=trtllm", "trainer.n_gpus_per_node=2"],
            "actor_rollout_ref.rollout.name='trtllm': the TensorRT-LLM rollout engine is not implemented",
        ),
        (
            "ppo_trainer",
            [
                "actor_rollout_ref.rollout.name=sglang",
                "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
                "trainer.n_gpus_per_node=2",
            ],
            "actor_rollout_ref.rollout.tensor_model_parallel_size: expected 1 with rollout.name=sglang",
        ),
        (
            *MEGATRON_CP,
            f"{ACTOR}.megatron.context_parallel_size=2: megatron-core's local layer spec (no Transformer Engine)",
        ),
        (
            "ppo_megatron_trainer",
            [f"{ACTOR}.megatron.tensor_model_parallel_size=2"],
            f"{ACTOR}.megatron.tensor_model_parallel_size: expected a size that times pipeline_model_parallel_size",
        ),
        (
            "ppo_trainer",
            ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.tensor_model_parallel_size=2"],
            "actor_rollout_ref.rollout.tensor_model_parallel_size: expected a divisor of the rollout's 1 ranks",
        ),
        (
            "ppo_trainer",
            ["trainer.n_gpus_per_node=3", "data.train_batch_size=32", "actor_rollout_ref.rollout.n=1"],
            "data.train_batch_size=32: its 32 rows (x rollout.n) do not split evenly over the 3 ranks",
        ),
    ],
)
def test_what_this_project_cannot_run_resolves_and_is_refused_at_start_up(
    config_name, overrides, first_words
):
    load_config(overrides, config_name=config_name, start_up=False)  # --cfg job
    with pytest.raises(ConfigError) as error:
        load_config(overrides, config_name=config_name)
    assert str(error.value).startswith(first_words) and "\n" not in str(error.value)


def test_npu_prints_with_cfg_job_and_its_run_stops_naming_the_device(monkeypatch, capsys):
    main_ppo_in_process.print_config(monkeypatch, "trainer.device=npu")
    assert "device: npu" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        main_ppo_in_process.run_job("trainer.device=npu")
    assert exit_.value.code == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("Error in the config: trainer.device='npu'") and "NPU" in line


# ---------------------------------------------------------------------------- data-parallel size
def test_the_mini_batch_is_checked_against_megatrons_data_parallel_size_not_the_world():
    """96 ranks with TP 4 x PP 2 leave 12 data-parallel ranks: 3 prompts x 4 samples split over them
    (verl's workers divide the mini-batch by the data-parallel size)."""
    layout = [
        "trainer.nnodes=12",
        "trainer.n_gpus_per_node=8",
        f"{ACTOR}.megatron.tensor_model_parallel_size=4",
        f"{ACTOR}.megatron.pipeline_model_parallel_size=2",
        "data.train_batch_size=24",
        "actor_rollout_ref.rollout.n=4",
    ]
    config = megatron(*layout, f"{ACTOR}.ppo_mini_batch_size=3")
    assert config.actor_data_parallel_size() == (12, "tensor x pipeline x context parallel")
    one_stage = [
        *layout,
        f"{ACTOR}.megatron.pipeline_model_parallel_size=1",
        f"{ACTOR}.ppo_mini_batch_size=3",
    ]
    megatron(*one_stage, start_up=False)  # --cfg job
    with pytest.raises(
        ConfigError, match=r"12 rows \(x rollout.n\) do not split evenly over the actor's 24 "
    ):
        megatron(*one_stage)


def test_the_mini_batch_is_checked_against_fsdps_data_parallel_size_under_ulysses():
    config = load_config(
        [
            "trainer.n_gpus_per_node=8",
            "actor_rollout_ref.model.use_remove_padding=True",
            f"{ACTOR}.ulysses_sequence_parallel_size=4",
            "data.train_batch_size=4",
            "actor_rollout_ref.rollout.n=2",
            f"{ACTOR}.ppo_mini_batch_size=1",
        ]
    )
    assert config.actor_data_parallel_size() == (2, "ulysses_sequence_parallel_size")


def test_a_null_importance_threshold_is_accepted_as_verl_accepts_it():
    config = load_config(
        [
            "algorithm.rollout_correction.rollout_is=null",
            "algorithm.rollout_correction.rollout_is_threshold=null",
        ]
    )
    assert config.algorithm.rollout_correction.rollout_is_threshold is None
