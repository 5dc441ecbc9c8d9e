"""The geo3k scorer: 0.9 for the right boxed answer, 0.1 for the think-then-box format, as verl."""

import pytest

from verl.utils.reward_score import default_compute_score


@pytest.mark.parametrize(
    ("response", "truth", "score"),
    [
        ("<think>angles sum to 180</think> so x is \\boxed{12}", "12", 1.0),
        ("\\boxed{12}", "12", 0.9),  # right, no reasoning block
        ("<think>guess</think> \\boxed{3}", "12", 0.1),  # the format only
        ("x = 12", "12", 0.0),  # no box: nothing to grade
        ("<think>.</think> \\boxed{\\frac{1}{2}}", "0.5", 1.0),  # equal as numbers
    ],
)
def test_geo3k_scores_like_verl(response, truth, score):
    assert default_compute_score("hiyouga/geometry3k", response, truth) == pytest.approx(score)
