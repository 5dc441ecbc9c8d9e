"""Interactions for the tests (named in their interaction YAML)."""

from __future__ import annotations

from typing import Any

from tests.experimental.agent_loop.tool_model import USER_RETRY
from verl.interactions.base import BaseInteraction
from verl.interactions.gsm8k_interaction import Gsm8kInteraction


class NagInteraction(BaseInteraction):
    """Never satisfied: answers every turn with the memorised retry request and a score of 0.5, and
    records which instances were started and finalized (class-level)."""

    started: list[str] = []
    finalized: list[str] = []

    async def start_interaction(self, instance_id: str | None = None, **kwargs: Any) -> str:
        instance_id = await super().start_interaction(instance_id)
        NagInteraction.started.append(instance_id)
        return instance_id

    async def generate_response(
        self, instance_id: str, messages: list[dict[str, Any]], **kwargs: Any
    ) -> tuple[bool, str, float, dict[str, Any]]:
        return False, USER_RETRY, 0.5, {}

    async def finalize_interaction(self, instance_id: str | None = None, **kwargs: Any) -> None:
        NagInteraction.finalized.append(instance_id)


class TerseGsm8kInteraction(Gsm8kInteraction):
    """The GSM8K user with the retry request the tool model memorised (its texts have no spaces)."""

    RETRY = USER_RETRY
