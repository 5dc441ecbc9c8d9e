"""Loss aggregation, value loss and entropy loss on hand-computed cases."""

import math

import pytest
import torch
from torch.testing import assert_close

from verl.trainer.ppo import core_algos
from verl.trainer.ppo.core_algos import agg_loss, compute_entropy_loss, compute_value_loss

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
# row 0 full, row 1 one token, row 2 fully masked (it must not count as a sequence).
MASK = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", (1 + 2 + 3 + 4) / 4),
        ("token-sum", 1.0 + 2 + 3 + 4),
        ("seq-mean-token-sum", (6 + 4) / 2),
        ("seq-mean-token-mean", (6 / 3 + 4 / 1) / 2),
        # verl 0.9.1: seq-mean-token-sum divided by the padded length R = 3
        ("seq-mean-token-sum-norm", (6 + 4) / 2 / 3),
    ],
)
def test_agg_loss_modes(mode, expected):
    assert_close(agg_loss(LOSS, MASK, mode), torch.tensor(expected))


def test_agg_loss_unknown_mode():
    with pytest.raises(ValueError, match=r"loss_agg_mode.*'nope'"):
        agg_loss(LOSS, MASK, "nope")


@pytest.mark.parametrize("mode", ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_agg_loss_of_micro_batches_with_global_counts_sums_to_the_batch_loss(mode):
    whole = agg_loss(LOSS, MASK, mode, global_batch_size=3, batch_num_tokens=4)
    parts = [
        agg_loss(LOSS[i : i + 1], MASK[i : i + 1], mode, global_batch_size=3, batch_num_tokens=4)
        for i in range(3)
    ]
    assert_close(sum(parts), whole)
    # over 2 data-parallel ranks the gradients are averaged, so each rank's loss is doubled
    half = agg_loss(LOSS[:1], MASK[:1], mode, dp_size=2, global_batch_size=3, batch_num_tokens=4)
    assert_close(half, 2 * parts[0])


def test_agg_loss_needs_global_counts_on_several_ranks():
    with pytest.raises(ValueError, match="batch_num_tokens"):
        agg_loss(LOSS, MASK, "token-mean", dp_size=2)


def test_seq_mean_token_sum_norm_takes_a_constant_scale_factor():
    assert_close(agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", loss_scale_factor=10), torch.tensor(0.5))


def test_value_loss_clips_around_old_values():
    vpreds = torch.tensor([[1.0, 2.0, 40.0]])
    values = torch.tensor([[0.0, 2.0, 0.0]])
    returns = torch.tensor([[2.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0]])
    vf_loss, vf_clipfrac = compute_value_loss(vpreds, returns, values, mask, cliprange_value=0.5)
    # token 0: clip(1, -0.5, 0.5) = 0.5 -> max((1-2)^2, (0.5-2)^2) = 2.25 (clipped term wins)
    # token 1: inside the band -> (2-0)^2 = 4
    assert_close(vf_loss, torch.tensor(0.5 * (2.25 + 4.0) / 2))
    assert_close(vf_clipfrac, torch.tensor(0.5))


def test_value_loss_gradient_is_zero_where_clipped_term_wins():
    vpreds = torch.tensor([[1.0, 2.0]], requires_grad=True)
    vf_loss, _ = compute_value_loss(
        vpreds, torch.tensor([[2.0, 0.0]]), torch.tensor([[0.0, 2.0]]), torch.ones(1, 2), 0.5
    )
    vf_loss.backward()
    # token 0: the clipped prediction is constant in vpreds; token 1: 0.5 * 2 * (2 - 0) / 2.
    assert_close(vpreds.grad, torch.tensor([[0.0, 1.0]]))


def test_entropy_loss_aggregates_token_entropy():
    logits = torch.zeros(2, 3, 4)
    logits[1, 0] = torch.tensor([0.0, math.log(3.0), -1e9, -1e9])  # probabilities 1/4, 3/4
    mask = torch.tensor([[1, 0, 0], [1, 0, 0]])
    expected = (math.log(4.0) - (0.25 * math.log(0.25) + 0.75 * math.log(0.75))) / 2
    assert_close(compute_entropy_loss(logits, mask), torch.tensor(expected))


def test_core_algos_re_exports_the_public_names():
    for name in core_algos.__all__:
        assert hasattr(core_algos, name), name
    assert core_algos.get_adv_estimator_fn("grpo") is core_algos.compute_grpo_outcome_advantage
    assert core_algos.get_policy_loss_fn("vanilla") is core_algos.compute_policy_loss_vanilla
