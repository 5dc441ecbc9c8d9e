"""DAPO's driver: the synchronous PPO loop with dynamic sampling (Yu et al. 2025,
https://arxiv.org/abs/2503.14476, section 3.2).

A prompt group whose responses all got the same reward (all right or all wrong) has zero
advantage under GRPO, so it adds nothing to the gradient but still dilutes the batch.
Dynamic sampling drops such groups and keeps generating from the next prompts until
``data.train_batch_size`` informative groups are collected::

    kept <- []
    repeat
        scored <- rollout_phase(prompts)                  (generate + reward, as in PPO)
        kept   <- kept + groups of scored whose metric varies
        prompts <- next(batches)
    until |kept| >= train_batch_size  (or max_num_gen_batches is reached: an error)
    batch <- first train_batch_size groups of kept

Everything after the rollout (log-probs, advantages, updates, checkpoints, resume) is the
core trainer's. Only ``rollout_phase`` is overridden: this is how a recipe changes the
dataflow without touching ``verl/``.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch

from verl.config.base import ConfigError
from verl.config.ppo_trainer import PPOTrainerConfig
from verl.protocol import DataProto
from verl.trainer.ppo.async_trainer import AsyncPPOTrainer
from verl.trainer.ppo.generations import Draw
from verl.trainer.ppo.ray_trainer import RayPPOTrainer

__all__ = ["AsyncDAPOTrainer", "RayDAPOTrainer", "dapo_trainer_class", "group_metric", "informative_groups"]


def group_metric(batch: DataProto, metric: str) -> np.ndarray:
    """Per-response value that dynamic sampling compares within a group.

    ``seq_reward`` sums the token-level scores; ``seq_final_reward`` sums the token-level
    rewards (the same here: the in-reward KL penalty needs reference log-probs, which are
    computed after filtering); any other name is a per-response column the reward manager
    returned (``acc``, ``score``, ...).
    """
    if metric in ("seq_reward", "seq_final_reward"):
        return batch.batch["token_level_scores"].sum(-1).numpy()
    if metric not in batch.non_tensor_batch:
        raise ConfigError(
            f"algorithm.filter_groups.metric={metric!r}: no such per-response value; expected "
            f"seq_reward, seq_final_reward or one of {sorted(batch.non_tensor_batch)}"
        )
    return np.asarray(batch.non_tensor_batch[metric], dtype=np.float64)


def informative_groups(uids: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Boolean row mask keeping the groups (rows sharing a uid) whose values are not all
    equal; a group of one response is kept (its spread is undefined, as in verl)."""
    by_uid: dict[str, list[float]] = defaultdict(list)
    for uid, value in zip(uids, values, strict=True):
        by_uid[uid].append(float(value))
    keep = {uid for uid, vals in by_uid.items() if len(vals) == 1 or np.std(vals) > 0}
    return np.array([uid in keep for uid in uids], dtype=bool)


class RayDAPOTrainer(RayPPOTrainer):
    """``RayPPOTrainer`` whose rollout keeps only groups with a reward signal."""

    def __init__(self, config: PPOTrainerConfig) -> None:
        check_dapo_config(config)
        super().__init__(config)

    def rollout_phase(self, draw: Draw, metrics: dict[str, float], timing: dict[str, float]) -> DataProto:
        filter_cfg = self.config.algorithm.filter_groups
        if not filter_cfg.enable:
            return super().rollout_phase(draw, metrics, timing)
        n = self.config.actor_rollout_ref.rollout.n
        target_rows = self.config.data.train_batch_size * n
        kept: list[DataProto] = []
        kept_rows = seen_groups = 0
        num_gen_batches = 0
        while True:
            num_gen_batches += 1
            scored = super().rollout_phase(draw, metrics, timing)
            # uids are "<step>-<row>"; later batches of the same step need their own
            scored.non_tensor_batch["uid"] = np.array(
                [f"{uid}.{num_gen_batches}" for uid in scored.non_tensor_batch["uid"]], dtype=object
            )
            mask = informative_groups(scored.non_tensor_batch["uid"], group_metric(scored, filter_cfg.metric))
            seen_groups += len(scored) // n
            if mask.any():
                kept.append(scored[torch.from_numpy(np.flatnonzero(mask))])
                kept_rows += int(mask.sum())
            if kept_rows >= target_rows:
                break
            limit = filter_cfg.max_num_gen_batches
            if 0 < limit <= num_gen_batches:
                raise RuntimeError(
                    f"algorithm.filter_groups.max_num_gen_batches={limit} reached at step "
                    f"{self.global_steps} with {kept_rows // n} of {target_rows // n} informative groups "
                    f"(out of {seen_groups} generated): the data is too easy or too hard for the policy; "
                    "raise the limit (0 = no limit) or change the data"
                )
            draw = self.next_draw(num_gen_batches + 1)  # seeded apart from this step's earlier draws
        metrics["train/num_gen_batches"] = num_gen_batches
        metrics["train/kept_group_ratio"] = (kept_rows // n) / seen_groups
        return DataProto.concat(kept)[:target_rows]


class AsyncDAPOTrainer(RayDAPOTrainer, AsyncPPOTrainer):
    """Dynamic sampling on the asynchronous trainer (``trainer.mode=async``): the recipe's rollout
    phase is the same; each of its draws is the next generation in flight (``next_draw``), and a
    draw consumed early is fresher than the staleness bound, never older."""


def dapo_trainer_class(config: PPOTrainerConfig) -> type[RayPPOTrainer]:
    """The recipe's driver for ``trainer.mode``."""
    return AsyncDAPOTrainer if config.trainer.mode == "async" else RayDAPOTrainer


def check_dapo_config(config: PPOTrainerConfig) -> None:
    """What the recipe needs beyond the core schema's checks."""
    filter_cfg = config.algorithm.filter_groups
    if not filter_cfg.enable:
        return
    if filter_cfg.metric == "seq_final_reward" and config.algorithm.use_kl_in_reward:
        raise ConfigError(
            "algorithm.filter_groups.metric=seq_final_reward with algorithm.use_kl_in_reward=True: "
            "the KL penalty needs reference log-probs, computed after filtering; expected "
            "seq_reward, acc or score, or use_kl_in_reward=False"
        )
