"""The one config schema: documented keys, clear errors, verl's key names accepted."""

from __future__ import annotations

import ast
import logging
import re
from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ValidationError

from tests.trainer.config import main_ppo_in_process
from verl.config.base import ConfigError
from verl.config.notes import log_config_notes
from verl.config.ppo_trainer import PPOTrainerConfig, flatten, load_config

SCHEMA_DIR = Path(__file__).resolve().parents[3] / "verl" / "config"

# The keys verl's example scripts use most (issue: "must all be accepted").
VERL_SCRIPT_OVERRIDES = [
    "data.train_files=/tmp/x.parquet",
    "data.val_files=/tmp/y.parquet",
    "data.train_batch_size=64",
    "data.max_prompt_length=512",
    "data.max_response_length=256",
    "data.filter_overlong_prompts=True",
    "data.truncation=error",
    "data.prompt_key=prompt",
    "data.shuffle=False",
    "data.return_raw_chat=True",
    "algorithm.adv_estimator=gae",
    "algorithm.use_kl_in_reward=False",
    "algorithm.gamma=1.0",
    "algorithm.lam=0.95",
    "algorithm.kl_ctrl.kl_coef=0.001",
    "algorithm.norm_adv_by_std_in_grpo=False",
    "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct",
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.actor.ppo_mini_batch_size=32",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.actor.use_dynamic_bsz=True",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384",
    "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.kl_loss_coef=0.001",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.actor.clip_ratio_low=0.2",
    "actor_rollout_ref.actor.clip_ratio_high=0.28",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size=1",
    "actor_rollout_ref.actor.policy_loss.loss_mode=vanilla",
    "actor_rollout_ref.actor.use_torch_compile=False",
    "actor_rollout_ref.rollout.name=hf",
    "actor_rollout_ref.rollout.n=5",
    "actor_rollout_ref.rollout.temperature=1.0",
    "actor_rollout_ref.rollout.top_p=1.0",
    "actor_rollout_ref.rollout.top_k=-1",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.rollout.enable_chunked_prefill=False",
    "actor_rollout_ref.rollout.enforce_eager=False",
    "actor_rollout_ref.rollout.free_cache_engine=False",
    "actor_rollout_ref.rollout.max_num_batched_tokens=8192",
    "actor_rollout_ref.rollout.mode=sync",
    "actor_rollout_ref.rollout.val_kwargs.do_sample=True",
    "actor_rollout_ref.rollout.val_kwargs.n=4",
    "actor_rollout_ref.rollout.val_kwargs.temperature=0.6",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "critic.optim.lr=1e-5",
    "critic.model.path=Qwen/Qwen2.5-0.5B-Instruct",
    "critic.ppo_micro_batch_size_per_gpu=4",
    "trainer.logger=[console]",
    "trainer.project_name=p",
    "trainer.experiment_name=e",
    "trainer.n_gpus_per_node=2",
    "trainer.nnodes=1",
    "trainer.save_freq=10",
    "trainer.test_freq=5",
    "trainer.total_epochs=2",
    "trainer.total_training_steps=10",
    "trainer.critic_warmup=0",
    "trainer.val_before_train=False",
    "trainer.default_local_dir=/tmp/ckpt",
    "trainer.resume_mode=disable",
    "trainer.device=cpu",
]


def test_verl_script_keys_are_accepted():
    config = load_config(VERL_SCRIPT_OVERRIDES)
    assert config.actor_rollout_ref.actor.clip_ratio_high == 0.28
    assert config.critic.ppo_mini_batch_size == 32  # interpolated from the actor's
    assert config.actor_rollout_ref.rollout.response_length == 256  # from data.max_response_length
    assert config.use_critic and config.use_reference


def test_unknown_key_names_the_key():
    with pytest.raises(ConfigCompositionException, match=r"actor_rollout_ref\.actor\.no_such_key"):
        load_config(["actor_rollout_ref.actor.no_such_key=1"])


def test_wrong_type_names_the_key():
    with pytest.raises((ConfigCompositionException, ValidationError), match="train_batch_size"):
        load_config(["data.train_batch_size=many"])


@pytest.mark.parametrize(
    "override, key",
    [
        ("actor_rollout_ref.rollout.top_p=2", "actor_rollout_ref.rollout.top_p"),
        ("actor_rollout_ref.actor.loss_agg_mode=mean", "actor_rollout_ref.actor.loss_agg_mode"),
        ("algorithm.adv_estimator=magic", "algorithm.adv_estimator"),
        ("trainer.device=tpu", "trainer.device"),
        ("actor_rollout_ref.actor.ppo_mini_batch_size=64", "actor_rollout_ref.actor.ppo_mini_batch_size"),
        (
            "algorithm.adv_estimator=optimal_token_baseline",
            "actor_rollout_ref.actor.calculate_sum_pi_squared",
        ),
    ],
)
def test_invalid_values_name_the_key(override, key):
    with pytest.raises(ConfigError, match=re.escape(key)):
        load_config([override])


def test_inert_key_is_accepted_and_noted(caplog):
    overrides = [
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.9",
        "actor_rollout_ref.actor.fsdp_config.param_offload=True",
    ]
    config = load_config(overrides)
    with caplog.at_level(logging.WARNING):
        notes = log_config_notes(config, "cpu", overrides)
    assert "actor_rollout_ref.rollout.gpu_memory_utilization" in notes[0]
    assert "actor_rollout_ref.actor.fsdp_config.param_offload" in notes[0]
    assert "no effect" in caplog.text


def test_a_real_model_gets_verls_sizes_and_no_preset_note():
    overrides = ["actor_rollout_ref.model.path=/models/qwen", "actor_rollout_ref.actor.optim.lr=1e-6"]
    config = load_config(overrides, start_up=False)
    assert config.data.train_batch_size == 1024 and config.actor_rollout_ref.rollout.n == 1
    assert not [n for n in log_config_notes(config, "cpu", overrides) if "preset" in n]


def test_the_embedded_preset_asked_for_with_a_real_model_lists_the_sizes_it_still_sets():
    overrides = ["actor_rollout_ref.model.path=/models/qwen", "actor_rollout_ref.actor.optim.lr=1e-6"]
    overrides.append("preset=embedded")
    notes = log_config_notes(load_config(overrides, start_up=False), "cpu", overrides)
    assert any("data.train_batch_size" in n and "actor.optim.lr" not in n for n in notes)


def test_cfg_job_prints_the_resolved_config(monkeypatch, capsys):
    main_ppo_in_process.print_config(monkeypatch, "algorithm.adv_estimator=rloo")
    out = capsys.readouterr().out
    assert "adv_estimator: rloo" in out and "ppo_mini_batch_size: 32" in out


def test_unknown_key_on_the_command_line_fails(capsys):
    with pytest.raises(SystemExit) as exit_:
        main_ppo_in_process.run_job("trainer.no_such_key=1")
    assert exit_.value.code != 0
    assert "no_such_key" in capsys.readouterr().err


def _dataclass_fields_without_doc(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    missing = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        body = node.body
        for i, stmt in enumerate(body):
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                nxt = body[i + 1] if i + 1 < len(body) else None
                documented = isinstance(nxt, ast.Expr) and isinstance(
                    getattr(nxt, "value", None), ast.Constant
                )
                if not documented:
                    missing.append(f"{path.name}:{node.name}.{stmt.target.id}")
    return missing


def test_every_schema_field_has_a_doc_string():
    files = sorted(SCHEMA_DIR.glob("*.py"))
    assert len(files) > 10, f"the schema's files were not found under {SCHEMA_DIR}"
    missing = [m for path in files for m in _dataclass_fields_without_doc(path)]
    assert not missing, f"fields without a one-line doc: {missing}"


def test_every_key_is_defined_once():
    keys = list(flatten(PPOTrainerConfig()).keys())
    assert len(keys) == len(set(keys))
    assert "actor_rollout_ref.actor.policy_loss.loss_mode" in keys
