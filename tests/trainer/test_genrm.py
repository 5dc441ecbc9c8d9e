"""A generative reward model (LLM-as-judge): ``reward_model.rollout.name=hf`` serves the judge
model like the policy in server mode, and the custom reward function asks it over HTTP
(``reward_router_address``), fills a prompt template and parses the verdict."""

from __future__ import annotations

import json

import pytest
import torch

from tests.trainer.fit import fit_trainer
from verl.builtin import task as builtin
from verl.builtin.arith import make_arith_rows
from verl.config.base import ConfigError
from verl.config.inert import inert_keys
from verl.config.ppo_trainer import load_config
from verl.utils.dataset.schema import write_parquet

JUDGE = """
from verl.utils.reward_score.judge import chat_complete


def compute_score(data_source, solution_str, ground_truth, extra_info, reward_router_address, **kwargs):
    # the judge works the sum out itself; the verdict: does the response agree with it?
    judged = chat_complete(reward_router_address, [{"role": "user", "content": extra_info["question"]}])
    return {"score": float(judged.strip() == solution_str.strip()), "judged": judged.strip()}
"""


def write_task(folder) -> tuple[str, str]:
    """The built-in task with each row's question in extra_info (what the judge is asked)."""
    paths = []
    for split, size in (("train", 64), ("test", 16)):
        rows = make_arith_rows(size, seed=0, split=split)
        for row in rows:
            row["extra_info"]["question"] = row["prompt"][0]["content"]
        paths.append(str(write_parquet(rows, folder / f"{split}.parquet")))
    return paths[0], paths[1]


def greedy_answer(model, tokenizer, question: str) -> str:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True)
    ids = torch.tensor([ids["input_ids"] if hasattr(ids, "keys") else ids])
    out = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True).strip()


@pytest.mark.usefixtures("ray_session", "builtin_assets")
def test_a_judge_served_by_the_rollout_engine_scores_through_a_custom_function(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.chdir(tmp_path)
    train, val = write_task(tmp_path)
    judge = tmp_path / "judge.py"
    judge.write_text(JUDGE)
    config = load_config(
        [
            f"data.train_files={train}",
            f"data.val_files={val}",
            "data.train_batch_size=8",
            "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8",
            "reward_model.enable=True",
            f"reward_model.model.path={builtin.builtin_model_dir()}",
            "reward_model.rollout.name=hf",
            "reward_model.rollout.do_sample=False",
            "reward_model.rollout.prompt_length=16",
            "reward_model.rollout.response_length=4",
            f"custom_reward_function.path={judge}",
            "trainer.total_training_steps=2",
            "trainer.val_before_train=False",
            f"trainer.rollout_data_dir={tmp_path / 'rollouts'}",
            "trainer.logger=[console]",
        ]
    )
    fit_trainer(config)
    rows = [json.loads(line) for line in (tmp_path / "rollouts" / "1.jsonl").open()]
    assert len(rows) == 32
    # the verdicts are the judge's (a plain transformers greedy decode of the same model) compared
    # with each response
    tokenizer = AutoTokenizer.from_pretrained(builtin.builtin_model_dir())
    model = AutoModelForCausalLM.from_pretrained(builtin.builtin_model_dir(), dtype=torch.float32).eval()
    answers = {}
    for row in rows:
        question = row["input"].strip()
        answers.setdefault(question, greedy_answer(model, tokenizer, question))
        assert row["judged"] == answers[question], row
        assert row["score"] == float(row["judged"] == row["output"].strip()), row
    assert 0 < sum(row["score"] for row in rows) < len(rows)  # both verdicts occur


def test_without_a_custom_function_the_reward_model_is_a_score_head():
    # verl's rule: the judge is asked only by a custom function; without one, reward_model.rollout.name
    # is verl's engine for a score-head model (inert here), which reads the chat messages
    # (the chat messages the score head reads are switched on, as verl always carries them)
    score_head = load_config(["reward_model.enable=True", "reward_model.rollout.name=hf"])
    assert not score_head.uses_judge and score_head.data.return_raw_chat
    verl_reward_loop_script = [  # examples/ppo_trainer/run_qwen2.5-3b_rm_reward_loop_colocate.sh in verl
        "data.return_raw_chat=True",
        "reward_model.enable=True",
        "reward_model.use_reward_loop=True",
        "reward_model.rollout.name=vllm",
        "reward_model.rollout.gpu_memory_utilization=0.8",
        "reward_model.rollout.tensor_model_parallel_size=1",
        "reward_model.rollout.prompt_length=4096",
        "reward_model.rollout.response_length=4096",
        "reward_model.num_workers=8",
    ]
    config = load_config(verl_reward_loop_script)
    assert not config.uses_judge
    assert "reward_model.rollout.gpu_memory_utilization" in inert_keys(config, "cpu", verl_reward_loop_script)
    with pytest.raises(ConfigError, match=r"reward_model\.rollout\.name: expected one of"):
        load_config(
            ["reward_model.enable=True", "reward_model.rollout.name=trtllm", "data.return_raw_chat=True"]
        )


def test_a_judge_refuses_what_it_cannot_do(tmp_path):
    judge = tmp_path / "judge.py"
    judge.write_text(JUDGE)
    base = [
        "reward_model.enable=True",
        "reward_model.rollout.name=hf",
        f"custom_reward_function.path={judge}",
    ]
    assert load_config(base).uses_judge
    with pytest.raises(ConfigError, match=r"reward_model\.rollout\.tensor_model_parallel_size: expected 1"):
        load_config([*base, "reward_model.rollout.tensor_model_parallel_size=2"])
    with pytest.raises(ConfigError, match=r"reward_model\.reward_manager: expected naive or dapo"):
        load_config([*base, "reward_model.reward_manager=batch"])
