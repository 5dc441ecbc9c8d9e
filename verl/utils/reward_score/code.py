"""Code scorer: run a response's Python program against test cases in the local sandbox.

The program is the last fenced block tagged ``python`` / ``py`` / ``python3`` in the response (an
unclosed final block counts, for responses cut at the length limit), else the last untagged
fenced block, else the whole response. ``ground_truth`` is a dict, or that dict as JSON text (how
verl's code datasets store it), in one of two styles (the APPS / TACO layout):

* standard input/output: ``{"inputs": ["3\\n", ...], "outputs": ["6\\n", ...]}``; the program
  reads the input on stdin and its stdout must equal the output, compared line by line with
  surrounding whitespace and trailing blank lines ignored;
* function call: ``{"fn_name": "f", "inputs": [[arg, ...], ...], "outputs": [value, ...]}``;
  ``f(*args)`` (or ``Solution().f(*args)``, LeetCode style) must return the value (JSON values;
  floats compared with a relative tolerance of 1e-6; an output wrapped in a one-item list, as
  APPS writes some, also matches).

Each case is a separate sandbox run (``verl.tools.sandbox.run_python``) with its own time and
memory limit. The expected outputs never enter the sandbox: the program only sees its input, and
what it printed or returned is compared here, so code that searches its process, files or
environment for the answers finds nothing. After the first case that times out the remaining
cases are not run (they count as failed), which bounds the time a looping program costs.

Score: the fraction of cases passed (``pass_rate``), as verl's default scorer does for
``codecontests``/``apps``/``codeforces``/``taco``; ``acc`` is 1.0 only when every case passed
(the pass-all score of PRIME). A sandbox that cannot run code at all (status ``error``) raises
:class:`SandboxUnavailableError`, so a machine without user namespaces shows up as scorer errors
instead of zero rewards that look like wrong code.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

from verl.tools.sandbox import SandboxResult, run_python

__all__ = ["SandboxUnavailableError", "build_program", "compute_score", "extract_code", "parse_test_cases"]

DEFAULT_TIMEOUT_S = 3.0
DEFAULT_MEMORY_MB = 256
_TAGGED = re.compile(r"```[ \t]*(?:python3?|py)[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)
_UNTAGGED = re.compile(r"```[ \t]*\n(.*?)```", re.DOTALL)

# What the sandbox runs. The solution's source and the case's input travel as string literals;
# the expected output is never part of the program.
_STDIN_HARNESS = """\
import io, sys
sys.stdin = io.TextIOWrapper(io.BytesIO({input!r}.encode()))
exec(compile({source!r}, "solution.py", "exec"), {{"__name__": "__main__"}})
"""
_CALL_HARNESS = """\
import contextlib, json, sys
namespace = {{"__name__": "solution"}}
with contextlib.redirect_stdout(sys.stderr):  # the solution's own prints are not its result
    exec(compile({source!r}, "solution.py", "exec"), namespace)
    target = namespace.get({fn_name!r})
    if target is None and isinstance(namespace.get("Solution"), type):
        target = getattr(namespace["Solution"](), {fn_name!r}, None)
    if target is None:
        raise SystemExit("solution.py defines no function " + repr({fn_name!r}))
    result = target(*json.loads({args!r}))
print(json.dumps(result))
"""


class SandboxUnavailableError(RuntimeError):
    """The sandbox could not run the program (no user namespaces, bad limits): nothing was tested."""


def extract_code(response: str) -> str:
    """The program in ``response``: its last python-tagged fenced block, else its last untagged
    fenced block, else the whole text."""
    for pattern in (_TAGGED, _UNTAGGED):
        blocks = pattern.findall(response)
        if blocks:
            return blocks[-1]
    return response


def parse_test_cases(ground_truth: Any) -> dict[str, Any]:
    """``{"inputs", "outputs"[, "fn_name"]}`` from a dict or its JSON text, checked."""
    cases = ground_truth
    if isinstance(ground_truth, (str, bytes)):
        try:
            cases = json.loads(ground_truth)
        except ValueError as error:
            raise ValueError(f"code ground_truth: not JSON ({error}): {ground_truth[:80]!r}") from error
    if not isinstance(cases, Mapping):
        raise ValueError(
            f"code ground_truth: expected a dict with inputs/outputs, got {type(cases).__name__}"
        )
    inputs, outputs = cases.get("inputs"), cases.get("outputs")
    if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(outputs):
        raise ValueError("code ground_truth: 'inputs' and 'outputs' must be lists of the same length")
    if not inputs:
        raise ValueError("code ground_truth: no test cases")
    fn_name = cases.get("fn_name")
    if fn_name is not None and not (isinstance(fn_name, str) and fn_name.isidentifier()):
        raise ValueError(f"code ground_truth: fn_name must be a Python name, got {fn_name!r}")
    if fn_name is None and not all(isinstance(x, str) for x in inputs + outputs):
        raise ValueError("code ground_truth: stdin/stdout cases need string inputs and outputs")
    if fn_name is not None and not all(isinstance(x, list) for x in inputs):
        raise ValueError("code ground_truth: each function-call input must be a list of arguments")
    return {"inputs": inputs, "outputs": outputs, "fn_name": fn_name}


def build_program(source: str, case_input: Any, fn_name: str | None) -> str:
    """The program run for one case: ``source`` fed ``case_input`` on stdin, or called with it."""
    if fn_name is None:
        return _STDIN_HARNESS.format(input=case_input, source=source)
    return _CALL_HARNESS.format(source=source, fn_name=fn_name, args=json.dumps(case_input))


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.strip().splitlines()]


def _same(got: Any, expected: Any) -> bool:
    if isinstance(got, float) or isinstance(expected, float):
        if isinstance(got, (int, float)) and isinstance(expected, (int, float)):
            return math.isclose(got, expected, rel_tol=1e-6, abs_tol=1e-9)
        return False
    if isinstance(got, list) and isinstance(expected, list):
        return len(got) == len(expected) and all(_same(g, e) for g, e in zip(got, expected))
    if isinstance(got, dict) and isinstance(expected, dict):
        return got.keys() == expected.keys() and all(_same(got[k], expected[k]) for k in got)
    return got == expected


def _passed(result: SandboxResult, expected: Any, fn_name: str | None) -> bool:
    if result.status != "ok":
        return False
    if fn_name is None:
        return _lines(result.stdout) == _lines(expected)
    try:
        got = json.loads(result.stdout)
    except ValueError:
        return False
    return _same(got, expected) or _same([got], expected)


def compute_score(
    solution_str: str,
    ground_truth: Any,
    timeout_s: float | None = None,
    memory_mb: int = DEFAULT_MEMORY_MB,
) -> dict[str, float]:
    """``{"score": pass_rate, "pass_rate": passed / cases, "acc": 1.0 if all passed else 0.0}``.

    timeout_s / memory_mb: the sandbox's wall-clock and per-process memory limit for each case
    (``timeout_s`` None: :data:`DEFAULT_TIMEOUT_S`, read at each call).
    """
    timeout_s = DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s
    cases = parse_test_cases(ground_truth)
    source, fn_name = extract_code(solution_str), cases["fn_name"]
    passed = 0
    for case_input, expected in zip(cases["inputs"], cases["outputs"]):
        result = run_python(
            build_program(source, case_input, fn_name), timeout_s=timeout_s, memory_mb=memory_mb
        )
        if result.status == "error":
            raise SandboxUnavailableError(
                f"the code sandbox could not run a test case: {result.stderr[-500:]}"
            )
        passed += _passed(result, expected, fn_name)
        if result.status == "timeout":
            break
    rate = passed / len(cases["inputs"])
    return {"score": rate, "pass_rate": rate, "acc": float(passed == len(cases["inputs"]))}
