"""``BaseTool``: the interface of a tool in a multi-turn agent loop (verl's shape).

A tool instance serves many trajectories; each trajectory gets its own state through an
``instance_id``:

* ``create(instance_id, **create_kwargs)`` when the trajectory starts (per-row kwargs come from
  the dataset's ``extra_info.tools_kwargs[<tool name>].create_kwargs``);
* ``execute(instance_id, parameters)`` for each call the model makes, returning the response
  shown to the model, a step reward and metrics;
* ``calc_reward(instance_id)`` at the end (e.g. whether the answer the tool saw is right);
* ``release(instance_id)`` always, also after an error.
"""

from __future__ import annotations

import uuid
from typing import Any

from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse


class BaseTool:
    def __init__(self, config: dict[str, Any], tool_schema: OpenAIFunctionToolSchema | None) -> None:
        self.config = dict(config or {})
        self.tool_schema = tool_schema or self.get_openai_tool_schema()
        if self.tool_schema is None:
            raise ValueError(f"{type(self).__name__}: no tool_schema given and none built in")
        self.name = self.tool_schema.function.name

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema | None:
        """A built-in schema, for tools whose YAML entry gives none."""
        return getattr(self, "tool_schema", None)

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        return instance_id or uuid.uuid4().hex, ToolResponse()

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        """Run one call: (response to the model, step reward, metrics)."""
        raise NotImplementedError(f"{type(self).__name__}.execute")

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        return 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        return None
