"""verl's spellings: accepted with verl's meaning, converted, refused with a message, or noted
as inert, never silently dropped (verl/config/compat.py)."""

from __future__ import annotations

import logging

import pytest

from tests.trainer.config import main_ppo_in_process
from verl.config.base import ConfigError
from verl.config.compat import refuse_recipe_only_keys
from verl.config.notes import log_config_notes
from verl.config.ppo_trainer import load_config
from verl.trainer.main_ppo import run_ppo


@pytest.mark.parametrize(
    "override, expected",
    [
        ("trainer.logger=console", ["console"]),
        ("trainer.logger=[console,file]", ["console", "file"]),
        ("trainer.logger=['console','file']", ["console", "file"]),
        ('trainer.logger=["console"]', ["console"]),
    ],
)
def test_logger_is_a_name_or_a_list(override, expected):
    assert load_config([override]).trainer.logger == expected


def test_an_unknown_logger_is_named():
    with pytest.raises(ConfigError, match=r"trainer\.logger.*'consle'"):
        load_config(["trainer.logger=consle"])


# ---------------------------------------------------------------------------- +key=value
def test_plus_on_a_known_key_sets_it():
    config = load_config(
        ["+actor_rollout_ref.model.path=/models/x", "+trainer.use_legacy_worker_impl=disable"]
    )
    assert config.actor_rollout_ref.model.path == "/models/x"
    assert config.trainer.use_legacy_worker_impl == "disable"


def test_plus_into_a_free_form_dict_adds_the_entry():
    config = load_config(
        ["+reward_model.reward_kwargs.max_resp_len=8", "+actor_rollout_ref.rollout.engine_kwargs.x=1"]
    )
    assert config.reward_model.reward_kwargs == {"max_resp_len": 8}
    assert config.actor_rollout_ref.rollout.engine_kwargs == {"x": 1}


@pytest.mark.parametrize(
    "key", ["trainer.no_such_key", "actor_rollout_ref.actor.fsdp_config.mixed_precision.x"]
)
def test_plus_on_an_unknown_key_is_an_error_naming_it(key):
    with pytest.raises(ConfigError, match=key.split(".mixed")[0].replace(".", r"\.")):
        load_config([f"+{key}=1"])


# ---------------------------------------------------------------------------- conversions
def test_global_micro_batch_sizes_are_divided_over_the_ranks():
    config = load_config(
        [
            "trainer.n_gpus_per_node=2",
            "trainer.nnodes=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size=16",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size=8",
            "actor_rollout_ref.ref.log_prob_micro_batch_size=4",
            "critic.ppo_micro_batch_size=32",
        ]
    )
    arr = config.actor_rollout_ref
    assert arr.actor.ppo_micro_batch_size_per_gpu == 4  # 16 // 4 ranks; not multiplied by rollout.n
    assert arr.rollout.log_prob_micro_batch_size_per_gpu == 2
    assert arr.ref.log_prob_micro_batch_size_per_gpu == 1
    assert config.critic.ppo_micro_batch_size_per_gpu == config.critic.forward_micro_batch_size_per_gpu == 8


def test_a_global_micro_batch_smaller_than_the_ranks_is_refused():
    with pytest.raises(
        ConfigError, match=r"actor_rollout_ref\.actor\.ppo_micro_batch_size: expected at least the 4"
    ):
        load_config(["trainer.n_gpus_per_node=4", "actor_rollout_ref.actor.ppo_micro_batch_size=2"])


def test_conversions_are_noted(caplog):
    with caplog.at_level("WARNING"):
        load_config(["trainer.n_gpus_per_node=2", "actor_rollout_ref.actor.ppo_micro_batch_size=8"])
    assert "ppo_micro_batch_size_per_gpu=4 (8 // 2 ranks, replacing 256)" in caplog.text


def test_the_verl_09_reward_block_lands_on_the_keys_read_here(tmp_path):
    scorer = tmp_path / "score.py"
    scorer.write_text(
        "def my_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n"
    )
    config = load_config(
        [
            "reward.num_workers=3",
            "reward.reward_manager.name=dapo",
            f"reward.custom_reward_function.path={scorer}",
            "reward.custom_reward_function.name=my_score",
            "+reward.reward_kwargs.max_resp_len=4",
        ]
    )
    assert config.reward_model.scoring.num_workers == 3
    assert config.reward_model.reward_manager == "dapo"
    assert config.custom_reward_function.path == str(scorer)
    assert config.custom_reward_function.name == "my_score"
    assert config.reward_model.reward_kwargs == {"max_resp_len": 4}


def test_the_verl_08_reward_model_num_workers_sizes_the_scoring_pool():
    assert load_config(["reward_model.num_workers=2"]).reward_model.scoring.num_workers == 2


def test_both_spellings_with_different_values_are_an_error():
    with pytest.raises(
        ConfigError, match=r"reward\.reward_manager\.name.*reward_model\.reward_manager='batch'"
    ):
        load_config(["reward.reward_manager.name=dapo", "reward_model.reward_manager=batch"])
    with pytest.raises(ConfigError, match=r"reward_model\.num_workers"):
        load_config(["reward.num_workers=2", "reward_model.num_workers=3"])


def test_dapo_overlong_buffer_cfg_in_reward_kwargs_is_converted():
    config = load_config(
        [
            "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
            "+reward_model.reward_kwargs.overlong_buffer_cfg.len=2",
            "+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0",
            "+reward_model.reward_kwargs.max_resp_len=4",
        ]
    )
    buffer = config.reward_model.overlong_buffer
    assert (buffer.enable, buffer.len, buffer.penalty_factor) == (True, 2, 1.0)
    assert config.reward_model.reward_kwargs == {"max_resp_len": 4}
    with pytest.raises(ConfigError, match=r"overlong_buffer_cfg\.lenn"):
        load_config(["+reward_model.reward_kwargs.overlong_buffer_cfg.lenn=2"])


# ---------------------------------------------------------------------------- refusals
def test_a_reward_model_gets_the_chat_messages_verl_always_carries(caplog):
    with caplog.at_level(logging.WARNING, logger="verl.config.ppo_trainer"):
        assert load_config(["reward_model.enable=True", "data.return_raw_chat=False"]).data.return_raw_chat
    assert any("data.return_raw_chat=False -> True" in r.getMessage() for r in caplog.records)
    with pytest.raises(ConfigError, match=r"reward_model\.nnodes: expected a positive integer"):
        load_config(
            [
                "reward_model.enable=True",
                "data.return_raw_chat=True",
                "reward_model.enable_resource_pool=True",
            ]
        )


def test_verl_0_9_reward_model_keys_are_converted():
    config = load_config(
        [
            "reward.reward_model.enable=True",
            "reward.reward_model.model_path=/models/rm",
            "reward.reward_model.enable_resource_pool=True",
            "reward.reward_model.nnodes=1",
            "reward.reward_model.n_gpus_per_node=2",
            "data.return_raw_chat=True",
        ]
    )
    rm = config.reward_model
    assert (rm.enable, rm.model.path, rm.enable_resource_pool, rm.nnodes, rm.n_gpus_per_node) == (
        True,
        "/models/rm",
        True,
        1,
        2,
    )


def test_filter_groups_is_refused_under_main_ppo_and_points_at_the_recipe():
    config = load_config(["algorithm.filter_groups.enable=True", "algorithm.filter_groups.metric=acc"])
    with pytest.raises(ConfigError, match=r"algorithm\.filter_groups\.enable.*recipe\.dapo\.main_dapo"):
        refuse_recipe_only_keys(config)
    with pytest.raises(ConfigError, match=r"filter_groups"):  # before Ray or any worker starts
        run_ppo(config)


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "remax", "reinforce_plus_plus_baseline"])
def test_greedy_sampling_with_a_group_baseline_is_refused(estimator):
    with pytest.raises(ConfigError, match=r"rollout\.temperature.*nothing is trained"):
        load_config([f"algorithm.adv_estimator={estimator}", "actor_rollout_ref.rollout.temperature=0"])
    with pytest.raises(ConfigError, match=r"rollout\.do_sample.*identical"):
        load_config([f"algorithm.adv_estimator={estimator}", "actor_rollout_ref.rollout.do_sample=False"])


def test_greedy_sampling_without_a_group_baseline_is_allowed():
    load_config(["algorithm.adv_estimator=gae", "actor_rollout_ref.rollout.temperature=0"])


def test_model_dtype_is_checked():
    assert (
        load_config(["critic.model.fsdp_config.model_dtype=bf16"]).critic.model.fsdp_config.model_dtype
        == "bf16"
    )
    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.ref\.fsdp_config\.model_dtype"):
        load_config(["actor_rollout_ref.ref.fsdp_config.model_dtype=int8"])


# ---------------------------------------------------------------------------- inert keys
def test_inert_keys_are_listed_on_every_device():
    overrides = [
        "actor_rollout_ref.model.use_fused_kernels=True",
        "actor_rollout_ref.actor.fsdp_config.fsdp_size=8",
        "trainer.use_legacy_worker_impl=disable",
        "reward_model.rollout.gpu_memory_utilization=0.3",
    ]
    config = load_config(overrides)
    for device in ("cpu", "cuda"):
        (note,) = [n for n in log_config_notes(config, device, overrides) if "no effect" in n]
        for override in overrides:
            assert override.split("=")[0] in note


GPU_ONLY = [
    "actor_rollout_ref.model.use_liger=True",
    "actor_rollout_ref.actor.fsdp_config.param_offload=True",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=True",
    "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "critic.model.fsdp_config.optimizer_offload=True",
]
CPU_ONLY = [  # on CUDA the fused log-prob kernel computes the entropy: nothing to chunk or recompute
    "actor_rollout_ref.actor.entropy_from_logits_with_chunking=True",
    "actor_rollout_ref.actor.entropy_from_logits_chunk_size=512",
    "actor_rollout_ref.actor.entropy_checkpointing=True",
]


@pytest.mark.parametrize(
    "overrides, inert_on, effective_on", [(GPU_ONLY, "cpu", "cuda"), (CPU_ONLY, "cuda", "cpu")]
)
def test_device_only_keys_are_listed_on_the_other_device_only(overrides, inert_on, effective_on):
    config = load_config(overrides)
    (note,) = [n for n in log_config_notes(config, inert_on, overrides) if "no effect" in n]
    for override in overrides:
        assert override.split("=")[0] in note
    assert not [n for n in log_config_notes(config, effective_on, overrides) if "no effect" in n]


# ---------------------------------------------------------------------------- --cfg job
@pytest.mark.parametrize(
    "args, message",
    [
        (["data.train_batch_size=0"], "data.train_batch_size: expected a positive integer"),
        (
            ["algorithm.filter_groups.enable=True", "algorithm.filter_groups.metric=acc"],
            "recipe.dapo.main_dapo",
        ),
    ],
)
def test_cfg_job_validates_values(args, message, monkeypatch, capsys):
    with pytest.raises(SystemExit) as exit_:
        main_ppo_in_process.print_config(monkeypatch, *args)
    out = capsys.readouterr()
    assert exit_.value.code == 1, out.out[-500:]
    assert message in out.err


def test_cfg_job_accepts_plus_on_a_known_key_and_a_bare_logger(monkeypatch, capsys):
    main_ppo_in_process.print_config(
        monkeypatch, "+actor_rollout_ref.model.torch_dtype=bfloat16", "trainer.logger=console"
    )
    assert "torch_dtype: bfloat16" in capsys.readouterr().out
