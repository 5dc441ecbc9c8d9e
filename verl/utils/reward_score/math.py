"""MATH scorer: the answer is the content of the last ``\\boxed{...}`` (Hendrycks et al. 2021,
arXiv:2103.03874; MATH-500 from Lightman et al. 2023, arXiv:2305.20050).

A response is correct when its boxed answer equals the ground truth

1. as strings, after the usual normalisation (``\\dfrac`` -> ``\\frac``, no ``\\left``/``\\right``,
   units in ``\\text{}``, degree signs, ``$``, spaces, thousands separators, ``x = `` prefixes);
2. otherwise as mathematics: through Hugging Face's ``math-verify`` when it is installed
   (``pip install math-verify``), else through sympy (:mod:`verl.utils.reward_score.math_equiv`).
"""

from __future__ import annotations

import re
import threading

from verl.utils.reward_score.math_equiv import sympy_equal

__all__ = [
    "compute_score",
    "extract_boxed_answer",
    "is_equiv",
    "last_boxed_only_string",
    "normalize_final_answer",
    "remove_boxed",
]

_BOX_COMMANDS = ("\\boxed", "\\fbox")


def last_boxed_only_string(text: str) -> str | None:
    """The last ``\\boxed{...}`` (or ``\\fbox{...}``, or ``\\boxed 5``) in ``text``, braces included."""
    start = max(text.rfind(cmd) for cmd in _BOX_COMMANDS)
    if start < 0:
        return None
    cmd = next(c for c in _BOX_COMMANDS if text.startswith(c, start))
    rest = text[start + len(cmd) :]
    if rest.startswith(" "):  # "\boxed 5": the argument is the next word
        word = rest[1:].split("$")[0].split()
        return f"{cmd} {word[0]}" if word else None
    if not rest.startswith("{"):
        return None
    depth = 0
    for i, ch in enumerate(rest):
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if depth == 0:
            return text[start : start + len(cmd) + i + 1]
    return None  # unbalanced braces: the model stopped mid-answer


def remove_boxed(boxed: str) -> str:
    """``\\boxed{x}`` -> ``x`` (also ``\\fbox{x}`` and ``\\boxed x``)."""
    for cmd in _BOX_COMMANDS:
        if boxed.startswith(cmd + " "):
            return boxed[len(cmd) + 1 :]
        if boxed.startswith(cmd + "{") and boxed.endswith("}"):
            return boxed[len(cmd) + 1 : -1]
    raise ValueError(f"not a boxed expression: {boxed!r:.80}")


def extract_boxed_answer(text: str) -> str | None:
    """The content of the last box in ``text``, or None."""
    boxed = last_boxed_only_string(text)
    return remove_boxed(boxed) if boxed is not None else None


_REMOVALS = ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\$", "$", "\\%", "%", "^{\\circ}", "^\\circ")
_TEXT_COMMAND = re.compile(r"\\(?:text|textbf|mbox|mathrm)\{([^{}]*)\}")
_THOUSANDS = re.compile(r"^-?\d{1,3}(,\d{3})+(\.\d+)?$")
_SHORT_FRAC = re.compile(r"\\frac(\d)(\d)")
_SLASH_FRAC = re.compile(r"^(-?\d+)/(\d+)$")
_VAR_PREFIX = re.compile(r"^[a-zA-Z]\s*=\s*")


def normalize_final_answer(answer: str) -> str:
    """A canonical string form of a final answer, so that trivially different spellings compare equal."""
    s = str(answer).strip().replace("\n", "").replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    for token in _REMOVALS:
        s = s.replace(token, "")
    s = _TEXT_COMMAND.sub(r"\1", s)
    s = s.replace("{,}", ",").strip().rstrip(".")
    if _VAR_PREFIX.match(s) and "," not in s:
        s = _VAR_PREFIX.sub("", s, count=1)
    s = s.replace(" ", "")
    if _THOUSANDS.match(s):
        s = s.replace(",", "")
    s = _SHORT_FRAC.sub(r"\\frac{\1}{\2}", s)
    s = _SLASH_FRAC.sub(r"\\frac{\1}{\2}", s)
    if s.startswith("."):
        s = "0" + s
    return s


def is_equiv(prediction: str, ground_truth: str) -> bool:
    """Equal after normalisation, or mathematically equal according to sympy."""
    a, b = normalize_final_answer(prediction), normalize_final_answer(ground_truth)
    return a == b or sympy_equal(a, b)


def _math_verify_score(solution_str: str, ground_truth: str) -> float | None:
    """1.0/0.0 from math-verify, or None when the package is not installed."""
    try:
        from math_verify import parse, verify
    except ImportError:
        return None
    # math-verify enforces its own time limit with SIGALRM, which only works in the main thread;
    # elsewhere the pool's per-call timeout has to do.
    limit = 5 if threading.current_thread() is threading.main_thread() else None
    gold = parse(f"\\boxed{{{ground_truth}}}", parsing_timeout=limit)
    pred = parse(solution_str, parsing_timeout=limit)
    return 1.0 if verify(gold, pred, timeout_seconds=limit) else 0.0


def compute_score(solution_str: str, ground_truth: str, use_math_verify: bool = True) -> float:
    """1.0 when the last boxed answer of ``solution_str`` equals ``ground_truth``, else 0.0."""
    truth = str(ground_truth)
    if last_boxed_only_string(truth) is not None:
        truth = extract_boxed_answer(truth) or truth
    prediction = extract_boxed_answer(solution_str)
    if prediction is not None and normalize_final_answer(prediction) == normalize_final_answer(truth):
        return 1.0
    if use_math_verify:
        verified = _math_verify_score(solution_str, truth)
        if verified is not None:
            return verified
    if prediction is None:
        return 0.0
    return 1.0 if is_equiv(prediction, truth) else 0.0
