"""Tool calls parsed from the model's output, in the Hermes format (Qwen2.5/Qwen3, verl's
``multi_turn.format=hermes``)::

    some text <tool_call>
    {"name": "calculator", "arguments": {"expression": "12*7"}}
    </tool_call>

Parsing only reads the decoded text of the model's tokens; the tokens themselves go into the
sample unchanged. A call that is not valid JSON, or lacks a string ``name`` or a mapping
``arguments``, is reported as an error (shown to the model, counted in the metrics), not raised.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from verl.tools.schemas import OpenAIFunctionCall

FORMATS = ("hermes",)
_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@dataclass
class ParsedTurn:
    content: str
    """The text outside the tool-call tags."""
    calls: list[OpenAIFunctionCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    """One message per malformed call."""


def parse_hermes(text: str) -> ParsedTurn:
    turn = ParsedTurn(content=_CALL.sub("", text).strip())
    for body in _CALL.findall(text):
        try:
            call = json.loads(body)
        except json.JSONDecodeError as error:
            turn.errors.append(f"the tool call is not valid JSON ({error.msg} at character {error.pos})")
            continue
        name = call.get("name") if isinstance(call, dict) else None
        arguments = call.get("arguments", {}) if isinstance(call, dict) else None
        if isinstance(arguments, str):  # some models write the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                arguments = None
        if not isinstance(name, str) or not isinstance(arguments, dict):
            turn.errors.append('a tool call needs {"name": <string>, "arguments": <object>}')
            continue
        turn.calls.append(OpenAIFunctionCall(name, arguments))
    return turn


def parse_tool_calls(text: str, format: str) -> ParsedTurn:
    if format != "hermes":
        raise ValueError(f"actor_rollout_ref.rollout.multi_turn.format={format!r}: expected one of {FORMATS}")
    return parse_hermes(text)
