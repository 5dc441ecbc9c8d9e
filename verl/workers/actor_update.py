"""The actor's PPO update, part by part: the loss of one micro-batch (:class:`ActorLoss`), the
mini- and micro-batch sizes on this rank (:func:`actor_update_spec`), and what the update reports
about its speed (:func:`update_perf_metrics`). The worker runs them through
:func:`verl.workers.ppo_update.run_ppo_updates`.
"""

from __future__ import annotations

from typing import Any

import torch

from verl.algorithms.actor_loss import compute_actor_loss
from verl.algorithms.distillation import TEACHER_KEYS, compute_distilled_actor_loss
from verl.config.actor import ActorConfig
from verl.protocol import DataProto
from verl.utils.perf import compute_mfu, compute_perf_metrics
from verl.workers.engine.base import TrainEngine
from verl.workers.forward import EntropyOptions, response_log_probs
from verl.workers.ppo_update import UpdateSpec, rows_per_rank
from verl.workers.rollout.gap import GapSums

ACTOR_LOSS_KEYS = [
    "old_log_probs",
    "advantages",
    "response_mask",
    "ref_log_prob",
    "rollout_log_probs",
    "rollout_is_weights",
    *TEACHER_KEYS,
]
"""The batch keys the actor's loss reads where the batch has them (besides the policy inputs)."""


class ActorLoss:
    """The loss the engine back-propagates for one micro-batch: the PPO actor loss (or the distilled
    one, with teachers) of the responses' log-probs at ``temperature``.

    On-policy (the driver skipped the old-log-prob pass) this forward's log-probs are the old ones
    too, and :attr:`gap` sums the rollout/trainer gap that pass would have reported."""

    def __init__(
        self,
        cfg: ActorConfig,
        distillation: Any,
        temperature: float,
        entropy: EntropyOptions | None,
        packed: bool,
        on_policy: bool,
        sp_size: int,
    ) -> None:
        self.cfg, self.distillation = cfg, distillation
        self.temperature, self.entropy, self.packed = temperature, entropy, packed
        self.on_policy, self.sp_size = on_policy, sp_size
        self.gap = GapSums()

    def __call__(self, module: torch.nn.Module, micro: dict[str, Any]) -> tuple[torch.Tensor, dict]:
        out = response_log_probs(module, micro, self.temperature, self.entropy, packed=self.packed)
        if self.on_policy:
            micro = {**micro, "old_log_probs": out["log_probs"].detach()}
            if "rollout_log_probs" in micro:
                self.gap += GapSums.of(micro["rollout_log_probs"], out["log_probs"], micro["response_mask"])
        if self.distillation is not None:
            loss, metrics = compute_distilled_actor_loss(out, micro, self.cfg, self.distillation)
        else:
            loss, metrics = compute_actor_loss(out["log_probs"], out.get("entropys"), micro, self.cfg)
        # sequence parallel: the group's gradient is split over its ranks, which the engine
        # averages with every other rank's: scaled by the group size it sums instead
        return loss * self.sp_size, metrics


def actor_update_spec(
    cfg: ActorConfig, rollout_n: int, dp_size: int, replicas: int, sp_size: int
) -> UpdateSpec:
    """The update's batches on this rank: ``ppo_mini_batch_size`` prompts (``rollout_n`` samples
    each) over ``dp_size`` data-parallel ranks per optimizer step; a rank of a sequence-parallel
    group holds ``1/sp_size`` of each micro-batch's tokens."""
    return UpdateSpec(
        mini_batch_rows=rows_per_rank(cfg.ppo_mini_batch_size, rollout_n, dp_size, "ppo_mini_batch_size"),
        micro_batch_size=cfg.ppo_micro_batch_size_per_gpu,
        use_dynamic_bsz=cfg.use_dynamic_bsz,
        max_token_len=cfg.ppo_max_token_len_per_gpu * sp_size,
        epochs=cfg.ppo_epochs,
        shuffle=cfg.shuffle,
        replicas=replicas,
    )


def update_perf_metrics(
    actor: TrainEngine, data: DataProto, seconds: float, device: torch.device, epochs: int
) -> dict[str, float]:
    """Memory of this process and the MFU of this rank's update (GPU only; the driver
    reports rank 0's numbers)."""
    lengths = data.batch["attention_mask"].sum(-1).tolist()
    hf_config = actor.hf_config
    metrics = compute_perf_metrics()
    if hf_config is not None and device.type == "cuda":
        metrics.update(compute_mfu(hf_config, lengths, seconds, 1, epochs))
    return metrics
