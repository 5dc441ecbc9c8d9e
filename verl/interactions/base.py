"""``BaseInteraction``: the simulated user of a multi-turn rollout (verl's interface).

One interaction object serves every trajectory of a run; each trajectory is one *instance*,
named by an ``instance_id``, whose state the interaction keeps itself (e.g. in a dict):

* ``start_interaction(instance_id, **interaction_kwargs)`` when the trajectory starts; the keyword
  arguments are the row's ``extra_info.interaction_kwargs`` (its ``name`` included);
* ``generate_response(instance_id, messages, **interaction_kwargs)`` after each model turn that
  made no tool call: ``messages`` is the chat so far (the prompt, the model's turns as text, tool
  and user turns). It returns ``(should_terminate, response, turn_score, extra)``: whether the
  conversation ends here, the user's reply, a score for this turn (reported per trajectory as
  ``turn_scores``) and anything else (not used by the agent loop);
* ``calculate_score(instance_id)``: the interaction's own helper for ``turn_score``;
* ``finalize_interaction(instance_id)`` when the trajectory ends, whatever happened.

Every method is a coroutine: the interactions of a batch run on the agent loops' event loop, so a
slow one (an LLM judge, a request) must ``await`` its work instead of blocking.
"""

from __future__ import annotations

import uuid
from typing import Any


class BaseInteraction:
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = dict(config or {})
        self.name: str = self.config.get("name", "interaction_agent")

    async def start_interaction(self, instance_id: str | None = None, **kwargs: Any) -> str:
        """Begin one trajectory's conversation; returns its instance id (a new one when None)."""
        return instance_id or uuid.uuid4().hex

    async def generate_response(
        self, instance_id: str, messages: list[dict[str, Any]], **kwargs: Any
    ) -> tuple[bool, str, float, dict[str, Any]]:
        """The user's reply to the chat so far: (should_terminate, response, turn_score, extra)."""
        raise NotImplementedError(f"{type(self).__name__}.generate_response")

    async def calculate_score(self, instance_id: str | None = None, **kwargs: Any) -> float:
        """A score for the instance's latest turn (0.0 here)."""
        return 0.0

    async def finalize_interaction(self, instance_id: str | None = None, **kwargs: Any) -> None:
        """Drop the instance's state (nothing to drop here)."""
        return None
