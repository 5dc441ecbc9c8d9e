"""Policy-gradient losses: a registry selected by ``actor_rollout_ref.actor.policy_loss.loss_mode``.

Importing this module registers every built-in loss (verl 0.9.1's set):

* :mod:`~verl.algorithms.ppo_losses`: ``vanilla`` (PPO, dual clip), ``gspo``, ``sapo``,
  ``cispo``, ``gpg``, ``dro``, ``geo_mean`` (GMPO)
* :mod:`~verl.algorithms.dppo_losses`: ``dppo_tv``, ``dppo_kl``
* :mod:`~verl.algorithms.cov_losses`: ``clip_cov``, ``kl_cov``
* :mod:`~verl.algorithms.bypass_loss`: ``bypass_mode``

The calling convention, the registry and the shared helpers are in
:mod:`~verl.algorithms.policy_loss_base`. Every loss returns ``(pg_loss, metrics)`` with at
least ``actor/pg_clipfrac``, ``actor/ppo_kl`` and ``actor/pg_clipfrac_lower``.
"""

from __future__ import annotations

from verl.algorithms.bypass_loss import compute_policy_loss_bypass_mode, compute_policy_loss_reinforce
from verl.algorithms.cov_losses import compute_policy_loss_clip_cov, compute_policy_loss_kl_cov
from verl.algorithms.dppo_losses import compute_policy_loss_dppo_kl, compute_policy_loss_dppo_tv
from verl.algorithms.policy_loss_base import (
    LOG_RATIO_CLAMP,
    POLICY_LOSS_REGISTRY,
    PolicyLossFn,
    clip_range,
    get_policy_loss_fn,
    register_policy_loss,
)
from verl.algorithms.ppo_losses import (
    GSPO_LOG_RATIO_MAX,
    compute_policy_loss,
    compute_policy_loss_cispo,
    compute_policy_loss_dro,
    compute_policy_loss_geo_mean,
    compute_policy_loss_gpg,
    compute_policy_loss_gspo,
    compute_policy_loss_sapo,
    compute_policy_loss_vanilla,
)

__all__ = [
    "GSPO_LOG_RATIO_MAX",
    "LOG_RATIO_CLAMP",
    "POLICY_LOSS_REGISTRY",
    "PolicyLossFn",
    "clip_range",
    "compute_policy_loss",
    "compute_policy_loss_bypass_mode",
    "compute_policy_loss_cispo",
    "compute_policy_loss_clip_cov",
    "compute_policy_loss_dppo_kl",
    "compute_policy_loss_dppo_tv",
    "compute_policy_loss_dro",
    "compute_policy_loss_geo_mean",
    "compute_policy_loss_gpg",
    "compute_policy_loss_gspo",
    "compute_policy_loss_kl_cov",
    "compute_policy_loss_reinforce",
    "compute_policy_loss_sapo",
    "compute_policy_loss_vanilla",
    "get_policy_loss_fn",
    "register_policy_loss",
]
