"""KL estimators, KL-coefficient controllers, and the in-reward KL penalty.

Estimators of KL(pi || pi_ref) from per-token log-probs (J. Schulman, "Approximating KL
divergence", http://joschu.net/blog/kl-approx.html), with ``log_r = logp - ref_logp``:

* ``kl`` / ``k1``: ``log_r`` (unbiased, high variance, can be negative)
* ``abs``: ``|log_r|``
* ``mse`` / ``k2``: ``0.5 * log_r^2``
* ``low_var_kl`` / ``k3``: ``exp(-log_r) + log_r - 1`` (unbiased, non-negative, low variance)

A ``+`` suffix (``k1+``, ``k3+``) keeps the forward value of the estimator but takes the
gradient of ``k2``, whose gradient is the unbiased gradient of the KL (straight-through).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from verl.utils.torch_functional import masked_mean

if TYPE_CHECKING:
    from verl.config.algorithm import KLControlConfig
    from verl.protocol import DataProto

_BASE_TYPES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
KL_PENALTY_TYPES: tuple[str, ...] = _BASE_TYPES + tuple(f"{name}+" for name in _BASE_TYPES)
"""Every accepted ``kl_penalty`` / ``kl_loss_type`` value."""

# Clamps of the k3 estimator, as in verl: the log-ratio before exp, the result after.
K3_LOG_RATIO_CLAMP = 20.0
K3_VALUE_CLAMP = 10.0


def kl_penalty_forward(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """The value of the estimator ``kl_penalty`` (a ``+`` suffix changes only the gradient, so it
    is dropped here); :func:`kl_penalty` adds the straight-through gradient."""
    name = kl_penalty.removesuffix("+")
    if name in ("kl", "k1"):
        return logprob - ref_logprob
    if name == "abs":
        return (logprob - ref_logprob).abs()
    if name in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if name in ("low_var_kl", "k3"):
        log_ratio = torch.clamp(ref_logprob - logprob, min=-K3_LOG_RATIO_CLAMP, max=K3_LOG_RATIO_CLAMP)
        kld = (torch.exp(log_ratio) - log_ratio - 1).contiguous()
        return torch.clamp(kld, min=-K3_VALUE_CLAMP, max=K3_VALUE_CLAMP)
    if name == "full":
        raise ValueError(
            "kl_penalty='full' needs full-vocabulary distributions and is not supported; use k1/k2/k3"
        )
    raise ValueError(f"unknown kl_penalty {name!r}; expected one of {list(KL_PENALTY_TYPES)}")


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """Per-token KL estimate between the policy and the reference (see the module doc).

    Args:
        logprob: [B, R] log-probs of the sampled tokens under the policy.
        ref_logprob: [B, R] log-probs of the same tokens under the reference policy.
        kl_penalty: estimator name, one of :data:`KL_PENALTY_TYPES`.
    """
    forward = kl_penalty_forward(logprob, ref_logprob, kl_penalty)
    if not kl_penalty.endswith("+") or kl_penalty in ("mse+", "k2+"):
        return forward
    # Value of the chosen estimator, gradient of k2 (unbiased gradient of the KL).
    k2 = 0.5 * (logprob - ref_logprob).square()
    return k2 - k2.detach() + forward.detach()


# Alias so apply_kl_penalty's argument name (verl's) does not shadow the function inside it.
_kl_estimate = kl_penalty


def compute_rewards(
    token_level_scores: torch.Tensor, old_log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kl_ratio: float
) -> torch.Tensor:
    """verl's plain in-reward KL: ``scores - kl_ratio * (old_log_prob - ref_log_prob)`` per token
    (the ``k1`` estimate, no mask; the trainer uses :func:`apply_kl_penalty`)."""
    return token_level_scores - (old_log_prob - ref_log_prob) * kl_ratio


class FixedKLController:
    """A constant KL coefficient ``value``."""

    def __init__(self, kl_coef: float) -> None:
        self.value = kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op: the coefficient stays fixed."""

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = state["value"]


class AdaptiveKLController:
    """Proportional controller of the KL coefficient (Ziegler et al. 2019, https://arxiv.org/abs/1909.08593).

    ``e = clip(KL / target - 1, -0.2, 0.2)``, then ``beta <- beta * (1 + e * n_steps / horizon)``.
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int) -> None:
        self.value = init_kl_coef
        self.target = target_kl
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        proportional_error = np.clip(current_kl / self.target - 1, -0.2, 0.2)
        self.value = float(self.value * (1 + proportional_error * n_steps / self.horizon))

    def state_dict(self) -> dict[str, float]:
        # Target and horizon come from the config; only the coefficient evolves.
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = state["value"]


def get_kl_controller(kl_ctrl: KLControlConfig | Any) -> FixedKLController | AdaptiveKLController:
    """Build the controller named by ``algorithm.kl_ctrl.type`` from a :class:`KLControlConfig`
    (its own checks run first, so a bad value raises ``ConfigError`` naming the key) or any object
    with verl's fields ``type``, ``kl_coef``, ``target_kl``, ``horizon`` (an OmegaConf node)."""
    if hasattr(kl_ctrl, "validate"):
        kl_ctrl.validate("algorithm.kl_ctrl")
    if kl_ctrl.type == "adaptive":
        if not kl_ctrl.horizon > 0:
            raise ValueError(f"algorithm.kl_ctrl.horizon: expected > 0, got {kl_ctrl.horizon}")
        return AdaptiveKLController(kl_ctrl.kl_coef, kl_ctrl.target_kl, kl_ctrl.horizon)
    if kl_ctrl.type == "fixed":
        return FixedKLController(kl_coef=kl_ctrl.kl_coef)
    raise ValueError(f"algorithm.kl_ctrl.type: expected 'fixed' or 'adaptive', got {kl_ctrl.type!r}")


def apply_kl_penalty(
    data: DataProto, kl_ctrl: FixedKLController | AdaptiveKLController, kl_penalty: str = "kl"
) -> tuple[DataProto, dict[str, Any]]:
    """In-reward KL: ``token_level_rewards = token_level_scores - beta * kl * response_mask``.

    Reads ``token_level_scores``, ``old_log_probs``, ``ref_log_prob``, ``response_mask``;
    writes ``token_level_rewards``. The controller is then updated with the batch KL
    (mean over rows of the per-row token-mean KL) and ``n_steps`` = number of rows.
    """
    response_mask = data.batch["response_mask"]
    kld = _kl_estimate(data.batch["old_log_probs"], data.batch["ref_log_prob"], kl_penalty) * response_mask
    beta = kl_ctrl.value
    data.batch["token_level_rewards"] = data.batch["token_level_scores"] - beta * kld

    current_kl = torch.mean(masked_mean(kld, response_mask, axis=-1), dim=0).item()
    kl_ctrl.update(current_kl=current_kl, n_steps=len(data))
    return data, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}
