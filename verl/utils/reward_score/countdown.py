"""Countdown scorer: combine the given numbers with + - * / into an equation equal to the target
(the task of TinyZero, Pan et al. 2025, used to study "aha" moments in small models).

The answer is the text of the last ``<answer>...</answer>`` tag (a trailing ``= target`` is
allowed). It is correct when it uses every given number exactly once, only the four operations
and brackets, and evaluates exactly (rational arithmetic) to the target. The expression is read
with Python's ``ast`` module and evaluated by walking the tree, never with ``eval``.
"""

from __future__ import annotations

import ast
import json
import operator
import re
from collections import Counter
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

__all__ = ["compute_score", "evaluate_equation", "extract_equation", "parse_ground_truth"]

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ALLOWED_CHARS = re.compile(r"^[\d+\-*/().\s]+$")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_MAX_CHARS = 200


def parse_ground_truth(ground_truth: Any) -> tuple[int, list[int]]:
    """``(target, numbers)`` from ``{"target": t, "numbers": [...]}`` (or that dict as JSON text)."""
    if isinstance(ground_truth, str):
        ground_truth = json.loads(ground_truth)
    if not isinstance(ground_truth, Mapping) or "target" not in ground_truth or "numbers" not in ground_truth:
        raise ValueError(
            f"countdown ground truth must be {{'target': int, 'numbers': [int, ...]}}, got {ground_truth!r:.80}"
        )
    return int(ground_truth["target"]), [int(n) for n in ground_truth["numbers"]]


def extract_equation(solution_str: str) -> str | None:
    """The expression inside the last ``<answer>`` tag, without a trailing ``= ...``."""
    found = _ANSWER.findall(solution_str)
    if not found:
        return None
    equation = found[-1].strip().split("=")[0].strip()
    return equation or None


def _evaluate(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    raise ValueError(f"unsupported element {ast.dump(node)[:60]}")


def evaluate_equation(equation: str) -> tuple[Fraction, list[int]] | None:
    """Exact value of ``equation`` and the integer literals it uses, or None if it is not a
    plain arithmetic expression (or divides by zero)."""
    if len(equation) > _MAX_CHARS or not _ALLOWED_CHARS.match(equation):
        return None
    try:
        tree = ast.parse(equation, mode="eval").body
        value = _evaluate(tree)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError):
        return None
    used = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)]
    return value, used


def compute_score(
    solution_str: str, ground_truth: Any, format_score: float = 0.0, score: float = 1.0
) -> float:
    """``score`` for a valid equation equal to the target, ``format_score`` for a well-formed but
    wrong one, 0 when there is no answer tag."""
    target, numbers = parse_ground_truth(ground_truth)
    equation = extract_equation(solution_str)
    if equation is None:
        return 0.0
    result = evaluate_equation(equation)
    if result is None:
        return format_score
    value, used = result
    if Counter(used) != Counter(numbers):
        return format_score
    return score if value == target else format_score
