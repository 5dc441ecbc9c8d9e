import pytest

from verl.utils.reward_score import (
    KNOWN_DATA_SOURCES,
    UnknownDataSourceError,
    arith,
    default_compute_score,
    default_compute_score_batch,
    is_known_data_source,
)


@pytest.mark.parametrize(
    ("source", "response", "truth", "expected"),
    [
        ("openai/gsm8k", "so #### 42", "42", 1.0),
        ("openai/gsm8k", "so 42", "42", 0.0),
        ("reasoning_gym/gsm_symbolic", "#### 7", "7", 1.0),
        ("reasoning_gym/basic_arithmetic", "5 - 9 = -4", "-4", 1.0),  # the last number counts
        ("reasoning_gym/basic_arithmetic", "-4, not 4", "-4", 0.0),
        ("lighteval/MATH", "\\boxed{\\frac{2}{4}}", "\\frac{1}{2}", 1.0),
        ("HuggingFaceH4/MATH-500", "\\boxed{3}", "2", 0.0),
        ("countdown", "<answer>2 * 3</answer>", {"target": 6, "numbers": [2, 3]}, 1.0),
        ("arith", "7", "7", 1.0),
    ],
)
def test_dispatch_by_data_source(source, response, truth, expected):
    assert default_compute_score(source, response, truth, extra_info={"index": 0}) == expected


def test_unknown_data_source_names_it_and_the_fix():
    with pytest.raises(UnknownDataSourceError, match=r"'my/data'.*custom_reward_function"):
        default_compute_score("my/data", "x", "y")
    assert not is_known_data_source("my/data")
    assert is_known_data_source("arith")
    assert "openai/gsm8k" in KNOWN_DATA_SOURCES


@pytest.mark.parametrize(
    ("response", "expected"),
    [("7", 1.0), (" 7\n", 1.0), ("07", 0.0), ("7.", 0.0), ("77", 0.0), ("", 0.0), ("7 7", 0.0)],
)
def test_arith_is_exact_match_after_strip(response, expected):
    assert arith.compute_score(response, "7") == expected


def test_batch_form_scores_each_row():
    scores = default_compute_score_batch(["arith", "arith"], ["7", "8"], ["7", "7"], [None, None])
    assert scores == [1.0, 0.0]
