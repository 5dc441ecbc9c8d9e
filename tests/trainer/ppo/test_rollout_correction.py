"""algorithm.rollout_correction.*: the driver writes weights and the rejection mask, the actor
applies the weights to every loss, and the config names a wrong key."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from verl.algorithms.actor_loss import compute_actor_loss
from verl.algorithms.advantages import compute_advantage
from verl.config.actor import ActorConfig
from verl.config.algorithm import AlgorithmConfig, PolicyLossConfig, RolloutCorrectionConfig
from verl.config.base import ConfigError
from verl.protocol import DataProto

MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
OLD = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]])
ROLLOUT = OLD - torch.tensor(
    [[0.0, math.log(3.0), 0.0], [0.1, -0.1, 0.0]]
)  # token ratios [1, 3, 1], [e^.1, e^-.1]


def batch() -> DataProto:
    data = DataProto.from_dict(
        {
            "response_mask": MASK.clone(),
            "old_log_probs": OLD.clone(),
            "rollout_log_probs": ROLLOUT.clone(),
            "token_level_rewards": torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.5, 0.0]]),
        }
    )
    data.non_tensor_batch["uid"] = np.array(["a", "a"], dtype=object)
    return data


def algorithm(**correction) -> AlgorithmConfig:
    return AlgorithmConfig(adv_estimator="grpo", rollout_correction=RolloutCorrectionConfig(**correction))


def test_compute_advantage_writes_truncated_token_weights():
    data = compute_advantage(batch(), "grpo", config=algorithm(rollout_is="token", rollout_is_threshold=2.0))
    expected = torch.tensor([[1.0, 2.0, 1.0], [math.exp(0.1), math.exp(-0.1), 0.0]])
    assert_close(data.batch["rollout_is_weights"], expected)
    assert data.meta_info["rollout_corr_metrics"]["rollout_corr/rollout_is_mean"] == pytest.approx(
        expected.sum().item() / 5
    )


def test_compute_advantage_rejects_before_the_advantages():
    data = compute_advantage(
        batch(), "grpo", config=algorithm(rollout_rs="token_k2", rollout_rs_threshold=0.1)
    )
    assert "rollout_is_weights" not in data.batch.keys()
    assert_close(data.batch["response_mask"], torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]]))
    assert data.batch["advantages"][0, 1] == 0  # the rejected token gets no advantage either


def test_disabled_correction_leaves_the_batch_alone():
    data = compute_advantage(batch(), "grpo", config=algorithm())
    assert "rollout_is_weights" not in data.batch.keys() and "rollout_corr_metrics" not in data.meta_info
    assert_close(data.batch["response_mask"], MASK)


def test_bypass_mode_trains_against_the_rollout_log_probs():
    data = compute_advantage(batch(), "grpo", config=algorithm(bypass_mode=True))
    assert_close(data.batch["old_log_probs"], ROLLOUT)


def test_correction_needs_rollout_log_probs():
    data = batch()
    data.batch.pop("rollout_log_probs")
    with pytest.raises(ValueError, match="calculate_log_probs"):
        compute_advantage(data, "grpo", config=algorithm(rollout_is="sequence"))


def micro(**extra) -> dict[str, torch.Tensor]:
    return {"old_log_probs": OLD, "advantages": torch.ones(2, 3), "response_mask": MASK, **extra}


def test_actor_applies_the_driver_weights_to_any_loss():
    weights = torch.tensor([[2.0, 2.0, 2.0], [2.0, 2.0, 0.0]])
    for mode in ("vanilla", "cispo", "gpg"):
        config = ActorConfig(policy_loss=PolicyLossConfig(loss_mode=mode))
        plain, _ = compute_actor_loss(OLD, None, micro(), config)
        weighted, _ = compute_actor_loss(OLD, None, micro(rollout_is_weights=weights), config)
        assert_close(weighted, 2 * plain)


def test_legacy_tis_cap_applies_to_any_loss():
    for mode in ("vanilla", "gspo", "gpg"):
        config = ActorConfig(tis_imp_ratio_cap=2.0, policy_loss=PolicyLossConfig(loss_mode=mode))
        plain, _ = compute_actor_loss(OLD, None, micro(), config)
        capped, metrics = compute_actor_loss(OLD, None, micro(rollout_log_probs=OLD - math.log(4.0)), config)
        assert_close(capped, 2 * plain)  # min(4, 2) on every token
        assert metrics["actor/tis_clipfrac"] == 1.0


def test_both_weightings_at_once_are_refused():
    config = ActorConfig(tis_imp_ratio_cap=2.0)
    with pytest.raises(ValueError, match="tis_imp_ratio_cap"):
        compute_actor_loss(
            OLD, None, micro(rollout_is_weights=torch.ones(2, 3), rollout_log_probs=OLD), config
        )


@pytest.mark.parametrize(
    "settings, key",
    [
        ({"rollout_is": "tokens"}, "rollout_is"),
        ({"rollout_is_threshold": "2_1"}, "rollout_is_threshold"),
        ({"rollout_rs": "token_k4", "rollout_rs_threshold": 1.0}, "rollout_rs"),
        ({"rollout_rs": "token_k2,seq_max_k3", "rollout_rs_threshold": "1,2,3"}, "rollout_rs_threshold"),
        ({"rollout_rs": "token_k1"}, "rollout_rs_threshold"),
        ({"loss_type": "ppo"}, "loss_type"),
    ],
)
def test_invalid_settings_name_the_key(settings, key):
    with pytest.raises(ConfigError, match=rf"algorithm\.rollout_correction\.{key}:"):
        algorithm(**settings).validate("algorithm")


def test_bypass_mode_loss_reads_its_settings_from_the_policy_loss_config():
    from verl.algorithms.policy_losses import get_policy_loss_fn

    config = SimpleNamespace(policy_loss=SimpleNamespace())
    with pytest.raises(ValueError, match="rollout_correction"):
        get_policy_loss_fn("bypass_mode")(OLD, OLD, torch.ones(2, 3), MASK, "token-mean", config)


def test_the_actor_worker_carries_the_rollout_weights():
    from verl.workers.actor_rollout_ref import ACTOR_LOSS_KEYS

    assert "rollout_is_weights" in ACTOR_LOSS_KEYS


BYPASS_REINFORCE = {
    "bypass_mode": True,
    "rollout_is": "token",
    "rollout_is_threshold": 2.0,
    "loss_type": "reinforce",
}


def test_bypass_mode_weights_come_from_the_current_policy_inside_the_actor_loss():
    """Bypass with token weights and REINFORCE: the driver only swaps in the rollout's log-probs;
    the actor's loss is ``-A * min(pi / pi_rollout, 2) * log pi`` with pi the current policy."""
    data = compute_advantage(batch(), "grpo", config=algorithm(**BYPASS_REINFORCE))
    assert "rollout_is_weights" not in data.batch.keys()
    assert_close(data.batch["old_log_probs"], ROLLOUT)

    config = ActorConfig(
        policy_loss=PolicyLossConfig(rollout_correction=RolloutCorrectionConfig(**BYPASS_REINFORCE))
    )
    log_prob = OLD.clone().requires_grad_(
        True
    )  # current policy: ratios to the rollout [1, 3, 1], [e^.1, e^-.1]
    loss, _ = compute_actor_loss(log_prob, None, micro(old_log_probs=ROLLOUT), config)
    weights = torch.tensor([[1.0, 2.0, 1.0], [math.exp(0.1), math.exp(-0.1), 0.0]])
    assert_close(loss, -(weights * OLD * MASK).sum() / MASK.sum())
    loss.backward()
    assert_close(log_prob.grad, -weights * MASK / MASK.sum())  # the weights carry no gradient


def test_bypass_mode_rejection_masks_tokens_inside_the_actor_loss():
    settings = {"bypass_mode": True, "rollout_rs": "token_k2", "rollout_rs_threshold": 0.1}
    config = ActorConfig(policy_loss=PolicyLossConfig(rollout_correction=RolloutCorrectionConfig(**settings)))
    kept = ActorConfig()
    loss, _ = compute_actor_loss(OLD, None, micro(old_log_probs=ROLLOUT), config)
    rejected_mask = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]])  # k2 of log 3 is over 0.1
    plain, _ = compute_actor_loss(OLD, None, micro(old_log_probs=ROLLOUT, response_mask=rejected_mask), kept)
    assert_close(loss, plain)


def test_the_config_copies_the_correction_into_the_actor_and_guards_it():
    from verl.config.ppo_trainer import load_config

    base = ["actor_rollout_ref.rollout.calculate_log_probs=True"]
    keys = [f"algorithm.rollout_correction.{k}={v}" for k, v in BYPASS_REINFORCE.items()]
    config = load_config(base + keys)
    assert (
        config.actor_rollout_ref.actor.policy_loss.rollout_correction == config.algorithm.rollout_correction
    )
    assert config.actor_rollout_ref.actor.policy_loss.rollout_correction.loss_type == "reinforce"
    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.actor\.policy_loss\.loss_mode"):
        load_config(base + keys + ["actor_rollout_ref.actor.policy_loss.loss_mode=gspo"])
    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.rollout\.calculate_log_probs"):
        load_config(keys)
    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.actor\.policy_loss\.rollout_correction"):
        load_config([*base, "actor_rollout_ref.actor.policy_loss.rollout_correction.rollout_is=token"])
