"""The policy losses verl 0.9.1 added, on small hand-computed cases."""

import math

import pytest
import torch
from torch.testing import assert_close

from verl.algorithms.policy_losses import get_policy_loss_fn
from verl.config.actor import ActorConfig
from verl.config.algorithm import PolicyLossConfig, RolloutCorrectionConfig


def call(name, old, logp, adv, mask, mode="token-mean", **config):
    policy = PolicyLossConfig(loss_mode=name, dro_beta=config.pop("dro_beta", None))
    logp = logp.clone().requires_grad_(True)
    loss, metrics = get_policy_loss_fn(name)(
        old, logp, adv, mask, mode, ActorConfig(policy_loss=policy, **config)
    )
    loss.backward()
    return loss.detach(), metrics, logp.grad


def test_sapo_gate_is_the_policy_gradient_on_policy():
    old = torch.zeros(1, 2)
    adv = torch.tensor([[1.0, -2.0]])
    loss, _, grad = call("sapo", old, old, adv, torch.ones(1, 2), tau_pos=1.0, tau_neg=2.0)
    # f(1) = sigmoid(0) * 4 / tau = 2 / tau: L = -(2 * 1 + 1 * -2) / 2 = 0; f'(1) = 1: dL/dlogp = -A / 2
    assert_close(loss, torch.tensor(0.0))
    assert_close(grad, torch.tensor([[-0.5, 1.0]]))


def test_dppo_tv_drops_tokens_that_moved_too_far():
    old = torch.log(torch.tensor([[0.5, 0.5, 0.5]]))
    logp = torch.log(torch.tensor([[0.6, 0.8, 0.2]]))
    adv = torch.tensor([[1.0, 1.0, -1.0]])
    loss, metrics, grad = call(
        "dppo_tv", old, logp, adv, torch.ones(1, 3), clip_ratio_low=0.2, clip_ratio_high=0.2
    )
    # p - p_old = 0.1 (kept), 0.3 > 0.2 with A > 0 (dropped), -0.3 < -0.2 with A < 0 (dropped)
    assert_close(loss, torch.tensor(-1.2 * math.log(0.6) / 3))
    assert_close(grad, torch.tensor([[-1.2 / 3, 0.0, 0.0]]))
    assert metrics["actor/pg_clipfrac"] == pytest.approx(2 / 3)


def test_dro_adds_a_quadratic_pull_to_the_old_policy():
    old = torch.zeros(1, 2)
    logp = torch.tensor([[-1.0, 0.5]])
    adv = torch.tensor([[2.0, 0.0]])
    loss, _, grad = call("dro", old, logp, adv, torch.ones(1, 2), dro_beta=0.5)
    # L = -(A logp - 0.25 logp^2): token 0: 2 + 0.25, token 1: 0.0625
    assert_close(loss, torch.tensor((2.25 + 0.0625) / 2))
    assert_close(grad, torch.tensor([[(-2 - 0.5) / 2, 0.25 / 2]]))
    with pytest.raises(ValueError, match="dro_beta"):
        call("dro", old, logp, adv, torch.ones(1, 2))


def test_bypass_reinforce_weights_by_the_current_policy():
    rollout = torch.zeros(1, 2)
    logp = torch.log(torch.tensor([[3.0, 0.5]]))  # rho = 3 (truncated to 2), 0.5
    adv = torch.tensor([[1.0, 1.0]])
    policy = PolicyLossConfig(loss_mode="bypass_mode")
    policy.rollout_correction = RolloutCorrectionConfig(loss_type="reinforce", rollout_is="token")
    logp.requires_grad_(True)
    fn = get_policy_loss_fn("bypass_mode")
    loss, metrics = fn(rollout, logp, adv, torch.ones(1, 2), "token-mean", ActorConfig(policy_loss=policy))
    loss.backward()
    assert_close(loss, -(2 * math.log(3.0) + 0.5 * math.log(0.5)) / 2 * torch.ones(()))
    assert_close(logp.grad, torch.tensor([[-1.0, -0.25]]))  # the weights carry no gradient
    assert "rollout_corr/rollout_is_mean" in metrics
