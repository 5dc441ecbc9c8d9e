"""Scorer of the built-in arithmetic task (:mod:`verl.builtin.arith`).

The response is correct exactly when, with surrounding whitespace stripped, it equals the
ground truth (e.g. ``"7"`` for ``"3+4="``). Nothing else is accepted: the embedded tiny model
must learn to stop right after the number.
"""

from __future__ import annotations

__all__ = ["compute_score"]


def compute_score(solution_str: str, ground_truth: str) -> float:
    """1.0 if ``solution_str.strip() == str(ground_truth).strip()``, else 0.0."""
    return 1.0 if solution_str.strip() == str(ground_truth).strip() else 0.0
