"""Every advantage estimator on small hand-computed batches (padding and single-sample groups included)."""

import math

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from verl.algorithms import advantages as adv
from verl.algorithms.advantages import (
    OPTIONAL_BATCH_KEYS,
    call_adv_estimator,
    compute_advantage_for,
    get_adv_estimator_fn,
    register_adv_est,
)
from verl.config.algorithm import AlgorithmConfig
from verl.config.base import ConfigError
from verl.protocol import DataProto

EPS = 1e-6  # group-std epsilon of GRPO / pass@k


def uids(*names):
    return np.array(names, dtype=object)


def outcome_batch(scores, lengths, width=3):
    """Rewards at the last valid token of each row, a right-padded response mask."""
    rewards = torch.zeros(len(scores), width)
    mask = torch.zeros(len(scores), width)
    for i, (s, n) in enumerate(zip(scores, lengths)):
        mask[i, :n] = 1
        rewards[i, n - 1] = s
    return rewards, mask


def run(name, rewards, mask, index=None, config=None, **extra):
    """The estimator called as compute_advantage calls it (absent batch keys offered as None)."""
    config = config or AlgorithmConfig()
    return call_adv_estimator(
        get_adv_estimator_fn(name),
        token_level_rewards=rewards,
        response_mask=mask,
        index=index,
        config=config,
        gamma=config.gamma,
        lam=config.lam,
        norm_adv_by_std_in_grpo=config.norm_adv_by_std_in_grpo,
        **{**dict.fromkeys(OPTIONAL_BATCH_KEYS), **extra},
    )


def advantage(data, config):
    """compute_advantage as the trainer calls it, for an algorithm config."""
    return compute_advantage_for(data, config)


def broadcast(per_row, mask):
    return torch.tensor(per_row).unsqueeze(-1) * mask


# ----------------------------------------------------------------------------- registry
def test_unknown_estimator_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown advantage estimator 'nope'.*'grpo'.*'rloo'"):
        get_adv_estimator_fn("nope")


def test_registering_another_function_under_a_taken_name_fails():
    with pytest.raises(ValueError, match="already registered"):
        register_adv_est("grpo")(lambda **kw: None)


def test_config_validation_checks_the_estimator_name():
    AlgorithmConfig(adv_estimator="rloo").validate("algorithm")
    with pytest.raises(ConfigError, match=r"algorithm.adv_estimator"):
        AlgorithmConfig(adv_estimator="nope").validate("algorithm")


def test_user_registered_estimator_is_picked_by_name():
    @register_adv_est("test_constant_two")
    def constant_two(*, token_level_rewards, response_mask, **kwargs):
        return 2.0 * response_mask, 3.0 * response_mask

    try:
        rewards, mask = outcome_batch([1.0, 0.0], [2, 1])
        data = DataProto.from_dict({"token_level_rewards": rewards, "response_mask": mask})
        out = advantage(data, AlgorithmConfig(adv_estimator="test_constant_two"))
        assert_close(out.batch["advantages"], 2.0 * mask)
        assert_close(out.batch["returns"], 3.0 * mask)
        AlgorithmConfig(adv_estimator="test_constant_two").validate("algorithm")
    finally:
        del adv.ADV_ESTIMATOR_REGISTRY["test_constant_two"]


# ----------------------------------------------------------------------------- GRPO family
def test_grpo_normalises_by_group_std_and_keeps_single_samples():
    rewards, mask = outcome_batch([1.0, 0.0, 2.0], [2, 3, 1])
    a, r = run("grpo", rewards, mask, uids("p", "p", "q"))
    # group p: mean 0.5, unbiased std sqrt((0.25 + 0.25) / 1); group q (alone): mean 0, std 1.
    std = math.sqrt(0.5)
    expected = broadcast([0.5 / (std + EPS), -0.5 / (std + EPS), 2.0 / (1.0 + EPS)], mask)
    assert_close(a, expected)
    assert_close(r, expected)
    assert (a[mask == 0] == 0).all()


def test_dr_grpo_only_subtracts_the_group_mean():
    rewards, mask = outcome_batch([1.0, 0.0, 2.0], [2, 3, 1])
    a, _ = run("grpo", rewards, mask, uids("p", "p", "q"), AlgorithmConfig(norm_adv_by_std_in_grpo=False))
    assert_close(a, broadcast([0.5, -0.5, 2.0], mask))


def test_grpo_needs_uids():
    rewards, mask = outcome_batch([1.0], [1])
    with pytest.raises(ValueError, match="'uid'"):
        run("grpo", rewards, mask, None)
    with pytest.raises(ValueError, match="'uid' has 2 rows but rewards have 1"):
        run("grpo", rewards, mask, uids("a", "b"))


def test_grpo_passk_rewards_only_the_best_response():
    rewards, mask = outcome_batch([1.0, 3.0, 2.0, 5.0, 5.5], [1, 2, 3, 1, 1])
    a, _ = run("grpo_passk", rewards, mask, uids("p", "p", "p", "q", "q"))
    # p: best 3, second 2, std of [1, 3, 2] = 1.  q: 5.5 - 5 over std sqrt(0.125).
    q_adv = 0.5 / (math.sqrt(0.125) + EPS)
    assert_close(a, broadcast([0.0, 1.0 / (1.0 + EPS), 0.0, 0.0, q_adv], mask))
    a, _ = run(
        "grpo_passk",
        rewards,
        mask,
        uids("p", "p", "p", "q", "q"),
        AlgorithmConfig(norm_adv_by_std_in_grpo=False),
    )
    assert_close(a, broadcast([0.0, 1.0, 0.0, 0.0, 0.5], mask))


def test_grpo_passk_rejects_single_sample_groups():
    rewards, mask = outcome_batch([1.0, 0.0, 2.0], [1, 1, 1])
    with pytest.raises(ValueError, match="at least 2 responses per uid"):
        run("grpo_passk", rewards, mask, uids("p", "p", "q"))


def test_gpg_scales_by_fraction_of_rows_with_signal():
    rewards, mask = outcome_batch([1.0, 0.0, 0.0, 0.0, 3.0], [1, 2, 1, 3, 1])
    a, _ = run("gpg", rewards, mask, uids("p", "p", "q", "q", "r"))
    # 2 of 5 scores are non-zero: alpha = 5 / 2. p: mean 0.5; q: mean 0; r alone: mean 0.
    assert_close(a, broadcast([1.25, -1.25, 0.0, 0.0, 7.5], mask))


# ----------------------------------------------------------------------------- leave-one-out style
def test_rloo_uses_the_mean_of_the_other_samples():
    rewards, mask = outcome_batch([1.0, 2.0, 6.0, 4.0], [1, 2, 3, 2])
    a, r = run("rloo", rewards, mask, uids("p", "p", "p", "q"))
    # 1 - (2+6)/2 = -3, 2 - (1+6)/2 = -1.5, 6 - (1+2)/2 = 4.5; a lone sample keeps its score.
    assert_close(a, broadcast([-3.0, -1.5, 4.5, 4.0], mask))
    assert_close(r, a)


def test_opo_uses_a_length_weighted_baseline():
    rewards, mask = outcome_batch([2.0, 0.0, 5.0], [1, 3, 2])
    a, _ = run("opo", rewards, mask, uids("p", "p", "q"))
    # p: baseline (1*2 + 3*0) / (1 + 3) = 0.5; q alone: baseline 0.
    assert_close(a, broadcast([1.5, -0.5, 5.0], mask))


def test_reinforce_plus_plus_baseline_whitens_over_the_batch():
    rewards, mask = outcome_batch([1.0, 0.0], [2, 1])
    a, _ = run("reinforce_plus_plus_baseline", rewards, mask, uids("p", "p"))
    # centred scores 0.5, -0.5 on tokens [0.5, 0.5 | -0.5]: mean 1/6, unbiased var 1/3.
    scale = math.sqrt(3.0)
    expected = torch.tensor([[1 / 3 * scale, 1 / 3 * scale, 0.0], [-2 / 3 * scale, 0.0, 0.0]])
    assert_close(a, expected, atol=1e-5, rtol=0)


# ----------------------------------------------------------------------------- return based
def test_reinforce_plus_plus_discounts_over_valid_tokens_only():
    rewards = torch.tensor([[0.0, 1.0, 0.0], [2.0, 5.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    a, r = run("reinforce_plus_plus", rewards, mask, config=AlgorithmConfig(gamma=0.5))
    # row 0: G = [0 + 0.5*1, 1, 0]; row 1: the 5 after EOS is ignored and G there is 0
    # (verl 0.9.1 zeroes returns outside the mask): G_0 = 2.
    assert_close(r, torch.tensor([[0.5, 1.0, 0.0], [2.0, 0.0, 0.0]]))
    # whiten [0.5, 1, 2]: mean 7/6, unbiased var (4/9 + 1/36 + 25/36) / 2 = 7/12.
    std = math.sqrt(7 / 12)
    expected = torch.tensor([[-2 / 3 / std, -1 / 6 / std, 0.0], [5 / 6 / std, 0.0, 0.0]])
    assert_close(a, expected, atol=1e-5, rtol=0)


def test_reinforce_plus_plus_carries_the_return_across_an_interior_gap():
    # turn 1 (tokens 0-1), an observation token (2, masked), turn 2 (token 3) with the reward
    rewards = torch.tensor([[0.0, 0.0, 7.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    _, r = run("reinforce_plus_plus", rewards, mask, config=AlgorithmConfig(gamma=0.5))
    # the gap is skipped, not a discount step, and its reward 7 is ignored: G_1 = 0.5 * G_3
    assert_close(r, torch.tensor([[0.25, 0.5, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0]]))


def test_remax_subtracts_the_greedy_baseline():
    rewards = torch.tensor([[0.0, 1.0, 0.0], [0.5, 0.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    a, r = run("remax", rewards, mask, reward_baselines=torch.tensor([0.25, 1.0]))
    assert_close(r, torch.tensor([[1.0, 1.0, 0.0], [0.5, 0.0, 0.0]]))
    assert_close(a, torch.tensor([[0.75, 0.75, 0.0], [-0.5, 0.0, 0.0]]))
    with pytest.raises(ValueError, match="reward_baselines"):
        run("remax", rewards, mask)


def test_gae_hand_computed():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 7.0]])
    values = torch.tensor([[1.0, 2.0, 3.0], [1.0, 1.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    a, r = run("gae", rewards, mask, values=values, config=AlgorithmConfig(gamma=0.5, lam=0.5))
    # row 0: deltas (t=2,1,0) = 1-3, 0+1.5-2, 0+1-1 -> A = -2, -0.5 + 0.25*(-2), 0 + 0.25*(-1)
    # row 1: t=2 is padding (skipped); delta_1 = 2 - 1 = 1, delta_0 = 0.5 - 1 -> A = 1, -0.5 + 0.25
    raw = torch.tensor([[-0.25, -1.0, -2.0], [-0.25, 1.0, 0.0]])
    assert_close(r, raw + values)
    # whitened over the 5 valid entries: mean -0.5, unbiased var 4.875 / 4.
    expected = (raw + 0.5) / math.sqrt(4.875 / 4)
    assert_close(a[mask.bool()], expected[mask.bool()], atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="'values'"):
        run("gae", rewards, mask)


# ----------------------------------------------------------------------------- driver entry
def test_compute_advantage_reads_the_batch_and_uids():
    rewards, mask = outcome_batch([1.0, 0.0, 2.0], [2, 3, 1])
    data = DataProto.from_dict(
        {"token_level_rewards": rewards, "response_mask": mask}, {"uid": ["p", "p", "q"]}
    )
    out = advantage(data, AlgorithmConfig(adv_estimator="grpo", norm_adv_by_std_in_grpo=False))
    assert_close(out.batch["advantages"], broadcast([0.5, -0.5, 2.0], mask))
    assert_close(out.batch["returns"], broadcast([0.5, -0.5, 2.0], mask))


def test_compute_advantage_passes_values_and_reward_baselines():
    rewards = torch.tensor([[0.0, 1.0]])
    mask = torch.ones(1, 2)
    data = DataProto.from_dict(
        {"token_level_rewards": rewards, "response_mask": mask, "reward_baselines": torch.tensor([0.5])}
    )
    out = advantage(data, AlgorithmConfig(adv_estimator="remax"))
    assert_close(out.batch["advantages"], torch.tensor([[0.5, 0.5]]))

    data = DataProto.from_dict(
        {"token_level_rewards": rewards, "response_mask": mask, "values": torch.zeros(1, 2)}
    )
    out = advantage(data, AlgorithmConfig(adv_estimator="gae"))
    assert_close(out.batch["returns"], torch.tensor([[1.0, 1.0]]))  # gamma = lam = 1, V = 0


def test_pf_ppo_resamples_rows_by_reward():
    torch.manual_seed(0)
    scores = torch.tensor([[1.0], [0.5], [0.0], [0.5]])
    data = DataProto.from_dict(
        {
            "token_level_scores": scores,
            "token_level_rewards": scores,
            "response_mask": torch.ones(4, 1),
            "values": torch.zeros(4, 1),
        },
        {"uid": ["a", "b", "c", "d"]},
        {"global_token_num": [10, 11, 12, 13], "global_steps": 3},
    )
    config = AlgorithmConfig(adv_estimator="gae", use_pf_ppo=True)
    config.pf_ppo.reweight_method = "max_min"
    out = advantage(data, config)
    assert out is data  # resampled in place, so callers may ignore the return value
    # max_min keeps only the best (row a) and the worst (row c) score, weight 1 each.
    assert len(out) == 4
    assert set(out.non_tensor_batch["uid"]) <= {"a", "c"}
    picked = [ord(u) - ord("a") for u in out.non_tensor_batch["uid"]]
    assert out.meta_info["global_token_num"] == [10 + i for i in picked]
    assert out.meta_info["global_steps"] == 3
    assert_close(out.batch["token_level_scores"][:, 0], torch.tensor([1.0 - i / 2 for i in picked]))


def test_filter_groups_needs_a_metric_when_enabled():
    from verl.config.algorithm import FilterGroupsConfig

    AlgorithmConfig(filter_groups=FilterGroupsConfig(enable=True, metric="acc")).validate("algorithm")
    with pytest.raises(ConfigError, match=r"algorithm\.filter_groups\.metric"):
        AlgorithmConfig(filter_groups=FilterGroupsConfig(enable=True)).validate("algorithm")
