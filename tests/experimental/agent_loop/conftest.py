"""The agent-loop fixture: a real hf rollout server (loopback HTTP) on the memorised tool model,
and an AgentLoopManager over it with the test tools and loops registered."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.experimental.agent_loop.tool_model import cached_tool_model
from verl.config.ppo_trainer import load_config
from verl.experimental.agent_loop.manager import AgentLoopManager
from verl.protocol import DataProto
from verl.utils.model import eos_token_ids, load_causal_lm, load_tokenizer
from verl.workers.rollout import build_server
from verl.workers.rollout.hf_rollout import HFRollout

LOOPS_YAML = """
- name: openai_calculator
  _target_: verl.experimental.agent_loop.openai_agent_loop.OpenAIAgentLoop
  function: tests.experimental.agent_loop.openai_agents.calculator_agent
- name: openai_rewriter
  _target_: verl.experimental.agent_loop.openai_agent_loop.OpenAIAgentLoop
  function: tests.experimental.agent_loop.openai_agents.history_rewriting_agent
"""
TOOLS_YAML = """
tools:
  - class_name: verl.tools.calculator_tool.CalculatorTool
    config: {}
  - class_name: tests.experimental.agent_loop.tools_for_tests.FailingTool
    config: {}
  - class_name: tests.experimental.agent_loop.tools_for_tests.SlowTool
    config: {timeout_s: 0.2, sleep_s: 600}
  - class_name: tests.experimental.agent_loop.tools_for_tests.CountingTool
    config: {}
"""


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    root = tmp_path_factory.mktemp("agent")
    model_path = cached_tool_model()
    (root / "tools.yaml").write_text(TOOLS_YAML)
    (root / "loops.yaml").write_text(LOOPS_YAML)
    config = load_config(
        [
            f"actor_rollout_ref.model.path={model_path}",
            "actor_rollout_ref.rollout.mode=async",
            "actor_rollout_ref.rollout.multi_turn.enable=True",
            "actor_rollout_ref.rollout.multi_turn.max_user_turns=1",
            f"actor_rollout_ref.rollout.multi_turn.tool_config_path={root / 'tools.yaml'}",
            "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
            f"actor_rollout_ref.rollout.agent.agent_loop_config_path={root / 'loops.yaml'}",
            "actor_rollout_ref.rollout.calculate_log_probs=True",
            "data.return_raw_chat=True",
            "data.max_prompt_length=8",
            "data.max_response_length=160",
        ]
    )
    tokenizer = load_tokenizer(model_path)
    server, front, manager = serve(config, tokenizer)
    yield manager, tokenizer, server.rollout
    manager.close()
    front.close()
    server.close()


def serve(config, tokenizer):
    """The hf rollout server (loopback HTTP) on the config's model, and an AgentLoopManager over it."""
    rollout_cfg = config.actor_rollout_ref.rollout
    model = load_causal_lm(config.actor_rollout_ref.model)
    rollout = HFRollout(
        model,
        rollout_cfg,
        tokenizer.pad_token_id,
        eos_token_ids(tokenizer, config.actor_rollout_ref.model.path),
        torch.device("cpu"),
        0,
    )
    server, front = build_server(rollout, rollout_cfg, tokenizer, "tool-model")
    return server, front, AgentLoopManager(config, [front.address], tokenizer)


def run(
    manager: AgentLoopManager,
    tokenizer,
    questions: list[str],
    agent_name: str | None = None,
    columns: dict[str, list] | None = None,
) -> DataProto:
    """Greedy trajectories for ``questions`` (``columns``: more non-tensor columns, one value per row)."""
    width = manager.rollout.prompt_length
    rows = [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)
        for q in questions
    ]
    rows = [list(r["input_ids"] if hasattr(r, "keys") else r) for r in rows]
    ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(r)) + r for r in rows])
    mask = (torch.arange(width)[None] >= torch.tensor([width - len(r) for r in rows])[:, None]).long()
    prompts = DataProto.from_dict(
        {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)},
        non_tensors={
            "raw_prompt": _column([[{"role": "user", "content": q}] for q in questions]),
            "reward_model": _column([{"ground_truth": "84"} for _ in questions]),
            **({"agent_name": _column([agent_name] * len(questions))} if agent_name else {}),
            **{key: _column(values) for key, values in (columns or {}).items()},
        },
        meta_info={"do_sample": False},
    )
    return manager.generate_sequences(prompts)


def _column(values):
    column = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        column[i] = v
    return column
