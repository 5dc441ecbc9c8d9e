"""``strategy=megatron``: verl's megatron keys with verl's defaults, the reference following the
actor's parallel sizes, clear refusals of what the engine lacks, and the three ways verl selects the
engine (``strategy``, ``model_engine=megatron``, ``--config-name ppo_megatron_trainer``). Config only:
these lines are not run here (one training step of each: tests/trainer/test_verl_megatron_examples.py)."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest

from tests.trainer.verl_lines import script_args
from verl.config.base import ConfigError
from verl.config.cli import prepare_argv
from verl.config.megatron import NOT_YET, MegatronConfig, refuse_not_yet
from verl.config.notes import log_config_notes
from verl.config.ppo_trainer import CONFIG_DIR, load_config
from verl.config.sft_trainer import load_sft_config

SCRIPTS = Path(__file__).resolve().parent / "verl_scripts" / "megatron"
MEGATRON = ["actor_rollout_ref.actor.strategy=megatron"]
# verl 0.9.1's verl/trainer/config/engine/megatron.yaml (actor and critic sections)
VERL_DEFAULTS = {
    "param_offload": False,
    "optimizer_offload": False,
    "tensor_model_parallel_size": 1,
    "expert_model_parallel_size": 1,
    "expert_tensor_parallel_size": None,
    "pipeline_model_parallel_size": 1,
    "virtual_pipeline_model_parallel_size": None,
    "context_parallel_size": 1,
    "sequence_parallel": True,
    "use_distributed_optimizer": True,
    "use_dist_checkpointing": False,
    "dist_checkpointing_path": None,
    "dynamic_context_parallel": False,
    "max_seqlen_per_dp_cp_rank": None,
    "dist_checkpointing_prefix": "",
    "dist_ckpt_optim_fully_reshardable": False,
    "distrib_optim_fully_reshardable_mem_efficient": False,
    "entropy_from_logits_with_chunking": False,
    "entropy_from_logits_chunk_size": 2048,
    "seed": 42,
    "override_ddp_config": {},
    "override_transformer_config": {
        "recompute_granularity": None,
        "recompute_modules": ["core_attn"],
        "recompute_method": None,
        "recompute_num_layers": None,
        "attention_backend": "flash",
    },
    "override_mcore_model_config": {},
    "use_mbridge": True,
    "vanilla_mbridge": False,
    "use_remove_padding": True,
    "pad_bshd_to_minibatch_max": True,
    "pad_to_length": False,
    "pad_to_length_bucket": 512,
    "use_megatron_fsdp": False,
    "forward_only": False,
    "dtype": "bfloat16",
}


def load_script(script: Path):
    args = script_args(script)
    name = next(a.split("=", 1)[1] for a in args if a.startswith("--config-name"))
    overrides = [a for a in args if not a.startswith("--")]
    return load_config(overrides, config_name=name.removesuffix(".yaml")), overrides


def test_the_megatron_sections_have_verls_keys_and_defaults():
    assert {f.name for f in fields(MegatronConfig)} == {
        *VERL_DEFAULTS,
        "grad_offload",
    }  # grad_offload: verl 0.8
    config = load_config(MEGATRON, config_name="ppo_trainer")
    for section in (config.actor_rollout_ref.actor.megatron, config.critic.megatron):
        given = {name: getattr(section, name) for name in VERL_DEFAULTS}
        # verl turns sequence parallelism off at tensor_model_parallel_size=1, and so does this schema
        assert given == {**VERL_DEFAULTS, "sequence_parallel": False}
    assert config.actor_rollout_ref.ref.megatron.forward_only  # verl's megatron_ref.yaml


def test_sequence_parallel_stays_on_with_tensor_parallelism():
    config = load_config(
        [
            *MEGATRON,
            "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
            "trainer.n_gpus_per_node=2",
        ]
    )
    assert config.actor_rollout_ref.actor.megatron.sequence_parallel
    assert config.actor_rollout_ref.ref.megatron.sequence_parallel


def test_the_reference_follows_the_actors_parallel_sizes_seed_and_overrides():
    config = load_config(
        [
            *MEGATRON,
            "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
            "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
            "actor_rollout_ref.actor.megatron.seed=7",
            "+actor_rollout_ref.actor.megatron.override_transformer_config.num_layers_in_first_pipeline_stage=3",
            "trainer.n_gpus_per_node=4",
        ]
    )
    actor, ref = config.actor_rollout_ref.actor, config.actor_rollout_ref.ref
    assert ref.strategy == "megatron"
    assert (ref.megatron.tensor_model_parallel_size, ref.megatron.pipeline_model_parallel_size) == (2, 2)
    assert ref.megatron.seed == 7
    assert ref.megatron.override_transformer_config == actor.megatron.override_transformer_config
    assert ref.megatron.override_transformer_config["num_layers_in_first_pipeline_stage"] == 3


def test_a_reference_layout_other_than_the_actors_is_refused():
    overrides = [*MEGATRON, "actor_rollout_ref.ref.megatron.tensor_model_parallel_size=2"]
    with pytest.raises(
        ConfigError, match=r"actor_rollout_ref\.ref\.megatron\.tensor_model_parallel_size.*share"
    ):
        load_config([*overrides, "trainer.n_gpus_per_node=2"])


def test_tensor_times_pipeline_must_divide_the_ranks():
    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.actor\.megatron\.tensor_model_parallel_size"):
        load_config([*MEGATRON, "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2"])


def test_expert_times_pipeline_must_divide_the_ranks():
    key = "actor_rollout_ref.actor.megatron.expert_model_parallel_size"
    with pytest.raises(ConfigError, match=re.escape(key) + ".*divides the 1 ranks"):
        load_config([*MEGATRON, f"{key}=2"])
    config = load_config([*MEGATRON, f"{key}=2", "trainer.n_gpus_per_node=2"])
    assert config.critic.megatron.expert_model_parallel_size == 2  # the critic follows (same processes)


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        ("context_parallel_size", "2", "no context-parallel attention"),
        ("virtual_pipeline_model_parallel_size", "2", "interleaved"),
    ],
)
def test_a_feature_the_engine_lacks_is_refused_naming_the_key(key, value, reason):
    full = f"actor_rollout_ref.actor.megatron.{key}"
    with pytest.raises(ConfigError, match=re.escape(full) + "=.*" + reason):
        load_config([*MEGATRON, f"{full}={value}"])


def test_use_dist_checkpointing_is_accepted_with_a_path_and_refused_without_one():
    """The load itself: tests/workers/engine/test_megatron_dist_checkpoint.py."""
    section = "actor_rollout_ref.actor.megatron"
    config = load_config(
        [*MEGATRON, f"{section}.use_dist_checkpointing=true", f"{section}.dist_checkpointing_path=/ckpt"]
    )
    assert config.actor_rollout_ref.actor.megatron.dist_checkpointing_path == "/ckpt"
    with pytest.raises(ConfigError, match=re.escape(f"{section}.dist_checkpointing_path") + ".*got None"):
        load_config([*MEGATRON, f"{section}.use_dist_checkpointing=true"])


def test_the_offload_keys_are_accepted_and_the_reference_follows_the_actors_param_offload():
    """verl's MoE scripts set all three (engine: tests/workers/engine/test_megatron_offload.py)."""
    actor_keys = [
        f"actor_rollout_ref.actor.megatron.{name}=true"
        for name in ("param_offload", "grad_offload", "optimizer_offload")
    ]
    config = load_config([*MEGATRON, *actor_keys, "critic.megatron.optimizer_offload=true"])
    actor, ref = config.actor_rollout_ref.actor.megatron, config.actor_rollout_ref.ref.megatron
    assert actor.param_offload and actor.grad_offload and actor.optimizer_offload
    assert ref.param_offload  # verl's megatron_ref.yaml interpolates it; the reference has no optimizer
    assert config.critic.megatron.optimizer_offload and not config.critic.megatron.param_offload
    assert not set(NOT_YET) & {"param_offload", "grad_offload", "optimizer_offload"}


def test_param_offload_with_the_async_proximal_weights_is_accepted():
    """The proximal weights are copied and swapped in with the offloaded weights brought back
    (``TrainEngine.weights_copy`` / ``computing_with``; tests/workers/engine/test_megatron_offload.py)."""
    key = "actor_rollout_ref.actor.megatron.param_offload"
    name = "fully_async_ppo_megatron_trainer"
    config = load_config([f"{key}=true", "async_training.compute_prox_log_prob=True"], config_name=name)
    assert (
        config.actor_rollout_ref.actor.megatron.param_offload and config.async_training.compute_prox_log_prob
    )


@pytest.mark.parametrize("name", sorted(NOT_YET))
def test_every_listed_feature_is_refused_away_from_its_default_only(name):
    default = getattr(MegatronConfig(), name)
    refuse_not_yet(MegatronConfig(), "x.megatron")  # verl's defaults pass
    bad = {"x": 1} if isinstance(default, dict) else True if isinstance(default, bool) else 2
    with pytest.raises(ConfigError, match=re.escape(f"x.megatron.{name}={bad!r}")):
        refuse_not_yet(MegatronConfig(**{name: bad}), "x.megatron")


def test_an_override_the_engine_does_not_apply_is_refused():
    key = "actor_rollout_ref.actor.megatron.override_ddp_config"
    with pytest.raises(ConfigError, match=re.escape(key) + "=.*does not apply DDP overrides"):
        load_config([*MEGATRON, f"+{key}.grad_reduce_in_fp32=false"])


def test_a_critic_refusal_names_the_critics_key():
    overrides = [
        "model_engine=megatron",
        "algorithm.adv_estimator=gae",
        "critic.megatron.context_parallel_size=2",
    ]
    with pytest.raises(ConfigError, match=r"critic\.megatron\.context_parallel_size"):
        load_config(overrides)


def test_null_or_one_is_accepted_for_the_virtual_and_expert_sizes():
    keys = ("virtual_pipeline_model_parallel_size", "expert_tensor_parallel_size")
    config = load_config([*MEGATRON, *(f"actor_rollout_ref.actor.megatron.{k}=1" for k in keys)])
    assert config.actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size == 1


def test_ulysses_sequence_parallelism_is_refused_under_megatron():
    overrides = [
        *MEGATRON,
        "actor_rollout_ref.model.use_remove_padding=true",
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
        "trainer.n_gpus_per_node=2",
    ]
    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.actor\.ulysses_sequence_parallel_size"):
        load_config(overrides)


def test_under_fsdp_the_megatron_section_is_inert_not_refused():
    overrides = ["actor_rollout_ref.actor.megatron.context_parallel_size=2"]
    config = load_config(overrides)
    (inert,) = [n for n in log_config_notes(config, "cuda", overrides) if "no effect" in n]
    assert "actor_rollout_ref.actor.megatron.context_parallel_size" in inert


def test_under_megatron_the_fsdp_keys_are_accepted_and_noted_but_model_dtype_is_read():
    overrides = [
        *MEGATRON,
        "actor_rollout_ref.actor.fsdp_config.param_offload=true",
        "actor_rollout_ref.actor.fsdp_config.model_dtype=bf16",
        "actor_rollout_ref.actor.megatron.use_mbridge=false",
    ]
    config = load_config(overrides)
    (inert,) = [n for n in log_config_notes(config, "cuda", overrides) if "no effect" in n]
    assert "actor_rollout_ref.actor.fsdp_config.param_offload" in inert
    assert "actor_rollout_ref.actor.megatron.use_mbridge" in inert
    assert "actor_rollout_ref.actor.fsdp_config.model_dtype" not in inert


def test_strategy_megatron_moves_the_reference_but_not_the_critic_as_in_verl():
    config = load_config([*MEGATRON, "algorithm.adv_estimator=gae"])
    assert config.actor_rollout_ref.ref.strategy == "megatron"
    assert config.critic.strategy == "fsdp"  # verl chooses the critic's engine apart from the actor's


def test_an_fsdp_actor_with_a_megatron_critic_is_allowed_as_in_verl():
    config = load_config(["algorithm.adv_estimator=gae", "critic.strategy=megatron"])
    assert (config.actor_rollout_ref.actor.strategy, config.critic.strategy) == ("fsdp", "megatron")


@pytest.mark.parametrize(
    ("overrides", "name"),
    [
        (["model_engine=megatron"], "ppo_trainer"),
        ([], "ppo_megatron_trainer"),
        ([], "ppo_megatron_trainer.yaml"),
    ],
)
def test_model_engine_and_the_megatron_config_name_select_megatron_for_every_role(overrides, name):
    config = load_config(overrides, config_name=name)
    arr = config.actor_rollout_ref
    assert (arr.actor.strategy, arr.ref.strategy, config.critic.strategy) == ("megatron",) * 3


def test_model_engine_dp_keeps_fsdp():
    config = load_config(["model_engine=dp"])
    assert config.actor_rollout_ref.actor.strategy == config.critic.strategy == "fsdp"


def test_the_command_line_resolves_a_relative_config_path_as_hydra_does(capsys):
    # `--config-path=config` is relative to main_ppo's module; --cfg validates before Hydra starts
    argv = ["--config-path=config", "--config-name=ppo_megatron_trainer.yaml", "--cfg", "job"]
    # the preset's built-in model: the embedded default's sizes are chosen
    assert prepare_argv(argv, "ppo_trainer", CONFIG_DIR) == [*argv, "~generated", "preset=embedded"]


@pytest.mark.parametrize("script", sorted(SCRIPTS.glob("*.sh")), ids=lambda p: p.stem)
def test_verls_megatron_launch_lines_load_and_validate(script):
    config, overrides = load_script(script)
    arr = config.actor_rollout_ref
    assert arr.actor.strategy == arr.ref.strategy == "megatron"
    for section in (arr.actor.megatron, arr.ref.megatron):
        assert (section.tensor_model_parallel_size, section.pipeline_model_parallel_size) == (2, 2)
    if config.use_critic:  # the PPO line leaves the critic's sizes unset: they follow the actor's
        assert config.critic.strategy == "megatron"
        assert config.critic.megatron.tensor_model_parallel_size == 2
    notes = log_config_notes(config, "cuda", overrides)
    assert all("megatron" not in n for n in notes if "no effect" in n)


def test_sft_engine_megatron_is_accepted_and_refuses_what_the_engine_lacks():
    assert load_sft_config(["engine=fsdp", "optim=fsdp"]).engine.strategy == "fsdp"
    config = load_sft_config(["engine=megatron", "optim=megatron", "engine.tensor_model_parallel_size=2"])
    assert config.engine.strategy == "megatron" and config.engine.model_parallel_size() == 2
    with pytest.raises(ConfigError, match=r"engine\.context_parallel_size"):
        load_sft_config(["engine=megatron", "engine.context_parallel_size=2"])


def test_lora_on_megatron_is_accepted_and_refuses_what_the_engine_lacks():
    from verl.config.megatron import megatron_lora_targets

    megatron = "actor_rollout_ref.actor.strategy=megatron"
    config = load_config([megatron, "actor_rollout_ref.model.lora_rank=8"])
    assert config.actor_rollout_ref.model.lora_rank == 8
    # verl's Megatron LoRA line: the nested section, megatron's names mapped onto the engine's targets
    nested = [
        "actor_rollout_ref.model.lora.rank=8",
        "actor_rollout_ref.model.lora.target_modules=[linear_qkv,linear_fc2]",
    ]
    model = load_config([megatron, *nested]).actor_rollout_ref.model
    assert megatron_lora_targets(model.target_modules, "k") == ("linear_qkv", "linear_fc2")
    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.model\.lora_adapter_path: expected null"):
        load_config([megatron, "actor_rollout_ref.model.lora_adapter_path=/tmp/adapter"])
    with pytest.raises(
        ConfigError, match=r"actor_rollout_ref\.model\.target_modules: .*fuses them in linear_qkv"
    ):
        load_config(
            [
                megatron,
                "actor_rollout_ref.model.lora_rank=8",
                "actor_rollout_ref.model.target_modules=[q_proj]",
            ]
        )
    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.model\.exclude_modules: expected null"):
        load_config(
            [
                megatron,
                "actor_rollout_ref.model.lora_rank=8",
                "actor_rollout_ref.model.exclude_modules=[o_proj]",
            ]
        )
