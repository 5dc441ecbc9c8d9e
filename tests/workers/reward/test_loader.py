from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from tests.utils.dataset.char_tokenizer import make_char_tokenizer
from tests.workers.reward import scorers
from tests.workers.reward.helpers import make_batch
from verl.config.base import ConfigError
from verl.config.data import DataConfig
from verl.config.reward import CustomRewardFunctionConfig, RewardModelConfig
from verl.utils.reward_score.scorer_process import ScorerLoadError
from verl.workers.reward_manager import (
    BatchRewardManager,
    DAPORewardManager,
    NaiveRewardManager,
    RewardManager,
    load_reward_manager,
    register_reward_manager,
)


def make_config(**reward_model):
    rm = RewardModelConfig(**reward_model)
    rm.scoring.num_workers = 0
    return SimpleNamespace(
        data=DataConfig(), reward_model=rm, custom_reward_function=CustomRewardFunctionConfig()
    )


@pytest.fixture(scope="module")
def tok():
    return make_char_tokenizer()


def test_default_is_naive_with_builtin_scorers(tok):
    manager = load_reward_manager(make_config(), tok)
    assert type(manager) is NaiveRewardManager and manager.spec.kind == "default"
    assert manager.reward_fn_key == "data_source"


def test_batch_gets_the_vectorised_default(tok):
    manager = load_reward_manager(make_config(reward_manager="batch"), tok)
    assert type(manager) is BatchRewardManager and manager.spec.kind == "default_batch"


def test_dapo_gets_length_and_buffer_from_config(tok):
    config = make_config(reward_manager="dapo")
    config.data.max_response_length = 8
    config.reward_model.overlong_buffer.enable = True
    config.reward_model.overlong_buffer.len = 4
    config.reward_model.overlong_buffer.penalty_factor = 1.0
    manager = load_reward_manager(config, tok)
    assert type(manager) is DAPORewardManager and manager.max_resp_len == 8
    data = make_batch(tok, ["1+1="], ["2222222"], ["2222222"], data_source="arith")
    assert manager(data).sum().item() == pytest.approx(0.0)  # 8 tokens: full penalty of 1.0


def test_custom_function_with_kwargs_runs_in_the_pool(tok):
    config = make_config()
    config.reward_model.scoring.num_workers = 1
    config.custom_reward_function = CustomRewardFunctionConfig(
        path=scorers.__file__, name="compute_score", reward_kwargs={"bonus": 3}
    )
    manager = load_reward_manager(config, tok)
    try:
        out = manager(make_batch(tok, ["p"], ["dict"], ["a"], data_source="anything"), return_dict=True)
    finally:
        manager.close()
    assert out["reward_extra_info"]["bonus"] == [3]
    assert out["reward_extra_info"]["score"] == [0.5]
    manager.check_data_sources({"anything": "f, row 0"})  # custom scorers accept every source


def test_bad_custom_path_or_name_fails_at_load_time(tmp_path, tok):
    config = make_config()
    config.custom_reward_function.path = str(tmp_path / "missing.py")
    with pytest.raises(ScorerLoadError, match=r"custom_reward_function.path: no such file"):
        load_reward_manager(config, tok)
    config.custom_reward_function = CustomRewardFunctionConfig(path=scorers.__file__, name="nope")
    with pytest.raises(
        ScorerLoadError, match=r"custom_reward_function.name: .* no function or class 'nope'.*compute_score"
    ):
        load_reward_manager(config, tok)


def test_unknown_manager_names_the_key(tok):
    with pytest.raises(
        ConfigError, match=r"reward_model.reward_manager: expected one of \[.*'naive'.*got 'prime_x'"
    ):
        load_reward_manager(make_config(reward_manager="prime_x"), tok)


def test_registered_manager_is_loadable(tok, monkeypatch):
    from verl.workers.reward_manager import registry

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))  # undone after the test

    @register_reward_manager("constant_for_test")
    class ConstantRewardManager(RewardManager):
        def score_responses(self, data, responses):
            from verl.workers.reward_manager import ScoreOutcome

            return [ScoreOutcome("ok", 0.75) for _ in responses]

    manager = load_reward_manager(make_config(reward_manager="constant_for_test"), tok, num_examine=1)
    assert manager(make_batch(tok, ["p"], ["x"], ["y"])).sum().item() == 0.75
    with pytest.raises(ValueError, match="already registered"):
        register_reward_manager("naive")(ConstantRewardManager)


def test_num_examine_prints_one_example_per_source(tok, capsys):
    manager = NaiveRewardManager(tok, num_examine=1)
    manager(make_batch(tok, ["1+1=", "2+2="], ["2", "4"], ["2", "4"], data_source="arith"))
    printed = capsys.readouterr().out
    assert printed.count("[prompt] ") == 1 and "[prompt] 1+1=" in printed and "[score] 1.0" in printed


def test_reward_config_validation(tmp_path):
    cfg = RewardModelConfig()
    assert (cfg.reward_manager, cfg.enable, cfg.scoring.num_workers) == ("naive", False, 1)
    cfg.validate("reward_model")
    cfg.scoring.timeout_s = 0
    with pytest.raises(ConfigError, match=r"reward_model.scoring.timeout_s"):
        cfg.validate("reward_model")
    cfg = RewardModelConfig()
    cfg.overlong_buffer.enable = True
    with pytest.raises(ConfigError, match=r"reward_model.overlong_buffer.len"):
        cfg.validate("reward_model")
    custom = CustomRewardFunctionConfig(path=str(tmp_path / "gone.py"))
    with pytest.raises(ConfigError, match=r"custom_reward_function.path: expected an existing Python file"):
        custom.validate("custom_reward_function")
    assert CustomRewardFunctionConfig().name == "compute_score"


def test_reward_configs_are_omegaconf_structured():
    cfg = OmegaConf.structured(RewardModelConfig)
    cfg.overlong_buffer.len = 16
    assert OmegaConf.to_object(cfg).overlong_buffer.len == 16
    OmegaConf.structured(CustomRewardFunctionConfig)
