"""Advantage estimators (registered by name) and the driver-side ``compute_advantage``.

Importing this module registers every built-in estimator (verl 0.9.1's set):

* here: ``gae``, ``reinforce_plus_plus``, ``remax`` (per-token returns)
* :mod:`~verl.algorithms.group_advantages`: ``grpo``, ``grpo_vectorized``, ``gdpo``,
  ``grpo_passk``, ``reinforce_plus_plus_baseline``, ``rloo``, ``rloo_vectorized``, ``opo``, ``gpg``
* :mod:`~verl.algorithms.token_baselines`: ``optimal_token_baseline``,
  ``tir_optimal_token_baseline``

The calling convention and the registry are in :mod:`~verl.algorithms.adv_registry`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from verl.algorithms.adv_registry import (
    ADV_ESTIMATOR_REGISTRY,
    GROUP_STD_EPS,
    AdvEstimatorFn,
    get_adv_estimator_fn,
    register_adv_est,
    require,
)
from verl.algorithms.group_advantages import (
    compute_gdpo_outcome_advantage,
    compute_gpg_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    compute_grpo_vectorized_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_rloo_outcome_advantage,
    compute_rloo_vectorized_outcome_advantage,
)
from verl.algorithms.rollout_correction import apply_rollout_correction
from verl.algorithms.token_baselines import (
    compute_multi_turn_optimal_token_baseline_advantage,
    compute_optimal_token_baseline_advantage,
)
from verl.utils.torch_functional import masked_whiten

if TYPE_CHECKING:
    from verl.config.algorithm import AlgorithmConfig
    from verl.protocol import DataProto

__all__ = [
    "ADV_ESTIMATOR_REGISTRY",
    "GROUP_STD_EPS",
    "AdvEstimatorFn",
    "compute_advantage",
    "compute_gae_advantage_return",
    "compute_gdpo_outcome_advantage",
    "compute_gpg_outcome_advantage",
    "compute_grpo_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_grpo_vectorized_outcome_advantage",
    "compute_multi_turn_optimal_token_baseline_advantage",
    "compute_opo_outcome_advantage",
    "compute_optimal_token_baseline_advantage",
    "compute_pf_ppo_reweight_data",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "compute_rloo_vectorized_outcome_advantage",
    "get_adv_estimator_fn",
    "pf_ppo_weights",
    "register_adv_est",
]


# ----------------------------------------------------------------------------- per-token returns
@register_adv_est("gae")
@torch.no_grad()
def compute_gae_advantage_return(
    *,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    config: AlgorithmConfig,
    values: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized Advantage Estimation (Schulman et al. 2015, https://arxiv.org/abs/1506.02438).

    ``delta_t = r_t + gamma * V_{t+1} - V_t``, ``A_t = delta_t + gamma * lam * A_{t+1}``,
    computed backwards; masked positions carry ``V`` and ``A`` through unchanged so they
    are skipped. ``returns = A + V``; the advantages are then whitened over valid tokens.
    """
    values = require(values, "values", "gae")
    gamma, lam = config.gamma, config.lam
    mask = response_mask.to(values.dtype)  # `1 - mask` below needs a numeric mask
    next_value = torch.zeros_like(values[:, 0])
    last_gae = torch.zeros_like(values[:, 0])
    reversed_adv = []
    for t in reversed(range(token_level_rewards.shape[-1])):
        mask_t = mask[:, t]
        delta = token_level_rewards[:, t] + gamma * next_value - values[:, t]
        gae_t = delta + gamma * lam * last_gae
        next_value = values[:, t] * mask_t + (1 - mask_t) * next_value
        last_gae = gae_t * mask_t + (1 - mask_t) * last_gae
        reversed_adv.append(last_gae)
    advantages = torch.stack(reversed_adv[::-1], dim=1)
    returns = advantages + values
    return masked_whiten(advantages, response_mask), returns


@register_adv_est("reinforce_plus_plus")
@torch.no_grad()
def compute_reinforce_plus_plus_outcome_advantage(
    *,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    config: AlgorithmConfig,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu 2025, https://arxiv.org/abs/2501.03262).

    Discounted return-to-go over the valid tokens, ``G_t = r_t + gamma * G_{t'}`` with ``t'``
    the next valid token: masked positions (padding, or observation tokens between two
    turns) get ``G = 0`` and carry the running return across unchanged, ignoring their
    reward. Whitened over all valid tokens of the batch: ``A = whiten(G) * mask``.
    """
    mask = response_mask.to(token_level_rewards.dtype)
    returns = torch.zeros_like(token_level_rewards)
    running = torch.zeros_like(token_level_rewards[:, 0])
    for t in reversed(range(token_level_rewards.shape[1])):
        candidate = token_level_rewards[:, t] + config.gamma * running
        returns[:, t] = candidate * mask[:, t]
        running = candidate * mask[:, t] + running * (1 - mask[:, t])
    advantages = masked_whiten(returns, response_mask) * response_mask
    return advantages, returns


@register_adv_est("remax")
@torch.no_grad()
def compute_remax_outcome_advantage(
    *,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    reward_baselines: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax (Li et al. 2023, https://arxiv.org/abs/2310.10505): baseline = reward of a greedy rollout.

    ``G_t = sum_{t' >= t} r_t'`` (undiscounted return-to-go), ``A_t = G_t - b * mask_t``
    with ``b`` the row's ``reward_baselines`` entry.
    """
    reward_baselines = require(reward_baselines, "reward_baselines", "remax")
    returns = (token_level_rewards * response_mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
    advantages = returns - reward_baselines.unsqueeze(-1) * response_mask
    return advantages, returns


# ----------------------------------------------------------------------------- driver entry
def compute_advantage(data: DataProto, config: AlgorithmConfig) -> DataProto:
    """Run ``algorithm.adv_estimator`` on a batch and write ``advantages`` and ``returns``.

    First, with ``algorithm.rollout_correction`` enabled (``rollout_is`` or ``rollout_rs``
    set, or ``bypass_mode``), :func:`apply_rollout_correction` writes the rollout importance
    weights and the rejection mask (``rollout_is_weights``, ``response_mask``; metrics in
    ``meta_info["rollout_corr_metrics"]``), where verl 0.9.1's trainer does it. The estimator
    then gets every batch key it may use (``token_level_rewards``, ``response_mask``,
    ``values``, ``reward_baselines``, ``old_log_probs``, ``sum_pi_squared``,
    ``rollout_is_weights``; ``None`` when absent), the non-tensor ``uid`` and the non-tensor
    columns. With ``algorithm.use_pf_ppo`` and GAE the
    batch is then resampled by reward (PF-PPO), in place. Returns ``data``.
    """
    correction = config.rollout_correction
    if correction.bypass_mode or correction.rollout_is is not None or correction.rollout_rs is not None:
        data.meta_info["rollout_corr_metrics"] = apply_rollout_correction(data, correction)
    batch = data.batch
    present = set(batch.keys())

    def optional(key: str) -> torch.Tensor | None:
        return batch[key] if key in present else None

    advantages, returns = get_adv_estimator_fn(config.adv_estimator)(
        token_level_rewards=batch["token_level_rewards"],
        response_mask=batch["response_mask"],
        index=data.non_tensor_batch.get("uid"),
        config=config,
        values=optional("values"),
        reward_baselines=optional("reward_baselines"),
        old_log_probs=optional("old_log_probs"),
        sum_pi_squared=optional("sum_pi_squared"),
        rollout_is_weights=optional("rollout_is_weights"),
        non_tensor_batch=data.non_tensor_batch,
        batch=batch,
    )
    batch["advantages"] = advantages
    batch["returns"] = returns
    if config.use_pf_ppo and config.adv_estimator == "gae":
        data = compute_pf_ppo_reweight_data(data, config.pf_ppo.reweight_method, config.pf_ppo.weight_pow)
    return data


def pf_ppo_weights(scores: torch.Tensor, reweight_method: str, weight_pow: float) -> torch.Tensor:
    """Resampling weights of PF-PPO (https://arxiv.org/abs/2409.06957), floored at 1e-8.

    ``pow``: ``|s|^p``; ``max_min``: 1 for the best and worst score, else 0;
    ``max_random``: 0.4 for the best score, else 0.1.
    """
    if reweight_method == "pow":
        weights = torch.pow(torch.abs(scores), weight_pow)
    elif reweight_method == "max_min":
        weights = torch.where((scores == scores.max()) | (scores == scores.min()), 1.0, 0.0)
    elif reweight_method == "max_random":
        weights = torch.where(scores == scores.max(), 0.4, 0.1)
    else:
        raise ValueError(f"algorithm.pf_ppo.reweight_method: unknown method {reweight_method!r}")
    return torch.clamp(weights + 1e-8, min=1e-8)


@torch.no_grad()
def compute_pf_ppo_reweight_data(
    data: DataProto, reweight_method: str = "pow", weight_pow: float = 2.0
) -> DataProto:
    """Resample ``data`` in place: ``B`` rows drawn with replacement, with probability
    proportional to :func:`pf_ppo_weights` of each row's summed ``token_level_scores``.

    Per-row lists in ``meta_info`` follow the rows. Returns ``data`` (the same object).
    """
    scores = data.batch["token_level_scores"].sum(dim=-1)
    weights = pf_ppo_weights(scores, reweight_method, weight_pow)
    size = len(scores)
    picks = torch.multinomial(weights, size, replacement=True)
    resampled = data.select_idxs(picks)
    data.batch, data.non_tensor_batch = resampled.batch, resampled.non_tensor_batch
    for key, value in list(data.meta_info.items()):
        if isinstance(value, list) and len(value) == size:
            data.meta_info[key] = [value[i] for i in picks.tolist()]
    return data
