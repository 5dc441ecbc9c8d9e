"""DAPO's dynamic sampling: the pure group filter by hand, and a real run whose training
batches are full of groups that carry a reward signal."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from recipe.dapo.dapo_ray_trainer import RayDAPOTrainer, group_metric, informative_groups
from verl.config.base import ConfigError
from verl.config.ppo_trainer import load_config
from verl.protocol import DataProto

DAPO_CONFIG = str(Path(__file__).resolve().parents[2] / "recipe" / "dapo" / "config")
SMALL = [
    "trainer.val_before_train=False",
    "trainer.logger=[console]",
    "data.train_batch_size=8",
    "data.val_max_samples=16",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "actor_rollout_ref.rollout.n=4",
]


def dapo_config(overrides: list[str]):
    return load_config(SMALL + overrides, config_name="dapo_trainer", config_dir=DAPO_CONFIG)


def test_informative_groups_by_hand():
    uids = np.array(["a", "a", "a", "b", "b", "b", "c", "d", "d"], dtype=object)
    values = np.array([1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    # a: all right (dropped), b: mixed (kept), c: a single response (kept), d: all wrong (dropped)
    assert informative_groups(uids, values).tolist() == [False] * 3 + [True] * 3 + [True] + [False] * 2


def test_group_metric_reads_scores_or_a_reward_column():
    batch = DataProto.from_dict(
        tensors={"token_level_scores": torch.tensor([[0.0, 1.0], [0.5, 0.0]])},
        non_tensors={"acc": np.array([True, False], dtype=object)},
    )
    assert group_metric(batch, "seq_reward").tolist() == [1.0, 0.5]
    assert group_metric(batch, "seq_final_reward").tolist() == [1.0, 0.5]
    assert group_metric(batch, "acc").tolist() == [1.0, 0.0]
    with pytest.raises(ConfigError, match=r"filter_groups\.metric='pass'.*acc"):
        group_metric(batch, "pass")


def test_config_the_recipe_cannot_run_is_refused():
    with pytest.raises(ConfigError, match=r"trainer\.mode"):
        RayDAPOTrainer(
            dapo_config(["trainer.mode=async", "actor_rollout_ref.rollout.calculate_log_probs=True"])
        )
    with pytest.raises(ConfigError, match="seq_final_reward"):
        RayDAPOTrainer(
            dapo_config(
                ["algorithm.filter_groups.metric=seq_final_reward", "algorithm.use_kl_in_reward=True"]
            )
        )


class RecordingDAPOTrainer(RayDAPOTrainer):
    """The recipe's trainer, keeping what its rollout phase hands to the update."""

    def rollout_phase(self, batch, metrics, timing):
        out = super().rollout_phase(batch, metrics, timing)
        self.recorded.append((out, dict(metrics)))
        return out


@pytest.mark.usefixtures("ray_session", "builtin_assets")
def test_dynamic_sampling_fills_the_batch_with_informative_groups():
    config = dapo_config(["trainer.total_training_steps=3"])
    trainer = RecordingDAPOTrainer(config)
    trainer.recorded = []
    try:
        trainer.init_workers()
        trainer.fit()
    finally:
        trainer.close()

    assert len(trainer.recorded) == 3
    generated = kept = 0
    for batch, metrics in trainer.recorded:
        assert len(batch) == 8 * 4, "the training batch is not full"
        uids, acc = batch.non_tensor_batch["uid"], np.asarray(batch.non_tensor_batch["acc"], dtype=float)
        assert len(set(uids)) == 8
        for uid in set(uids):
            rows = uids == uid
            assert rows.sum() == 4, f"group {uid} is not whole"
            assert np.std(acc[rows]) > 0, f"group {uid} has no reward signal: acc {acc[rows]}"
        generated += metrics["train/num_gen_batches"] * 8
        kept += 8
        assert 0 < metrics["train/kept_group_ratio"] <= 1
    assert generated > kept, "no group was ever dropped: the filter was not exercised"


@pytest.mark.usefixtures("ray_session", "builtin_assets")
def test_running_out_of_generation_batches_is_a_clear_error():
    from verl.trainer.main_ppo import run_ppo

    # every response scores 0 and no length penalty applies: no group is informative
    overrides = [
        "reward_model.overlong_buffer.enable=False",
        "trainer.total_training_steps=1",
        "algorithm.filter_groups.metric=seq_reward",
        "algorithm.filter_groups.max_num_gen_batches=2",
        "custom_reward_function.path=" + str(Path(__file__).with_name("zero_reward.py")),
    ]
    with pytest.raises(RuntimeError, match=r"max_num_gen_batches=2 reached at step 1 with 0 of 8"):
        run_ppo(dapo_config(overrides), overrides, trainer_cls=RayDAPOTrainer)
