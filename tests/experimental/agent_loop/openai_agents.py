"""Agents written for the ``openai`` client, as a user would write them (test fixtures of the
``openai_agent`` loop). Each records the token ids the endpoint returned, by question."""

from __future__ import annotations

import json
from typing import Any

from verl.tools.calculator_tool import evaluate

RETURNED: dict[str, list[list[int]]] = {}  # question -> token ids of each completion, in order

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    },
}


async def calculator_agent(client, raw_prompt, reward_model, **row: Any) -> float:
    """Ask, run the calculator calls locally, answer; reward 1 if the answer has the ground truth."""
    messages = [dict(m) for m in raw_prompt]
    question = messages[-1]["content"]
    RETURNED[question] = []
    for _ in range(3):
        response = await client.chat.completions.create(
            model="policy", messages=messages, tools=[CALCULATOR], max_tokens=100, temperature=0.0
        )
        message = response.choices[0].message
        RETURNED[question].append(response.choices[0].model_extra["token_ids"])
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            value = evaluate(json.loads(call.function.arguments)["expression"])
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(value)})
    return 1.0 if reward_model["ground_truth"] in (message.content or "") else 0.0


async def history_rewriting_agent(client, raw_prompt, **row: Any) -> dict:
    """Asks twice with unrelated histories: the first completion cannot be part of the sample."""
    first = [dict(m) for m in raw_prompt]
    await client.chat.completions.create(model="policy", messages=first, max_tokens=8, temperature=0.0)
    await client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "Q6"}], max_tokens=8, temperature=0.0
    )
    return {"reward": 0.5}
