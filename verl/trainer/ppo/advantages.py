"""Advantage estimators: a registry of pure functions plus the driver-side ``compute_advantage``.

Every registered estimator takes the same keyword arguments::

    fn(*, token_level_rewards [B, R], response_mask [B, R], index (np object array of uids, len B) | None,
       config (AlgorithmConfig), values [B, R] | None, reward_baselines [B] | None, **kwargs)
    -> (advantages [B, R], returns [B, R])

so a new estimator is one decorated function::

    @register_adv_est("my_estimator")
    def my_estimator(*, token_level_rewards, response_mask, config, **kwargs): ...

Outcome estimators use the sequence score ``s_i = sum_t r_{i,t}`` and broadcast one scalar
per response over its valid tokens. Groups are the rows that share a ``uid`` (the n
responses to one prompt). Numerics follow verl's ``core_algos.py``: unbiased group std,
``eps = 1e-6``, and a group of one sample has mean 0 and std 1.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from verl.utils.torch_functional import masked_whiten

if TYPE_CHECKING:
    from verl.protocol import DataProto
    from verl.trainer.config.algorithm import AlgorithmConfig

AdvEstimatorFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]
ADV_ESTIMATOR_REGISTRY: dict[str, AdvEstimatorFn] = {}

GROUP_STD_EPS = 1e-6
"""Added to the group std before dividing (GRPO, pass@k)."""


def register_adv_est(name: str) -> Callable[[AdvEstimatorFn], AdvEstimatorFn]:
    """Register an estimator under ``name`` (``algorithm.adv_estimator=name`` selects it)."""

    def decorator(fn: AdvEstimatorFn) -> AdvEstimatorFn:
        known = ADV_ESTIMATOR_REGISTRY.get(name)
        if known is not None and known is not fn:
            raise ValueError(f"advantage estimator {name!r} is already registered to {known.__qualname__}")
        ADV_ESTIMATOR_REGISTRY[name] = fn
        return fn

    return decorator


def get_adv_estimator_fn(name: str) -> AdvEstimatorFn:
    """The estimator registered under ``name``; unknown names list the known ones."""
    if name not in ADV_ESTIMATOR_REGISTRY:
        raise ValueError(
            f"unknown advantage estimator {name!r}; registered: {sorted(ADV_ESTIMATOR_REGISTRY)}"
        )
    return ADV_ESTIMATOR_REGISTRY[name]


# ----------------------------------------------------------------------------- helpers
def _groups(index: np.ndarray | None, batch_size: int, estimator: str) -> list[torch.Tensor]:
    """Row indices of each group, in order of first appearance."""
    if index is None:
        raise ValueError(
            f"advantage estimator {estimator!r} needs the non-tensor column 'uid' to group responses"
        )
    if len(index) != batch_size:
        raise ValueError(
            f"advantage estimator {estimator!r}: 'uid' has {len(index)} rows but rewards have {batch_size}"
        )
    rows: dict[Any, list[int]] = {}
    for i, uid in enumerate(index):
        rows.setdefault(uid, []).append(i)
    return [torch.tensor(r, dtype=torch.long) for r in rows.values()]


def _group_mean_std(scores: torch.Tensor, groups: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row mean and unbiased std of its group; a single-sample group gets mean 0, std 1."""
    mean, std = torch.zeros_like(scores), torch.ones_like(scores)
    for rows in groups:
        if len(rows) > 1:
            mean[rows] = torch.mean(scores[rows])
            std[rows] = torch.std(scores[rows])
    return mean, std


def _require(tensor: torch.Tensor | None, key: str, estimator: str) -> torch.Tensor:
    if tensor is None:
        raise ValueError(f"advantage estimator {estimator!r} needs batch key {key!r}")
    return tensor


# ----------------------------------------------------------------------------- estimators
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
    values = _require(values, "values", "gae")
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


@register_adv_est("grpo")
@torch.no_grad()
def compute_grpo_outcome_advantage(
    *,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | None,
    config: AlgorithmConfig,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO (Shao et al. 2024, https://arxiv.org/abs/2402.03300): ``A_i = (s_i - mean_g) / (std_g + 1e-6)``.

    With ``algorithm.norm_adv_by_std_in_grpo=False`` it is ``A_i = s_i - mean_g``
    (Dr.GRPO, https://arxiv.org/abs/2503.20783).
    """
    scores = token_level_rewards.sum(dim=-1)
    mean, std = _group_mean_std(scores, _groups(index, len(scores), "grpo"))
    if config.norm_adv_by_std_in_grpo:
        scores = (scores - mean) / (std + GROUP_STD_EPS)
    else:
        scores = scores - mean
    advantages = scores.unsqueeze(-1) * response_mask
    return advantages, advantages


@register_adv_est("grpo_passk")
@torch.no_grad()
def compute_grpo_passk_outcome_advantage(
    *,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | None,
    config: AlgorithmConfig,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass@k training (Chen et al. 2025, https://arxiv.org/abs/2503.19595).

    Only the best response of each group gets a non-zero advantage, ``s_max - s_second``
    (divided by ``std_g + 1e-6`` when ``norm_adv_by_std_in_grpo``). Groups need >= 2 samples.
    """
    scores = token_level_rewards.sum(dim=-1)
    advantages = torch.zeros_like(scores)
    for rows in _groups(index, len(scores), "grpo_passk"):
        group = scores[rows]
        if group.numel() < 2:
            raise ValueError(f"grpo_passk needs at least 2 responses per uid; row {rows[0].item()} is alone")
        top, top_idx = torch.topk(group, 2)
        advantage = top[0] - top[1]
        if config.norm_adv_by_std_in_grpo:
            advantage = advantage / (torch.std(group) + GROUP_STD_EPS)
        advantages[rows[top_idx[0]]] = advantage
    advantages = advantages.unsqueeze(-1) * response_mask
    return advantages, advantages


@register_adv_est("reinforce_plus_plus_baseline")
@torch.no_grad()
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    *,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with a group baseline (Hu 2025, https://arxiv.org/abs/2501.03262).

    ``A_i = s_i - mean_g`` on every valid token, then whitened over all valid tokens of the batch.
    """
    scores = token_level_rewards.sum(dim=-1)
    mean, _ = _group_mean_std(scores, _groups(index, len(scores), "reinforce_plus_plus_baseline"))
    scores = (scores - mean).unsqueeze(-1).tile([1, token_level_rewards.shape[-1]]) * response_mask
    advantages = masked_whiten(scores, response_mask) * response_mask
    return advantages, advantages


@register_adv_est("rloo")
@torch.no_grad()
def compute_rloo_outcome_advantage(
    *,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO (Ahmadian et al. 2024, https://arxiv.org/abs/2402.14740): leave-one-out baseline.

    ``A_i = s_i - mean_{j != i} s_j = n / (n - 1) * (s_i - mean_g)`` for a group of ``n > 1``;
    a single-sample group keeps its raw score as the advantage (verl's behaviour).
    """
    scores = token_level_rewards.sum(dim=-1)
    for rows in _groups(index, len(scores), "rloo"):
        n = len(rows)
        if n > 1:
            mean = torch.mean(scores[rows])
            scores[rows] = scores[rows] * n / (n - 1) - mean * n / (n - 1)
    advantages = scores.unsqueeze(-1) * response_mask
    return advantages, advantages


@register_adv_est("opo")
@torch.no_grad()
def compute_opo_outcome_advantage(
    *,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """On-Policy RL with Optimal reward baseline (Hao et al. 2025, https://arxiv.org/abs/2505.23585).

    Length-weighted group baseline ``b_g = sum_i |y_i| s_i / sum_i |y_i|``, ``A_i = s_i - b_g``;
    a single-sample group has baseline 0.
    """
    lengths = response_mask.sum(dim=-1)
    scores = token_level_rewards.sum(dim=-1)
    baseline = torch.zeros_like(scores)
    for rows in _groups(index, len(scores), "opo"):
        if len(rows) > 1:
            baseline[rows] = (lengths[rows] * scores[rows]).sum() / lengths[rows].sum()
    advantages = (scores - baseline).unsqueeze(-1) * response_mask
    return advantages, advantages


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

    Discounted return-to-go ``G_t = r_t + gamma * G_{t+1}`` (reset after the response
    ends), whitened over all valid tokens of the batch: ``A = whiten(G) * mask``.
    """
    returns = torch.zeros_like(token_level_rewards)
    running = torch.zeros_like(token_level_rewards[:, 0])
    for t in reversed(range(token_level_rewards.shape[1])):
        running = token_level_rewards[:, t] + config.gamma * running
        returns[:, t] = running
        running = running * response_mask[:, t]
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
    reward_baselines = _require(reward_baselines, "reward_baselines", "remax")
    returns = (token_level_rewards * response_mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
    advantages = returns - reward_baselines.unsqueeze(-1) * response_mask
    return advantages, returns


@register_adv_est("gpg")
@torch.no_grad()
def compute_gpg_outcome_advantage(
    *,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPG (Chu et al. 2025, https://arxiv.org/abs/2504.02546): ``A_i = alpha * (s_i - mean_g)``.

    ``alpha = B / max(1, #rows with non-zero score)`` rescales the gradient when many
    groups carry no signal. The normaliser ``F_norm`` is 1, as in verl.
    """
    scores = token_level_rewards.sum(dim=-1)
    alpha = len(scores) / torch.count_nonzero(scores).clamp(min=1)
    mean, _ = _group_mean_std(scores, _groups(index, len(scores), "gpg"))
    f_norm = 1.0
    advantages = (alpha * (scores - mean) / f_norm).unsqueeze(-1) * response_mask
    return advantages, advantages


# ----------------------------------------------------------------------------- driver entry
def compute_advantage(data: DataProto, config: AlgorithmConfig) -> DataProto:
    """Run ``algorithm.adv_estimator`` on a batch and write ``advantages`` and ``returns``.

    Reads ``token_level_rewards``, ``response_mask``, ``values`` and ``reward_baselines``
    when present, and the non-tensor ``uid``. With ``algorithm.use_pf_ppo`` and GAE the
    batch is then resampled by reward (PF-PPO), in place. Returns ``data``.
    """
    batch = data.batch
    present = set(batch.keys())
    advantages, returns = get_adv_estimator_fn(config.adv_estimator)(
        token_level_rewards=batch["token_level_rewards"],
        response_mask=batch["response_mask"],
        index=data.non_tensor_batch.get("uid"),
        config=config,
        values=batch["values"] if "values" in present else None,
        reward_baselines=batch["reward_baselines"] if "reward_baselines" in present else None,
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
