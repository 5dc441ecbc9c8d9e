"""Multi-turn samples: tool tokens sit inside the response with response_mask 0. Every policy
loss then ignores them (whatever their log-probs and advantages are), and every estimator gives
them no advantage."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from verl.algorithms.actor_loss import compute_actor_loss
from verl.algorithms.advantages import compute_advantage
from verl.algorithms.policy_losses import POLICY_LOSS_REGISTRY
from verl.config.actor import ActorConfig
from verl.config.algorithm import AlgorithmConfig
from verl.protocol import DataProto

# two responses: model tokens, a tool turn (0s), model tokens again, then padding
MASK = torch.tensor([[1, 1, 0, 0, 0, 1, 1, 0], [1, 0, 0, 1, 1, 1, 0, 0]], dtype=torch.float32)
TOOL = torch.tensor([[0, 0, 1, 1, 1, 0, 0, 0], [0, 1, 1, 0, 0, 0, 0, 0]], dtype=torch.bool)
LOSS_MODES = sorted(POLICY_LOSS_REGISTRY)


def micro(tool_values: float | None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Log-probs and the loss inputs; ``tool_values`` overwrites every tool-token entry."""
    g = torch.Generator().manual_seed(0)
    log_prob = -torch.rand(MASK.shape, generator=g)
    batch = {
        "response_mask": MASK.clone(),
        "old_log_probs": log_prob - 0.1 * torch.rand(MASK.shape, generator=g),
        "advantages": torch.randn(MASK.shape, generator=g),
        "ref_log_prob": log_prob - 0.2,
        "rollout_log_probs": log_prob - 0.05,
    }
    if tool_values is not None:
        log_prob = log_prob.masked_fill(TOOL, tool_values)
        batch = {
            k: (v if k == "response_mask" else v.masked_fill(TOOL, tool_values)) for k, v in batch.items()
        }
    return log_prob, batch


@pytest.mark.parametrize("loss_mode", LOSS_MODES)
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_tool_tokens_change_no_policy_loss(loss_mode, agg):
    config = ActorConfig(loss_agg_mode=agg, use_kl_loss=True, kl_loss_coef=0.1)
    config.policy_loss.loss_mode = loss_mode
    config.policy_loss.dro_beta = 0.1  # dro's own setting (no default)
    reference, _ = compute_actor_loss(*_args(micro(None)), config)
    for garbage in (-30.0, 5.0):
        loss, _ = compute_actor_loss(*_args(micro(garbage)), config)
        torch.testing.assert_close(loss, reference)
    log_prob, batch = micro(None)
    log_prob.requires_grad_(True)
    loss, _ = compute_actor_loss(log_prob, None, batch, config)
    loss.backward()
    assert (log_prob.grad[TOOL] == 0).all() and log_prob.grad[MASK.bool()].abs().sum() > 0


def _args(pair):
    log_prob, batch = pair
    return log_prob, None, batch


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"])
def test_estimators_give_tool_tokens_no_advantage(estimator):
    rewards = torch.zeros(MASK.shape)
    rewards[0, 6], rewards[1, 5] = 1.0, 0.25  # the outcome reward sits on the last model token
    data = DataProto.from_dict({"response_mask": MASK.clone(), "token_level_rewards": rewards})
    data.non_tensor_batch["uid"] = np.array(["a", "a"], dtype=object)
    out = compute_advantage(data, estimator, config=AlgorithmConfig())
    advantages = out.batch["advantages"]
    assert (advantages[TOOL] == 0).all()
    # the model tokens before the tool turn get the return of the whole trajectory (carried across)
    assert advantages[0, 0] != 0 and advantages[1, 0] != 0
