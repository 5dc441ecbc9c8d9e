"""RL with ``reward_model.enable=True``: the reward model's scores are the reward (as in verl), or
feed a custom function (``extra_info["rm_score"]``); colocated or on a pool of its own."""

from __future__ import annotations

import json

import pytest

from tests.trainer.fit import fit_trainer
from tests.workers.test_reward_model import save_tiny_reward_model
from verl.config.ppo_trainer import load_config

HYBRID = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return extra_info["rm_score"] + (1.0 if solution_str.strip() == str(ground_truth) else 0.0) + 10.0
"""


def run(tmp_path, overrides: list[str]) -> tuple[list[dict], object]:
    save_tiny_reward_model(tmp_path / "rm")
    config = load_config(
        [
            "reward_model.enable=True",
            f"reward_model.model.path={tmp_path / 'rm'}",
            "reward_model.micro_batch_size_per_gpu=16",
            "data.return_raw_chat=True",
            "data.train_batch_size=8",
            "data.val_max_samples=16",
            "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8",
            "trainer.total_training_steps=2",
            "trainer.test_freq=2",
            "trainer.logger=[file]",
            "trainer.project_name=rm",
            "trainer.experiment_name=run",
            *overrides,
        ]
    )
    trainer = fit_trainer(config)
    return [json.loads(line) for line in (tmp_path / "logs/rm/run/metrics.jsonl").open()], trainer


@pytest.mark.usefixtures("ray_session", "builtin_assets")
def test_the_reward_model_scores_are_the_reward(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rows, trainer = run(tmp_path, [])
    assert [pool.name_prefix for pool in trainer.pools] == ["global_pool"]  # colocated
    steps = [row for row in rows if "critic/score/mean" in row]
    assert len(steps) == 2
    for row in steps:
        assert row["critic/score/mean"] == pytest.approx(row["reward_model/score/mean"], abs=1e-5)
        assert row["reward_model/score/max"] > row["reward_model/score/min"]  # really per response
        assert row["reward_model/truncated"] == 0.0
    # validation is scored by the model too (its rewards are not the 0/1 of the rule scorer)
    val = [row for row in rows if "val-core/arith/reward/mean@1" in row]
    assert val and all(row["val-core/arith/reward/mean@1"] not in (0.0, 1.0) for row in val)


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session", "builtin_assets")
def test_a_custom_function_combines_the_model_score_on_its_own_pool(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    scorer = tmp_path / "hybrid.py"
    scorer.write_text(HYBRID)
    rows, trainer = run(
        tmp_path,
        [
            f"custom_reward_function.path={scorer}",
            "reward_model.enable_resource_pool=True",
            "reward_model.nnodes=1",
            "reward_model.n_gpus_per_node=1",
            "trainer.cpus_per_worker=1",
        ],
    )
    assert [pool.name_prefix for pool in trainer.pools] == ["global_pool", "reward_model_pool"]
    steps = [row for row in rows if "critic/score/mean" in row]
    assert len(steps) == 2
    for row in steps:
        # rm_score + a 0/1 rule bonus + 10: the mean lies 10 to 11 above the model's mean
        gap = row["critic/score/mean"] - row["reward_model/score/mean"]
        assert 10.0 - 1e-5 <= gap <= 11.0 + 1e-5, gap
