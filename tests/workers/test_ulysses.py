"""Ulysses sequence parallelism for real: two gloo ranks (``torchrun``) split each packed sequence
of a tiny Qwen2 between them, and give the log-probs, entropies and gradients of one rank
(``ulysses_ranks.py``; with 2 key/value heads, split as they are, and with 1, repeated first)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_two_ranks_splitting_each_sequence_equal_one_rank(tmp_path):
    report = tmp_path / "report.json"
    pythonpath = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            str(REPO / "tests" / "workers" / "ulysses_ranks.py"),
            str(report),
        ],
        env={**os.environ, "PYTHONPATH": pythonpath, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    for case, diffs in json.loads(report.read_text()).items():
        # attention of each head runs whole on one rank, everything else per token: the outputs are
        # the same numbers; gradients differ by the order of the group's sum only
        assert diffs["log_probs"] < 1e-6 and diffs["entropys"] < 1e-6, (case, diffs)
        assert diffs["grads"] < 1e-5 * diffs["grad_scale"], (case, diffs)


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session", "builtin_assets")
def test_a_sequence_parallel_group_trains_as_the_data_parallel_ranks_do(tmp_path, monkeypatch):
    """PPO with a critic on 2 ranks, packed, as one sequence-parallel group (each rank holds half of
    every sequence) and as 2 data-parallel ranks: the same rollouts (generation is per rank either
    way), so the first step's log-probs, values, losses and gradient norms agree."""
    from tests.trainer.fit import fit_trainer
    from verl.config.ppo_trainer import load_config

    monkeypatch.chdir(tmp_path)
    streams = {}
    for sp in (1, 2):
        config = load_config(
            [
                "trainer.n_gpus_per_node=2",
                "trainer.cpus_per_worker=1",
                "trainer.total_training_steps=2",
                "trainer.val_before_train=False",
                "trainer.test_freq=-1",
                "trainer.logger=[file]",
                "trainer.project_name=ulysses",
                f"trainer.experiment_name=sp{sp}",
                "data.train_batch_size=8",
                "actor_rollout_ref.actor.ppo_mini_batch_size=8",  # one optimizer step: the same rows
                "actor_rollout_ref.actor.use_dynamic_bsz=True",  # token budgets: x2 for a group of 2
                "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=96",
                "actor_rollout_ref.actor.use_kl_loss=True",
                "actor_rollout_ref.rollout.n=4",
                "actor_rollout_ref.rollout.calculate_log_probs=True",
                "actor_rollout_ref.model.use_remove_padding=True",
                f"actor_rollout_ref.actor.ulysses_sequence_parallel_size={sp}",
                "algorithm.adv_estimator=gae",  # and a critic, split the same way
                "critic.model.use_remove_padding=True",
                "critic.ppo_max_token_len_per_gpu=96",
                f"critic.ulysses_sequence_parallel_size={sp}",
            ]
        )
        fit_trainer(config)
        lines = (tmp_path / f"logs/ulysses/sp{sp}/metrics.jsonl").read_text().splitlines()
        streams[sp] = [json.loads(line) for line in lines]
    (dp,), (split,) = ([row for row in streams[sp] if row.get("step") == 1] for sp in (1, 2))
    for key in (
        "critic/score/mean",
        "training/rollout_logprob_diff_max",
        "actor/entropy",
        "critic/values/mean",
    ):
        assert split[key] == pytest.approx(dp[key], rel=1e-5, abs=1e-6), key
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "critic/vf_loss", "critic/grad_norm"):
        assert split[key] == pytest.approx(dp[key], rel=1e-4, abs=1e-6), key
    assert len([row for row in streams[2] if "actor/pg_loss" in row]) == 2


def test_settings_sequence_parallelism_cannot_honour_are_refused_naming_the_key():
    from verl.config.base import ConfigError
    from verl.config.ppo_trainer import load_config

    sp = "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"
    with pytest.raises(
        ConfigError, match=r"ulysses_sequence_parallel_size: expected 1 unless .*use_remove_padding"
    ):
        load_config([sp, "trainer.n_gpus_per_node=2"])
    with pytest.raises(ConfigError, match=r"ref\.ulysses_sequence_parallel_size: expected the actor's \(2\)"):
        load_config(
            [
                sp,
                "actor_rollout_ref.model.use_remove_padding=True",
                "actor_rollout_ref.ref.ulysses_sequence_parallel_size=1",
            ]
        )
    with pytest.raises(ConfigError, match=r"critic\.ulysses_sequence_parallel_size: expected 1 unless"):
        load_config(["critic.ulysses_sequence_parallel_size=2"])
    with pytest.raises(ConfigError, match=r"reward_model\.ulysses_sequence_parallel_size"):
        load_config(["reward_model.ulysses_sequence_parallel_size=2"])
