"""Scorer of the built-in tool task (:mod:`verl.builtin.tool_arith`).

The scored text is the whole decoded trajectory: the model's turns and the tool answers the chat
template put between them, e.g.::

    <tool_call>{"name":"calculator","arguments":{"expression":"123*456"}}</tool_call><tool_response>56088</tool_response>56088

* ``acc`` (also the ``score``): the final answer, the text after the last tool answer (the whole
  text when there is none), equals the ground truth once stripped;
* ``tool_success``: some tool answer equals the ground truth, i.e. the model made a well-formed
  call with the right expression and the calculator ran it.
"""

from __future__ import annotations

import re

__all__ = ["compute_score"]

_TOOL_ANSWER = re.compile(r"<tool_response>(.*?)</tool_response>", re.DOTALL)
_CLOSE = "</tool_response>"


def compute_score(solution_str: str, ground_truth: str) -> dict[str, float]:
    truth = str(ground_truth).strip()
    answer = solution_str.rpartition(_CLOSE)[2] if _CLOSE in solution_str else solution_str
    acc = float(answer.strip() == truth)
    tool_success = float(any(a.strip() == truth for a in _TOOL_ANSWER.findall(solution_str)))
    return {"score": acc, "acc": acc, "tool_success": tool_success}
