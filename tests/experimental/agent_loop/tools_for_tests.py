"""Tools that misbehave on purpose, for the agent-loop tests (named in their tool YAML)."""

from __future__ import annotations

import asyncio
from typing import Any

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionSchema, OpenAIFunctionToolSchema, ToolResponse


class FailingTool(BaseTool):
    """``boom``: raises on every call."""

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        return OpenAIFunctionToolSchema(OpenAIFunctionSchema("boom", "always fails"))

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any):
        raise RuntimeError("the tool broke")


class SlowTool(BaseTool):
    """``wait``: answers after ``config.sleep_s`` seconds (its time-out is ``config.timeout_s``)."""

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        return OpenAIFunctionToolSchema(OpenAIFunctionSchema("wait", "answers slowly"))

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any):
        await asyncio.sleep(float(self.config.get("sleep_s", 600)))
        return ToolResponse(text="done"), 0.0, {}


class CountingTool(BaseTool):
    """Records create/release calls (class-level), to check every instance is released."""

    created: list[str] = []
    released: list[str] = []

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        return OpenAIFunctionToolSchema(OpenAIFunctionSchema("counter", "counts"))

    async def create(self, instance_id: str | None = None, **kwargs: Any):
        instance_id, response = await super().create(instance_id, **kwargs)
        CountingTool.created.append(instance_id)
        return instance_id, response

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any):
        return ToolResponse(text="1"), 0.0, {}

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        CountingTool.released.append(instance_id)
