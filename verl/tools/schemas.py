"""The records tools exchange with the agent loop: an OpenAI function schema and a tool response.

Field names follow the OpenAI function-calling format (and verl's tool YAML), so a tool written
for verl declares the same schema here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class OpenAIFunctionSchema:
    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})


@dataclass
class OpenAIFunctionToolSchema:
    """``{"type": "function", "function": {"name", "description", "parameters"}}``."""

    function: OpenAIFunctionSchema
    type: str = "function"

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "tool_schema") -> OpenAIFunctionToolSchema:
        function = data.get("function") if isinstance(data, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ValueError(
                f"{where}: expected {{type: function, function: {{name, description, parameters}}}}"
            )
        unknown = set(function) - {"name", "description", "parameters", "strict"}
        if unknown:
            raise ValueError(f"{where}.function: unknown field(s) {sorted(unknown)}")
        params = function.get("parameters") or {"type": "object", "properties": {}}
        return cls(OpenAIFunctionSchema(function["name"], function.get("description", ""), params))

    def to_dict(self) -> dict[str, Any]:
        f = self.function
        return {
            "type": self.type,
            "function": {"name": f.name, "description": f.description, "parameters": f.parameters},
        }


@dataclass
class OpenAIFunctionCall:
    """A call parsed from the model's output: the function name and its JSON arguments."""

    name: str
    arguments: dict[str, Any]


@dataclass
class ToolResponse:
    """What a tool returns to the model (text only here; images and videos are verl's multimodal tools)."""

    text: str | None = None
    image: list[Any] | None = None
    video: list[Any] | None = None

    def is_empty(self) -> bool:
        return not self.text and not self.image and not self.video
