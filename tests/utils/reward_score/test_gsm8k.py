import pytest

from verl.utils.reward_score import gsm8k


@pytest.mark.parametrize(
    ("text", "method", "expected"),
    [
        ("so the total is 5.\n#### 72", "strict", "72"),
        ("#### 1 then #### 1,234", "strict", "1234"),  # the last marker wins, commas dropped
        ("#### -3.", "strict", "-3"),
        ("the answer is 72", "strict", None),  # strict needs the marker
        ("the answer is 72", "flexible", "72"),
        ("3 apples and 4 pears make 7.", "flexible", "7"),
        ("no digits here", "flexible", None),
        ("####", "strict", None),
    ],
)
def test_extract_solution(text, method, expected):
    assert gsm8k.extract_solution(text, method=method) == expected


def test_extract_solution_only_reads_the_tail():
    text = "#### 5" + "x" * 400
    assert gsm8k.extract_solution(text) is None
    assert gsm8k.extract_solution("y" * 400 + "#### 5") == "5"


def test_extract_solution_rejects_unknown_method():
    with pytest.raises(ValueError, match="strict"):
        gsm8k.extract_solution("#### 1", method="loose")


@pytest.mark.parametrize(
    ("text", "truth", "expected"),
    [
        ("#### 72", "72", 1.0),
        ("#### 1,000", "1000", 1.0),
        ("#### 18.0", "18", 1.0),  # compared as decimals
        ("#### 71", "72", 0.0),
        ("72", "72", 0.0),  # strict: no marker, no answer
    ],
)
def test_compute_score_strict(text, truth, expected):
    assert gsm8k.compute_score(text, truth) == expected


def test_compute_score_flexible_and_format_score():
    assert gsm8k.compute_score("I think 72", "72", method="flexible") == 1.0
    assert gsm8k.compute_score("#### 70", "72", format_score=0.1) == 0.1
    assert gsm8k.compute_score("nothing", "72", format_score=0.1) == 0.0
