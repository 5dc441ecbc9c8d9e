"""Interactions: the registry builds what the YAML lists, the GSM8K user checks answers, and the
tool agent loop appends a simulated user's replies as masked turns, on a real hf rollout server
with the memorised tool model (``Q7``: a wrong answer, the user's retry request, the right answer)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from tests.experimental.agent_loop.conftest import run, serve
from tests.experimental.agent_loop.tool_model import ANSWER_TOKEN, USER_RETRY, cached_tool_model
from tests.interactions.interactions_for_tests import NagInteraction
from verl.config.ppo_trainer import load_config
from verl.experimental.agent_loop.manager import AgentLoopManager
from verl.interactions.base import BaseInteraction
from verl.interactions.gsm8k_interaction import Gsm8kInteraction
from verl.interactions.utils.interaction_registry import initialize_interactions_from_config
from verl.utils.model import load_tokenizer
from verl.workers.reward_manager import NaiveRewardManager

INTERACTIONS_YAML = """
interaction:
  - class_name: verl.interactions.gsm8k_interaction.Gsm8kInteraction
    config: {}
  - name: nag
    class_name: tests.interactions.interactions_for_tests.NagInteraction
    config: {patience: 0}
"""
# the GSM8K user with the retry request the tool model memorised; Q7's answer is a bare number
ROLLOUT_YAML = """
interaction:
  - name: gsm8k
    class_name: tests.interactions.interactions_for_tests.TerseGsm8kInteraction
    config: {method: flexible}
  - name: nag
    class_name: tests.interactions.interactions_for_tests.NagInteraction
"""


def test_the_registry_builds_every_interaction_the_yaml_lists(tmp_path):
    path = tmp_path / "interactions.yaml"
    path.write_text(INTERACTIONS_YAML)
    interactions = initialize_interactions_from_config(str(path))
    assert sorted(interactions) == ["gsm8k", "nag"]  # an entry without a name is named after its class
    assert type(interactions["gsm8k"]) is Gsm8kInteraction and interactions["gsm8k"].name == "gsm8k"
    assert type(interactions["nag"]) is NagInteraction
    assert interactions["nag"].config == {"patience": 0, "name": "nag"}


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            "class_name: no_such_package.module.Thing",
            r"interaction\[0\]\.class_name: cannot import 'no_such_package",
        ),
        (
            "class_name: verl.tools.calculator_tool.CalculatorTool",
            r"'verl.tools.calculator_tool.CalculatorTool' is not a subclass of "
            r"verl.interactions.base.BaseInteraction",
        ),
        ("class_name: BaseInteraction", r"'BaseInteraction' is not a dotted path"),
    ],
)
def test_the_registry_refuses_a_bad_class_path_naming_the_file_and_the_entry(tmp_path, entry, message):
    path = tmp_path / "interactions.yaml"
    path.write_text(f"interaction:\n  - {entry}\n")
    with pytest.raises(ValueError, match=message) as error:
        initialize_interactions_from_config(str(path))
    assert str(path) in str(error.value)


def test_the_registry_refuses_a_missing_file_and_a_name_used_twice(tmp_path):
    missing = tmp_path / "nowhere.yaml"
    with pytest.raises(
        FileNotFoundError, match=r"multi_turn\.interaction_config_path: .*nowhere\.yaml: no such file"
    ):
        initialize_interactions_from_config(str(missing))
    twice = tmp_path / "twice.yaml"
    twice.write_text(
        "interaction:\n"
        "  - {name: a, class_name: verl.interactions.base.BaseInteraction}\n"
        "  - {name: a, class_name: verl.interactions.gsm8k_interaction.Gsm8kInteraction}\n"
    )
    with pytest.raises(ValueError, match=r"interaction\[1\]: the name 'a' is taken"):
        initialize_interactions_from_config(str(twice))


def test_the_gsm8k_user_asks_again_until_the_answer_is_right():
    async def chat() -> list[tuple[bool, str, float, dict]]:
        user = Gsm8kInteraction({"name": "gsm8k"})
        instance = await user.start_interaction("row-0", ground_truth="1,234")
        messages = [{"role": "user", "content": "How many?"}, {"role": "assistant", "content": "#### 1230"}]
        replies = [await user.generate_response(instance, messages)]
        messages += [
            {"role": "user", "content": replies[0][1]},
            {"role": "assistant", "content": "So #### 1234"},
        ]
        replies.append(await user.generate_response(instance, messages))
        await user.finalize_interaction(instance)
        assert instance not in user._instances
        return replies

    assert asyncio.run(chat()) == [
        (False, Gsm8kInteraction.RETRY, 0.0, {}),
        (True, Gsm8kInteraction.CORRECT, 1.0, {}),
    ]


def test_the_base_interaction_leaves_the_reply_to_subclasses():
    base = BaseInteraction({})
    assert base.name == "interaction_agent"
    with pytest.raises(NotImplementedError, match=r"BaseInteraction\.generate_response"):
        asyncio.run(base.generate_response("x", []))


# ---------------------------------------------------------------------------- rollouts
def interaction_config(model_path: str, interactions_yaml, max_user_turns: int | None):
    return load_config(
        [
            f"actor_rollout_ref.model.path={model_path}",
            "actor_rollout_ref.rollout.mode=async",
            "actor_rollout_ref.rollout.multi_turn.enable=True",
            f"actor_rollout_ref.rollout.multi_turn.max_user_turns={max_user_turns or 'null'}",
            f"actor_rollout_ref.rollout.multi_turn.interaction_config_path={interactions_yaml}",
            "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
            "actor_rollout_ref.rollout.calculate_log_probs=True",
            "data.return_raw_chat=True",
            "data.max_prompt_length=8",
            "data.max_response_length=160",
        ]
    )


@pytest.fixture(scope="module")
def users(tmp_path_factory):
    """Two agent loop managers on one server: no limit on user turns, and at most one."""
    path = tmp_path_factory.mktemp("interactions") / "interactions.yaml"
    path.write_text(ROLLOUT_YAML)
    model_path = cached_tool_model()
    tokenizer = load_tokenizer(model_path)
    server, front, unbounded = serve(interaction_config(model_path, path, None), tokenizer)
    bounded = AgentLoopManager(interaction_config(model_path, path, 1), [front.address], tokenizer)
    yield unbounded, bounded, tokenizer
    bounded.close()
    unbounded.close()
    front.close()
    server.close()


def chat(manager, tokenizer, interaction: str):
    """Q7's trajectory with the interaction named ``interaction``."""
    kwargs = {"name": interaction, "ground_truth": "84"}
    return run(manager, tokenizer, ["Q7"], columns={"extra_info": [{"interaction_kwargs": kwargs}]})


def turns(out) -> tuple[list[int], list[int]]:
    """The first row's response ids and mask, without padding."""
    n = int(out.batch["attention_mask"][0, out.batch["prompts"].shape[1] :].sum())
    return out.batch["responses"][0, :n].tolist(), out.batch["response_mask"][0, :n].tolist()


def test_a_user_reply_is_a_masked_turn_and_the_user_ends_the_chat_when_the_answer_is_right(users):
    manager, _, tokenizer = users
    out = chat(manager, tokenizer, "gsm8k")
    response, mask = turns(out)
    eos, answer = tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(ANSWER_TOKEN)
    seven = tokenizer("7", add_special_tokens=False)["input_ids"]
    user = tokenizer(f"{USER_RETRY}>", add_special_tokens=False)["input_ids"]
    last = [answer, eos]
    # model (a wrong answer) | the user's retry request (mask 0) | model (the right answer); the
    # user's closing "correct" is not appended: the trajectory ends on the model's turn
    assert response == [*seven, eos, *user, *last]
    assert mask == [1] * (len(seven) + 1) + [0] * len(user) + [1] * len(last)
    assert out.batch["rollout_log_probs"][0, len(seven) + 1 : len(seven) + 1 + len(user)].eq(0).all()
    assert out.non_tensor_batch["turn_scores"][0] == [0.0, 1.0]
    assert out.non_tensor_batch["__num_turns__"][0] == 4  # prompt, answer, user, answer
    assert out.meta_info["metrics"]["agent/user_turns"] == 1
    assert out.meta_info["metrics"]["agent/tool_calls"] == 0


def test_the_scorer_finds_the_turn_scores_in_its_extra_info(users):
    manager, _, tokenizer = users
    out = chat(manager, tokenizer, "gsm8k")
    seen = []

    def scorer(data_source, solution_str, ground_truth, extra_info):
        seen.append(extra_info)
        return extra_info["turn_scores"][-1]

    for key, value in {
        "data_source": "q7",
        "reward_model": {"ground_truth": "84"},
        "extra_info": {"index": 3},
    }.items():
        out.non_tensor_batch[key] = np.empty(1, dtype=object)
        out.non_tensor_batch[key][0] = value
    reward = NaiveRewardManager(tokenizer, 0, compute_score=scorer)(out)
    assert seen == [{"index": 3, "tool_rewards": [], "turn_scores": [0.0, 1.0]}]
    assert reward.sum() == 1.0


def test_max_user_turns_bounds_a_user_that_never_ends_the_chat(users):
    _, bounded, tokenizer = users
    NagInteraction.started.clear()
    NagInteraction.finalized.clear()
    out = chat(bounded, tokenizer, "nag")
    response, mask = turns(out)
    # one reply (max_user_turns=1), then the model's second answer ends the trajectory
    assert out.non_tensor_batch["turn_scores"][0] == [0.5]
    assert out.non_tensor_batch["__num_turns__"][0] == 4
    assert mask[-1] == 1 and response[-1] == tokenizer.eos_token_id
    assert mask.count(0) == len(tokenizer(f"{USER_RETRY}>", add_special_tokens=False)["input_ids"])
    assert NagInteraction.started == NagInteraction.finalized and len(NagInteraction.started) == 1


def test_a_row_that_names_no_interaction_is_refused_with_the_choices(users):
    manager, _, tokenizer = users
    with pytest.raises(ValueError, match=r"interaction_kwargs.name is None.*\['gsm8k', 'nag'\]"):
        run(manager, tokenizer, ["Q6"])
