"""The trainer on multi-turn tool-using trajectories: two steps end to end (server mode, agent
loops, reward, old log-probs, update, weight sync) with the tool model of tool_model.py."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from tests.experimental.agent_loop.tool_model import cached_tool_model
from verl.config.ppo_trainer import load_config
from verl.trainer.ppo.ray_trainer import RayPPOTrainer

HERE = Path(__file__).resolve().parent


def write_rows(path: Path, questions: list[str]) -> str:
    rows = [
        {
            "data_source": "tool_test",
            "prompt": [{"role": "user", "content": q}],
            "reward_model": {"style": "rule", "ground_truth": "84"},
            "extra_info": {"index": i},
        }
        for i, q in enumerate(questions)
    ]
    pd.DataFrame(rows).to_parquet(path)
    return str(path)


LOOPS = """
- name: openai_calculator
  _target_: verl.experimental.agent_loop.openai_agent_loop.OpenAIAgentLoop
  function: tests.experimental.agent_loop.openai_agents.calculator_agent
"""


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("agent_loop", ["tool_agent", "openai_calculator"])
def test_two_steps_on_tool_trajectories(tmp_path, agent_loop):
    """tool_agent: tools from the YAML, the reward manager scores; openai_calculator: an agent
    written for the openai client runs the calculator itself and returns the reward."""
    if agent_loop.startswith("openai"):
        pytest.importorskip("openai", reason="the openai package is not installed (vllm brings it)")
    (tmp_path / "loops.yaml").write_text(LOOPS)
    model = cached_tool_model()
    (tmp_path / "tools.yaml").write_text(
        "tools:\n  - class_name: verl.tools.calculator_tool.CalculatorTool\n    config: {}\n"
    )
    train = write_rows(tmp_path / "train.parquet", ["Q1", "Q6", "Q1", "Q6"])
    config = load_config(
        [
            f"actor_rollout_ref.model.path={model}",
            f"data.train_files={train}",
            f"data.val_files={train}",
            "data.return_raw_chat=True",
            "data.max_prompt_length=8",
            "data.max_response_length=128",
            "data.train_batch_size=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.rollout.mode=async",
            "actor_rollout_ref.rollout.multi_turn.enable=True",
            f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tmp_path / 'tools.yaml'}",
            f"actor_rollout_ref.rollout.agent.default_agent_loop={agent_loop}",
            f"actor_rollout_ref.rollout.agent.agent_loop_config_path={tmp_path / 'loops.yaml'}",
            "actor_rollout_ref.rollout.calculate_log_probs=True",
            f"custom_reward_function.path={HERE / 'answer_reward.py'}",
            "trainer.n_gpus_per_node=1",
            "trainer.total_training_steps=2",
            "trainer.val_before_train=False",
            "trainer.test_freq=-1",
            "trainer.save_freq=-1",
            "trainer.logger=[console]",
            f"trainer.default_local_dir={tmp_path / 'ckpt'}",
        ]
    )
    trainer = RayPPOTrainer(config)
    try:
        trainer.init_workers()
        metrics = trainer.fit()
    finally:
        trainer.close()
    assert metrics["training/global_step"] == 2
    assert metrics["agent/num_turns/max"] >= 4  # Q1's call went through the calculator
    assert metrics.get("agent/tool_calls", metrics.get("agent/openai_completions")) >= 1
    # engine and trainer agree on the model tokens of multi-turn samples (tool turns masked out)
    assert metrics["training/rollout_logprob_diff_max"] <= 1e-3
    assert metrics["rollout/weight_sync_probe_gap"] <= 1e-6
