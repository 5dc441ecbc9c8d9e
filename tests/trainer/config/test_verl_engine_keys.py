"""verl 0.9's engine and optimizer keys (issue 16): accepted with verl's defaults, and each one takes
effect, is converted, is refused with a message naming it, or is noted as inert."""

from __future__ import annotations

import pytest

from verl.config.base import ConfigError
from verl.config.keypaths import get_key
from verl.config.notes import log_config_notes
from verl.config.ppo_trainer import load_config

A, C = "actor_rollout_ref.actor", "critic"

VERL_DEFAULTS = {
    "actor_rollout_ref.nccl_timeout": 600,
    f"{A}.ulysses_sequence_parallel_size": 1,
    f"{A}.fsdp_config.ulysses_sequence_parallel_size": 1,
    "actor_rollout_ref.ref.fsdp_config.ulysses_sequence_parallel_size": 1,
    f"{C}.model.fsdp_config.ulysses_sequence_parallel_size": 1,
    f"{A}.entropy_from_logits_with_chunking": False,
    f"{A}.entropy_from_logits_chunk_size": 2048,
    f"{A}.entropy_checkpointing": False,
    "actor_rollout_ref.ref.entropy_from_logits_with_chunking": False,
    "actor_rollout_ref.ref.entropy_from_logits_chunk_size": 2048,
    "actor_rollout_ref.ref.entropy_checkpointing": False,
    f"{A}.checkpoint.strict": True,
    f"{C}.enable": None,
    f"{A}.optim.clip_grad": 1.0,
    f"{A}.optim.lr_scheduler_type": "constant",
    f"{A}.optim.warmup_style": None,
    f"{C}.optim.clip_grad": 1.0,
    f"{C}.optim.lr_scheduler_type": "constant",
    f"{A}.fsdp_config.use_orig_params": False,
    f"{A}.fsdp_config.mixed_precision.param_dtype": "bf16",
    f"{A}.fsdp_config.mixed_precision.reduce_dtype": "fp32",
    f"{A}.fsdp_config.mixed_precision.buffer_dtype": "fp32",
}


def test_the_keys_exist_with_verls_defaults():
    config = load_config()
    assert {key: get_key(config, key) for key in VERL_DEFAULTS} == VERL_DEFAULTS


# ---------------------------------------------------------------------------- critic.enable
@pytest.mark.parametrize(
    "estimator, enable, expected",
    [("gae", "null", True), ("grpo", "null", False), ("grpo", "True", True), ("grpo", "False", False)],
)
def test_critic_enable_decides_whether_a_critic_is_trained(estimator, enable, expected):
    config = load_config([f"algorithm.adv_estimator={estimator}", f"critic.enable={enable}"])
    assert config.use_critic is expected


def test_disabling_the_critic_of_gae_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"critic\.enable: expected null or True.*GAE"):
        load_config(["algorithm.adv_estimator=gae", "critic.enable=False"])


# ---------------------------------------------------------------------------- optim aliases
@pytest.mark.parametrize("section", [A, C])
def test_optim_clip_grad_sets_grad_clip(section):
    config = load_config([f"{section}.optim.clip_grad=0.5"])
    assert get_key(config, f"{section}.grad_clip") == 0.5


@pytest.mark.parametrize("section", [A, C])
def test_grad_clip_alone_is_mirrored_into_optim_clip_grad(section):
    config = load_config([f"{section}.grad_clip=0.3"])
    assert get_key(config, f"{section}.optim.clip_grad") == 0.3


def test_clip_grad_and_grad_clip_set_to_the_same_value_are_accepted():
    config = load_config([f"{A}.optim.clip_grad=0.7", f"{A}.grad_clip=0.7"])
    assert config.actor_rollout_ref.actor.grad_clip == 0.7


def test_clip_grad_and_grad_clip_set_to_different_values_are_refused():
    with pytest.raises(
        ConfigError, match=r"actor\.optim\.clip_grad: expected the same value as .*grad_clip=0\.3"
    ):
        load_config([f"{A}.optim.clip_grad=0.5", f"{A}.grad_clip=0.3"])


def test_warmup_style_is_converted_onto_lr_scheduler_type():
    config = load_config([f"{A}.optim.warmup_style=cosine", f"{C}.optim.warmup_style=cosine"])
    assert config.actor_rollout_ref.actor.optim.lr_scheduler_type == "cosine"
    assert config.critic.optim.lr_scheduler_type == "cosine"


def test_warmup_style_contradicting_lr_scheduler_type_is_refused():
    with pytest.raises(ConfigError, match=r"optim\.warmup_style: expected the same value"):
        load_config([f"{A}.optim.warmup_style=constant", f"{A}.optim.lr_scheduler_type=cosine"])


@pytest.mark.parametrize("key", ["warmup_style", "lr_scheduler_type"])
def test_an_unknown_schedule_is_refused_naming_the_key_given(key):
    with pytest.raises(ConfigError, match=rf"actor\.optim\.{key}: expected one of"):
        load_config([f"{A}.optim.{key}=linear"])


def test_min_lr_is_not_a_key_of_verls_fsdp_optimizer():
    # min_lr belongs to verl's Megatron optimizer; verl's FSDP config refuses it too (use min_lr_ratio)
    with pytest.raises(ConfigError, match=r"optim\.min_lr: a key of verl's Megatron optimizer"):
        load_config([f"+{A}.optim.min_lr=1e-7"])


def test_verls_megatron_optimizer_keys_take_effect_under_megatron():
    config = load_config(
        [
            f"{A}.strategy=megatron",
            f"{A}.optim.lr_decay_style=cosine",
            f"{A}.optim.min_lr=1e-7",
            f"{A}.optim.lr_warmup_init=1e-8",
        ]
    )
    optim = config.actor_rollout_ref.actor.optim
    assert optim.megatron_schedule() and (optim.lr_decay_style, optim.min_lr) == ("cosine", 1e-7)


# ---------------------------------------------------------------------------- engine keys
def test_mixed_precision_is_accepted_the_way_verl_scripts_add_it():
    config = load_config([f"+{A}.fsdp_config.mixed_precision.param_dtype=fp32"])
    assert config.actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype == "fp32"


def test_fp16_compute_is_refused_without_loss_scaling():
    with pytest.raises(
        ConfigError, match=r"mixed_precision\.param_dtype: expected bf16 or fp32.*loss scaling"
    ):
        load_config([f"{A}.fsdp_config.mixed_precision.param_dtype=fp16"])


def test_an_unknown_dtype_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"critic\.model\.fsdp_config\.mixed_precision\.reduce_dtype"):
        load_config([f"{C}.model.fsdp_config.mixed_precision.reduce_dtype=fp8"])


def test_entropy_chunk_size_must_be_positive():
    with pytest.raises(ConfigError, match=r"actor\.entropy_from_logits_chunk_size"):
        load_config([f"{A}.entropy_from_logits_chunk_size=0"])


def test_nccl_timeout_must_be_positive():
    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.nccl_timeout"):
        load_config(["actor_rollout_ref.nccl_timeout=0"])


INERT_ON_CPU = [f"{A}.fsdp_config.mixed_precision.param_dtype=fp32"]
INERT_EVERYWHERE = [
    f"{A}.fsdp_config.use_orig_params=True",
    f"{C}.model.fsdp_config.use_orig_params=True",
    f"{A}.checkpoint.strict=False",
    "actor_rollout_ref.ref.entropy_checkpointing=True",
]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_keys_without_effect_are_noted_once(device):
    overrides = INERT_ON_CPU + INERT_EVERYWHERE
    notes = log_config_notes(load_config(overrides), device, overrides)
    expected = [o.split("=")[0] for o in INERT_EVERYWHERE + (INERT_ON_CPU if device == "cpu" else [])]
    noted = [key for key in (o.split("=")[0] for o in overrides) if any(key in note for note in notes)]
    assert sorted(noted) == sorted(expected)
