"""GSM8K scorer: the final answer follows ``####`` (Cobbe et al. 2021, arXiv:2110.14168).

Two ways to find the model's answer:

* ``strict``: the number after the last ``#### `` marker, as the preprocessing instruction asks;
* ``flexible``: the last number anywhere in the response (for models that ignore the format).

Numbers are compared as decimals after removing thousands separators and ``$``, so ``1,000``,
``1000`` and ``1000.0`` all match a ground truth of ``1000``.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

__all__ = ["compute_score", "extract_solution"]

# Only the tail is searched: the answer is at the end, and regexes over very long
# (runaway) generations would otherwise dominate the scoring time.
_TAIL_CHARS = 300

_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_NUMBER = re.compile(r"(\-?[0-9\.\,]+)")


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """The answer string found in ``solution_str`` (commas and ``$`` removed), or None."""
    if method not in ("strict", "flexible"):
        raise ValueError(f"method must be 'strict' or 'flexible', got {method!r}")
    tail = solution_str[-_TAIL_CHARS:]
    if method == "strict":
        found = _STRICT.findall(tail)
        return _clean(found[-1]) if found and _is_number(_clean(found[-1])) else None
    for candidate in reversed(_NUMBER.findall(tail)):
        if _is_number(_clean(candidate)):
            return _clean(candidate)
    return None


def _is_number(text: str) -> bool:
    return any(ch.isdigit() for ch in text)


def _clean(number: str) -> str:
    return number.replace(",", "").replace("$", "").rstrip(".")


def _same_number(answer: str, ground_truth: str) -> bool:
    try:
        return Decimal(answer) == Decimal(_clean(str(ground_truth)))
    except InvalidOperation:
        return answer == str(ground_truth).strip()


def compute_score(
    solution_str: str,
    ground_truth: str,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """``score`` for the right answer, ``format_score`` for a wrong one, 0 when none is found."""
    answer = extract_solution(solution_str, method=method)
    if answer is None:
        return 0.0
    return score if _same_number(answer, ground_truth) else format_score
