"""Advantage estimators (registered by name) and the driver-side ``compute_advantage``.

Importing this module registers every built-in estimator (verl 0.9.1's set):

* here: ``gae``, ``reinforce_plus_plus``, ``remax`` (per-token returns)
* :mod:`~verl.algorithms.group_advantages`: ``grpo``, ``grpo_vectorized``, ``gdpo``,
  ``grpo_passk``, ``reinforce_plus_plus_baseline``, ``rloo``, ``rloo_vectorized``, ``opo``, ``gpg``
* :mod:`~verl.algorithms.token_baselines`: ``optimal_token_baseline``,
  ``tir_optimal_token_baseline``

Signatures are verl's; the calling convention, the registry and ``AdvantageEstimator`` are in
:mod:`~verl.algorithms.adv_registry`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from verl.algorithms.adv_registry import (
    ADV_ESTIMATOR_REGISTRY,
    GROUP_STD_EPS,
    AdvantageEstimator,
    AdvEstimatorFn,
    call_adv_estimator,
    estimator_name,
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
    "OPTIONAL_BATCH_KEYS",
    "AdvEstimatorFn",
    "AdvantageEstimator",
    "call_adv_estimator",
    "compute_advantage",
    "compute_advantage_for",
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
    "compute_response_mask",
    "compute_rloo_outcome_advantage",
    "compute_rloo_vectorized_outcome_advantage",
    "get_adv_estimator_fn",
    "pf_ppo_weights",
    "register_adv_est",
]


# ----------------------------------------------------------------------------- per-token returns
@register_adv_est(AdvantageEstimator.GAE)
@torch.no_grad()
def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor | None,
    response_mask: torch.Tensor,
    gamma: float | torch.Tensor,
    lam: float | torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized Advantage Estimation (Schulman et al. 2015, https://arxiv.org/abs/1506.02438).

    ``delta_t = r_t + gamma * V_{t+1} - V_t``, ``A_t = delta_t + gamma * lam * A_{t+1}``,
    computed backwards; masked positions carry ``V`` and ``A`` through unchanged so they
    are skipped. ``returns = A + V``; the advantages are then whitened over valid tokens.
    """
    values = require(values, "values", "gae")
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


@register_adv_est(AdvantageEstimator.REINFORCE_PLUS_PLUS)
@torch.no_grad()
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    config: AlgorithmConfig | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu 2025, https://arxiv.org/abs/2501.03262).

    Discounted return-to-go over the valid tokens, ``G_t = r_t + gamma * G_{t'}`` with ``t'``
    the next valid token: masked positions (padding, or observation tokens between two
    turns) get ``G = 0`` and carry the running return across unchanged, ignoring their
    reward. Whitened over all valid tokens of the batch: ``A = whiten(G) * mask``.

    ``gamma`` is ``config.gamma`` as in verl; without a config, a ``gamma`` keyword.
    """
    gamma = config.gamma if config is not None else kwargs.get("gamma")
    if gamma is None:
        raise ValueError("reinforce_plus_plus needs config (an AlgorithmConfig, for its gamma) or gamma=")
    mask = response_mask.to(token_level_rewards.dtype)
    returns = torch.zeros_like(token_level_rewards)
    running = torch.zeros_like(token_level_rewards[:, 0])
    for t in reversed(range(token_level_rewards.shape[1])):
        candidate = token_level_rewards[:, t] + gamma * running
        returns[:, t] = candidate * mask[:, t]
        running = candidate * mask[:, t] + running * (1 - mask[:, t])
    advantages = masked_whiten(returns, response_mask) * response_mask
    return advantages, returns


@register_adv_est(AdvantageEstimator.REMAX)
@torch.no_grad()
def compute_remax_outcome_advantage(
    token_level_rewards: torch.Tensor,
    reward_baselines: torch.Tensor | None,
    response_mask: torch.Tensor,
    config: AlgorithmConfig | None = None,
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
OPTIONAL_BATCH_KEYS = ("values", "reward_baselines", "old_log_probs", "sum_pi_squared", "rollout_is_weights")
"""Batch keys offered to the estimators when present (``None`` otherwise)."""


def compute_advantage_for(data: DataProto, config: AlgorithmConfig) -> DataProto:
    """:func:`compute_advantage` with the estimator and settings the ``algorithm`` section names
    (``adv_estimator``, ``gamma``, ``lam``, ``norm_adv_by_std_in_grpo``): the trainer's call."""
    return compute_advantage(
        data,
        config.adv_estimator,
        gamma=config.gamma,
        lam=config.lam,
        norm_adv_by_std_in_grpo=config.norm_adv_by_std_in_grpo,
        config=config,
    )


def compute_advantage(
    data: DataProto,
    adv_estimator: str | AdvantageEstimator,
    gamma: float = 1.0,
    lam: float = 1.0,
    num_repeat: int = 1,
    norm_adv_by_std_in_grpo: bool = True,
    config: AlgorithmConfig | None = None,
) -> DataProto:
    """Run the estimator named ``adv_estimator`` on a batch; write ``advantages`` and ``returns``.

    verl's ``ray_trainer.compute_advantage``: ``gamma``, ``lam`` and ``norm_adv_by_std_in_grpo``
    reach the estimators that take them (GAE, the GRPO family), ``config`` (the ``algorithm``
    section, or ``None``) the others, with the batch keys of :data:`OPTIONAL_BATCH_KEYS`, the
    non-tensor ``uid`` as ``index`` and the non-tensor columns (see
    :func:`~verl.algorithms.adv_registry.call_adv_estimator`). ``num_repeat`` is unused, as in
    verl. A batch without ``response_mask`` gets the response columns of ``attention_mask``.

    ``config`` also enables two batch-level steps. Before the estimator, with
    ``config.rollout_correction`` on (``rollout_is`` or ``rollout_rs`` set, or ``bypass_mode``),
    :func:`apply_rollout_correction` writes ``rollout_is_weights`` and the rejection mask
    (metrics in ``meta_info["rollout_corr_metrics"]``); verl's trainer does this just before
    calling it. After GAE, with ``config.use_pf_ppo``, the batch is resampled by reward
    (PF-PPO), in place. Returns ``data``.
    """
    name = _checked_name(adv_estimator)
    if "response_mask" not in data.batch.keys():
        data.batch["response_mask"] = compute_response_mask(data)
    if config is not None:
        correction = config.rollout_correction
        if correction.bypass_mode or correction.rollout_is is not None or correction.rollout_rs is not None:
            data.meta_info["rollout_corr_metrics"] = apply_rollout_correction(data, correction)
    batch = data.batch
    present = set(batch.keys())
    advantages, returns = call_adv_estimator(
        get_adv_estimator_fn(name),
        token_level_rewards=batch["token_level_rewards"],
        response_mask=batch["response_mask"],
        index=data.non_tensor_batch.get("uid"),
        config=config,
        gamma=gamma,
        lam=lam,
        norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
        non_tensor_batch=data.non_tensor_batch,
        batch=batch,
        **{key: batch[key] if key in present else None for key in OPTIONAL_BATCH_KEYS},
    )
    batch["advantages"] = advantages
    batch["returns"] = returns
    if config is not None and config.use_pf_ppo and name == AdvantageEstimator.GAE:
        data = compute_pf_ppo_reweight_data(data, config.pf_ppo.reweight_method, config.pf_ppo.weight_pow)
    return data


def _checked_name(adv_estimator: Any) -> str:
    if not isinstance(adv_estimator, str):  # an AdvantageEstimator is a str too
        raise TypeError(
            "compute_advantage(data, adv_estimator, gamma, lam, num_repeat, norm_adv_by_std_in_grpo, "
            f"config): adv_estimator must be an estimator name, got {type(adv_estimator).__name__}; "
            "pass the algorithm config as config="
        )
    return estimator_name(adv_estimator)


def compute_response_mask(data: DataProto) -> torch.Tensor:
    """``[B, R]`` 1 on the response tokens: the last ``R`` columns of ``attention_mask``, ``R`` the
    width of ``responses`` (verl's ``ray_trainer.compute_response_mask``; the rollout also returns
    ``response_mask`` itself)."""
    keys = set(data.batch.keys())
    if not {"responses", "attention_mask"} <= keys:
        raise ValueError(
            "the response mask needs batch keys 'responses' and 'attention_mask' (or 'response_mask' "
            f"itself); the batch has {sorted(keys)}"
        )
    return data.batch["attention_mask"][:, -data.batch["responses"].shape[-1] :]


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
