"""Geometry3K (``hiyouga/geometry3k``, verl's geo3k VLM task): 0.9 x the answer's correctness plus
0.1 x the format, as verl scores it.

The format is right when the response is a ``<think>...</think>`` block followed by a ``\\boxed{}``
answer; the answer is the last ``\\boxed{}`` content, compared with :func:`.math.is_equiv`
(normalised text, else sympy).
"""

from __future__ import annotations

import re

from verl.utils.reward_score.math import extract_boxed_answer, is_equiv

FORMAT_WEIGHT = 0.1
_FORMAT = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)


def format_score(solution_str: str) -> float:
    return 1.0 if _FORMAT.fullmatch(solution_str) else 0.0


def accuracy(solution_str: str, ground_truth: str) -> float:
    answer = extract_boxed_answer(solution_str)
    return 1.0 if answer is not None and is_equiv(answer, str(ground_truth)) else 0.0


def compute_score(solution_str: str, ground_truth: str) -> float:
    return (1 - FORMAT_WEIGHT) * accuracy(solution_str, ground_truth) + FORMAT_WEIGHT * format_score(
        solution_str
    )
