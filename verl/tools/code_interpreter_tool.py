"""``code_interpreter``: runs the model's Python code in the local sandbox and shows what it printed.

Each call is a fresh sandbox run (``verl.tools.sandbox.run_python``: no network, no view of the
host's files or environment, limits on time, memory and processes), so calls never share state.
The run is a blocking subprocess wait, done in a worker thread so the agent loops' event loop
keeps serving other trajectories meanwhile.

YAML entry (docs/agents.md)::

    - class_name: verl.tools.code_interpreter_tool.CodeInterpreterTool
      config: {timeout_s: 10, memory_mb: 512, max_output_bytes: 4096}

``timeout_s`` is the code's wall-clock limit. The agent loop's limit on one call is the tool's
``call_timeout_s``, ``timeout_s + CALL_MARGIN_S``, so that a program that runs out of time is
reported by the sandbox (with what it printed) and not cut off by the agent loop a moment earlier.

The text returned to the model: stdout; then ``stderr:`` and stderr if there is any; then
``[status: ...]`` unless the program exited with code 0; ``(no output)`` if there is nothing
else. When the sandbox itself cannot run code (status ``error``), the text starts with
``Error:`` and says why. The metrics of every call: ``status`` (the sandbox's status, or
``invalid`` for a call without a string ``code``), ``exit_code``, ``wall_s``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from verl.tools.base_tool import BaseTool
from verl.tools.sandbox import SandboxResult, run_python
from verl.tools.schemas import OpenAIFunctionSchema, OpenAIFunctionToolSchema, ToolResponse

logger = logging.getLogger(__name__)

CALL_MARGIN_S = 5.0
_DEFAULTS = {"timeout_s": 10.0, "memory_mb": 512, "max_output_bytes": 4096}
_INERT = {"type"}  # verl's YAML names the tool kind (`type: native`); it changes nothing here


class CodeInterpreterTool(BaseTool):
    def __init__(self, config: dict[str, Any], tool_schema: OpenAIFunctionToolSchema | None) -> None:
        super().__init__(config, tool_schema)
        unknown = set(self.config) - set(_DEFAULTS) - _INERT
        if unknown:
            raise ValueError(
                f"{self.name} tool config: unknown key(s) {sorted(unknown)}; known: {sorted(_DEFAULTS)}"
            )
        limits = {**_DEFAULTS, **{k: v for k, v in self.config.items() if k in _DEFAULTS}}
        self.timeout_s = float(limits["timeout_s"])
        self.memory_mb = int(limits["memory_mb"])
        self.max_output_bytes = int(limits["max_output_bytes"])
        if self.timeout_s <= 0 or self.memory_mb < 32 or self.max_output_bytes < 1:
            raise ValueError(
                f"{self.name} tool config: need timeout_s > 0, memory_mb >= 32, max_output_bytes >= 1; "
                f"got {self.timeout_s}, {self.memory_mb}, {self.max_output_bytes}"
            )
        self.call_timeout_s = self.timeout_s + CALL_MARGIN_S  # the agent loop's limit on one call

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        return OpenAIFunctionToolSchema(
            OpenAIFunctionSchema(
                name="code_interpreter",
                description=(
                    "Run a Python 3 program (standard library only, no network, no input) and "
                    "return what it printed. Use print() to see values."
                ),
                parameters={
                    "type": "object",
                    "properties": {"code": {"type": "string", "description": "the Python program"}},
                    "required": ["code"],
                },
            )
        )

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        code = parameters.get("code")
        if not isinstance(code, str):
            text = "Error: expected a string argument `code`"
            return ToolResponse(text=text), 0.0, {"status": "invalid", "exit_code": None, "wall_s": 0.0}
        result = await asyncio.to_thread(
            run_python,
            code,
            timeout_s=self.timeout_s,
            memory_mb=self.memory_mb,
            max_output_bytes=self.max_output_bytes,
        )
        if result.status == "error":
            logger.warning("code_interpreter: the sandbox could not run the code: %s", result.stderr[-300:])
        metrics = {"status": result.status, "exit_code": result.exit_code, "wall_s": result.wall_s}
        return ToolResponse(text=self.format_result(result)), 0.0, metrics

    def format_result(self, result: SandboxResult) -> str:
        """The text the model sees for one run."""
        if result.status == "error":
            return f"Error: the sandbox could not run the code: {result.stderr.strip()}"
        parts = [result.stdout] if result.stdout else []
        if result.stderr:
            parts.append(f"stderr:\n{result.stderr}")
        if result.status == "timeout":
            parts.append(f"[status: timeout, the program was stopped after {self.timeout_s:g} s]")
        elif result.status != "ok":
            parts.append(f"[status: {result.status}, exit code {result.exit_code}]")
        text = "\n".join(part.rstrip("\n") for part in parts)
        return text or "(no output)"
