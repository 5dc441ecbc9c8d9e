"""``verl.trainer.ppo.core_algos`` answers verl's calls: verl's signatures (positional or keyword),
``AdvantageEstimator`` and its registry, ``compute_advantage(data, adv_estimator, ...)``, and the
older ``compute_policy_loss``."""

from __future__ import annotations

import inspect
import math
import warnings
from enum import Enum
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from torch.testing import assert_close

from tests.trainer.ppo.verl_reference import cases
from verl.config.actor import ActorConfig
from verl.config.algorithm import AlgorithmConfig
from verl.config.base import ConfigError
from verl.config.ppo_trainer import load_config
from verl.protocol import DataProto
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.core_algos import (
    ADV_ESTIMATOR_REGISTRY,
    AdvantageEstimator,
    compute_advantage,
    get_adv_estimator_fn,
    register_adv_est,
)

RECORDED = Path(__file__).parent / "verl_reference" / "verl091_outputs.pt"
UIDS = cases.index("pairs")  # grpo_passk needs two responses per group
_GROUP = "token_level_rewards, response_mask, index, epsilon=1e-06, config=None, **kwargs"
_GRPO = "token_level_rewards, response_mask, index, epsilon=1e-06, norm_adv_by_std_in_grpo=True, config=None"
_OTB = (
    "token_level_rewards, response_mask, index, old_log_probs, sum_pi_squared, rollout_is_weights=None, "
    "handle_zero_tail=True, epsilon=1e-08"
)
# verl's parameter lists (names, order, defaults). Where verl's HEAD and 0.9.1 differ we follow
# 0.9.1, the parity target: optimal_token_baseline's handle_zero_tail defaults to True there.
VERL_SIGNATURES = {
    "compute_gae_advantage_return": "token_level_rewards, values, response_mask, gamma, lam",
    "compute_grpo_outcome_advantage": _GRPO,
    "compute_grpo_vectorized_outcome_advantage": _GRPO,
    "compute_grpo_passk_outcome_advantage": _GRPO + ", **kwargs",
    "compute_gdpo_outcome_advantage": _GRPO + ", non_tensor_batch=None, batch=None, **kwargs",
    "compute_reinforce_plus_plus_baseline_outcome_advantage": _GROUP,
    "compute_rloo_outcome_advantage": _GROUP,
    "compute_rloo_vectorized_outcome_advantage": _GROUP,
    "compute_opo_outcome_advantage": _GROUP,
    "compute_gpg_outcome_advantage": (
        "token_level_rewards, response_mask, index, epsilon=1e-06, f_norm=1.0, alpha=1.0, config=None, **kwargs"
    ),
    "compute_reinforce_plus_plus_outcome_advantage": "token_level_rewards, response_mask, config=None, **kwargs",
    "compute_remax_outcome_advantage": "token_level_rewards, reward_baselines, response_mask, config=None, **kwargs",
    "compute_optimal_token_baseline_advantage": _OTB,
    "compute_multi_turn_optimal_token_baseline_advantage": _OTB,
    "compute_advantage": (
        "data, adv_estimator, gamma=1.0, lam=1.0, num_repeat=1, norm_adv_by_std_in_grpo=True, config=None"
    ),
    "compute_policy_loss": (
        "old_log_prob, log_prob, advantages, response_mask, cliprange=None, cliprange_low=None, "
        "cliprange_high=None, clip_ratio_c=3.0, loss_agg_mode='token-mean'"
    ),
    "compute_rewards": "token_level_scores, old_log_prob, ref_log_prob, kl_ratio",
    "kl_penalty": "logprob, ref_logprob, kl_penalty",
    "kl_penalty_forward": "logprob, ref_logprob, kl_penalty",
    "agg_loss": (
        "loss_mat, loss_mask, loss_agg_mode, dp_size=1, batch_num_tokens=None, global_batch_size=None, "
        "loss_scale_factor=None"
    ),
    "compute_entropy_loss": "logits, response_mask, loss_agg_mode='token-mean'",
    "compute_pf_ppo_reweight_data": "data, reweight_method='pow', weight_pow=2.0",
    "get_kl_controller": "kl_ctrl",
    "AdaptiveKLController": "init_kl_coef, target_kl, horizon",
    "FixedKLController": "kl_coef",
    "register_adv_est": "name_or_enum",
    "get_adv_estimator_fn": "name_or_enum",
    "register_policy_loss": "name",
    "get_policy_loss_fn": "name",
}
POLICY_LOSS_PARAMS = [
    "log_prob",
    "advantages",
    "response_mask",
    "loss_agg_mode",
    "config",
    "rollout_is_weights",
]


def rendered(fn) -> str:
    parts = []
    for p in inspect.signature(fn).parameters.values():
        if p.kind is p.VAR_KEYWORD:
            parts.append(f"**{p.name}")
        else:
            parts.append(p.name if p.default is p.empty else f"{p.name}={p.default!r}")
    return ", ".join(parts)


# ----------------------------------------------------------------------------- signatures
@pytest.mark.parametrize("name", sorted(VERL_SIGNATURES))
def test_each_public_function_has_verls_parameters(name):
    assert rendered(getattr(core_algos, name)) == VERL_SIGNATURES[name]


def test_the_value_loss_starts_with_verls_parameters_and_only_adds_keyword_defaults():
    params = rendered(core_algos.compute_value_loss)
    assert params.startswith(
        "vpreds, returns, values, response_mask, cliprange_value, loss_agg_mode='token-mean'"
    )


@pytest.mark.parametrize("name", sorted(core_algos.POLICY_LOSS_REGISTRY))
def test_every_registered_policy_loss_takes_verls_seven_arguments_in_order(name):
    names = list(inspect.signature(core_algos.get_policy_loss_fn(name)).parameters)
    assert names[0] in ("old_log_prob", "rollout_log_prob") and names[1:] == POLICY_LOSS_PARAMS


# ----------------------------------------------------------------------------- AdvantageEstimator
def test_advantage_estimator_lists_verls_0_9_1_estimators():
    recorded = torch.load(RECORDED, weights_only=True)["meta"]["adv_estimators"]
    assert sorted(member.value for member in AdvantageEstimator) == sorted(recorded)
    assert AdvantageEstimator.GRPO == "grpo" and isinstance(AdvantageEstimator.GAE, str)


def test_built_in_estimators_are_stored_under_strings_and_found_by_string_or_enum():
    assert all(type(key) is str for key in ADV_ESTIMATOR_REGISTRY)
    for member in AdvantageEstimator:
        assert get_adv_estimator_fn(member) is get_adv_estimator_fn(member.value) is not None


class _Names(str, Enum):
    MINE = "test_enum_registered_estimator"


def _estimator_a(token_level_rewards, response_mask, **kwargs):
    return token_level_rewards, token_level_rewards


def _estimator_b(token_level_rewards, response_mask, **kwargs):
    return response_mask, response_mask


def test_registering_under_an_enum_member_stores_its_string_value():
    try:
        register_adv_est(_Names.MINE)(_estimator_a)
        key = next(k for k in ADV_ESTIMATOR_REGISTRY if k == _Names.MINE.value)
        assert type(key) is str
        assert get_adv_estimator_fn("test_enum_registered_estimator") is _estimator_a
        assert get_adv_estimator_fn(_Names.MINE) is _estimator_a
        # the string and the member are one name: another function under the string is refused
        with pytest.raises(ValueError, match="already registered"):
            register_adv_est("test_enum_registered_estimator")(_estimator_b)
    finally:
        ADV_ESTIMATOR_REGISTRY.pop(_Names.MINE.value, None)


def test_registering_a_built_in_enum_member_again_with_another_function_is_refused():
    with pytest.raises(ValueError, match="'grpo' is already registered"):
        register_adv_est(AdvantageEstimator.GRPO)(_estimator_a)
    # the same function again is accepted (re-imports)
    register_adv_est(AdvantageEstimator.GRPO)(core_algos.compute_grpo_outcome_advantage)


def test_an_unknown_name_lists_the_registered_ones():
    with pytest.raises(ValueError, match=r"unknown advantage estimator 'nope'.*'gae'"):
        get_adv_estimator_fn("nope")


# ----------------------------------------------------------------------------- positional == keyword
def verl_positional_call(name: str, x: dict, config: AlgorithmConfig, columns: dict) -> tuple:
    """The estimator called as verl's code calls it: positionally, settings as arguments."""
    fn, r, m, idx = get_adv_estimator_fn(name), x["token_level_rewards"].clone(), x["response_mask"], UIDS
    norm = config.norm_adv_by_std_in_grpo
    calls = {
        "gae": lambda: fn(r, x["values"], m, config.gamma, config.lam),
        "grpo": lambda: fn(r, m, idx, 1e-6, norm),
        "grpo_vectorized": lambda: fn(r, m, idx, 1e-6, norm),
        "grpo_passk": lambda: fn(r, m, idx, 1e-6, norm, config),
        "gdpo": lambda: fn(r, m, idx, 1e-6, norm, config, columns),
        "reinforce_plus_plus_baseline": lambda: fn(r, m, idx, 1e-6, config),
        "rloo": lambda: fn(r, m, idx, 1e-6, config),
        "rloo_vectorized": lambda: fn(r, m, idx, 1e-6, config),
        "opo": lambda: fn(r, m, idx, 1e-6, config),
        "gpg": lambda: fn(r, m, idx, 1e-6, 1.0, 1.0, config),
        "reinforce_plus_plus": lambda: fn(r, m, config),
        "remax": lambda: fn(r, x["reward_baselines"], m, config),
        "optimal_token_baseline": lambda: fn(r, m, idx, x["old_log_probs"], x["sum_pi_squared"], None, True),
        "tir_optimal_token_baseline": lambda: fn(r, m, idx, x["old_log_probs"], x["sum_pi_squared"]),
    }
    return calls[name]()


def keyword_call_through_compute_advantage(name: str, x: dict, config: AlgorithmConfig, columns: dict):
    keys = ("token_level_rewards", "response_mask", "values", "reward_baselines", "old_log_probs")
    tensors = {k: x[k].clone() for k in (*keys, "sum_pi_squared")}
    data = DataProto.from_dict(tensors, {"uid": UIDS, **columns})
    out = compute_advantage(
        data,
        name,
        gamma=config.gamma,
        lam=config.lam,
        norm_adv_by_std_in_grpo=config.norm_adv_by_std_in_grpo,
        config=config,
    )
    return out.batch["advantages"], out.batch["returns"]


@pytest.mark.parametrize("norm", [True, False], ids=["std", "no_std"])
@pytest.mark.parametrize("name", [m.value for m in AdvantageEstimator])
def test_each_estimator_called_with_verls_positional_arguments_equals_the_trainers_keyword_call(name, norm):
    x = cases.make_inputs()
    columns = {k: x[k].numpy().astype(np.float32) for k in cases.GDPO_KEYS}
    config = AlgorithmConfig(
        gamma=0.9, lam=0.8, norm_adv_by_std_in_grpo=norm, gdpo_reward_keys=cases.GDPO_KEYS
    )
    positional = verl_positional_call(name, x, config, columns)
    keyword = keyword_call_through_compute_advantage(name, x, config, columns)
    assert positional[0].abs().sum() > 0  # a real comparison, not of two zero tensors
    assert_close(positional[0], keyword[0], rtol=1e-6, atol=1e-6)
    assert_close(positional[1], keyword[1], rtol=1e-6, atol=1e-6)


def test_grpo_takes_the_std_flag_from_its_argument_and_pass_at_k_from_the_config():
    x = cases.make_inputs()
    r, m = x["token_level_rewards"], x["response_mask"]
    with_std = core_algos.compute_grpo_outcome_advantage(r.clone(), m, UIDS)[0]
    without = core_algos.compute_grpo_outcome_advantage(r.clone(), m, UIDS, norm_adv_by_std_in_grpo=False)[0]
    assert not torch.allclose(with_std, without)
    passk = core_algos.compute_grpo_passk_outcome_advantage
    off = AlgorithmConfig(norm_adv_by_std_in_grpo=False)
    assert_close(passk(r.clone(), m, UIDS, config=off)[0], passk(r.clone(), m, UIDS, 1e-6, False)[0])
    assert not torch.allclose(passk(r.clone(), m, UIDS, config=off)[0], passk(r.clone(), m, UIDS)[0])


def test_reinforce_plus_plus_without_a_config_says_what_it_needs():
    with pytest.raises(ValueError, match=r"config .*gamma"):
        core_algos.compute_reinforce_plus_plus_outcome_advantage(torch.ones(1, 2), torch.ones(1, 2))


# ----------------------------------------------------------------------------- custom estimators
@pytest.fixture
def my_est():
    """A verl-style estimator (no ``**kwargs``) registered for one test."""
    seen = {}

    @register_adv_est("my_est")
    def my_estimator(token_level_rewards, response_mask, index, config=None):
        seen.update(index=index, config=config)
        advantages = 10.0 * token_level_rewards.sum(-1, keepdim=True) * response_mask
        return advantages, -advantages

    yield seen
    ADV_ESTIMATOR_REGISTRY.pop("my_est")


def test_a_registered_estimator_is_picked_by_its_name_in_the_config_and_run_by_compute_advantage(my_est):
    algo = load_config(["algorithm.adv_estimator=my_est"]).algorithm
    assert algo.adv_estimator == "my_est"
    rewards = torch.tensor([[0.0, 1.0], [2.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    data = DataProto.from_dict({"token_level_rewards": rewards, "response_mask": mask}, {"uid": ["a", "a"]})
    compute_advantage(data, algo.adv_estimator, algo.gamma, algo.lam, 1, algo.norm_adv_by_std_in_grpo, algo)
    assert_close(data.batch["advantages"], torch.tensor([[10.0, 10.0], [20.0, 0.0]]))
    assert_close(data.batch["returns"], -data.batch["advantages"])
    assert my_est["config"] is algo and list(my_est["index"]) == ["a", "a"]


def test_an_unregistered_estimator_name_is_refused_naming_the_key():
    with pytest.raises(
        ConfigError, match=r"algorithm\.adv_estimator: expected one of .*got 'my_unknown_est'"
    ):
        load_config(["algorithm.adv_estimator=my_unknown_est"])


# ----------------------------------------------------------------------------- compute_advantage
def test_compute_advantage_takes_the_enum_and_gaes_gamma_and_lam_as_arguments():
    x = cases.make_inputs()
    data = DataProto.from_dict({k: x[k].clone() for k in ("token_level_rewards", "response_mask", "values")})
    compute_advantage(data, AdvantageEstimator.GAE, gamma=0.5, lam=0.7)
    expected = core_algos.compute_gae_advantage_return(
        x["token_level_rewards"], x["values"], x["response_mask"], 0.5, 0.7
    )
    assert_close(data.batch["advantages"], expected[0])
    assert_close(data.batch["returns"], expected[1])


def test_compute_advantage_derives_a_missing_response_mask_from_the_attention_mask():
    rewards = torch.tensor([[0.0, 1.0, 0.0], [3.0, 0.0, 0.0]])
    attention = torch.tensor([[1, 1, 1, 1, 0], [0, 1, 1, 0, 0]])  # 2 prompt + 3 response columns
    data = DataProto.from_dict(
        {
            "token_level_rewards": rewards,
            "responses": torch.zeros(2, 3, dtype=torch.long),
            "attention_mask": attention,
        },
        {"uid": ["a", "a"]},
    )
    compute_advantage(data, "grpo", norm_adv_by_std_in_grpo=False)
    assert_close(data.batch["response_mask"], attention[:, 2:])
    assert_close(data.batch["advantages"], torch.tensor([[-1.0, -1.0, 0.0], [1.0, 0.0, 0.0]]))


def test_compute_advantage_given_the_config_where_the_estimator_goes_says_how_to_call_it():
    data = DataProto.from_dict({"token_level_rewards": torch.ones(1, 2), "response_mask": torch.ones(1, 2)})
    with pytest.raises(
        TypeError, match=r"adv_estimator must be an estimator name, got AlgorithmConfig.*config="
    ):
        compute_advantage(data, AlgorithmConfig(adv_estimator="grpo"))


# ----------------------------------------------------------------------------- compute_policy_loss
RATIOS = torch.tensor([[1.5, 0.5, 1.1, 4.0, 9.0]])
ADVANTAGES = torch.tensor([[1.0, -1.0, 1.0, -1.0, 5.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])  # the last token is padding


def test_compute_policy_loss_is_the_dual_clip_ppo_loss_on_hand_computed_values():
    old, new = torch.zeros_like(RATIOS), RATIOS.log()
    with pytest.warns(FutureWarning, match="compute_policy_loss_vanilla"):
        loss, clipfrac, ppo_kl, clipfrac_lower = core_algos.compute_policy_loss(
            old, new, ADVANTAGES, MASK, cliprange=0.2, clip_ratio_c=3.0
        )
    # per token: max(-A r, -A clip(r, 0.8, 1.2)) = -1.2, 0.8, -1.1, 4.0; the last one (A < 0) is
    # capped by the dual clip at -A * 3 = 3.0. Token-mean over the 4 valid tokens.
    assert_close(loss, torch.tensor((-1.2 + 0.8 - 1.1 + 3.0) / 4))
    assert_close(clipfrac, torch.tensor(0.5))  # tokens 0 and 1 are clipped
    assert_close(clipfrac_lower, torch.tensor(0.25))  # token 3 hits the dual clip
    assert_close(ppo_kl, -torch.log(torch.tensor([1.5, 0.5, 1.1, 4.0])).mean())


def test_compute_policy_loss_equals_the_vanilla_loss_with_the_same_clip_settings():
    old, new = torch.zeros_like(RATIOS), RATIOS.log()
    config = ActorConfig(clip_ratio=0.2, clip_ratio_low=0.1, clip_ratio_high=0.3, clip_ratio_c=2.5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        old_api = core_algos.compute_policy_loss(
            old, new, ADVANTAGES, MASK, 0.2, 0.1, 0.3, 2.5, "seq-mean-token-sum"
        )
    loss, metrics = core_algos.compute_policy_loss_vanilla(
        old, new, ADVANTAGES, MASK, "seq-mean-token-sum", config
    )
    assert_close(old_api[0], loss)
    assert old_api[1].item() == pytest.approx(metrics["actor/pg_clipfrac"])
    assert old_api[2].item() == pytest.approx(metrics["actor/ppo_kl"])
    assert old_api[3].item() == pytest.approx(metrics["actor/pg_clipfrac_lower"])
    # the low clip of 0.1 binds token 1 (ratio 0.5, A < 0): 0.9 instead of the symmetric 0.8
    assert_close(loss, torch.tensor(-1.3 + 0.9 - 1.1 + 2.5))


def test_compute_policy_loss_without_a_clip_range_says_so():
    with pytest.raises(ValueError, match="cliprange"), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        core_algos.compute_policy_loss(
            torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1)
        )


def test_a_ratio_loss_without_its_actor_config_says_so():
    with pytest.raises(ValueError, match="needs config"):
        core_algos.compute_policy_loss_vanilla(
            torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1)
        )


# ----------------------------------------------------------------------------- KL helpers
def test_compute_rewards_subtracts_the_k1_kl_times_the_ratio():
    scores, old, ref = torch.tensor([[1.0, 0.0]]), torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]])
    assert_close(core_algos.compute_rewards(scores, old, ref, 0.1), torch.tensor([[1.0 - 0.05, 0.1]]))


def test_kl_penalty_forward_is_the_value_of_kl_penalty_and_ignores_the_straight_through_suffix():
    logp, ref = torch.tensor([-1.0, -0.2]), torch.tensor([-0.5, -0.9])
    k3 = torch.exp(ref - logp) - (ref - logp) - 1
    assert_close(core_algos.kl_penalty_forward(logp, ref, "k3"), k3)
    assert_close(core_algos.kl_penalty_forward(logp, ref, "k3+"), k3)
    assert_close(core_algos.kl_penalty(logp, ref, "k3+"), k3)


def test_get_kl_controller_takes_verls_omegaconf_node_as_well_as_our_config():
    node = OmegaConf.create({"type": "adaptive", "kl_coef": 0.2, "target_kl": 0.1, "horizon": 100})
    controller = core_algos.get_kl_controller(node)
    assert isinstance(controller, core_algos.AdaptiveKLController) and controller.value == 0.2
    controller.update(current_kl=0.2, n_steps=10)  # error clipped at 0.2: 0.2 * (1 + 0.2 * 10 / 100)
    assert controller.value == pytest.approx(0.2 * 1.02)
    fixed = core_algos.get_kl_controller(SimpleNamespace(type="fixed", kl_coef=0.3))
    assert isinstance(fixed, core_algos.FixedKLController) and fixed.value == 0.3
    with pytest.raises(ValueError, match=r"kl_ctrl\.type.*'pid'"):
        core_algos.get_kl_controller(SimpleNamespace(type="pid", kl_coef=0.3))
    assert math.isclose(core_algos.get_kl_controller(AlgorithmConfig().kl_ctrl).value, 0.001)
