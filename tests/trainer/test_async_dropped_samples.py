"""Samples the async trainer drops as stale (``async_training.drop_stale=True``) leave the
advantages of the samples kept from their group exactly as if they had never been drawn."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from verl.algorithms.advantages import compute_advantage_for
from verl.config.ppo_trainer import load_config
from verl.protocol import DataProto
from verl.trainer.ppo.async_trainer import AsyncPPOTrainer

STALE_ROW = 1  # group "a", 2 versions old with max_staleness=1 at policy version 3


def scored_batch() -> DataProto:
    """Two groups of three responses (4 tokens, the last one padding) with distinct scores."""
    scores = torch.tensor([1.0, 5.0, 0.0, 2.0, 0.5, 1.5])
    mask = torch.tensor([[1, 1, 1, 0]] * 6)
    token_scores = torch.zeros(6, 4)
    token_scores[:, 2] = scores  # the reward sits on the last valid token
    versions = torch.tensor([[3, 3, 3, -1]] * 6)
    versions[STALE_ROW] = torch.tensor([1, 1, 2, -1])
    versions[4] = torch.tensor([2, 2, 3, -1])  # 1 version old: within the bound, kept
    return DataProto.from_dict(
        {"response_mask": mask, "token_level_scores": token_scores, "response_versions": versions},
        non_tensors={"uid": np.array(["a", "a", "a", "b", "b", "b"], dtype=object)},
    )


@pytest.fixture
def make_trainer(builtin_assets):
    trainers = []

    def make(estimator: str) -> AsyncPPOTrainer:
        overrides = [
            f"actor_rollout_ref.model.path={builtin_assets['model']}",
            f"data.train_files={builtin_assets['train']}",
            f"data.val_files={builtin_assets['val']}",
            "trainer.logger=[console]",
            "trainer.mode=async",
            "async_training.max_staleness=1",
            "async_training.drop_stale=True",
            "actor_rollout_ref.rollout.calculate_log_probs=True",
            f"algorithm.adv_estimator={estimator}",
        ]
        trainers.append(AsyncPPOTrainer(load_config(overrides)))
        return trainers[-1]

    yield make
    for trainer in trainers:
        trainer.close()


@pytest.mark.parametrize(
    "estimator",
    [
        "grpo",
        "grpo_vectorized",
        "rloo",
        "rloo_vectorized",
        "opo",
        "reinforce_plus_plus_baseline",
        "grpo_passk",
    ],
)
def test_a_dropped_stale_sample_does_not_move_its_groups_baseline(make_trainer, estimator):
    trainer = make_trainer(estimator)
    trainer.policy_version = 3
    batch = scored_batch()
    metrics = trainer._check_staleness(batch)
    assert metrics["async/dropped_samples"] == 1.0
    assert batch.batch["response_mask"][STALE_ROW].sum() == 0
    trainer._compute_advantage(batch, {})

    kept = [i for i in range(len(batch)) if i != STALE_ROW]
    without = scored_batch().select_idxs(torch.tensor(kept))  # the stale sample never drawn
    without.batch["token_level_rewards"] = without.batch["token_level_scores"]
    algo = trainer.config.algorithm
    compute_advantage_for(without, algo)

    assert_close(batch.batch["advantages"][kept], without.batch["advantages"])
    assert torch.all(batch.batch["advantages"][STALE_ROW] == 0)
    assert len(batch) == 6  # the row stays: batch and mini-batch sizes do not change
