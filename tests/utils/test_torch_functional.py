"""Hand-computed checks of the masked statistics and log-prob helpers."""

import math

import pytest
import torch
from torch.testing import assert_close

from verl.utils.torch_functional import (
    clip_by_value,
    entropy_from_logits,
    get_response_mask,
    logprobs_from_logits,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)

VALUES = torch.tensor([[1.0, float("nan")], [3.0, 4.0]])
MASK = torch.tensor([[1, 0], [1, 1]])


def test_masked_sum_ignores_nan_outside_the_mask():
    # 1 + 3 + 4; the NaN sits on a masked position.
    assert masked_sum(VALUES, MASK).item() == 8.0
    assert_close(masked_sum(VALUES, MASK, axis=-1), torch.tensor([1.0, 7.0]))


def test_masked_mean_all_and_per_row():
    assert_close(masked_mean(VALUES, MASK), torch.tensor(8.0 / 3.0))
    assert_close(masked_mean(VALUES, MASK, axis=-1), torch.tensor([1.0, 3.5]))


def test_masked_mean_of_empty_mask_is_zero_not_nan():
    assert masked_mean(torch.ones(2, 2), torch.zeros(2, 2)).item() == 0.0


def test_masked_var_biased_and_unbiased():
    values = torch.tensor([[1.0, 2.0], [3.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    # mean 2, squared deviations 1, 0, 1: biased 2/3, unbiased (n=3) 2/3 * 3/2 = 1.
    assert_close(masked_var(values, mask, unbiased=False), torch.tensor(2.0 / 3.0))
    assert_close(masked_var(values, mask), torch.tensor(1.0))


@pytest.mark.parametrize("mask", [torch.tensor([1.0, 0.0]), torch.tensor([0.0, 0.0])])
def test_unbiased_masked_var_needs_two_elements(mask):
    with pytest.raises(ValueError, match="masked_var"):
        masked_var(torch.tensor([1.0, 2.0]), mask)


def test_masked_whiten():
    values = torch.tensor([2.0, 4.0, 6.0, 50.0])
    mask = torch.tensor([1.0, 1.0, 1.0, 0.0])
    # mean 4, unbiased var (4 + 0 + 4) / 2 = 4, std 2.
    whitened = masked_whiten(values, mask)
    assert_close(whitened[:3], torch.tensor([-1.0, 0.0, 1.0]), atol=1e-6, rtol=0)
    unshifted = masked_whiten(values, mask, shift_mean=False)
    assert_close(unshifted[:3], torch.tensor([3.0, 4.0, 5.0]), atol=1e-6, rtol=0)


def test_clip_by_value_with_tensor_bounds():
    x = torch.tensor([0.0, 5.0, -5.0])
    low = torch.tensor([1.0, 1.0, -1.0])
    high = torch.tensor([2.0, 2.0, 1.0])
    assert_close(clip_by_value(x, low, high), torch.tensor([1.0, 2.0, -1.0]))


def test_logprobs_from_logits():
    # softmax([0, ln 3, ln 4]) = [1/8, 3/8, 4/8]
    logits = torch.tensor([[[0.0, math.log(3.0), math.log(4.0)]] * 2])
    labels = torch.tensor([[1, 2]])
    expected = torch.tensor([[math.log(3 / 8), math.log(4 / 8)]])
    assert_close(logprobs_from_logits(logits, labels), expected)
    assert logprobs_from_logits(logits, labels).shape == labels.shape


def test_entropy_from_logits():
    uniform = torch.zeros(2, 4)
    assert_close(entropy_from_logits(uniform), torch.full((2,), math.log(4.0)))
    skewed = torch.tensor([0.0, math.log(3.0)])  # probabilities 1/4, 3/4
    expected = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert_close(entropy_from_logits(skewed), torch.tensor(expected))


def test_get_response_mask_stops_after_first_eos():
    ids = torch.tensor([[5, 7, 1, 0, 1], [5, 2, 9, 9, 9], [1, 9, 9, 9, 9]])
    assert get_response_mask(ids, eos_token=1).tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]
    assert get_response_mask(ids, eos_token=[1, 2]).tolist() == [
        [1, 1, 1, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 0, 0, 0, 0],
    ]
