"""Agents written for the openai client train unchanged: their completions, recorded by the
loopback endpoint, become the sample token for token."""

from __future__ import annotations

import pytest

from tests.experimental.agent_loop.conftest import run
from tests.experimental.agent_loop.openai_agents import RETURNED

pytest.importorskip("openai", reason="the openai package is not installed (vllm brings it)")


def test_an_openai_client_agents_completions_are_the_sample(agent):
    manager, tokenizer, _ = agent
    out = run(manager, tokenizer, ["Q1"], agent_name="openai_calculator")
    b = out.batch
    n = int(b["attention_mask"][0, manager.rollout.prompt_length :].sum())
    response, mask = b["responses"][0, :n].tolist(), b["response_mask"][0, :n].tolist()
    first, second = RETURNED["Q1"]  # the tool call, then the answer
    tool_turn = tokenizer("<r>84</r>>", add_special_tokens=False)["input_ids"]
    assert response == first + tool_turn + second  # what the server returned, in order
    assert mask == [1] * len(first) + [0] * len(tool_turn) + [1] * len(second)
    # the agent's reward is the sample's score, on its last token
    scores = b["rm_scores"][0]
    assert scores[n - 1] == 1.0 and scores.sum() == 1.0
    metrics = out.meta_info["metrics"]
    assert metrics["agent/openai_completions"] == 2 and metrics["agent/openai_dropped_completions"] == 0


def test_a_rewritten_history_starts_a_new_chain_and_counts_the_dropped_completion(agent):
    manager, tokenizer, _ = agent
    out = run(manager, tokenizer, ["Q1"], agent_name="openai_rewriter")
    metrics = out.meta_info["metrics"]
    assert metrics["agent/openai_completions"] == 2 and metrics["agent/openai_dropped_completions"] == 1
    width = manager.rollout.prompt_length
    prompt = out.batch["prompts"][0][out.batch["attention_mask"][0, :width].bool()].tolist()
    assert tokenizer.decode(prompt) == "Q6>"  # the last chain's prompt
    assert float(out.batch["rm_scores"][0].sum()) == 0.5
