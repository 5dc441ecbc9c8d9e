"""Rollout correction: importance weights and rejection masks for off-policy rollouts (as verl 0.9.1).

The rollout engine samples from ``pi_rollout`` (another numerical implementation, or an older
policy); the loss is taken under ``pi_old`` (log-probs the trainer recomputes). With
``log_rho = log pi_old - log pi_rollout`` per token (Liu et al. 2025, "When Speed Kills
Stability", https://richardli.xyz/rl-collapse; TIS, https://fengyao.notion.site/off-policy-rl):

* importance weights (``rollout_is``): ``token``: ``rho_t``; ``sequence``: ``prod_t rho_t`` of
  the row, broadcast to its tokens (log clamped to [-20, 20]). A threshold ``u`` truncates them,
  ``min(rho, u)`` (TIS); ``"l_u"`` zeroes those outside ``[l, u]`` (IcePop). Optionally divided by
  their batch mean. Every policy loss multiplies its per-token loss by them.
* rejection (``rollout_rs``): tokens or whole rows whose divergence estimate exceeds a
  threshold leave ``response_mask`` (comma-separated options must all pass):
  ``token_k{1,2,3}``, ``seq_sum_k{1,2,3}``, ``seq_mean_k{1,2,3}``, ``seq_max_k{2,3}`` with
  ``k1 = -log_rho``, ``k2 = log_rho^2 / 2``, ``k3 = rho - 1 - log_rho`` (log_rho clamped to
  [-20, 20]). ``k1`` options keep ``log l <= k1 <= log u`` (``"l_u"``, or ``u`` with ``l = 1/u``);
  the others keep ``k <= u``.

Both report verl's ``rollout_corr/*`` diagnostics (weight, rejection and off-policy-gap
statistics), defined in :mod:`verl.algorithms.rollout_corr_metrics`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from verl.algorithms.rollout_corr_metrics import (
    SAFETY_BOUND,
    is_weight_metrics,
    offpolicy_metrics,
    rs_option_metrics,
    rs_summary_metrics,
    to_floats,
)
from verl.utils.torch_functional import masked_mean, masked_sum

if TYPE_CHECKING:
    from verl.protocol import DataProto

__all__ = [
    "RS_OPTIONS",
    "SAFETY_BOUND",
    "apply_rollout_correction",
    "compute_rollout_correction_and_rejection_mask",
    "offpolicy_metrics",
    "parse_is_threshold",
    "parse_rs_options",
    "parse_rs_thresholds",
    "rollout_is_weights",
    "rollout_rejection_mask",
    "truncated_is_weights",
]

NORMALIZE_EPS = 1e-8
"""Batch normalisation is skipped when the mean weight is not above this."""
RS_OPTIONS = tuple(
    [f"token_k{k}" for k in (1, 2, 3)]
    + [f"seq_{agg}_k{k}" for agg in ("sum", "mean") for k in (1, 2, 3)]
    + ["seq_max_k2", "seq_max_k3"]
)


# ----------------------------------------------------------------------------- thresholds
def parse_is_threshold(spec: float | str) -> tuple[float, float | None]:
    """``2.0`` or ``"2.0"`` -> ``(2.0, None)`` (TIS); ``"0.5_5.0"`` -> ``(5.0, 0.5)`` (IcePop)."""
    if isinstance(spec, bool) or not isinstance(spec, int | float | str):
        raise ValueError(f"rollout_is_threshold: expected a number or 'lower_upper', got {spec!r}")
    text = str(spec).strip()
    try:
        lower, upper = (float(v) for v in text.split("_", 1)) if "_" in text else (None, float(text))
    except ValueError as error:
        raise ValueError(f"rollout_is_threshold: expected a number or 'lower_upper', got {spec!r}") from error
    if upper <= 0 or (lower is not None and not 0 < lower <= upper):
        raise ValueError(f"rollout_is_threshold: expected 0 < lower <= upper, got {spec!r}")
    return upper, lower


def parse_rs_thresholds(
    options: list[str], spec: float | str | None
) -> dict[str, tuple[float | None, float]]:
    """``{option: (lower, upper)}``: one comma-separated entry per option, or one shared entry.

    ``*_k1`` options take ``"l_u"`` or ``u`` (then ``l = 1/u``); the others a single ``u``.
    """
    if spec is None:
        raise ValueError("rollout_rs_threshold: expected a threshold when rollout_rs is set, got None")
    entries = [part.strip() for part in str(spec).split(",") if part.strip()]
    if len(entries) not in (1, len(options)):
        raise ValueError(
            f"rollout_rs_threshold: expected 1 or {len(options)} entries for {options}, got {spec!r}"
        )
    entries = entries * len(options) if len(entries) == 1 else entries
    thresholds = {}
    for option, entry in zip(options, entries, strict=True):
        try:
            if option.endswith("k1"):
                lower, upper = (
                    (float(v) for v in entry.split("_", 1)) if "_" in entry else (None, float(entry))
                )
                lower = float(str(1.0 / upper)) if lower is None else lower
            elif "_" in entry:
                raise ValueError(entry)
            else:
                lower, upper = None, float(entry)
        except (ValueError, ZeroDivisionError) as error:
            raise ValueError(f"rollout_rs_threshold: bad entry {entry!r} for {option}") from error
        if upper <= 0 or (lower is not None and not 0 < lower <= upper):
            raise ValueError(f"rollout_rs_threshold: expected 0 < lower <= upper for {option}, got {entry!r}")
        thresholds[option] = (lower, upper)
    return thresholds


def parse_rs_options(rollout_rs: str) -> list[str]:
    """The distinct options of a comma-separated ``rollout_rs``, checked against :data:`RS_OPTIONS`."""
    options = list(dict.fromkeys(o.strip() for o in rollout_rs.split(",") if o.strip()))
    unknown = [o for o in options if o not in RS_OPTIONS]
    if not options or unknown:
        raise ValueError(f"rollout_rs: expected options from {list(RS_OPTIONS)}, got {rollout_rs!r}")
    return options


# ----------------------------------------------------------------------------- weights
def truncated_is_weights(
    log_ratio: torch.Tensor, response_mask: torch.Tensor, level: str = "token", threshold: float | str = 2.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weights, raw)``: the detached truncated (TIS) or masked (IcePop) importance weights and the
    ratios they come from, 0 on padding (module doc); no metrics, for the loss's hot path."""
    upper, lower = parse_is_threshold(threshold)
    if level == "token":
        log_weight = log_ratio
    elif level == "sequence":
        log_weight = masked_sum(log_ratio, response_mask, axis=-1).unsqueeze(-1)
    else:
        raise ValueError(f"rollout_is: expected token or sequence, got {level!r}")
    raw = torch.exp(torch.clamp(log_weight, min=-SAFETY_BOUND, max=SAFETY_BOUND)).expand_as(log_ratio)
    raw = (raw * response_mask).detach()
    if lower is None:
        return raw.clamp(max=upper), raw
    return torch.where((raw >= lower) & (raw <= upper), raw, torch.zeros_like(raw)), raw


def rollout_is_weights(
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    level: str = "token",
    threshold: float | str = 2.0,
    batch_normalize: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """:func:`truncated_is_weights`, optionally batch-normalised, and their ``rollout_is_*`` metrics
    (:func:`~verl.algorithms.rollout_corr_metrics.is_weight_metrics`, taken before the batch
    normalisation, plus ``rollout_is_batch_norm_factor`` with it)."""
    weights, raw = truncated_is_weights(log_ratio, response_mask, level, threshold)
    upper, lower = parse_is_threshold(threshold)
    metrics = is_weight_metrics(weights, raw, log_ratio.detach(), response_mask, level, upper, lower)
    if batch_normalize:
        mean = _weights_mean(weights, response_mask, level)
        usable = mean > NORMALIZE_EPS
        metrics["rollout_is_batch_norm_factor"] = torch.where(usable, mean, 1.0)
        weights = torch.where(usable, weights / mean, weights)
    return weights, to_floats(metrics)


def _weights_mean(weights: torch.Tensor, response_mask: torch.Tensor, level: str) -> torch.Tensor:
    """Mean weight over valid tokens (token level) or over non-empty rows (sequence level)."""
    if level == "token":
        return masked_mean(weights, response_mask)
    seq_weights = masked_mean(weights, response_mask, axis=-1)
    seq_mask = (response_mask.sum(dim=-1) > 0).to(dtype=weights.dtype)
    return (seq_weights * seq_mask).sum() / seq_mask.sum().clamp_min(NORMALIZE_EPS)


# ----------------------------------------------------------------------------- rejection
def _divergences(log_ratio: torch.Tensor) -> dict[str, torch.Tensor]:
    safe = torch.clamp(log_ratio, min=-SAFETY_BOUND, max=SAFETY_BOUND)
    return {"k1": -safe, "k2": 0.5 * safe**2, "k3": torch.exp(safe) - 1.0 - safe}


def _row_statistic(values: torch.Tensor, response_mask: torch.Tensor, how: str) -> torch.Tensor:
    if how == "sum":
        return masked_sum(values, response_mask, axis=-1)
    if how == "mean":
        return masked_mean(values, response_mask, axis=-1)
    masked = values.masked_fill(~response_mask.bool(), float("-inf"))
    row_max = masked.max(dim=-1).values
    return torch.where(row_max == float("-inf"), torch.zeros_like(row_max), row_max)


def _apply_option(
    option: str,
    bounds: tuple[float | None, float],
    divergences: dict[str, torch.Tensor],
    response_mask: torch.Tensor,
) -> tuple[torch.Tensor, dict[str, torch.Tensor | float]]:
    """One ``rollout_rs`` option: its pass mask over ``response_mask``'s shape (bool) and metrics."""
    lower, upper = bounds
    level, kind = option.rsplit("_", 1)
    token_stat, row_stat = divergences[kind], None
    if level != "token":
        row_stat = _row_statistic(token_stat, response_mask, level.removeprefix("seq_"))
        token_stat = row_stat.unsqueeze(-1).expand_as(response_mask)
    if kind == "k1":
        log_bounds = (math.log(lower), math.log(upper))
        passed = (token_stat >= log_bounds[0]) & (token_stat <= log_bounds[1])
    else:
        log_bounds = (None, upper)
        passed = token_stat <= upper
    metrics = rs_option_metrics(option, token_stat, row_stat, passed, response_mask, log_bounds)
    return passed, metrics


def rollout_rejection_mask(
    log_ratio: torch.Tensor, response_mask: torch.Tensor, rollout_rs: str, threshold: float | str | None
) -> tuple[torch.Tensor, dict[str, float]]:
    """``response_mask`` with the rejected tokens (or rows) set to 0 (module doc), and the
    ``rollout_rs_*`` metrics: per option, and of all options together."""
    options = parse_rs_options(rollout_rs)
    bounds = parse_rs_thresholds(options, threshold)
    divergences = _divergences(log_ratio.detach())
    keep = torch.ones_like(response_mask, dtype=log_ratio.dtype)
    metrics: dict[str, torch.Tensor | float] = {}
    for option in options:
        passed, option_metrics = _apply_option(option, bounds[option], divergences, response_mask)
        keep = keep * passed.to(dtype=log_ratio.dtype)
        metrics.update(option_metrics)
    metrics.update(rs_summary_metrics(keep, response_mask))
    return (response_mask * keep).to(dtype=response_mask.dtype), to_floats(metrics)


# ----------------------------------------------------------------------------- both
def compute_rollout_correction_and_rejection_mask(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is: str | None = None,
    rollout_is_threshold: float | str | None = 2.0,
    rollout_is_batch_normalize: bool = False,
    rollout_rs: str | None = None,
    rollout_rs_threshold: float | str | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, float]]:
    """``(rollout_is_weights or None, response_mask after rejection, metrics)``.

    Weights come from ``log_rho = old_log_prob - rollout_log_prob`` on the *unrejected* mask.
    Metrics are verl's, prefixed ``rollout_corr/``: the weight statistics (``rollout_is_*``, when
    ``rollout_is`` is set), the rejection statistics (``rollout_rs_*``, when ``rollout_rs`` is set)
    and the off-policy gap (:mod:`verl.algorithms.rollout_corr_metrics`).
    """
    if old_log_prob.shape != rollout_log_prob.shape or old_log_prob.shape != response_mask.shape:
        raise ValueError(
            "rollout correction: old_log_prob, rollout_log_prob and response_mask must have one shape, got "
            f"{tuple(old_log_prob.shape)}, {tuple(rollout_log_prob.shape)}, {tuple(response_mask.shape)}"
        )
    log_ratio = old_log_prob - rollout_log_prob
    metrics: dict[str, float] = {}
    weights = None
    if rollout_is is not None and rollout_is_threshold is not None:
        weights, is_metrics = rollout_is_weights(
            log_ratio, response_mask, rollout_is, rollout_is_threshold, rollout_is_batch_normalize
        )
        metrics.update(is_metrics)
    mask = response_mask.clone()
    if rollout_rs is not None:
        mask, rs_metrics = rollout_rejection_mask(log_ratio, response_mask, rollout_rs, rollout_rs_threshold)
        metrics.update(rs_metrics)
    metrics.update(offpolicy_metrics(old_log_prob, rollout_log_prob, response_mask))
    return weights, mask, {f"rollout_corr/{k}": v for k, v in metrics.items()}


def apply_rollout_correction(data: DataProto, config: Any) -> dict[str, float]:
    """Driver side (before the advantages, as verl's trainer): write ``rollout_is_weights`` and
    the rejected ``response_mask`` into ``data`` from ``old_log_probs`` and ``rollout_log_probs``.

    ``config`` is ``algorithm.rollout_correction``. In bypass mode ``old_log_probs`` are
    ``rollout_log_probs`` instead, and the weights and rejection are computed inside the actor's
    loss from the current policy (``bypass_mode`` in :mod:`verl.algorithms.bypass_loss`). Returns
    the ``rollout_corr/*`` metrics.
    """
    batch = data.batch
    if "rollout_log_probs" not in batch.keys():
        raise ValueError(
            "algorithm.rollout_correction needs the batch key 'rollout_log_probs': "
            "set actor_rollout_ref.rollout.calculate_log_probs=True"
        )
    if config.bypass_mode:
        batch["old_log_probs"] = batch["rollout_log_probs"]
        return {}
    weights, mask, metrics = compute_rollout_correction_and_rejection_mask(
        old_log_prob=batch["old_log_probs"],
        rollout_log_prob=batch["rollout_log_probs"],
        response_mask=batch["response_mask"],
        rollout_is=config.rollout_is,
        rollout_is_threshold=config.rollout_is_threshold,
        rollout_is_batch_normalize=config.rollout_is_batch_normalize,
        rollout_rs=config.rollout_rs,
        rollout_rs_threshold=config.rollout_rs_threshold,
    )
    batch["response_mask"] = mask
    if weights is not None:
        batch["rollout_is_weights"] = weights
    return metrics
