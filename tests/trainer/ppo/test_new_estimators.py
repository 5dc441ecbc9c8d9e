"""The estimators verl 0.9.1 added, on small hand-computed cases."""

import math

import numpy as np
import torch
from torch.testing import assert_close

from verl.algorithms.advantages import call_adv_estimator, get_adv_estimator_fn
from verl.config.algorithm import AlgorithmConfig

MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 1.0]])
REWARDS = torch.tensor([[0.0, 1.0], [3.0, 0.0], [0.0, 0.0], [2.0, 0.0]])  # scores 1, 3, 0, 2
UIDS = np.array(["a", "a", "a", "b"], dtype=object)  # "b" is a single sample


def run(name, config=None, **extra):
    """The estimator called as compute_advantage calls it."""
    config = config or AlgorithmConfig()
    return call_adv_estimator(
        get_adv_estimator_fn(name),
        token_level_rewards=REWARDS.clone(),
        response_mask=MASK,
        index=UIDS,
        config=config,
        norm_adv_by_std_in_grpo=config.norm_adv_by_std_in_grpo,
        **extra,
    )


def test_grpo_vectorized_equals_grpo():
    for norm in (True, False):
        config = AlgorithmConfig(norm_adv_by_std_in_grpo=norm)
        assert_close(run("grpo_vectorized", config)[0], run("grpo", config)[0])


def test_rloo_vectorized_gives_single_samples_zero():
    a, _ = run("rloo_vectorized")
    # group a: s_i - mean of the two others: 1 - 1.5, 3 - 0.5, 0 - 2; b alone: 0 (rloo keeps 2)
    assert_close(a[:, 0], torch.tensor([-0.5, 2.5, -2.0, 0.0]))
    assert run("rloo")[0][3, 0] == 2.0


def test_gdpo_normalises_each_reward_column_then_whitens():
    columns = {"x": np.array([1.0, 0.0, 0.0, 5.0]), "y": np.array([0.0, 0.0, 3.0, 1.0])}
    config = AlgorithmConfig(
        norm_adv_by_std_in_grpo=False, gdpo_reward_keys=["x", "y"], gdpo_reward_weights=[1, 2]
    )
    a, _ = run("gdpo", config, non_tensor_batch=columns)
    # centred per group: x -> [2/3, -1/3, -1/3, 5], y -> [-1, -1, 2, 1]; sum x + 2y per row,
    # then whitened over the 7 valid tokens
    total = torch.tensor([2 / 3 - 2, -1 / 3 - 2, -1 / 3 + 4, 5 + 2]).unsqueeze(-1) * MASK
    valid = total[MASK > 0]
    expected = (total - valid.mean()) / math.sqrt(valid.var().item() + 1e-8) * MASK
    assert_close(a, expected)


def test_optimal_token_baseline_weights_returns_by_path_variance():
    old = torch.log(torch.tensor([[0.5, 0.5], [0.5, 0.5], [0.5, 0.5], [0.5, 0.5]]))
    sum_pi_sq = torch.full((4, 2), 0.5)  # w = 1 - 2 * 0.5 + 0.5 = 0.5 per token
    a, returns = run(
        "optimal_token_baseline", old_log_probs=old, sum_pi_squared=sum_pi_sq, handle_zero_tail=False
    )
    assert_close(returns[:, 0], torch.tensor([1.0, 3.0, 0.0, 2.0]))
    # t = 0: W = 0.5 for the three rows of "a": B_0 = (1 + 3 + 0) / 3; t = 1: W = 1 on rows 0 and 2
    # (row 1 has ended): B_1 = (1 + 0) / 2. The single sample "b" keeps its return.
    b0, b1 = 4 / 3, 0.5
    expected = torch.tensor([[1 - b0, 1 - b1], [3 - b0, 0.0], [0 - b0, 0 - b1], [2.0, 0.0]])
    assert_close(a, expected, atol=1e-6, rtol=1e-6)
