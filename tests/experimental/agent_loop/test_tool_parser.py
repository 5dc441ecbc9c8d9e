"""Tool calls in the three formats verl's multi_turn.format names, and their malformed cases."""

from __future__ import annotations

import pytest

from verl.config.ppo_trainer import load_config
from verl.experimental.agent_loop.tool_parser import parameter_types, parse_tool_calls

SCHEMAS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "top_k": {"type": "integer"},
                    "exact": {"type": "boolean"},
                    "filters": {"type": "object"},
                },
            },
        },
    }
]
TYPES = parameter_types(SCHEMAS)
WANTED = {"query": "12", "top_k": 3, "exact": True, "filters": {"year": 2024}}

QWEN3_CODER = """Let me look.
<tool_call>
<function=search>
<parameter=query>
12
</parameter>
<parameter=top_k>
3
</parameter>
<parameter=exact>
true
</parameter>
<parameter=filters>
{"year": 2024}
</parameter>
</function>
</tool_call>"""

GLM = """Let me look.<tool_call>search
<arg_key>query</arg_key>
<arg_value>12</arg_value>
<arg_key>top_k</arg_key>
<arg_value>3</arg_value>
<arg_key>exact</arg_key>
<arg_value>true</arg_value>
<arg_key>filters</arg_key>
<arg_value>{"year": 2024}</arg_value>
</tool_call>"""

HERMES = (
    'Let me look.<tool_call>{"name": "search", "arguments": {"query": "12", "top_k": 3, "exact": true, '
    '"filters": {"year": 2024}}}</tool_call>'
)


@pytest.mark.parametrize(("format", "text"), [("hermes", HERMES), ("qwen3_coder", QWEN3_CODER), ("glm", GLM)])
def test_each_format_gives_the_same_call_with_typed_arguments(format, text):
    turn = parse_tool_calls(text, format, TYPES)
    assert turn.errors == [] and turn.content == "Let me look."
    [call] = turn.calls
    assert (call.name, call.arguments) == ("search", WANTED)


def test_values_stay_text_without_a_declared_type_or_when_not_json():
    text = QWEN3_CODER.replace("<parameter=top_k>\n3\n", "<parameter=top_k>\nthree\n")
    [call] = parse_tool_calls(text, "qwen3_coder", TYPES).calls
    assert call.arguments["top_k"] == "three"  # the tool sees what the model wrote
    [untyped] = parse_tool_calls(QWEN3_CODER, "qwen3_coder").calls  # no schemas: all text
    assert untyped.arguments["top_k"] == "3" and untyped.arguments["query"] == "12"


def test_several_calls_and_multi_line_values():
    text = (
        "<tool_call>\n<function=run>\n<parameter=code>\nprint(1)\nprint(2)\n</parameter>\n</function>\n</tool_call>"
        "<tool_call>\n<function=run>\n<parameter=code>\nx = 1\n</parameter>\n</function>\n</tool_call>"
    )
    calls = parse_tool_calls(text, "qwen3_coder").calls
    assert [c.arguments["code"] for c in calls] == ["print(1)\nprint(2)", "x = 1"]


@pytest.mark.parametrize(
    ("format", "text", "says"),
    [
        ("qwen3_coder", "<tool_call>\nsearch(12)\n</tool_call>", "<function=NAME>"),
        ("glm", "<tool_call><arg_key>q</arg_key><arg_value>1</arg_value></tool_call>", "NAME <arg_key>"),
        ("hermes", "<tool_call>{not json}</tool_call>", "not valid JSON"),
    ],
)
def test_a_malformed_call_is_an_error_message_not_an_exception(format, text, says):
    turn = parse_tool_calls(text, format, TYPES)
    assert turn.calls == [] and len(turn.errors) == 1 and says in turn.errors[0]


def test_the_config_takes_the_formats_and_names_the_key_for_others():
    for format in ("hermes", "qwen3_coder", "glm"):
        load_config([f"actor_rollout_ref.rollout.multi_turn.format={format}"])
    with pytest.raises(ValueError, match=r"multi_turn\.format"):
        load_config(["actor_rollout_ref.rollout.multi_turn.format=pythonic"])
