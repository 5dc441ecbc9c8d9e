import json
from fractions import Fraction

import pytest

from verl.utils.reward_score import countdown

TRUTH = {"target": 24, "numbers": [3, 3, 8]}


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("<think>try</think><answer>(3 + 3) * 8 / 2</answer>", 0.0),  # uses a 2 that was not given
        ("<answer>3 * 8</answer>", 0.0),  # leaves a 3 unused
        ("<answer>8 * 3 * 3</answer>", 0.0),  # uses every number but equals 72
        ("<answer>8 * (3 - 3)</answer>", 0.0),
        ("<answer>8 / (3 - 8 / 3)</answer>", 0.0),  # uses 8 twice
        ("<answer>8 * 3 + 3 - 3</answer>", 0.0),  # uses 3 three times
        ("<answer>(3 + 3) * 8</answer>", 0.0),  # 48
        ("<answer>8 * (3 + 3) / 2</answer>", 0.0),
        ("<answer>3 * 8 * 3 / 3</answer>", 0.0),
        ("no tag 3*8", 0.0),
    ],
)
def test_wrong_answers_score_zero(response, expected):
    assert countdown.compute_score(response, TRUTH) == expected


def test_correct_answers():
    truth = {"target": 24, "numbers": [8, 3, 3]}
    assert (
        countdown.compute_score("<answer>8 / (3 - 8 / 3)</answer>", {"target": 24, "numbers": [8, 3, 8, 3]})
        == 1.0
    )
    assert (
        countdown.compute_score("<answer> (8 * 3) * 3 / 3 </answer>", {"target": 24, "numbers": [8, 3, 3, 3]})
        == 1.0
    )
    assert (
        countdown.compute_score("<answer>8 * (3 + 3) - 24</answer>", {"target": 24, "numbers": [8, 3, 3, 24]})
        == 1.0
    )
    assert (
        countdown.compute_score("<answer>(3 * 3 - 1) * 3</answer>", {"target": 24, "numbers": [3, 3, 1, 3]})
        == 1.0
    )
    # a trailing "= target" is allowed; the last answer tag counts
    assert (
        countdown.compute_score(
            "<answer>1</answer><answer>8 * 3 = 24</answer>", {"target": 24, "numbers": [8, 3]}
        )
        == 1.0
    )
    assert (
        countdown.compute_score("<answer>8*3</answer>", json.dumps({"target": 24, "numbers": [3, 8]})) == 1.0
    )
    assert countdown.compute_score("<answer>3*3</answer>", truth, format_score=0.1) == 0.1


def test_evaluate_equation_is_exact_and_refuses_code():
    value, used = countdown.evaluate_equation("1 / 3 * 3")
    assert value == Fraction(1) and sorted(used) == [1, 3, 3]
    assert countdown.evaluate_equation("4 / (2 - 2)") is None
    assert countdown.evaluate_equation("__import__('os')") is None
    assert countdown.evaluate_equation("2 ** 3") is None
    assert countdown.evaluate_equation("-3 + 5") is None  # numbers must be used as given
    assert countdown.evaluate_equation("1.5 * 2") is None


def test_bad_ground_truth_raises():
    with pytest.raises(ValueError, match="target"):
        countdown.compute_score("<answer>1</answer>", {"numbers": [1]})
