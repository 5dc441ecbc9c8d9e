import time

import pytest

from verl.utils.reward_score import math as math_score
from verl.utils.reward_score.math_equiv import latex_to_python, sympy_equal


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so \\boxed{5}", "\\boxed{5}"),
        ("\\boxed{1} then \\boxed{\\frac{1}{2}}", "\\boxed{\\frac{1}{2}}"),
        ("nested \\boxed{\\sqrt{\\frac{a}{b}}} end", "\\boxed{\\sqrt{\\frac{a}{b}}}"),
        ("\\fbox{7}", "\\fbox{7}"),
        ("$\\boxed 9$", "\\boxed 9"),
        ("\\boxed{unbalanced", None),
        ("no box", None),
    ],
)
def test_last_boxed_only_string(text, expected):
    assert math_score.last_boxed_only_string(text) == expected


def test_remove_boxed():
    assert math_score.remove_boxed("\\boxed{x+1}") == "x+1"
    assert math_score.remove_boxed("\\boxed 9") == "9"
    with pytest.raises(ValueError):
        math_score.remove_boxed("x")


@pytest.mark.parametrize(
    ("answer", "normal"),
    [
        ("\\dfrac{1}{2}", "\\frac{1}{2}"),
        ("\\frac12", "\\frac{1}{2}"),
        ("1/2", "\\frac{1}{2}"),
        ("\\left( 1, 2 \\right)", "(1,2)"),
        ("10\\text{ cm}", "10cm"),
        ("90^\\circ", "90"),
        ("\\$5.", "5"),
        ("x = 3", "3"),
        ("1,000", "1000"),
        (".5", "0.5"),
        ("50\\%", "50"),
    ],
)
def test_normalize_final_answer(answer, normal):
    assert math_score.normalize_final_answer(answer) == normal


@pytest.mark.parametrize(
    ("a", "b", "equal"),
    [
        ("\\frac{1}{2}", "0.5", True),
        ("2\\sqrt{2}", "\\sqrt{8}", True),
        ("\\sqrt[3]{8}", "2", True),
        ("2^{10}", "1024", True),
        ("x^2+2x+1", "(x+1)^2", True),
        ("(1,2)", "(1, 2)", True),
        ("(1,2)", "(2,1)", False),
        ("(1,2)", "[1,2]", False),
        ("3", "4", False),
        ("\\pi", "3.14159265358979", True),
    ],
)
def test_sympy_equal(a, b, equal):
    assert sympy_equal(a, b) is equal


@pytest.mark.parametrize(
    "hostile",
    ["__import__('os')", "9^9^9^9", "9^{9999}", "x.__class__", "lambda: 1", "a" * 300],
)
def test_latex_to_python_rejects_unsafe_text(hostile):
    assert latex_to_python(hostile) is None


def test_sympy_equal_on_power_tower_returns_quickly():
    start = time.monotonic()
    assert sympy_equal("9^9^9^9", "1") is False
    assert time.monotonic() - start < 2.0


@pytest.mark.parametrize("use_math_verify", [False, True])
@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("The answer is \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}", 1.0),
        ("The answer is \\boxed{\\dfrac12}.", "\\frac{1}{2}", 1.0),
        ("The answer is \\boxed{0.5}.", "\\frac{1}{2}", 1.0),
        ("The answer is \\boxed{3}.", "4", 0.0),
        ("No box at all: 4", "5", 0.0),
        ("\\boxed{10}", "\\boxed{10}", 1.0),  # a boxed ground truth is unwrapped
    ],
)
def test_compute_score(use_math_verify, response, truth, expected):
    if use_math_verify:
        pytest.importorskip("math_verify")
    assert math_score.compute_score(response, truth, use_math_verify=use_math_verify) == expected
