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
    """What a tool returns to the model: text, and images for a vision-language policy.

    ``image`` is a list (one entry per image, as verl's tools return them): PIL images, encoded bytes,
    ``{"bytes": ...}`` / ``{"path": ...}`` dicts or file paths. The agent loop puts the images before
    the text in the tool message, expands each to the model's image tokens and adds its pixels to the
    trajectory's ``multi_modal_inputs`` (docs/vlm.md). ``video`` is verl's field; the agent loop refuses it.
    """

    text: str | None = None
    image: list[Any] | None = None
    video: list[Any] | None = None

    def __post_init__(self) -> None:
        # a bare image would be iterated pixel row by pixel row (or byte by byte) further on
        for name in ("image", "video"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, list):
                raise TypeError(
                    f"ToolResponse.{name} must be a list (one entry per {name}), got {type(value).__name__}; "
                    f"wrap a single one as [{name}]"
                )

    def is_empty(self) -> bool:
        return not self.text and not self.image and not self.video
