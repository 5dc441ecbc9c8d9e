"""The policy-loss registry and what every loss shares (verl 0.9.1's calling convention).

Every registered loss has the signature::

    fn(old_log_prob [B, R], log_prob [B, R], advantages [B, R], response_mask [B, R],
       loss_agg_mode: str = "token-mean", config = None, rollout_is_weights [B, R] | None = None)
    -> (pg_loss: scalar tensor, pg_metrics: dict[str, float])

``config`` is the actor config (clip ratios, ``clip_ratio_c``, ``tau_pos``/``tau_neg``,
``policy_loss.*``). ``rollout_is_weights`` are detached per-token importance weights that
correct for the rollout engine being a different (or older) policy than ``old_log_prob``'s;
every loss multiplies its per-token loss by them. The losses aggregate with
``agg_loss(..., **config.global_batch_info)`` (global-batch normalisation, see
:mod:`verl.algorithms.loss_agg`) when the actor sets that attribute.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from verl.algorithms.loss_agg import agg_loss, global_batch_info

PolicyLossFn = Callable[..., tuple[torch.Tensor, dict[str, float]]]
POLICY_LOSS_REGISTRY: dict[str, PolicyLossFn] = {}

LOG_RATIO_CLAMP = 20.0
"""The token log-ratio is clamped to [-20, 20] before exp() (vanilla, CISPO, SAPO, DPPO; as in verl)."""


def register_policy_loss(name: str) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Register a policy loss under ``name`` (``policy_loss.loss_mode=name`` selects it)."""

    def decorator(fn: PolicyLossFn) -> PolicyLossFn:
        POLICY_LOSS_REGISTRY[name] = fn
        return fn

    return decorator


def get_policy_loss_fn(name: str) -> PolicyLossFn:
    """The loss registered under ``name``; unknown names list the known ones."""
    if name not in POLICY_LOSS_REGISTRY:
        raise ValueError(f"unknown policy loss_mode {name!r}; registered: {sorted(POLICY_LOSS_REGISTRY)}")
    return POLICY_LOSS_REGISTRY[name]


def clip_range(config: Any) -> tuple[float, float]:
    """``(clip_ratio_low, clip_ratio_high)``, each falling back to ``clip_ratio`` when null."""
    if config is None:
        raise ValueError("this policy loss needs config: the actor config (its clip_ratio* keys)")
    low = config.clip_ratio_low if config.clip_ratio_low is not None else config.clip_ratio
    high = config.clip_ratio_high if config.clip_ratio_high is not None else config.clip_ratio
    return low, high


def clamped_log_ratio(log_prob: torch.Tensor, old_log_prob: torch.Tensor) -> torch.Tensor:
    """``clamp(log pi - log pi_old, -20, 20)``."""
    return torch.clamp(log_prob - old_log_prob, min=-LOG_RATIO_CLAMP, max=LOG_RATIO_CLAMP)


def aggregate(
    pg_losses: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    config: Any,
    rollout_is_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """``agg_loss(pg_losses * rollout_is_weights, ...)`` with the actor's global-batch info."""
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    return agg_loss(pg_losses, response_mask, loss_agg_mode, **global_batch_info(config))


def pg_metrics(
    clipfrac: torch.Tensor | float, ppo_kl: torch.Tensor | float, clipfrac_lower: torch.Tensor | float
) -> dict[str, float]:
    """The three metrics every loss reports (0 where a loss has no such notion)."""

    def as_float(x: torch.Tensor | float) -> float:
        return x.detach().item() if isinstance(x, torch.Tensor) else float(x)

    return {
        "actor/pg_clipfrac": as_float(clipfrac),
        "actor/ppo_kl": as_float(ppo_kl),
        "actor/pg_clipfrac_lower": as_float(clipfrac_lower),
    }
