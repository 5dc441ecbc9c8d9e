"""The on-policy distillation loss of one micro-batch, composed as verl 0.9.1's ``distillation_ppo_loss``.

The student samples; a frozen teacher scores the same tokens (:mod:`verl.workers.teacher`). Per
response token the loss is a divergence of the student from the teacher
(``distillation.distillation_loss.loss_mode``):

* an estimator of KL(student || teacher) at the sampled token (``k1``/``kl``, ``abs``, ``k2``/``mse``,
  ``k3``/``low_var_kl``: :func:`verl.algorithms.kl.kl_penalty` of the two log-probs);
* ``forward_kl_topk``: ``sum_k p_T(k) (log p_T(k) - log p_S(k))`` over the teacher's top-k tokens
  (log-probs clamped from below by ``log_prob_min_clamp``; negative values, possible because the k
  tokens do not hold all the mass, clamped to 0).

The per-token loss (clamped to ``[-loss_max_clamp, loss_max_clamp]``) is then either aggregated as
a supervised loss (``loss_agg_mode``, global-batch normalised like the actor's) or, with
``use_policy_gradient``, its negative is the advantage of a vanilla clipped policy-gradient loss
(clip ratios of the distillation section). With ``use_task_rewards`` the actor's usual loss
(:func:`verl.algorithms.actor_loss.compute_actor_loss`) is added: ``task + coef * distillation``;
without it the distillation loss alone is trained.

``config`` below is the ``distillation.distillation_loss`` section
(:class:`verl.config.distillation.DistillationLossConfig`).
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from verl.algorithms.actor_loss import compute_actor_loss, global_batch_info, importance_weights
from verl.algorithms.kl import kl_penalty
from verl.algorithms.loss_agg import agg_loss
from verl.algorithms.policy_losses import get_policy_loss_fn
from verl.utils.torch_functional import masked_mean

TEACHER_KEYS = ("teacher_log_probs", "teacher_topk_log_probs", "teacher_topk_ids")
"""What the teacher adds to a batch: the sampled tokens' log-probs, or its top-k log-probs and ids."""
PG_CLIP_RATIO_C = 3.0
"""The dual-clip bound of the distillation policy loss (verl's default where the config has none)."""


def per_token_distillation_loss(
    out: dict[str, torch.Tensor], micro: dict[str, torch.Tensor], config: Any
) -> tuple[torch.Tensor, dict[str, float]]:
    """``[B, R]`` distillation loss of each response token, and its metrics (module doc).

    ``out``: the student's ``log_probs`` (and ``student_topk_log_probs`` at the teacher's top-k ids for
    forward_kl_topk); ``micro``: ``response_mask`` and the teacher's :data:`TEACHER_KEYS`."""
    mask = micro["response_mask"]
    if not config.uses_topk:
        losses = kl_penalty(
            out["log_probs"], micro["teacher_log_probs"].to(out["log_probs"]), config.loss_mode
        )
        return losses, {"distillation/abs_loss": masked_mean(losses.detach().abs(), mask).item()}
    student = out["student_topk_log_probs"].float()
    teacher = micro["teacher_topk_log_probs"].float()
    metrics = {
        "distillation/student_mass": masked_mean(student.detach().exp().sum(-1), mask).item(),
        "distillation/teacher_mass": masked_mean(teacher.exp().sum(-1), mask).item(),
    }
    if config.log_prob_min_clamp is not None:
        student = student.clamp_min(config.log_prob_min_clamp)
        teacher = teacher.clamp_min(config.log_prob_min_clamp)
    losses = (teacher.exp() * (teacher - student)).sum(-1)
    return losses.clamp_min(0.0), metrics


def compute_distilled_actor_loss(
    out: dict[str, torch.Tensor],
    micro: dict[str, torch.Tensor],
    actor_config: Any,
    config: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The actor's loss with distillation (module doc): the scalar and its metrics, the distillation
    ones under ``distillation/`` (``loss``: the aggregated distillation loss of the micro-batch)."""
    losses, metrics = per_token_distillation_loss(out, micro, config)
    if config.loss_max_clamp is not None:
        losses = losses.clamp(-config.loss_max_clamp, config.loss_max_clamp)
    mask, mode = micro["response_mask"], actor_config.loss_agg_mode
    info, share = global_batch_info(micro, actor_config)
    if config.use_policy_gradient:
        distill, pg_metrics = _policy_gradient(losses.detach(), out["log_probs"], micro, actor_config, config)
        metrics.update({f"distillation/{k.removeprefix('actor/')}": v for k, v in pg_metrics.items()})
    else:
        distill = agg_loss(losses, mask, mode, **info)
    distill = distill / share
    metrics["distillation/loss"] = distill.detach().item()
    if not (config.use_task_rewards or config.use_policy_gradient):
        return distill, metrics  # distillation only: the task's loss is not even computed
    task, task_metrics = compute_actor_loss(out["log_probs"], out.get("entropys"), micro, actor_config)
    metrics.update(task_metrics)
    if not config.use_task_rewards:
        return distill, metrics  # as verl: the task's metrics are reported, its loss not trained
    return task + distill * config.distillation_loss_coef, metrics


def _policy_gradient(
    losses: torch.Tensor,
    log_prob: torch.Tensor,
    micro: dict[str, torch.Tensor],
    actor_config: Any,
    config: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """A vanilla clipped policy-gradient loss whose advantage is the negative distillation loss."""
    pg_config = copy.copy(actor_config)
    pg_config.clip_ratio, pg_config.clip_ratio_c = config.clip_ratio, PG_CLIP_RATIO_C
    pg_config.clip_ratio_low, pg_config.clip_ratio_high = config.clip_ratio_low, config.clip_ratio_high
    pg_config.global_batch_info = global_batch_info(micro, actor_config)[0]
    weights, _ = importance_weights(micro, actor_config)
    return get_policy_loss_fn("vanilla")(
        micro["old_log_probs"],
        log_prob,
        -losses,
        micro["response_mask"],
        actor_config.loss_agg_mode,
        pg_config,
        rollout_is_weights=weights,
    )
