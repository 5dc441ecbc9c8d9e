"""The composed actor and critic losses of one micro-batch."""

import math
from types import SimpleNamespace

import pytest
import torch
from torch.testing import assert_close

from verl.algorithms import policy_losses
from verl.algorithms.actor_loss import compute_actor_loss, compute_critic_loss
from verl.algorithms.policy_losses import register_policy_loss
from verl.config.algorithm import PolicyLossConfig


def actor_config(**overrides):
    fields = dict(
        clip_ratio=0.2,
        clip_ratio_low=None,
        clip_ratio_high=None,
        clip_ratio_c=3.0,
        tis_imp_ratio_cap=-1.0,
        loss_agg_mode="token-mean",
        policy_loss=PolicyLossConfig(),
        entropy_coeff=0.0,
        use_kl_loss=False,
        kl_loss_coef=0.001,
        kl_loss_type="low_var_kl",
    )
    fields.update(overrides)
    return SimpleNamespace(**fields)


# One row, two valid tokens and one padded token; ratios 1 (old == new).
LOGP = torch.tensor([[-1.0, -2.0, -5.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0]])


def micro_batch(**extra):
    batch = {
        "old_log_probs": LOGP.clone(),
        "advantages": torch.tensor([[1.0, -3.0, 9.0]]),
        "response_mask": MASK,
    }
    batch.update(extra)
    return batch


def test_policy_loss_only():
    loss, metrics = compute_actor_loss(LOGP, None, micro_batch(), actor_config())
    # ratio 1: per-token loss -A -> mean(-1, 3) = 1
    assert_close(loss, torch.tensor(1.0))
    assert metrics["actor/pg_loss"] == pytest.approx(1.0)
    assert {"actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"} <= set(metrics)
    assert "actor/kl_loss" not in metrics and "actor/entropy" not in metrics


def test_entropy_bonus_and_kl_loss_are_added():
    entropy = torch.tensor([[0.5, 1.5, 100.0]])
    ref = LOGP - torch.tensor([[0.2, -0.4, 7.0]])  # k1 = logp - ref = [0.2, -0.4]
    config = actor_config(entropy_coeff=0.1, use_kl_loss=True, kl_loss_coef=0.5, kl_loss_type="k1")
    logp = LOGP.clone().requires_grad_(True)
    loss, metrics = compute_actor_loss(logp, entropy, micro_batch(ref_log_prob=ref), config)
    # pg 1; entropy mean 1.0; kl mean -0.1 -> 1 - 0.1 * 1.0 + 0.5 * (-0.1)
    assert_close(loss, torch.tensor(1.0 - 0.1 - 0.05))
    assert metrics["actor/entropy"] == pytest.approx(1.0)
    assert metrics["actor/kl_loss"] == pytest.approx(-0.1)
    assert metrics["actor/kl_coef"] == 0.5
    loss.backward()
    # d/dlogp: -A * r / 2 from PPO plus 0.5 * 1 / 2 from k1; padding gets nothing.
    assert_close(logp.grad, torch.tensor([[-0.5 + 0.25, 1.5 + 0.25, 0.0]]))


def test_entropy_coeff_needs_entropy():
    with pytest.raises(ValueError, match="entropy_coeff"):
        compute_actor_loss(LOGP, None, micro_batch(), actor_config(entropy_coeff=0.01))


def test_kl_loss_needs_ref_log_prob():
    with pytest.raises(KeyError, match="ref_log_prob"):
        compute_actor_loss(LOGP, None, micro_batch(), actor_config(use_kl_loss=True))


def test_rollout_log_probs_apply_only_with_a_positive_cap():
    rollout = LOGP - math.log(4.0)  # exp(old - rollout) = 4
    batch = micro_batch(rollout_log_probs=rollout)
    plain, _ = compute_actor_loss(LOGP, None, batch, actor_config())
    capped, _ = compute_actor_loss(LOGP, None, batch, actor_config(tis_imp_ratio_cap=2.0))
    assert_close(plain, torch.tensor(1.0))
    assert_close(capped, torch.tensor(2.0))


def test_loss_mode_selects_a_user_registered_loss():
    @register_policy_loss("test_constant_seven")
    def constant_seven(
        old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights=None
    ):
        metrics = {"actor/pg_clipfrac": 0.0, "actor/ppo_kl": 0.0, "actor/pg_clipfrac_lower": 0.0}
        return log_prob.sum() * 0 + 7.0, metrics

    try:
        config = actor_config(policy_loss=PolicyLossConfig(loss_mode="test_constant_seven"))
        loss, metrics = compute_actor_loss(LOGP, None, micro_batch(), config)
        assert loss.item() == 7.0 and metrics["actor/pg_loss"] == 7.0
    finally:
        del policy_losses.POLICY_LOSS_REGISTRY["test_constant_seven"]


def test_critic_loss_and_metrics():
    batch = {
        "values": torch.tensor([[0.0, 2.0, 0.0]]),
        "returns": torch.tensor([[2.0, 0.0, 0.0]]),
        "response_mask": torch.tensor([[1, 1, 0]]),
    }
    vpreds = torch.tensor([[1.0, 2.0, 40.0]])
    loss, metrics = compute_critic_loss(
        vpreds, batch, SimpleNamespace(cliprange_value=0.5, loss_agg_mode="token-mean")
    )
    # clipped squared errors 2.25 and 4 (see test_core_algos): 0.5 * mean
    assert_close(loss, torch.tensor(0.5 * 6.25 / 2))
    assert metrics["critic/vf_loss"] == pytest.approx(1.5625)
    assert metrics["critic/vf_clipfrac"] == pytest.approx(0.5)
    assert metrics["critic/vpred_mean"] == pytest.approx(1.5)  # padding's 40 excluded


def test_critic_loss_names_a_missing_key():
    with pytest.raises(KeyError, match="returns"):
        compute_critic_loss(
            torch.zeros(1, 1),
            {"values": torch.zeros(1, 1), "response_mask": torch.ones(1, 1)},
            SimpleNamespace(cliprange_value=0.5, loss_agg_mode="token-mean"),
        )


def test_micro_batch_may_be_a_tensordict():
    from tensordict import TensorDict

    batch = TensorDict(micro_batch(rollout_log_probs=LOGP - math.log(4.0)), batch_size=[1])
    capped, _ = compute_actor_loss(LOGP, None, batch, actor_config(tis_imp_ratio_cap=2.0))
    assert_close(capped, torch.tensor(2.0))
    with pytest.raises(KeyError, match="ref_log_prob"):
        compute_actor_loss(LOGP, None, batch, actor_config(use_kl_loss=True))
