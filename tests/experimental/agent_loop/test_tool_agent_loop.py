"""The tool agent loop on a real hf rollout server (loopback HTTP) with a tiny model that has
memorised tool-using conversations: token-in/token-out samples, masks on tool turns, and tool
failures that become messages and metrics instead of crashed steps."""

from __future__ import annotations

import pytest
import torch

from tests.experimental.agent_loop.conftest import run
from tests.experimental.agent_loop.tool_model import ANSWER_TOKEN
from tests.experimental.agent_loop.tools_for_tests import CountingTool
from verl.workers.forward import POLICY_INPUT_KEYS, response_log_probs


def test_a_tool_call_round_trip_keeps_the_generated_ids_and_masks_the_tool_turn(agent):
    manager, tokenizer, rollout = agent
    out = run(manager, tokenizer, ["Q1"])
    b = out.batch
    n = int(b["attention_mask"][0, manager.rollout.prompt_length :].sum())
    response, mask = b["responses"][0, :n].tolist(), b["response_mask"][0, :n].tolist()
    eos, answer = tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(ANSWER_TOKEN)
    tool_turn = tokenizer("<r>84</r>>", add_special_tokens=False)["input_ids"]
    first_eos = response.index(eos)
    # model turn (the call, then EOS) | tool turn (the calculator's answer) | model turn (answer, EOS)
    assert response[first_eos + 1 : first_eos + 1 + len(tool_turn)] == tool_turn
    assert response[first_eos + 1 + len(tool_turn) :] == [answer, eos]
    assert mask == [1] * (first_eos + 1) + [0] * len(tool_turn) + [1, 1]
    assert "calculator" in tokenizer.decode(response[:first_eos])
    # token-in/token-out: the answer token survives, though decode-then-encode would split it
    model_tokens = [t for t, m in zip(response, mask) if m]
    assert tokenizer(tokenizer.decode(model_tokens), add_special_tokens=False)["input_ids"] != model_tokens
    assert out.non_tensor_batch["__num_turns__"][0] == 4
    assert out.meta_info["metrics"]["agent/tool_calls"] == 1
    assert out.meta_info["metrics"]["agent/tool_errors/exception"] == 0
    # the engine's log-probs sit on model tokens only and equal a teacher-forced forward's there
    micro = {k: b[k] for k in POLICY_INPUT_KEYS}
    forced = response_log_probs(rollout.module, micro, 1.0)["log_probs"][0, :n]
    engine = b["rollout_log_probs"][0, :n]
    model_positions = torch.tensor(mask).bool()
    assert (engine[~model_positions] == 0).all()
    assert torch.allclose(engine[model_positions], forced[model_positions], atol=1e-4)
    assert (b["response_versions"][0, :n][~model_positions] == -1).all()


@pytest.mark.parametrize(
    ("question", "kind"), [("Q2", "malformed"), ("Q3", "unknown"), ("Q4", "exception"), ("Q5", "timeout")]
)
def test_a_failing_tool_call_becomes_an_error_message_and_a_metric(agent, question, kind):
    manager, tokenizer, _ = agent
    out = run(manager, tokenizer, [question])
    metrics = out.meta_info["metrics"]
    assert metrics[f"agent/tool_errors/{kind}"] == 1
    others = [k for k in ("malformed", "unknown", "exception", "timeout") if k != kind]
    assert all(metrics[f"agent/tool_errors/{k}"] == 0 for k in others)
    n = int(out.batch["attention_mask"][0, manager.rollout.prompt_length :].sum())
    text = tokenizer.decode(out.batch["responses"][0, :n][out.batch["response_mask"][0, :n] == 0].tolist())
    assert "Error:" in text  # the model was told
    assert out.non_tensor_batch["__num_turns__"][0] >= 3


def test_trajectories_run_concurrently_and_every_tool_instance_is_released(agent):
    manager, tokenizer, _ = agent
    CountingTool.created.clear()
    CountingTool.released.clear()
    out = run(manager, tokenizer, ["Q5", "Q1", "Q6", "Q4"])  # a slow tool does not hold up the others
    assert len(out) == 4
    assert out.non_tensor_batch["__num_turns__"].tolist()[2] == 2  # Q6 answers at once
    assert sorted(CountingTool.created) == sorted(CountingTool.released) and len(CountingTool.created) == 4
