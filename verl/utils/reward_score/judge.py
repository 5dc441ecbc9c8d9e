"""Asking a generative reward model (a judge) from a custom reward function.

With ``reward_model.enable=True reward_model.rollout.name=<engine>``, the judge at
``reward_model.model.path`` is served like the policy in server mode, and each call of your
``custom_reward_function`` gets ``reward_router_address``: the base URL of one of its servers. A
judge function fills a prompt template, asks, and parses the verdict::

    from verl.utils.reward_score.judge import chat_complete

    def compute_score(data_source, solution_str, ground_truth, extra_info, reward_router_address, **kw):
        prompt = TEMPLATE.format(question=extra_info["question"], answer=solution_str)
        verdict = chat_complete(reward_router_address, [{"role": "user", "content": prompt}], temperature=0)
        return 1.0 if verdict.strip().lower().startswith("yes") else 0.0

Only the standard library is used (the function runs in the scoring pool's processes, under the
pool's per-call timeout).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

__all__ = ["JudgeError", "chat_complete"]


class JudgeError(RuntimeError):
    """The judge server refused or failed a request; the message carries its answer."""


def chat_complete(
    address: str, messages: list[dict[str, Any]], timeout_s: float = 60.0, **sampling: Any
) -> str:
    """The judge's reply to ``messages`` (``POST {address}/v1/chat/completions``); ``sampling``:
    ``max_tokens``, ``temperature``, ``top_p``, ``top_k``, ``seed`` (unset: the judge's
    ``reward_model.rollout`` settings)."""
    body = json.dumps({"messages": messages, **sampling}).encode()
    request = urllib.request.Request(
        f"{address.rstrip('/')}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            reply = json.loads(response.read())
    except urllib.error.HTTPError as error:
        raise JudgeError(
            f"{address}: HTTP {error.code}: {error.read().decode(errors='replace')[:500]}"
        ) from error
    return reply["choices"][0]["message"]["content"]
