"""KL estimators, controllers and the in-reward KL penalty on hand-computed values."""

import math

import pytest
import torch
from torch.testing import assert_close

from verl.algorithms.kl import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    get_kl_controller,
    kl_penalty,
)
from verl.config.algorithm import AlgorithmConfig, KLControlConfig
from verl.config.base import ConfigError
from verl.protocol import DataProto

LOGP = torch.tensor([0.0, -1.0])
REF = torch.tensor([math.log(2.0), -0.5])  # log_r = logp - ref = [-ln 2, -0.5]


@pytest.mark.parametrize("name", ["kl", "k1"])
def test_k1(name):
    assert_close(kl_penalty(LOGP, REF, name), torch.tensor([-math.log(2.0), -0.5]))


def test_abs():
    assert_close(kl_penalty(LOGP, REF, "abs"), torch.tensor([math.log(2.0), 0.5]))


@pytest.mark.parametrize("name", ["mse", "k2", "k2+", "mse+"])
def test_k2(name):
    assert_close(kl_penalty(LOGP, REF, name), torch.tensor([0.5 * math.log(2.0) ** 2, 0.125]))


@pytest.mark.parametrize("name", ["low_var_kl", "k3"])
def test_k3(name):
    # exp(ref - logp) - (ref - logp) - 1: exp(ln 2) - ln 2 - 1, exp(0.5) - 0.5 - 1
    expected = torch.tensor([1.0 - math.log(2.0), math.exp(0.5) - 1.5])
    assert_close(kl_penalty(LOGP, REF, name), expected)


def test_k3_clamps_log_ratio_and_value():
    # ref - logp = 30 is clamped to 20 before exp; e^20 - 21 is then clamped to 10.
    assert kl_penalty(torch.tensor([0.0]), torch.tensor([30.0]), "k3").item() == 10.0
    # ref - logp = -30 -> clamped to -20: e^-20 + 20 - 1 -> clamped to 10 as well.
    assert kl_penalty(torch.tensor([30.0]), torch.tensor([0.0]), "k3").item() == 10.0


@pytest.mark.parametrize("name, base", [("k3+", "k3"), ("k1+", "k1"), ("low_var_kl+", "low_var_kl")])
def test_straight_through_keeps_value_and_takes_k2_gradient(name, base):
    logp = LOGP.clone().requires_grad_(True)
    value = kl_penalty(logp, REF, name)
    assert_close(value.detach(), kl_penalty(LOGP, REF, base))
    value.sum().backward()
    # d/dlogp of 0.5 * (logp - ref)^2 is logp - ref.
    assert_close(logp.grad, LOGP - REF)


def test_plain_k3_gradient_differs_from_k2():
    logp = LOGP.clone().requires_grad_(True)
    kl_penalty(logp, REF, "k3").sum().backward()
    # d/dlogp [exp(ref - logp) - (ref - logp) - 1] = 1 - exp(ref - logp)
    assert_close(logp.grad, 1 - torch.exp(REF - LOGP))


@pytest.mark.parametrize("name", ["nope", "full"])
def test_unknown_or_unsupported_estimator(name):
    with pytest.raises(ValueError, match=name):
        kl_penalty(LOGP, REF, name)


def test_config_validation_checks_kl_names():
    AlgorithmConfig(kl_penalty="k3+").validate("algorithm")
    with pytest.raises(ConfigError, match=r"algorithm.kl_penalty"):
        AlgorithmConfig(kl_penalty="k4").validate("algorithm")
    with pytest.raises(ConfigError, match=r"algorithm.kl_ctrl.type"):
        AlgorithmConfig(kl_ctrl=KLControlConfig(type="pid")).validate("algorithm")
    with pytest.raises(ConfigError, match=r"algorithm.kl_ctrl.horizon"):
        AlgorithmConfig(kl_ctrl=KLControlConfig(type="adaptive", horizon=0)).validate("algorithm")


# ----------------------------------------------------------------------------- controllers
def test_fixed_controller_never_moves():
    ctrl = get_kl_controller(KLControlConfig(type="fixed", kl_coef=0.3))
    assert isinstance(ctrl, FixedKLController)
    ctrl.update(current_kl=5.0, n_steps=100)
    assert ctrl.value == 0.3


def test_adaptive_controller_update_rule():
    ctrl = get_kl_controller(KLControlConfig(type="adaptive", kl_coef=0.1, target_kl=0.1, horizon=100))
    assert isinstance(ctrl, AdaptiveKLController)
    # KL twice the target: error 1 clipped to 0.2 -> beta *= 1 + 0.2 * 10 / 100.
    ctrl.update(current_kl=0.2, n_steps=10)
    assert ctrl.value == pytest.approx(0.1 * 1.02)
    # KL 10% under the target: error -0.1 -> beta *= 1 - 0.1 * 10 / 100.
    ctrl.update(current_kl=0.09, n_steps=10)
    assert ctrl.value == pytest.approx(0.1 * 1.02 * 0.99)


def test_controller_state_round_trip():
    config = KLControlConfig(type="adaptive", kl_coef=0.1, target_kl=0.1, horizon=100)
    ctrl = get_kl_controller(config)
    ctrl.update(current_kl=1.0, n_steps=50)
    restored = get_kl_controller(config)
    assert restored.value == 0.1
    restored.load_state_dict(ctrl.state_dict())
    assert restored.value == ctrl.value == pytest.approx(0.11)


def test_get_kl_controller_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"algorithm.kl_ctrl.type"):
        get_kl_controller(KLControlConfig(type="pid"))
    with pytest.raises(ConfigError, match=r"algorithm.kl_ctrl.horizon"):
        get_kl_controller(KLControlConfig(type="adaptive", horizon=0))


# ----------------------------------------------------------------------------- in-reward penalty
def test_apply_kl_penalty_writes_rewards_and_updates_controller():
    scores = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    old = torch.tensor([[-1.0, -1.0, -9.0], [-2.0, -2.0, -2.0]])
    ref = torch.tensor([[-1.5, -2.0, 0.0], [-1.0, -2.0, -2.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    data = DataProto.from_dict(
        {"token_level_scores": scores, "old_log_probs": old, "ref_log_prob": ref, "response_mask": mask}
    )
    ctrl = AdaptiveKLController(init_kl_coef=0.5, target_kl=1.0, horizon=20)
    data, metrics = apply_kl_penalty(data, ctrl, kl_penalty="kl")
    # k1 = old - ref, zeroed on padding: [[0.5, 1, 0], [-1, 0, 0]].
    kld = torch.tensor([[0.5, 1.0, 0.0], [-1.0, 0.0, 0.0]])
    assert_close(data.batch["token_level_rewards"], scores - 0.5 * kld)
    # per-row token means 1.5/2 and -1/3, batch mean (0.75 - 1/3) / 2
    current_kl = (0.75 - 1 / 3) / 2
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(current_kl)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.5
    # error clip(current_kl / 1 - 1) = -0.2, n_steps = 2 rows -> beta *= 1 - 0.2 * 2 / 20
    assert ctrl.value == pytest.approx(0.5 * 0.98)
