"""The code_interpreter tool with real sandbox runs: output, failures, time-outs, refused runs,
and calls that do not hold up the event loop."""

from __future__ import annotations

import asyncio
import sys
import textwrap

import pytest

from verl.tools.code_interpreter_tool import CALL_MARGIN_S, CodeInterpreterTool
from verl.tools.sandbox import MAX_CODE_BYTES, run_python
from verl.tools.tool_registry import initialize_tools_from_config

if not sys.platform.startswith("linux"):
    pytest.skip("the sandbox uses Linux namespaces", allow_module_level=True)
_probe = run_python("print('ready')", timeout_s=60)
if _probe.status == "error" and "unshare(" in _probe.stderr:
    pytest.skip(f"this kernel/container forbids user namespaces: {_probe.stderr}", allow_module_level=True)


def execute(tool: CodeInterpreterTool, code: str):
    async def call():
        instance, _ = await tool.create()
        try:
            return await tool.execute(instance, {"code": textwrap.dedent(code)})
        finally:
            await tool.release(instance)

    return asyncio.run(call())


def test_the_tool_loads_from_yaml_with_its_built_in_schema(tmp_path):
    path = tmp_path / "tools.yaml"
    path.write_text(
        "tools:\n  - class_name: verl.tools.code_interpreter_tool.CodeInterpreterTool\n"
        "    config: {type: native, timeout_s: 2, memory_mb: 128, max_output_bytes: 100}\n"
    )
    (tool,) = initialize_tools_from_config(str(path))
    assert tool.name == "code_interpreter"
    assert tool.tool_schema.function.parameters["required"] == ["code"]
    assert (tool.timeout_s, tool.memory_mb, tool.max_output_bytes) == (2.0, 128, 100)
    # the agent loop's own limit on a call leaves room for the sandbox to report its time-out
    assert tool.call_timeout_s == 2.0 + CALL_MARGIN_S


def test_an_unknown_config_key_is_named():
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['timeout'\]"):
        CodeInterpreterTool({"timeout": 3}, None)


def test_stdout_and_stderr_come_back_as_text():
    tool = CodeInterpreterTool({"timeout_s": 30}, None)
    response, reward, metrics = execute(
        tool,
        """
        import sys
        print(sum(range(1, 11)))
        print("careful", file=sys.stderr)
        """,
    )
    assert response.text == "55\nstderr:\ncareful"
    assert (reward, metrics["status"], metrics["exit_code"]) == (0.0, "ok", 0)


def test_an_exception_shows_its_traceback_and_status():
    tool = CodeInterpreterTool({"timeout_s": 30}, None)
    response, _, metrics = execute(tool, "print('before')\n1 / 0\n")
    assert response.text.startswith("before\nstderr:\nTraceback")
    assert "ZeroDivisionError" in response.text
    assert response.text.endswith("[status: failed, exit code 1]")
    assert metrics["status"] == "failed"


def test_no_output_says_so():
    response, _, _ = execute(CodeInterpreterTool({"timeout_s": 30}, None), "x = 1\n")
    assert response.text == "(no output)"


def test_output_is_cut_at_max_output_bytes():
    tool = CodeInterpreterTool({"timeout_s": 30, "max_output_bytes": 50}, None)
    response, _, _ = execute(tool, "print('x' * 10000)\n")
    assert response.text.startswith("x" * 50 + "\n[verl sandbox: output truncated to 50 bytes")
    assert len(response.text) < 200


def test_a_time_out_keeps_what_was_printed_and_is_in_the_metrics():
    tool = CodeInterpreterTool({"timeout_s": 1}, None)
    response, _, metrics = execute(tool, "print('started', flush=True)\nwhile True:\n    pass\n")
    assert response.text.startswith("started\n")
    assert response.text.endswith("[status: timeout, the program was stopped after 1 s]")
    assert metrics["status"] == "timeout"


def test_a_sandbox_error_is_shown_to_the_model_not_raised():
    # A program over the sandbox's size limit is refused before it runs: status "error".
    tool = CodeInterpreterTool({"timeout_s": 30}, None)
    response, reward, metrics = execute(tool, "#" * (MAX_CODE_BYTES + 1))
    assert response.text.startswith("Error: the sandbox could not run the code: code is")
    assert (reward, metrics["status"], metrics["exit_code"]) == (0.0, "error", None)


def test_a_call_without_code_is_an_error_message():
    tool = CodeInterpreterTool({}, None)
    response, _, metrics = asyncio.run(tool.execute("id", {"program": "print(1)"}))
    assert response.text == "Error: expected a string argument `code`"
    assert metrics["status"] == "invalid"


def test_a_running_call_does_not_block_the_event_loop():
    tool = CodeInterpreterTool({"timeout_s": 60}, None)

    async def scenario():
        slow = asyncio.create_task(tool.execute("a", {"code": "import time\ntime.sleep(3)\nprint('slow')"}))
        for _ in range(3):
            await asyncio.sleep(0)  # let the slow call start
        # Had execute blocked the loop, the slow call would have finished inside the yields above.
        assert not slow.done()
        fast, _, _ = await tool.execute("b", {"code": "print('fast')"})
        # The second call ran and finished while the first was still running: they overlapped.
        slow_was_running = not slow.done()
        return fast.text, slow_was_running, (await slow)[0].text

    fast_text, slow_was_running, slow_text = asyncio.run(scenario())
    assert (fast_text, slow_was_running, slow_text) == ("fast", True, "slow")
