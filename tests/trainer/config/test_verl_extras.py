"""Every key of verl 0.9.1's PPO config is accepted: converted, refused with a reason, or noted."""

from __future__ import annotations

import json

import pytest

from verl.config.base import ConfigError
from verl.config.cli import prepare_argv
from verl.config.keypaths import within_schema
from verl.config.notes import log_config_notes
from verl.config.ppo_trainer import CONFIG_DIR, PPOTrainerConfig, load_config
from verl.config.verl_extras import EXTRA_ALIASES, FEATURES, verl_keys


def override(key: str, value) -> str:
    return f"{key}={json.dumps(value)}"  # JSON literals are valid Hydra override values


def literal_extras() -> dict:
    """verl 0.9.1's keys this schema lacks whose default is a value (not an interpolation)."""
    return {
        k: v
        for k, v in verl_keys().items()
        if not within_schema(PPOTrainerConfig, k) and not (isinstance(v, str) and "${" in v)
    }


def test_the_recorded_table_is_verl_091s_config():
    keys = verl_keys()
    assert len(keys) > 800
    assert keys["actor_rollout_ref.actor.optim.optimizer"] == "AdamW"
    assert keys["actor_rollout_ref.rollout.tensor_model_parallel_size"] == 2  # a key the schema has


def test_every_verl_key_at_its_default_composes_and_each_extra_is_noted():
    extras = literal_extras()
    assert len(extras) > 300
    overrides = [override(k, v) for k, v in extras.items()]
    config = load_config(overrides)
    (note,) = [n for n in log_config_notes(config, "cpu", overrides) if "no effect" in n]
    noted = set(note.split(": ", 1)[1].split(", "))
    assert {k for k in extras if k not in EXTRA_ALIASES} <= noted


@pytest.mark.parametrize(
    ("given", "reason"),
    [
        ("transfer_queue.enable=true", "the transfer queue is not implemented"),
        ("actor_rollout_ref.actor.optim.optimizer=SGD", "only torch.optim.AdamW"),
        ("actor_rollout_ref.actor.fsdp_config.qat.enable=true", "quantization-aware training"),
        ("actor_rollout_ref.rollout.data_parallel_size=2", "parallel inference engines"),
        ("actor_rollout_ref.model.lora.type=dora", "only plain LoRA"),
        ("critic.model.lora_rank=8", "LoRA for the critic"),
        ("trainer.v1.sampler.max_off_policy_threshold=2", "v1 trainer"),
    ],
)
def test_a_feature_key_away_from_verls_default_is_refused_with_the_reason(given, reason):
    key = given.split("=")[0]
    with pytest.raises(ConfigError, match=reason) as error:
        load_config([given])
    assert str(error.value).startswith(key) and "verl's default" in str(error.value)


def test_every_feature_pattern_matches_some_verl_key():
    for pattern, reason in FEATURES:
        assert any(pattern.search(k) for k in verl_keys()), f"{pattern.pattern} ({reason}) matches no key"


def test_verl_091_spellings_are_converted_onto_the_keys_read_here():
    config = load_config(["ray_kwargs.ray_init.num_cpus=3", "+ray_kwargs.timeline_json_file=/tmp/t.json"])
    assert (config.ray_init.num_cpus, config.ray_init.timeline_json_file) == (3, "/tmp/t.json")
    assert set(EXTRA_ALIASES) <= set(verl_keys())
    for target in EXTRA_ALIASES.values():
        assert within_schema(PPOTrainerConfig, target)


def test_keys_inside_a_free_form_dict_stay_there():
    config = load_config(["+actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=4"])
    assert config.actor_rollout_ref.rollout.engine_kwargs == {"vllm": {"swap_space": 4}}
    assert config.verl_extras == {}


def test_the_command_line_routes_extra_keys_too():
    argv = prepare_argv(
        ["global_profiler.tool=nsys", "+trainer.esi_redundant_time=5", "trainer.total_training_steps=2"],
        "ppo_trainer",
        CONFIG_DIR,
    )
    assert argv == [
        "++verl_extras.global_profiler.tool=nsys",
        "++verl_extras.trainer.esi_redundant_time=5",
        "trainer.total_training_steps=2",
        "~generated",  # the schema's defaults as YAML are for plain Hydra
        "preset=embedded",  # the model is the built-in one, so its CPU sizes are chosen
    ]


def test_a_made_up_key_is_still_an_error():
    with pytest.raises(Exception, match="not_a_verl_key"):
        load_config(["+trainer.not_a_verl_key=1"])
    with pytest.raises(ConfigError, match=r"not a key of verl's config"):
        load_config(["+verl_extras.trainer.not_a_verl_key=1"])
