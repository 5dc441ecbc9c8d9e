"""Today's verl spellings load: each is converted onto the key read here (asserted), or refused in
one line naming the key, or listed as inert (see docs/verl_compat.md, "verl's newest spellings")."""

from __future__ import annotations

import logging
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from verl.config import veomni
from verl.config.base import ConfigError
from verl.config.notes import log_config_notes
from verl.config.ppo_trainer import load_config
from verl.config.verl_extras import check_verl_extras
from verl.trainer.main_ppo import run_ppo
from verl.trainer.main_ppo_sync import check_sync_entry
from verl.workers.rollout.sglang_rollout import engine_args as sglang_engine_args
from verl.workers.rollout.vllm_rollout import VLLMRollout

ACTOR = "actor_rollout_ref.actor"
REF = "actor_rollout_ref.ref"
PACKED = "actor_rollout_ref.model.use_remove_padding=True"
TWO_RANKS = "trainer.n_gpus_per_node=2"


# ---------------------------------------------------------------- fsdp_config's Ulysses size
def test_the_actors_engine_spelling_of_ulysses_sets_the_actor_and_the_reference():
    config = load_config([PACKED, TWO_RANKS, f"{ACTOR}.fsdp_config.ulysses_sequence_parallel_size=2"])
    arr = config.actor_rollout_ref
    assert arr.actor.ulysses_sequence_parallel_size == arr.ref.ulysses_sequence_parallel_size == 2
    assert arr.ref.fsdp_config.ulysses_sequence_parallel_size == 2  # the engine spelling mirrors it


def test_the_critics_engine_spelling_of_ulysses_sets_the_critic():
    overrides = [
        "algorithm.adv_estimator=gae",
        "critic.model.use_remove_padding=True",
        TWO_RANKS,
        "critic.model.fsdp_config.ulysses_sequence_parallel_size=2",
    ]
    assert load_config(overrides).critic.ulysses_sequence_parallel_size == 2


def test_both_ulysses_spellings_with_different_sizes_are_an_error_naming_both():
    overrides = [
        PACKED,
        "trainer.n_gpus_per_node=4",
        f"{ACTOR}.ulysses_sequence_parallel_size=4",
        f"{ACTOR}.fsdp_config.ulysses_sequence_parallel_size=2",
    ]
    with pytest.raises(ConfigError) as error:
        load_config(overrides)
    message = str(error.value)
    assert message.startswith(f"{ACTOR}.fsdp_config.ulysses_sequence_parallel_size: expected the same value")
    assert f"{ACTOR}.ulysses_sequence_parallel_size=4" in message and "\n" not in message


def test_a_reference_size_apart_from_the_actors_is_still_refused():
    with pytest.raises(
        ConfigError, match=re.escape(f"{REF}.ulysses_sequence_parallel_size: expected the actor's")
    ):
        load_config([PACKED, TWO_RANKS, f"{REF}.fsdp_config.ulysses_sequence_parallel_size=2"])


def test_the_reward_models_ulysses_size_stays_refused():
    key = "reward_model.model.fsdp_config.ulysses_sequence_parallel_size"
    with pytest.raises(ConfigError, match=re.escape(key) + ".*no sequence parallelism"):
        load_config([f"{key}=2"])


# ---------------------------------------------------------------- model.lora.*
LORA = "actor_rollout_ref.model.lora"
MODEL = "actor_rollout_ref.model"


def test_the_nested_lora_section_lands_on_the_flat_keys_with_peft_module_names():
    config = load_config(
        [f"{LORA}.rank=8", f"{LORA}.alpha=64", f"{LORA}.target_modules=[linear_qkv,linear_fc2]"]
    )
    model = config.actor_rollout_ref.model
    assert (model.lora_rank, model.lora_alpha) == (8, 64)
    assert model.target_modules == ["q_proj", "k_proj", "v_proj", "down_proj"]
    assert config.verl_extras == {}  # converted keys leave verl_extras (so they are not listed as inert)


def test_the_sections_rank_alone_brings_its_default_alpha_and_every_linear_layer():
    model = load_config([f"{LORA}.rank=8", f"{LORA}.adapter_path=/tmp/adapter"]).actor_rollout_ref.model
    assert (model.lora_rank, model.lora_alpha, model.target_modules) == (8, 32, "all-linear")
    assert model.lora_adapter_path == "/tmp/adapter"


def test_a_flat_key_set_on_its_own_is_kept_beside_the_sections_rank():
    model = load_config([f"{LORA}.rank=8", f"{MODEL}.lora_alpha=8"]).actor_rollout_ref.model
    assert (model.lora_rank, model.lora_alpha) == (8, 8)


@pytest.mark.parametrize(
    ("nested", "flat"),
    [
        ("rank=8", "lora_rank=16"),
        ("alpha=64", "lora_alpha=8"),
        ("target_modules=[linear_qkv]", "target_modules=[o_proj]"),
    ],
)
def test_a_lora_value_set_both_ways_apart_is_an_error_naming_both_keys(nested, flat):
    with pytest.raises(ConfigError) as error:
        load_config([f"{LORA}.rank=8", f"{LORA}.{nested}", f"{MODEL}.{flat}"])
    message = str(error.value)
    assert message.startswith(
        f"{LORA}.{nested.split('=')[0]}: expected the same value as {MODEL}.{flat.split('=')[0]}="
    )
    assert "\n" not in message


@pytest.mark.parametrize(
    ("given", "reason"),
    [
        ("type=dora", "only plain LoRA"),
        ("dropout=0.1", "without dropout"),
        ("lora_B_init_method=xavier", "B starts at zero"),
        ("dtype=bf16", "the model's dtype"),
        ("freeze_vision_model=false", "vision models"),
        ("target_modules=[*.layers.0.*.linear_qkv]", "patterns over Megatron's module paths"),
    ],
)
def test_what_the_lora_section_has_no_counterpart_for_is_refused_in_one_line(given, reason):
    key = f"{LORA}.{given.split('=')[0]}"
    with pytest.raises(ConfigError, match=re.escape(reason)) as error:
        load_config([f"{LORA}.rank=8", f"{LORA}.{given}"])
    assert str(error.value).startswith(key) and "\n" not in str(error.value)


def test_the_critics_lora_section_is_refused():
    with pytest.raises(ConfigError, match=r"^critic\.model\.lora\.rank=8: LoRA for the critic"):
        load_config(["critic.model.lora.rank=8"])


def test_lora_implementation_knobs_are_listed_as_inert():
    overrides = [f"{LORA}.rank=8", f"{LORA}.dropout_position=post", f"{LORA}.a2a_experimental=true"]
    config = load_config(overrides)
    (note,) = [n for n in log_config_notes(config, "cpu", overrides) if "no effect" in n]
    assert f"{LORA}.dropout_position" in note and f"{LORA}.a2a_experimental" in note
    assert f"{LORA}.rank" not in note


@pytest.mark.parametrize("name", ["hf", "vllm", "sglang"])
@pytest.mark.parametrize("load_format", ["auto", "dummy_dtensor"])
def test_merge_is_accepted_exactly_where_the_rollout_receives_merged_weights(name, load_format):
    from verl.workers.rollout.engine_rollout import syncs_lora_adapter

    base = load_config([f"{LORA}.rank=8", f"actor_rollout_ref.rollout.load_format={load_format}"])
    base.actor_rollout_ref.rollout.name = name  # sglang refuses a CPU machine at validation
    adapter_alone = syncs_lora_adapter(base.actor_rollout_ref.rollout, base.actor_rollout_ref.model)
    base.verl_extras = {"actor_rollout_ref": {"model": {"lora": {"merge": True}}}}
    if adapter_alone:
        with pytest.raises(
            ConfigError, match=re.escape(f"{LORA}.merge: expected False with rollout.name={name}")
        ):
            check_verl_extras(base)
    else:
        assert check_verl_extras(base) == [
            f"{LORA}.merge=True: the rollout receives the merged weights with "
            f"rollout.name={name}, rollout.load_format={load_format}"
        ]


def test_a_verl_key_given_twice_takes_the_later_value_as_any_key_does():
    config = load_config(["global_profiler.tool=nsys", "global_profiler.tool=torch"])
    assert config.verl_extras == {"global_profiler": {"tool": "torch"}}


# ---------------------------------------------------------------- model_engine=veomni
VEOMNI = "model_engine=veomni"
CRITIC = "critic"


def test_model_engine_veomni_trains_every_role_with_fsdp2_and_says_so_once(caplog):
    with caplog.at_level(logging.WARNING, logger="verl.config.ppo_trainer"):
        config = load_config([VEOMNI, "algorithm.adv_estimator=gae"])
    arr = config.actor_rollout_ref
    assert (arr.actor.strategy, arr.ref.strategy, config.critic.strategy) == ("fsdp2",) * 3
    assert arr.actor.optim.lr_scheduler_type == config.critic.optim.lr_scheduler_type == "cosine"  # verl's
    (note,) = [r.getMessage() for r in caplog.records if "model_engine=veomni" in r.getMessage()]
    assert "strategy=fsdp2" in note and "FSDP2" in note


def test_strategy_veomni_on_one_role_moves_that_role_only():
    config = load_config(["algorithm.adv_estimator=gae", f"{CRITIC}.strategy=veomni"])
    assert (config.actor_rollout_ref.actor.strategy, config.critic.strategy) == ("fsdp", "fsdp2")


def test_veomni_keys_with_a_counterpart_land_on_it_and_the_reference_follows_the_actor():
    config = load_config(
        [
            VEOMNI,
            PACKED,
            TWO_RANKS,
            f"{ACTOR}.veomni.param_offload=true",
            f"{ACTOR}.veomni.optimizer_offload=true",
            f"{ACTOR}.veomni.enable_full_shard=false",
            f"{ACTOR}.veomni.mixed_precision=false",
            f"{ACTOR}.veomni.ulysses_parallel_size=2",
            f"{ACTOR}.optim.lr_min=3e-5",
        ]
    )
    actor, ref = config.actor_rollout_ref.actor, config.actor_rollout_ref.ref
    assert actor.fsdp_config.param_offload and actor.fsdp_config.optimizer_offload
    assert not actor.fsdp_config.reshard_after_forward and actor.fsdp_config.model_dtype == "bf16"
    assert actor.ulysses_sequence_parallel_size == ref.ulysses_sequence_parallel_size == 2
    assert ref.fsdp_config.param_offload  # verl's veomni_ref.yaml takes the actor's
    assert actor.optim.min_lr_ratio == pytest.approx(3e-5 / actor.optim.lr)
    assert config.verl_extras == {}


def test_the_critics_veomni_keys_land_on_the_critics():
    overrides = [
        VEOMNI,
        "algorithm.adv_estimator=gae",
        "critic.model.use_remove_padding=True",
        TWO_RANKS,
        f"{CRITIC}.veomni.ulysses_parallel_size=2",
        f"{CRITIC}.veomni.param_offload=true",
    ]
    critic = load_config(overrides).critic
    assert critic.ulysses_sequence_parallel_size == 2 and critic.model.fsdp_config.param_offload


@pytest.mark.parametrize(
    ("given", "reason", "default"),
    [
        (f"{ACTOR}.veomni.expert_parallel_size=2", "expert parallelism is not implemented", "1"),
        (f"{REF}.veomni.router_replay.mode=R2", "router replay is not implemented", "'disabled'"),
        (f"{CRITIC}.veomni.qat_implementation=fp8", "quantization-aware training", "'none'"),
        (f"{ACTOR}.optim.lr_start=1e-7", "warmup starts from the cosine floor", "0.0"),
        (f"{CRITIC}.optim.lr_decay_ratio=0.5", "decays over all steps after warmup", "1.0"),
    ],
)
def test_what_veomni_has_and_this_engine_lacks_is_one_line_naming_key_reason_and_default(
    given, reason, default
):
    key = given.split("=")[0]
    with pytest.raises(ConfigError) as error:
        load_config([VEOMNI, "algorithm.adv_estimator=gae", given])
    message = str(error.value)
    assert message.startswith(f"{key}=") and reason in message and f"verl's default ({default})" in message
    assert "\n" not in message


def test_veomni_implementation_knobs_are_listed_as_inert():
    knobs = [
        f"{ACTOR}.veomni.attn_implementation=sdpa",
        f"{ACTOR}.veomni.init_device=cpu",
        f"{REF}.veomni.seed=1",
    ]
    config = load_config([VEOMNI, *knobs])
    (note,) = [n for n in log_config_notes(config, "cuda", [VEOMNI, *knobs]) if "no effect" in n]
    assert all(knob.split("=")[0] in note for knob in knobs)


def test_a_veomni_value_set_both_ways_apart_is_an_error_naming_both_keys():
    overrides = [VEOMNI, f"{ACTOR}.veomni.mixed_precision=false", f"{ACTOR}.fsdp_config.model_dtype=fp32"]
    with pytest.raises(ConfigError) as error:
        load_config(overrides)
    assert str(error.value) == (
        f"{ACTOR}.veomni.mixed_precision: expected the same value as {ACTOR}.fsdp_config.model_dtype='fp32' "
        "(both spellings are set), got False"
    )


def test_under_another_engine_the_veomni_keys_are_inert_not_converted():
    overrides = [f"{ACTOR}.veomni.param_offload=true", f"{ACTOR}.veomni.expert_parallel_size=4"]
    config = load_config(overrides)
    assert not config.actor_rollout_ref.actor.fsdp_config.param_offload
    (note,) = [n for n in log_config_notes(config, "cuda", overrides) if "no effect" in n]
    assert f"{ACTOR}.veomni.param_offload" in note and f"{ACTOR}.veomni.expert_parallel_size" in note


def test_every_veomni_field_has_one_decision_and_a_row_in_the_docs():
    decided = [*veomni.CONVERTED, *veomni.REFUSED, *veomni.INERT]
    assert sorted(decided) == sorted(veomni.FIELD_DEFAULTS)
    docs = (Path(__file__).resolve().parents[3] / "docs" / "verl_compat.md").read_text()
    names = [*decided, *(f"optim.{name}" for name in veomni.OPTIM_DEFAULTS)]
    missing = [n for n in names if f"`{n}`" not in docs]
    assert not missing, f"docs/verl_compat.md's VeOmni table lacks {missing}"


@pytest.mark.usefixtures("ray_session", "builtin_assets")
def test_the_embedded_default_trains_a_step_with_model_engine_veomni():
    overrides = [
        VEOMNI,
        "trainer.total_training_steps=1",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.logger=[console]",
        "data.train_batch_size=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.rollout.n=2",
    ]
    metrics = run_ppo(load_config(overrides), overrides)
    assert metrics["training/global_step"] == 1
    assert math.isfinite(metrics["actor/grad_norm"]) and metrics["actor/grad_norm"] > 0


def test_the_veomni_optimizers_spelling_of_adamw_is_adamw():
    overrides = [f"{ACTOR}.optim.optimizer=adamw", f"{ACTOR}.optim.override_optimizer_config={{}}"]
    config = load_config(overrides)
    (note,) = [n for n in log_config_notes(config, "cpu", overrides) if "no effect" in n]
    assert f"{ACTOR}.optim.optimizer" in note


# ---------------------------------------------------------------- python -m verl.trainer.main_ppo_sync
def test_the_sync_entry_accepts_what_main_ppo_runs_synchronously():
    check_sync_entry(load_config([VEOMNI]))  # trainer.mode=sync is the default


def test_the_sync_entry_refuses_the_asynchronous_mode_in_one_line_naming_itself():
    run = subprocess.run(
        [sys.executable, "-m", "verl.trainer.main_ppo_sync", "trainer.mode=async"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parents[3],
    )
    assert run.returncode == 1
    assert run.stderr.strip().splitlines()[-1] == (
        "Error in the config: trainer.mode: expected sync under verl.trainer.main_ppo_sync (for the "
        "asynchronous trainer run python -m verl.trainer.main_ppo trainer.mode=async), got 'async'"
    )


# ---------------------------------------------------------------- rollout.engine_kwargs.*
ROLLOUT = "actor_rollout_ref.rollout"


def test_sglang_engine_kwargs_reach_the_engine_constructor_over_the_derived_arguments():
    overrides = [
        f"+{ROLLOUT}.engine_kwargs.sglang.attention_backend=fa3",
        f"+{ROLLOUT}.engine_kwargs.sglang.mem_fraction_static=0.5",
        f"+{ROLLOUT}.engine_kwargs.sglang.log_level=null",
    ]
    rollout = load_config(overrides).actor_rollout_ref.rollout
    args = sglang_engine_args(rollout, "/models/m", seed=1, trust_remote_code=False, port=30000)
    assert args["attention_backend"] == "fa3" and args["mem_fraction_static"] == 0.5
    assert args["log_level"] == "warning"  # null: the rollout's own choice stays


def test_vllm_engine_kwargs_reach_the_engine_constructor_and_a_null_is_dropped():
    overrides = [
        f"+{ROLLOUT}.engine_kwargs.vllm.swap_space=4",
        f"+{ROLLOUT}.engine_kwargs.vllm.max_model_len=null",
    ]
    rollout = object.__new__(VLLMRollout)  # the arguments alone: building the engine needs vLLM
    rollout.config = load_config(overrides).actor_rollout_ref.rollout
    rollout.device, rollout.seed, rollout.lora, rollout.tp = torch.device("cuda"), 3, None, None
    rollout.dummy_weights = True
    args = rollout.engine_args("/models/m", trust_remote_code=False)
    assert args["swap_space"] == 4 and args["max_model_len"] == 12  # prompt + response length
    assert (args["seed"], args["load_format"]) == (3, "dummy")


@pytest.mark.parametrize(("name", "other"), [("vllm", "sglang"), ("sglang", "vllm"), ("hf", "vllm")])
def test_another_engines_kwargs_are_listed_as_inert(name, other):
    overrides = [
        f"{ROLLOUT}.name={name}",
        f"+{ROLLOUT}.engine_kwargs.{other}.x=1",
        f"+{ROLLOUT}.engine_kwargs.trtllm.y=2",
    ]
    config = load_config(overrides[1:])
    config.actor_rollout_ref.rollout.name = name  # sglang refuses a machine without CUDA at validation
    (note,) = [n for n in log_config_notes(config, "cuda", overrides) if "no effect" in n]
    assert f"{ROLLOUT}.engine_kwargs.{other}.x" in note and f"{ROLLOUT}.engine_kwargs.trtllm.y" in note


def test_engine_kwargs_need_no_plus_as_in_verls_scripts():
    """verl's gpt-oss line sets ``engine_kwargs.sglang.attention_backend=triton`` without ``+``: a key
    inside a free-form dict of the schema is added (or replaced) whether or not the dict has it."""
    config = load_config(
        [
            "actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend=triton",
            "actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=4",
            "actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=8",  # the later value wins
        ]
    )
    kwargs = config.actor_rollout_ref.rollout.engine_kwargs
    assert kwargs["sglang"] == {"attention_backend": "triton"} and kwargs["vllm"] == {"swap_space": 8}
