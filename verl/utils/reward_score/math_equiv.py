"""Mathematical equality of two normalised answers with sympy (the fallback when math-verify is
not installed).

A small LaTeX subset is rewritten into Python syntax (``\\frac{a}{b}``, ``\\sqrt{x}``,
``\\sqrt[n]{x}``, ``\\pi``, ``\\cdot``, ``\\times``, ``^``, braces) and parsed by sympy. The answer
comes from a model, and sympy's parser evaluates Python code, so the rewritten text must pass a
whitelist first: digits, single-letter symbols, ``sqrt``, ``pi``, operators and brackets, and only
small literal exponents (``9^9^9^9`` would otherwise run for ever). Anything else is "not equal".
"""

from __future__ import annotations

import re
from functools import lru_cache

__all__ = ["latex_to_python", "sympy_equal"]

_MAX_CHARS = 200
_ALLOWED = re.compile(r"^[0-9a-zA-Z+\-*/().\s]*$")
_NAMES = re.compile(r"[a-zA-Z]+")
_KNOWN_NAMES = {"sqrt", "pi"}
_POWER = re.compile(r"\*\*")
_SAFE_EXPONENT = re.compile(r"\*\*(\d{1,3}(?!\d)|[a-zA-Z](?![a-zA-Z])|\(-?\d{1,3}(/\d{1,3})?\))(?!\*\*)")


def _brace_group(text: str, start: int) -> tuple[str, int] | None:
    """Content of the ``{...}`` starting at ``text[start]`` and the index after it."""
    if start >= len(text) or text[start] != "{":
        return None
    depth = 0
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start + 1 : i], i + 1
    return None


def _replace_command(text: str, command: str, arity: int, template: str) -> str | None:
    """Rewrite every ``command{a}{b}`` with ``template.format(a, b)``; None on unbalanced braces."""
    while (pos := text.find(command)) >= 0:
        args, cursor = [], pos + len(command)
        for _ in range(arity):
            group = _brace_group(text, cursor)
            if group is None:
                return None
            args.append(group[0])
            cursor = group[1]
        text = text[:pos] + template.format(*args) + text[cursor:]
    return text


def latex_to_python(latex: str) -> str | None:
    """Python/sympy syntax for a small LaTeX subset, or None if ``latex`` is outside it or unsafe."""
    if len(latex) > _MAX_CHARS:
        return None
    text = latex.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    text = re.sub(r"\\sqrt\[([^\]]*)\]", r"\\rootof{\1}", text)
    for command, arity, template in (
        ("\\frac", 2, "(({0})/({1}))"),
        ("\\rootof", 2, "(({1})**(1/{0}))"),
        ("\\sqrt", 1, "sqrt({0})"),
    ):
        text = _replace_command(text, command, arity, template)
        if text is None:
            return None
    for latex_op, python_op in (("\\cdot", "*"), ("\\times", "*"), ("\\pi", "pi"), ("^", "**")):
        text = text.replace(latex_op, python_op)
    text = text.replace("{", "(").replace("}", ")")
    return text if _is_safe(text) else None


def _is_safe(text: str) -> bool:
    if not _ALLOWED.match(text):
        return False
    if any(len(name) > 1 and name not in _KNOWN_NAMES for name in _NAMES.findall(text)):
        return False
    return len(_POWER.findall(text)) == len(_SAFE_EXPONENT.findall(text))


@lru_cache(maxsize=4096)
def _parse(latex: str):  # -> sympy.Expr | None
    from sympy.parsing.sympy_parser import (
        implicit_multiplication_application,
        parse_expr,
        standard_transformations,
    )

    python = latex_to_python(latex)
    if python is None or not python.strip():
        return None
    transformations = (*standard_transformations, implicit_multiplication_application)
    try:
        return parse_expr(python, transformations=transformations, evaluate=True)
    except Exception:  # the text comes from a model: any parse failure just means "not equal"
        return None


def _equal_expr(a: str, b: str) -> bool:
    import sympy

    left, right = _parse(a), _parse(b)
    if left is None or right is None:
        return False
    try:
        if not left.free_symbols and not right.free_symbols:
            x, y = complex(sympy.N(left)), complex(sympy.N(right))
            return abs(x - y) <= 1e-6 * max(1.0, abs(y))
        return sympy.simplify(left - right) == 0
    except Exception:  # e.g. comparing a number with a relation or a set
        return False


def _split_top_level(text: str) -> list[str]:
    """Split ``(1,2)`` / ``1, 2`` at commas that are not nested in brackets or braces."""
    inner = text[1:-1] if len(text) > 1 and text[0] in "([" and text[-1] in ")]" else text
    parts, depth, current = [], 0, []
    for ch in inner:
        depth += 1 if ch in "([{" else -1 if ch in ")]}" else 0
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return parts


def sympy_equal(a: str, b: str) -> bool:
    """True when two answers are the same number/expression (element-wise for tuples/lists)."""
    parts_a, parts_b = _split_top_level(a), _split_top_level(b)
    if len(parts_a) != len(parts_b):
        return False
    if len(parts_a) > 1 and (a[:1] != b[:1] or a[-1:] != b[-1:]):
        return False  # (1,2) is an interval/point, [1,2] a closed interval: brackets must match
    return all(_equal_expr(x.strip(), y.strip()) for x, y in zip(parts_a, parts_b))
