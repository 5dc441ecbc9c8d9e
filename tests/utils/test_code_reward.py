"""The code reward with real sandbox runs: right, wrong, partly right, looping, broken and cheating
programs, in both test-case styles."""

from __future__ import annotations

import json
import sys
import time

import pytest

from verl.tools.sandbox import run_python
from verl.utils.reward_score import code, default_compute_score
from verl.workers.reward_manager.base import ScoredBatch
from verl.workers.reward_manager.pool import ScoreOutcome

if not sys.platform.startswith("linux"):
    pytest.skip("the sandbox uses Linux namespaces", allow_module_level=True)
_probe = run_python("print('ready')", timeout_s=60)
if _probe.status == "error" and "unshare(" in _probe.stderr:
    pytest.skip(f"this kernel/container forbids user namespaces: {_probe.stderr}", allow_module_level=True)

STDIN = {"inputs": ["3\n", "10\n", "1\n"], "outputs": ["6\n", "55\n", "1\n"]}  # sum of 1..n
CALL = {"fn_name": "rev", "inputs": [["abc"], [""], ["ab"]], "outputs": ["cba", "", "ba"]}


@pytest.fixture(autouse=True)
def patient_sandbox(monkeypatch):
    """Cases that should pass get a minute (the sandbox's wall clock includes starting Python, which a
    loaded machine can stretch past the 3 s default); the time-out tests set their own limit."""
    monkeypatch.setattr(code, "DEFAULT_TIMEOUT_S", 60.0)


def fenced(source: str) -> str:
    return f"Here is my solution:\n```python\n{source}\n```\nIt runs in O(n)."


def score(source: str, truth, **kwargs) -> dict:
    return code.compute_score(fenced(source), truth, **kwargs)


@pytest.mark.parametrize(
    ("truth", "source", "rate"),
    [
        (STDIN, "n = int(input())\nprint(n * (n + 1) // 2)", 1.0),
        (STDIN, "import sys\nn = int(sys.stdin.buffer.read())\nprint(sum(range(n + 1)))", 1.0),
        (STDIN, "n = int(input())\nprint(n * n)", 1 / 3),  # right for n = 1 only
        (STDIN, "print(42)", 0.0),
        (CALL, "def rev(s):\n    print('debugging')\n    return s[::-1]", 1.0),
        (CALL, "class Solution:\n    def rev(self, s):\n        return ''.join(reversed(s))", 1.0),
        (CALL, "def rev(s):\n    return s[::-1] if len(s) > 2 else s", 2 / 3),
        (CALL, "def rev(s):\n    return s", 1 / 3),  # right for "" only
        (CALL, "def reverse(s):\n    return s[::-1]", 0.0),  # the wrong name
    ],
)
def test_the_score_is_the_fraction_of_cases_passed(truth, source, rate):
    result = score(source, truth)
    assert result["score"] == pytest.approx(rate)
    assert result["pass_rate"] == pytest.approx(rate)
    assert result["acc"] == (1.0 if rate == 1.0 else 0.0)


@pytest.mark.parametrize("truth", [STDIN, CALL])
def test_a_syntax_error_scores_zero(truth):
    assert score("def rev(s)\n    return s[::-1]\nprint(int(input(", truth)["score"] == 0.0


def test_an_infinite_loop_times_out_and_stops_the_remaining_cases():
    # Right on the first case, loops on the second: the third is never run.
    looping = "n = int(input())\nwhile n != 3:\n    pass\nprint(6)"
    start = time.monotonic()
    result = score(looping, STDIN, timeout_s=1.0)
    assert result == {"score": pytest.approx(1 / 3), "pass_rate": pytest.approx(1 / 3), "acc": 0.0}
    assert time.monotonic() - start < 20  # one time-out, not one per case (a generous bound)


def test_a_function_that_loops_scores_zero():
    assert score("def rev(s):\n    while True:\n        pass", CALL, timeout_s=1.0)["score"] == 0.0


def test_json_text_ground_truth_and_float_tolerance():
    truth = json.dumps({"fn_name": "half", "inputs": [[1], [3]], "outputs": [0.5, [1.5]]})
    assert code.compute_score("def half(x): return x / 2 + 1e-12", truth)["score"] == 1.0


def test_stdout_is_compared_line_by_line_ignoring_surrounding_whitespace():
    truth = {"inputs": ["2\n"], "outputs": ["1 2\n3\n"]}
    assert score("input()\nprint('1 2  ')\nprint('  3')\nprint()", truth)["score"] == 1.0
    assert score("input()\nprint('1  2')\nprint(3)", truth)["score"] == 0.0


def test_the_program_never_contains_the_expected_output():
    program = code.build_program("print(1)", "expected-input", None)
    call_program = code.build_program("def f(x): return x", ["arg-value"], "f")
    assert "expected-input" in program and "arg-value" in call_program
    for text in (program, call_program):
        assert "secret-answer" not in text  # nothing but source and input goes in


def test_a_solution_that_hunts_for_the_answers_or_the_environment_fails(monkeypatch):
    # The expected output exists only in this process: in ground_truth and in an env variable.
    monkeypatch.setenv("VERL_TEST_SECRET", "secret-answer-7f3a")
    hunt = """
import gc, os, sys
def hunt(*args):
    needle = "-".join(["secret", "answer"])  # never in the source or its constants as one piece
    texts = list(os.environ.values())
    for path in ("/scratch/main.py", "/proc/1/environ", "/proc/self/environ", "/proc/1/cmdline"):
        try:
            texts.append(open(path, errors="replace").read())
        except OSError:
            pass
    texts += [repr(o)[:10000] for o in gc.get_objects() if isinstance(o, (list, tuple, dict))]
    frame = sys._getframe()
    while frame is not None:
        texts.append(repr(frame.f_globals)[:10000])
        frame = frame.f_back
    for text in texts:
        if needle in text:
            return text[text.index(needle) :][:18]
    return "nothing found"
"""
    hunter, call_hunter = hunt + "print(hunt())", hunt + "f = hunt"
    assert score(hunter, {"inputs": ["1\n"], "outputs": ["secret-answer-7f3a\n"]})["score"] == 0.0
    call_truth = {"fn_name": "f", "inputs": [[1]], "outputs": ["secret-answer-7f3a"]}
    assert score(call_hunter, call_truth)["score"] == 0.0
    # the same program does pass when the answer is what it can see: the check above is real
    assert score(hunter, {"inputs": [""], "outputs": ["nothing found"]})["score"] == 1.0


def test_a_sandbox_that_cannot_run_raises_instead_of_scoring_zero():
    with pytest.raises(code.SandboxUnavailableError, match="memory_mb >= 32"):
        score("print(1)", STDIN, memory_mb=16)


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("```python\nold\n```\ntext\n```python\nnew\n```", "new\n"),
        ("```py\na\n```", "a\n"),
        ("```\nuntagged\n```", "untagged\n"),
        ("```python\ncut off at the length limit", "cut off at the length limit"),
        ("print(1)", "print(1)"),
    ],
)
def test_the_code_is_the_last_fenced_block_or_the_whole_text(response, expected):
    assert code.extract_code(response) == expected


@pytest.mark.parametrize(
    "truth",
    [
        {"inputs": ["1"], "outputs": []},
        {"inputs": [], "outputs": []},
        {"inputs": [1], "outputs": [1]},
        {"fn_name": "f x", "inputs": [[1]], "outputs": [1]},
        {"fn_name": "f", "inputs": [1], "outputs": [1]},
        "{not json",
    ],
)
def test_malformed_test_cases_are_refused(truth):
    with pytest.raises(ValueError, match="code ground_truth"):
        code.parse_test_cases(truth)


@pytest.mark.parametrize("source", ["code_offline", "codecontests", "apps", "codeforces", "taco"])
def test_default_dispatch_returns_the_dict_and_the_reward_manager_keeps_its_keys(source):
    result = default_compute_score(source, fenced("def rev(s):\n    return s"), json.dumps(CALL))
    assert result == {"score": pytest.approx(1 / 3), "pass_rate": pytest.approx(1 / 3), "acc": 0.0}
    info = ScoredBatch([ScoreOutcome("ok", result)]).extra_info()
    assert info["score"] == [pytest.approx(1 / 3)] and info["acc"] == [0.0]
    assert info["pass_rate"] == [pytest.approx(1 / 3)]
