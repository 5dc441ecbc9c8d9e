"""A tool that answers with a picture, for the tool-image tests (named in their tool YAML)."""

from __future__ import annotations

import io
from typing import Any

from tests.vision.conftest import random_png
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionSchema, OpenAIFunctionToolSchema, ToolResponse

TOOL_IMAGE_SIZE = (112, 56)  # width, height: 8 x 4 patches of 14, 4 x 2 = 8 image tokens (h != w)


def tool_image():
    """The picture the tool returns: the same one at every call (seeded pixels), as a PIL image."""
    from PIL import Image

    return Image.open(io.BytesIO(random_png(*TOOL_IMAGE_SIZE, seed=7))).convert("RGB")


class ZoomTool(BaseTool):
    """``zoom``: answers with :func:`tool_image` and the text ``zoomed`` (whatever the arguments)."""

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        return OpenAIFunctionToolSchema(OpenAIFunctionSchema("zoom", "a closer look at the picture"))

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any):
        return ToolResponse(text="zoomed", image=[tool_image()]), 0.0, {}
