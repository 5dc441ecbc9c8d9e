"""DAPO's dynamic sampling: the pure group filter by hand, and real runs, synchronous and
asynchronous, whose training batches are full of groups that carry a reward signal; the
asynchronous one learns the embedded default."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from recipe.dapo.dapo_ray_trainer import (
    AsyncDAPOTrainer,
    RayDAPOTrainer,
    dapo_trainer_class,
    group_metric,
    informative_groups,
)
from tests.trainer.fit import fit_trainer
from tests.trainer.test_learning import ACC, MIN_GAIN
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


DAPO_STEPS = 16
ASYNC = [
    "trainer.mode=async",
    "trainer.n_gpus_per_node=1",
    "trainer.cpus_per_worker=1",  # a trainer process beside a rollout process on two cores
    "async_training.partial_rollout=False",  # the samples do not depend on thread timing
    "actor_rollout_ref.rollout.calculate_log_probs=True",
    "actor_rollout_ref.actor.tis_imp_ratio_cap=2.0",
]


def test_the_mode_picks_the_driver():
    assert dapo_trainer_class(dapo_config([])) is RayDAPOTrainer
    assert dapo_trainer_class(dapo_config(ASYNC)) is AsyncDAPOTrainer


def test_config_the_recipe_cannot_run_is_refused():
    with pytest.raises(ConfigError, match="seq_final_reward"):
        RayDAPOTrainer(
            dapo_config(
                ["algorithm.filter_groups.metric=seq_final_reward", "algorithm.use_kl_in_reward=True"]
            )
        )


# Before the asynchronous runs, which need pools of another shape: the synchronous runs start in
# the worker processes this one leaves (VERL_REUSE_WORKER_PROCESSES, tests/conftest.py).
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


class Recording:
    """Mixed into the recipe's trainer: keeps what its rollout phase hands to the update."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.recorded: list = []

    def rollout_phase(self, draw, metrics, timing):
        out = super().rollout_phase(draw, metrics, timing)
        self.recorded.append((out, dict(metrics)))
        return out


class RecordingDAPOTrainer(Recording, RayDAPOTrainer):
    pass


class RecordingAsyncDAPOTrainer(Recording, AsyncDAPOTrainer):
    pass


def assert_batches_are_full_of_informative_groups(trainer, steps: int) -> int:
    """Every recorded training batch holds whole groups with a reward signal; the generated prompts."""
    prompts, n = trainer.config.data.train_batch_size, trainer.config.actor_rollout_ref.rollout.n
    assert len(trainer.recorded) == steps
    generated = kept = 0
    for batch, metrics in trainer.recorded:
        assert len(batch) == prompts * n, "the training batch is not full"
        uids, acc = batch.non_tensor_batch["uid"], np.asarray(batch.non_tensor_batch["acc"], dtype=float)
        assert len(set(uids)) == prompts
        for uid in set(uids):
            rows = uids == uid
            assert rows.sum() == n, f"group {uid} is not whole"
            assert np.std(acc[rows]) > 0, f"group {uid} has no reward signal: acc {acc[rows]}"
        generated += metrics["train/num_gen_batches"] * prompts
        kept += prompts
        assert 0 < metrics["train/kept_group_ratio"] <= 1
    assert generated > kept, "no group was ever dropped: the filter was not exercised"
    return generated


@pytest.mark.usefixtures("ray_session", "builtin_assets")
def test_dynamic_sampling_fills_the_batch_with_informative_groups():
    trainer = fit_trainer(dapo_config(["trainer.total_training_steps=3"]), RecordingDAPOTrainer)
    assert_batches_are_full_of_informative_groups(trainer, steps=3)


LEARNING_RUN = [
    *ASYNC,
    "trainer.val_before_train=True",
    f"trainer.total_training_steps={DAPO_STEPS}",
    f"trainer.test_freq={DAPO_STEPS // 4}",
    "data.val_max_samples=200",
    "data.train_batch_size=32",  # the embedded default's sizes, not SMALL's
    "actor_rollout_ref.actor.ppo_mini_batch_size=32",
    "actor_rollout_ref.rollout.n=8",
]


@pytest.fixture(scope="module")
def async_dapo_run(ray_session, builtin_assets) -> RecordingAsyncDAPOTrainer:
    """The asynchronous run that learns, recorded: the two tests below read different things in it."""
    return fit_trainer(dapo_config(LEARNING_RUN), RecordingAsyncDAPOTrainer)


@pytest.mark.slow
def test_asynchronous_dynamic_sampling_fills_the_batch_with_informative_groups(async_dapo_run):
    trainer = async_dapo_run
    generated = assert_batches_are_full_of_informative_groups(trainer, steps=DAPO_STEPS)
    # the extra draws were generations in flight, none older than the bound
    assert (
        trainer.staleness_seen and max(trainer.staleness_seen) <= trainer.config.async_training.max_staleness
    )
    n = trainer.config.actor_rollout_ref.rollout.n
    assert len(trainer.staleness_seen) == generated * n  # every draw's samples were checked


@pytest.mark.slow
def test_dapo_learns_the_default_task_asynchronously(async_dapo_run):
    """Judged as each family's synchronous run in tests/trainer/test_learning.py (the best validation
    of the second half against the first), over 16 steps: DAPO's batches are all signal, so it peaks
    sooner (measured: 0.315 -> 0.575 at step 8, then 0.42-0.47 until step 32)."""
    history = [(step, metrics[ACC]) for step, metrics in async_dapo_run.validator.history]
    print(f"async DAPO run: {history}")
    assert [step for step, _ in history] == list(range(0, DAPO_STEPS + 1, DAPO_STEPS // 4))
    best = max(acc for step, acc in history if step >= DAPO_STEPS // 2)
    assert best >= history[0][1] + MIN_GAIN, history
