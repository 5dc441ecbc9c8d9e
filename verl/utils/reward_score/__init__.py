"""Rule-based scorers, picked by each row's ``data_source``.

``default_compute_score(data_source, solution_str, ground_truth, extra_info)`` is verl's entry
point: it returns a float (1.0 correct, 0.0 wrong for the built-in 0/1 scorers) or, for the code
scorer, a dict with ``score`` (the fraction of test cases passed), ``pass_rate`` and ``acc``; it
raises :class:`UnknownDataSourceError` for a data source no scorer handles. Known sources:

==========================================================  ===================================
data_source                                                 scorer
==========================================================  ===================================
``openai/gsm8k``, ``gsm8k``                                 :mod:`.gsm8k` (strict ``#### n``)
``reasoning_gym/gsm_symbolic``, ``gsm_symbolic``            :mod:`.gsm8k` (strict ``#### n``)
``reasoning_gym/basic_arithmetic``                          :mod:`.gsm8k` (flexible: the last number)
``lighteval/MATH``, ``DigitalLearningGmbH/MATH-lighteval``,  :mod:`.math` (``\\boxed{}``)
``HuggingFaceH4/MATH-500``, ``math``
``countdown``                                               :mod:`.countdown`
``arith``                                                   :mod:`.arith` (the built-in task)
``vision_digits``                                           :mod:`.arith` (the built-in vision task)
``hiyouga/geometry3k``                                      :mod:`.geo3k` (format and ``\\boxed{}``)
``tool_arith``                                              :mod:`.tool_arith` (the built-in tool task)
``code_offline``, ``codecontests``, ``apps``,               :mod:`.code` (test cases run in the
``codeforces``, ``taco``                                    local sandbox)
==========================================================  ===================================

Any other source needs ``custom_reward_function.path``. This package imports neither torch nor
sympy at import time: it is loaded by every scorer process.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from verl.utils.reward_score import arith, code, countdown, geo3k, gsm8k, tool_arith
from verl.utils.reward_score import math as math_score

__all__ = [
    "KNOWN_DATA_SOURCES",
    "UnknownDataSourceError",
    "default_compute_score",
    "default_compute_score_batch",
    "is_known_data_source",
]


def _last_number(solution_str: str, ground_truth: Any) -> float:
    """1.0 when the response's last number equals the ground truth (small models rarely keep a format)."""
    return gsm8k.compute_score(solution_str, ground_truth, method="flexible")


class UnknownDataSourceError(NotImplementedError):
    """No built-in scorer handles this data_source (and no custom reward function is set)."""


_SCORERS: dict[str, Callable[[str, Any], float | dict[str, float]]] = {
    "openai/gsm8k": gsm8k.compute_score,
    "gsm8k": gsm8k.compute_score,
    "reasoning_gym/gsm_symbolic": gsm8k.compute_score,
    "gsm_symbolic": gsm8k.compute_score,
    "reasoning_gym/basic_arithmetic": _last_number,
    "lighteval/MATH": math_score.compute_score,
    "DigitalLearningGmbH/MATH-lighteval": math_score.compute_score,
    "HuggingFaceH4/MATH-500": math_score.compute_score,
    "math": math_score.compute_score,
    "countdown": countdown.compute_score,
    "arith": arith.compute_score,
    "vision_digits": arith.compute_score,
    "hiyouga/geometry3k": geo3k.compute_score,
    "tool_arith": tool_arith.compute_score,
    # verl's names for APPS-format code datasets (it scores them with the pass fraction too)
    "code_offline": code.compute_score,
    "codecontests": code.compute_score,
    "apps": code.compute_score,
    "codeforces": code.compute_score,
    "taco": code.compute_score,
}

KNOWN_DATA_SOURCES: tuple[str, ...] = tuple(_SCORERS)
"""Every data_source that :func:`default_compute_score` can score."""


def is_known_data_source(data_source: str) -> bool:
    """True when :func:`default_compute_score` has a scorer for ``data_source``."""
    return data_source in _SCORERS


def default_compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict[str, Any] | None = None,
    **kwargs: Any,
) -> float | dict[str, float]:
    """Score one response with the scorer registered for ``data_source``."""
    scorer = _SCORERS.get(data_source)
    if scorer is None:
        raise UnknownDataSourceError(
            f"no built-in scorer for data_source {data_source!r}; known: {sorted(_SCORERS)}. "
            "Set custom_reward_function.path/name to score it with your own function."
        )
    result = scorer(solution_str, ground_truth)
    return dict(result) if isinstance(result, Mapping) else float(result)


def default_compute_score_batch(
    data_sources: Sequence[str],
    solution_strs: Sequence[str],
    ground_truths: Sequence[Any],
    extra_infos: Sequence[dict[str, Any] | None],
    **kwargs: Any,
) -> list[float | dict[str, float]]:
    """The vectorised form used by the ``batch`` reward manager when no custom function is set."""
    return [
        default_compute_score(source, solution, truth, extra)
        for source, solution, truth, extra in zip(data_sources, solution_strs, ground_truths, extra_infos)
    ]
