"""Policy-gradient losses: a registry selected by ``actor_rollout_ref.actor.policy_loss.loss_mode``.

Every registered loss has the signature::

    fn(old_log_prob [B, R], log_prob [B, R], advantages [B, R], response_mask [B, R],
       loss_agg_mode: str, config, rollout_log_probs [B, R] | None = None)
    -> (pg_loss: scalar tensor, pg_metrics: dict[str, float])

``config`` is the actor config (``clip_ratio``, ``clip_ratio_low``, ``clip_ratio_high``,
``clip_ratio_c``, ``tis_imp_ratio_cap``, ``policy_loss``). ``pg_metrics`` always holds
``actor/pg_clipfrac``, ``actor/ppo_kl`` and ``actor/pg_clipfrac_lower``. Notation:
``log_r = log_prob - old_log_prob``, ``r = exp(log_r)``, ``A`` the advantage.
Numerics follow verl's ``core_algos.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from verl.trainer.ppo.loss_agg import agg_loss
from verl.utils.torch_functional import masked_mean

PolicyLossFn = Callable[..., tuple[torch.Tensor, dict[str, float]]]
POLICY_LOSS_REGISTRY: dict[str, PolicyLossFn] = {}

# The log-ratio is clamped to this range before exp() in vanilla and CISPO (as in verl).
LOG_RATIO_CLAMP = 20.0
# GSPO clamps its sequence log-ratio from above only.
GSPO_LOG_RATIO_MAX = 10.0


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
    low = config.clip_ratio_low if config.clip_ratio_low is not None else config.clip_ratio
    high = config.clip_ratio_high if config.clip_ratio_high is not None else config.clip_ratio
    return low, high


def _metrics(
    clipfrac: torch.Tensor | float, ppo_kl: torch.Tensor | float, clipfrac_lower: torch.Tensor | float
) -> dict[str, float]:
    def as_float(x: torch.Tensor | float) -> float:
        return x.detach().item() if isinstance(x, torch.Tensor) else float(x)

    return {
        "actor/pg_clipfrac": as_float(clipfrac),
        "actor/ppo_kl": as_float(ppo_kl),
        "actor/pg_clipfrac_lower": as_float(clipfrac_lower),
    }


@register_policy_loss("vanilla")
def compute_policy_loss_vanilla(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    config: Any,
    rollout_log_probs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate (https://arxiv.org/abs/1707.06347) with dual clip (https://arxiv.org/abs/1912.09729).

    ``L1 = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))``; for ``A < 0`` the loss is
    further capped at ``-A * clip_ratio_c``: ``L = min(L1, -A c)``. ``log_r`` is clamped
    to [-20, 20]. ``ppo_kl = mean(-log_r)``; ``pg_clipfrac`` is the fraction of tokens
    where the clipped term wins, ``pg_clipfrac_lower`` where the dual clip binds.

    With ``rollout_log_probs`` and ``config.tis_imp_ratio_cap > 0``, each token loss is
    multiplied by the truncated importance weight ``min(exp(old_log_prob - rollout_log_probs), cap)``
    (TIS, https://fengyao.notion.site/off-policy-rl).
    """
    low, high = clip_range(config)
    if not config.clip_ratio_c > 1.0:
        raise ValueError(
            f"actor.clip_ratio_c: expected a value > 1.0 for dual-clip PPO, got {config.clip_ratio_c}"
        )
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-LOG_RATIO_CLAMP, max=LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    ppo_kl = masked_mean(-log_ratio, response_mask)

    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - low, 1 + high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_clipfrac = masked_mean(torch.gt(pg_losses2, pg_losses1).float(), response_mask)

    pg_losses3 = -advantages * config.clip_ratio_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    pg_clipfrac_lower = masked_mean(
        torch.gt(clip_pg_losses1, pg_losses3) * (advantages < 0).float(), response_mask
    )
    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)

    tis_metrics: dict[str, float] = {}
    if rollout_log_probs is not None and config.tis_imp_ratio_cap > 0:
        tis_ratio, tis_metrics = truncated_is_weights(
            old_log_prob,
            rollout_log_probs,
            response_mask,
            config.tis_imp_ratio_cap,
            getattr(config, "tis_level", "token"),
        )
        pg_losses = pg_losses * tis_ratio

    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode)
    return pg_loss, {**_metrics(pg_clipfrac, ppo_kl, pg_clipfrac_lower), **tis_metrics}


def truncated_is_weights(
    old_log_prob: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    cap: float,
    level: str = "token",
) -> tuple[torch.Tensor, dict[str, float]]:
    """Truncated importance weights ``min(pi_prox / pi_behav, cap)`` (TIS,
    https://fengyao.notion.site/off-policy-rl; decoupled PPO, AReaL https://arxiv.org/abs/2505.24298).

    ``old_log_prob`` are the proximal log-probs (recomputed by the trainer), ``rollout_log_probs``
    the behaviour ones (from the engine that sampled). ``level="token"``: one weight per token;
    ``"sequence"``: ``exp(sum_t (prox_t - behav_t))`` over each response's tokens, broadcast to
    them. Metrics: ``actor/tis_weight_mean`` (before truncation, over tokens or sequences) and
    ``actor/tis_clipfrac`` (the fraction truncated).
    """
    if level == "token":
        raw = torch.exp(old_log_prob - rollout_log_probs)
        weights = torch.clamp(raw, max=cap)
        mean, clipped = masked_mean(raw, response_mask), masked_mean((raw > cap).float(), response_mask)
    elif level == "sequence":
        log_w = ((old_log_prob - rollout_log_probs) * response_mask).sum(-1, keepdim=True)
        raw = torch.exp(torch.clamp(log_w, max=LOG_RATIO_CLAMP))
        weights = torch.clamp(raw, max=cap).expand_as(old_log_prob)
        mean, clipped = raw.mean(), (raw > cap).float().mean()
    else:
        raise ValueError(f"actor.tis_level: expected token or sequence, got {level!r}")
    return weights, {"actor/tis_weight_mean": float(mean), "actor/tis_clipfrac": float(clipped)}


@register_policy_loss("gspo")
def compute_policy_loss_gspo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    config: Any,
    rollout_log_probs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO (Zheng et al. 2025, https://arxiv.org/abs/2507.18071): a sequence-level ratio.

    ``s_i = exp(mean_t log_r_{i,t})`` over valid tokens. Per token the ratio is
    ``sg[s_i] * pi / sg[pi]`` (value ``s_i``, gradient of ``log pi``), log clamped at 10,
    then clipped as in PPO. Always aggregated with ``seq-mean-token-mean``, whatever
    ``loss_agg_mode`` says (as in verl).
    """
    low, high = clip_range(config)
    log_ratio = log_prob - old_log_prob
    seq_lengths = torch.sum(response_mask, dim=-1).clamp(min=1)
    seq_log_ratio = torch.sum(log_ratio * response_mask, dim=-1) / seq_lengths
    log_seq_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    seq_ratio = torch.exp(torch.clamp(log_seq_ratio, max=GSPO_LOG_RATIO_MAX))

    pg_losses1 = -advantages * seq_ratio
    pg_losses2 = -advantages * torch.clamp(seq_ratio, 1 - low, 1 + high)
    pg_losses = torch.maximum(pg_losses1, pg_losses2)
    pg_loss = agg_loss(pg_losses, response_mask, "seq-mean-token-mean")

    pg_clipfrac = masked_mean(torch.gt(pg_losses2, pg_losses1).float(), response_mask)
    return pg_loss, _metrics(pg_clipfrac, masked_mean(-log_ratio, response_mask), 0.0)


@register_policy_loss("gpg")
def compute_policy_loss_gpg(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    config: Any,
    rollout_log_probs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GPG (Chu et al. 2025, https://arxiv.org/abs/2504.02546): plain policy gradient ``-A log pi``.

    No ratio and no clipping; the metrics are reported as 0.
    """
    pg_loss = agg_loss(-log_prob * advantages, response_mask, loss_agg_mode)
    return pg_loss, _metrics(0.0, 0.0, 0.0)


@register_policy_loss("clip_cov")
def compute_policy_loss_clip_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    config: Any,
    rollout_log_probs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clip-Cov (Cui et al. 2025, https://arxiv.org/abs/2505.22617): PPO clip, plus detaching a few
    high-covariance tokens to keep entropy from collapsing.

    ``cov = (A - mean A) * (log pi - mean log pi)`` over valid tokens. Among valid tokens
    not already clipped by PPO with ``clip_cov_lb < cov < clip_cov_ub``, a random
    ``max(1, int(clip_cov_ratio * #valid))`` get zero loss. ``pg_clipfrac`` is that fraction.
    """
    options = config.policy_loss
    if not options.clip_cov_ratio > 0:
        raise ValueError(f"actor.policy_loss.clip_cov_ratio: expected > 0, got {options.clip_cov_ratio}")
    low, high = clip_range(config)
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - low, 1 + high)

    valid = response_mask > 0
    with torch.no_grad():
        cov = (advantages - masked_mean(advantages, response_mask)) * (
            log_prob - masked_mean(log_prob, response_mask)
        )
        candidates = (
            valid & ~(pg_losses2 > pg_losses1) & (cov > options.clip_cov_lb) & (cov < options.clip_cov_ub)
        )
    candidate_idx = torch.nonzero(candidates)
    clip_num = max(int(options.clip_cov_ratio * response_mask.sum().item()), 1)
    chosen = candidate_idx[torch.randperm(len(candidate_idx))[:clip_num]]
    corr = torch.ones_like(advantages)
    corr[chosen[:, 0], chosen[:, 1]] = 0

    pg_losses = torch.maximum(pg_losses1, pg_losses2) * corr
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode)
    pg_clipfrac = masked_mean((corr == 0).float(), response_mask)
    return pg_loss, _metrics(pg_clipfrac, masked_mean(-log_ratio, response_mask), 0.0)


@register_policy_loss("kl_cov")
def compute_policy_loss_kl_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    config: Any,
    rollout_log_probs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL-Cov (Cui et al. 2025, https://arxiv.org/abs/2505.22617): unclipped ``-A r``, plus
    ``ppo_kl_coef * |log_r|`` on the ``max(1, int(kl_cov_ratio * #valid))`` valid tokens
    with the largest ``cov = (A - mean A) * (log pi - mean log pi)``.

    ``actor/ppo_kl`` reports ``mean |log_r|``; the clip fractions are 0.
    """
    options = config.policy_loss
    if not options.kl_cov_ratio > 0:
        raise ValueError(f"actor.policy_loss.kl_cov_ratio: expected > 0, got {options.kl_cov_ratio}")
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio)
    pg_losses = -advantages * ratio
    pg_losses_kl = pg_losses + options.ppo_kl_coef * log_ratio.abs()

    valid = response_mask > 0
    n_valid = int(valid.sum().item())
    if n_valid > 0:
        adv_v, logp_v = advantages[valid].detach(), log_prob[valid].detach()
        cov = (adv_v - adv_v.mean()) * (logp_v - logp_v.mean())
        top = torch.topk(cov, max(1, int(n_valid * options.kl_cov_ratio)), largest=True).indices
        flat_selected = torch.zeros(n_valid, dtype=torch.bool, device=cov.device)
        flat_selected[top] = True
        selected = torch.zeros_like(valid)
        selected[valid] = flat_selected
        pg_losses = torch.where(selected, pg_losses_kl, pg_losses)

    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode)
    return pg_loss, _metrics(0.0, masked_mean(log_ratio.abs(), response_mask), 0.0)


@register_policy_loss("geo_mean")
def compute_policy_loss_geo_mean(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    config: Any,
    rollout_log_probs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GMPO (Zhao et al. 2025, https://arxiv.org/abs/2507.20673): geometric mean of token ratios.

    Token log-ratios are clipped on the side that matters for ``sign(A)``:
    ``l = sign(A) * min(sign(A) log_r, sign(A) clip(log_r, -eps_low, eps_high))``; then
    ``rho_i = exp(sum_t m l / (|y_i| + 1e-8))``, ``A_i = sum_t m A / (|y_i| + 1e-8)`` and
    ``loss = mean_i(-A_i rho_i)``. ``loss_agg_mode`` is ignored (sequence mean, as in verl).
    """
    low, high = clip_range(config)
    log_ratio = log_prob - old_log_prob
    sign = torch.sign(advantages)
    log_ratio_clamped = torch.clamp(log_ratio, -low, high)
    log_ratio_min = sign * torch.min(sign * log_ratio, sign * log_ratio_clamped)

    lengths = response_mask.sum(dim=-1)
    seq_ratio = torch.exp((log_ratio_min * response_mask).sum(dim=-1) / (lengths + 1e-8))
    seq_advantage = (advantages * response_mask).sum(dim=-1) / (lengths + 1e-8)
    pg_loss = torch.mean(-seq_advantage * seq_ratio)

    clipped = torch.ne(log_ratio, log_ratio_clamped)
    pg_clipfrac = masked_mean((clipped * (advantages > 0)).float(), response_mask)
    pg_clipfrac_lower = masked_mean((clipped * (advantages < 0)).float(), response_mask)
    return pg_loss, _metrics(pg_clipfrac, masked_mean(-log_ratio, response_mask), pg_clipfrac_lower)


@register_policy_loss("cispo")
def compute_policy_loss_cispo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    config: Any,
    rollout_log_probs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO (MiniMax-M1, https://arxiv.org/abs/2506.13585): clip the importance weight, not the update.

    ``loss = -sg[clip(r, 1 - eps_low, 1 + eps_high)] * A * log pi``: every token keeps a
    gradient; ``log_r`` is clamped to [-20, 20]. ``pg_clipfrac`` = fraction with clipped weight.
    """
    low, high = clip_range(config)
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-LOG_RATIO_CLAMP, max=LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    clipped_ratio = torch.clamp(ratio, 1 - low, 1 + high)
    pg_losses = -clipped_ratio.detach() * advantages * log_prob
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode)
    pg_clipfrac = masked_mean((ratio != clipped_ratio).float(), response_mask)
    return pg_loss, _metrics(pg_clipfrac, masked_mean(-log_ratio, response_mask), 0.0)
