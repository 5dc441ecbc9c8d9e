"""``Gsm8kInteraction``: a user that checks a GSM8K answer and asks for another try when it is wrong.

Listed in the interaction YAML as::

    interaction:
      - name: gsm8k
        class_name: verl.interactions.gsm8k_interaction.Gsm8kInteraction
        config: {}                  # method: strict (default, the number after "####") | flexible

and picked by rows whose ``extra_info.interaction_kwargs`` is ``{"name": "gsm8k", "ground_truth":
"<answer>"}`` (the same answer as the row's ``reward_model.ground_truth``). After each answer the
model's last turn is scored with :func:`verl.utils.reward_score.gsm8k.compute_score`: a right answer
ends the conversation with a turn score of 1.0, a wrong one gets :attr:`RETRY` as the next user turn
and a turn score of 0.0.
"""

from __future__ import annotations

from typing import Any

from verl.interactions.base import BaseInteraction
from verl.utils.reward_score import gsm8k

METHODS = ("strict", "flexible")


class Gsm8kInteraction(BaseInteraction):
    CORRECT = "Correct, well done."
    RETRY = "That answer is not correct. Check your work and give the final answer again after ####."

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.method = self.config.get("method", "strict")
        if self.method not in METHODS:
            raise ValueError(
                f"interaction {self.name!r}: config.method must be one of {METHODS}, got {self.method!r}"
            )
        self._instances: dict[str, dict[str, Any]] = {}

    async def start_interaction(
        self, instance_id: str | None = None, ground_truth: Any = None, **kwargs: Any
    ) -> str:
        instance_id = await super().start_interaction(instance_id)
        if ground_truth is None:
            raise ValueError(
                f"interaction {self.name!r}: the row's extra_info.interaction_kwargs needs a ground_truth"
            )
        self._instances[instance_id] = {"ground_truth": str(ground_truth), "answer": ""}
        return instance_id

    async def generate_response(
        self, instance_id: str, messages: list[dict[str, Any]], **kwargs: Any
    ) -> tuple[bool, str, float, dict[str, Any]]:
        last = next((m for m in reversed(messages) if m.get("role") == "assistant"), {})
        self._instances[instance_id]["answer"] = _text(last.get("content"))
        score = await self.calculate_score(instance_id)
        if score == 1.0:
            return True, self.CORRECT, score, {}
        return False, self.RETRY, score, {}

    async def calculate_score(self, instance_id: str | None = None, **kwargs: Any) -> float:
        state = self._instances[instance_id]
        return gsm8k.compute_score(state["answer"], state["ground_truth"], method=self.method)

    async def finalize_interaction(self, instance_id: str | None = None, **kwargs: Any) -> None:
        self._instances.pop(instance_id, None)


def _text(content: Any) -> str:
    """A message's text: the string, or the text parts of a list of content parts."""
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content or ""
