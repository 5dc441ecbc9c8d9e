"""Tool calls parsed from the model's output, in the formats verl's ``multi_turn.format`` names:

``hermes`` (Qwen2.5, Qwen3; the default)::

    some text <tool_call>
    {"name": "calculator", "arguments": {"expression": "12*7"}}
    </tool_call>

``qwen3_coder`` (Qwen3-Coder's XML)::

    <tool_call>
    <function=calculator>
    <parameter=expression>
    12*7
    </parameter>
    </function>
    </tool_call>

``glm`` (GLM-4.5 and later)::

    <tool_call>calculator
    <arg_key>expression</arg_key>
    <arg_value>12*7</arg_value>
    </tool_call>

The two XML formats carry every value as text; a value is converted to the type the tool's schema
declares for that parameter (integer, number, boolean, object, array: read as JSON), and stays
text where the schema says string, names no type, or the text is not valid JSON.

Parsing only reads the decoded text of the model's tokens; the tokens themselves go into the
sample unchanged. A call that is not valid JSON, or lacks a string ``name`` or a mapping
``arguments``, is reported as an error (shown to the model, counted in the metrics), not raised.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from verl.tools.schemas import OpenAIFunctionCall

FORMATS = ("hermes", "qwen3_coder", "glm")
_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)
_GLM_ARGUMENT = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)
_JSON_TYPES = ("integer", "number", "boolean", "object", "array", "null")

ParameterTypes = Mapping[str, Mapping[str, str]]
"""Per tool name, per parameter name: the JSON type its schema declares."""


def parameter_types(schemas: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """:data:`ParameterTypes` from OpenAI tool schemas (``{"type": "function", "function": {...}}``)."""
    out: dict[str, dict[str, str]] = {}
    for schema in schemas:
        function = schema.get("function", schema)
        properties = (function.get("parameters") or {}).get("properties") or {}
        out[function.get("name", "")] = {
            name: spec.get("type") for name, spec in properties.items() if isinstance(spec, dict)
        }
    return out


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


def _typed(value: str, declared: str | None) -> Any:
    if declared in _JSON_TYPES:
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value  # the tool sees what the model wrote and can say what is wrong
    return value


def _strip_one_newline(value: str) -> str:
    """The XML formats put a value on lines of its own: drop that one leading and trailing newline."""
    value = value[1:] if value.startswith("\n") else value
    return value[:-1] if value.endswith("\n") else value


def _xml_calls(
    text: str,
    types: ParameterTypes,
    read: Callable[[str], tuple[str, list[tuple[str, str]]] | None],
    shape: str,
) -> ParsedTurn:
    turn = ParsedTurn(content=_CALL.sub("", text).strip())
    for body in _CALL.findall(text):
        found = read(body)
        if found is None or not found[0]:
            turn.errors.append(f"a tool call needs the form {shape}")
            continue
        name, pairs = found
        declared = types.get(name, {})
        arguments = {
            key.strip(): _typed(_strip_one_newline(v), declared.get(key.strip())) for key, v in pairs
        }
        turn.calls.append(OpenAIFunctionCall(name, arguments))
    return turn


def _read_qwen3_coder(body: str) -> tuple[str, list[tuple[str, str]]] | None:
    function = _FUNCTION.search(body)
    if function is None:
        return None
    return function.group(1).strip(), _PARAMETER.findall(function.group(2))


def _read_glm(body: str) -> tuple[str, list[tuple[str, str]]] | None:
    name = body.split("<arg_key>", 1)[0].strip()
    return (name, _GLM_ARGUMENT.findall(body)) if name and "\n" not in name else None


def parse_tool_calls(text: str, format: str, types: ParameterTypes | None = None) -> ParsedTurn:
    """The calls in ``text`` written in ``format``; ``types`` (see :func:`parameter_types`)
    converts the text values of the XML formats."""
    if format == "hermes":
        return parse_hermes(text)
    if format == "qwen3_coder":
        shape = "<function=NAME><parameter=KEY>VALUE</parameter>...</function>"
        return _xml_calls(text, types or {}, _read_qwen3_coder, shape)
    if format == "glm":
        return _xml_calls(
            text, types or {}, _read_glm, "NAME <arg_key>KEY</arg_key><arg_value>VALUE</arg_value>..."
        )
    raise ValueError(f"actor_rollout_ref.rollout.multi_turn.format={format!r}: expected one of {FORMATS}")
