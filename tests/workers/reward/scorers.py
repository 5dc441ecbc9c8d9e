"""Scorer functions used by the reward tests (imported by path or by module name)."""

import os
import time


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """Behaves according to the response text, so one batch can mix outcomes."""
    if solution_str == "hang":
        time.sleep(60)
    if solution_str == "raise":
        raise ValueError("scorer exploded")
    if solution_str == "die":
        os._exit(3)
    if solution_str == "nan":
        return float("nan")
    if solution_str == "text":
        return "not a number"
    if solution_str == "dict":
        return {"score": 0.5, "acc": False, "pred": "x", **kwargs}
    return 1.0 if solution_str == ground_truth else 0.0


def batch_score(data_sources, solution_strs, ground_truths, extra_infos, **kwargs):
    """Vectorised: 2.0 for a match so tests can tell it from the per-row scorer."""
    if "hang" in solution_strs:
        time.sleep(60)
    if "short" in solution_strs:
        return [1.0]
    return [2.0 if s == g else 0.0 for s, g in zip(solution_strs, ground_truths)]


def prime_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """PRIME-style: ``(score, detail)``; the response ``99`` never finishes."""
    if solution_str == "99":
        time.sleep(60)
    return (1.0, "match") if solution_str == ground_truth else (0.0, "mismatch")


def digits_score(data_source, solution_str, ground_truth, extra_info=None):
    """verl's call convention, a plain module-level function: 1 per matching digit, divided by 10."""
    return sum(a == b for a, b in zip(solution_str, ground_truth)) / 10
