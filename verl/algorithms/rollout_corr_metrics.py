"""The ``rollout_corr/*`` diagnostics of rollout correction, under verl 0.9.1's names and definitions.

Three families (``docs/algorithms.md`` says which to watch), all from
``log_rho = log pi_old - log pi_rollout`` on the unrejected ``response_mask``:

* off-policy gap (:func:`offpolicy_metrics`): perplexities, their log difference per row, KL
  estimators and chi-squared divergences; reported whenever the correction runs.
* importance weights (:func:`is_weight_metrics`): statistics of the applied (truncated or
  IcePop-masked, not yet batch-normalised) weights; the high/low fractions read the raw ratios,
  so they count how often truncation or masking acts.
* rejection (:func:`rs_option_metrics` per ``rollout_rs`` option, :func:`rs_summary_metrics`
  for their logical AND): the divergence statistic, how many tokens and rows it rejects.

Row statistics follow verl: ``rollout_is_seq_*`` and the perplexities average over every row of the
batch (an all-padding row counts with weight 0 and log-ppl 0); ``rollout_rs_*_seq_*`` only over rows
with a valid token. Values are computed as tensors and read back in one transfer (:func:`to_floats`),
so a GPU call waits once, not once per metric.
"""

from __future__ import annotations

import torch

from verl.utils.torch_functional import masked_mean, masked_sum

SAFETY_BOUND = 20.0
"""Log-ratios are clamped to [-20, 20] before exp() (weights, divergences, chi-squared)."""
ESS_EPS = 1e-8
"""Added to the mean weight before normalising for the effective sample size (as verl)."""

Metrics = dict[str, torch.Tensor | float]
"""Metric name -> scalar tensor (or a constant float), before :func:`to_floats`."""


def to_floats(metrics: Metrics) -> dict[str, float]:
    """``{name: float}`` from scalar tensors (read back in one transfer) and plain floats."""
    names = [k for k, v in metrics.items() if isinstance(v, torch.Tensor)]
    read = torch.stack([metrics[k].detach().to(torch.float64) for k in names]).tolist() if names else []
    values = dict(zip(names, read, strict=True))
    return {k: values[k] if k in values else float(v) for k, v in metrics.items()}


def _masked_max(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return values.masked_fill(~mask.bool(), float("-inf")).max()


def _masked_min(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return values.masked_fill(~mask.bool(), float("inf")).min()


def _masked_std(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``sqrt(max(E[x^2] - E[x]^2, 0))`` over the mask; 0 when it holds at most one element."""
    var = masked_mean(values.square(), mask) - masked_mean(values, mask).square()
    return torch.where(mask.sum() > 1, var.clamp(min=0.0).sqrt(), 0.0)


def _fraction(condition: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Share of the ``rows`` (bool, one per row) where ``condition`` holds."""
    return (condition & rows).sum() / rows.sum().clamp(min=1)


def _row_summary(values: torch.Tensor, rows: torch.Tensor) -> dict[str, torch.Tensor]:
    """Mean, unbiased std (0 below two rows), max and min of ``values`` over the ``rows``."""
    count = rows.sum()
    mean = torch.where(rows, values, 0.0).sum() / count.clamp(min=1)
    var = torch.where(rows, (values - mean).square(), 0.0).sum() / (count - 1).clamp(min=1)
    return {
        "mean": mean,
        "std": torch.where(count > 1, var.sqrt(), 0.0),
        "max": torch.where(count > 0, values.masked_fill(~rows, float("-inf")).max(), 0.0),
        "min": torch.where(count > 0, values.masked_fill(~rows, float("inf")).min(), 0.0),
    }


# ----------------------------------------------------------------------------- off-policy gap
def offpolicy_metrics(
    old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor | None, response_mask: torch.Tensor
) -> dict[str, float]:
    """How far the rollout policy is from the trainer's (verl's ``compute_offpolicy_metrics``).

    Per row ``log_ppl = -mean_t log pi`` (``training_*`` for ``old_log_prob``, ``rollout_*`` for
    ``rollout_log_prob``); ``*_ppl`` and ``*_log_ppl`` are the row means of ``exp(log_ppl)`` and
    ``log_ppl``. ``log_ppl_diff`` = ``training_log_ppl - rollout_log_ppl`` per row (mean, mean of
    its absolute value, max, min) and ``ppl_ratio`` = mean of ``exp(log_ppl_diff)``. Over tokens:
    ``kl = E[log pi_rollout - log pi_old]``, ``k3_kl = E[rho - log rho - 1]``,
    ``chi2_token = E[rho^2] - 1``; over rows ``chi2_seq = E[(prod_t rho_t)^2] - 1``. Without
    ``rollout_log_prob`` only the training perplexities are reported.
    """
    training_log_ppl = -masked_mean(old_log_prob, response_mask, axis=-1)
    metrics: Metrics = {
        "training_ppl": torch.exp(training_log_ppl).mean(),
        "training_log_ppl": training_log_ppl.mean(),
    }
    if rollout_log_prob is None:
        return to_floats(metrics)
    rollout_log_ppl = -masked_mean(rollout_log_prob, response_mask, axis=-1)
    log_ppl_diff = training_log_ppl - rollout_log_ppl
    log_ratio = old_log_prob - rollout_log_prob
    rho = torch.exp(log_ratio.clamp(min=-SAFETY_BOUND, max=SAFETY_BOUND))
    log_row = masked_sum(log_ratio, response_mask, axis=-1).clamp(min=-SAFETY_BOUND, max=SAFETY_BOUND)
    metrics.update(
        rollout_ppl=torch.exp(rollout_log_ppl).mean(),
        rollout_log_ppl=rollout_log_ppl.mean(),
        log_ppl_diff=log_ppl_diff.mean(),
        log_ppl_abs_diff=log_ppl_diff.abs().mean(),
        log_ppl_diff_max=log_ppl_diff.max(),
        log_ppl_diff_min=log_ppl_diff.min(),
        ppl_ratio=torch.exp(log_ppl_diff).mean(),
        kl=masked_mean(-log_ratio, response_mask),
        k3_kl=masked_mean(torch.exp(log_ratio) - log_ratio - 1, response_mask),
        chi2_token=masked_mean(rho.square(), response_mask) - 1.0,
        chi2_seq=torch.exp(2.0 * log_row).mean() - 1.0,
    )
    return to_floats(metrics)


# ----------------------------------------------------------------------------- importance weights
def _is_extremes(
    weights: torch.Tensor,
    raw: torch.Tensor,
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    level: str,
    bounds: tuple[float, float],
) -> Metrics:
    """``rollout_is_{max,min,ratio_fraction_high,ratio_fraction_low}``.

    Sequence level: from the unclamped per-row log-ratio sums (max capped at ``exp(20)``), the
    fractions over every row. Token level: max/min of the applied weights, fractions of the raw
    ratios over valid tokens.
    """
    lower, upper = bounds
    if level == "sequence":
        log_row = masked_sum(log_ratio, response_mask, axis=-1)
        # log space, against the bounds' logs taken in float32 as verl does (same ties at a bound)
        log_lower, log_upper = torch.tensor(lower).log(), torch.tensor(upper).log()
        return {
            "rollout_is_max": torch.exp(log_row.max().clamp(max=SAFETY_BOUND)),
            "rollout_is_min": torch.exp(log_row.min()),
            "rollout_is_ratio_fraction_high": (log_row > log_upper.to(log_row.device)).float().mean(),
            "rollout_is_ratio_fraction_low": (log_row < log_lower.to(log_row.device)).float().mean(),
        }
    return {
        "rollout_is_max": _masked_max(weights, response_mask),
        "rollout_is_min": _masked_min(weights, response_mask),
        "rollout_is_ratio_fraction_high": masked_mean((raw > upper).float(), response_mask),
        "rollout_is_ratio_fraction_low": masked_mean((raw < lower).float(), response_mask),
    }


def is_weight_metrics(
    weights: torch.Tensor,
    raw: torch.Tensor,
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    level: str,
    upper: float,
    lower: float | None = None,
) -> Metrics:
    """``rollout_is_*`` statistics (tensors) of the weights before batch normalisation.

    ``weights`` are the applied ones (TIS-truncated, or IcePop-zeroed outside ``[lower, upper]``),
    ``raw`` the ratios before that (both 0 on padding), ``log_ratio`` the per-token ``log_rho``.
    The fraction thresholds are ``upper`` and ``lower`` (``1/upper`` for TIS). ``std`` and the
    effective sample size ``ess = 1 / E[(w / (E[w] + 1e-8))^2]`` (1 = uniform weights) use the
    weights clamped to ``[0, upper]``. ``seq_*`` summarise the per-row mean weights of every row;
    ``seq_fraction_*`` compare the per-row mean *raw* ratios with the bounds. IcePop adds
    ``oob_ratio``, the share of valid tokens whose raw ratio lies outside ``[lower, upper]``.
    """
    low = 1.0 / upper if lower is None else lower
    metrics: Metrics = {"rollout_is_mean": masked_mean(weights, response_mask)}
    metrics.update(_is_extremes(weights, raw, log_ratio, response_mask, level, (low, upper)))
    clamped = weights.clamp(min=0.0, max=upper)
    normalised = clamped / (masked_mean(clamped, response_mask) + ESS_EPS)
    metrics["rollout_is_std"] = _masked_std(clamped, response_mask)
    metrics["rollout_is_eff_sample_size"] = 1.0 / masked_mean(normalised.square(), response_mask)
    row_means = masked_mean(weights, response_mask, axis=-1)
    every_row = torch.ones_like(row_means, dtype=torch.bool)
    for stat, value in _row_summary(row_means, every_row).items():
        metrics[f"rollout_is_seq_{stat}"] = value
    metrics["rollout_is_seq_max_deviation"] = (row_means - 1.0).abs().max()
    raw_row_means = masked_mean(raw, response_mask, axis=-1)
    metrics["rollout_is_seq_fraction_high"] = (raw_row_means > upper).float().mean()
    metrics["rollout_is_seq_fraction_low"] = (raw_row_means < low).float().mean()
    if lower is not None:
        outside = (raw < lower) | (raw > upper)
        metrics["rollout_is_oob_ratio"] = masked_mean(outside.float(), response_mask)
    return metrics


# ----------------------------------------------------------------------------- rejection
def rs_option_metrics(
    option: str,
    token_stat: torch.Tensor,
    row_stat: torch.Tensor | None,
    kept: torch.Tensor,
    response_mask: torch.Tensor,
    bounds: tuple[float | None, float],
) -> Metrics:
    """``rollout_rs_<option>_*`` statistics (tensors) of one rejection option.

    ``token_stat`` is the divergence per token (a row statistic broadcast over its tokens for the
    ``seq_*`` options), ``row_stat`` that row statistic (None for ``token_*`` options: then the
    per-row mean of ``token_stat``), ``kept`` the option's pass mask (bool). ``bounds`` are the
    option's ``(lower, upper)`` on the statistic's scale (``log l``, ``log u`` for ``*_k1``; lower
    None otherwise, which reports ``fraction_low`` 0 and no ``seq_fraction_low``). ``max``, ``min``
    and the fractions are over valid tokens for ``token_*`` options and over non-empty rows for
    ``seq_*`` ones; ``std`` clamps the token statistic into the bounds (lower 0 if None) first.
    """
    lower, upper = bounds
    prefix = f"rollout_rs_{option}"
    rows = response_mask.sum(dim=-1) > 0
    per_row = row_stat is not None
    row_values = row_stat if per_row else masked_mean(token_stat, response_mask, axis=-1)
    summary = _row_summary(row_values, rows)
    metrics: Metrics = {f"{prefix}_mean": masked_mean(token_stat, response_mask)}
    if per_row:
        metrics[f"{prefix}_max"], metrics[f"{prefix}_min"] = summary["max"], summary["min"]
        metrics[f"{prefix}_fraction_high"] = _fraction(row_values > upper, rows)
        low = _fraction(row_values < lower, rows) if lower is not None else 0.0
    else:
        metrics[f"{prefix}_max"] = _masked_max(token_stat, response_mask)
        metrics[f"{prefix}_min"] = _masked_min(token_stat, response_mask)
        metrics[f"{prefix}_fraction_high"] = masked_mean((token_stat > upper).float(), response_mask)
        low = masked_mean((token_stat < lower).float(), response_mask) if lower is not None else 0.0
    metrics[f"{prefix}_fraction_low"] = low
    clamp_min = 0.0 if lower is None else lower
    metrics[f"{prefix}_std"] = _masked_std(token_stat.clamp(min=clamp_min, max=upper), response_mask)
    for stat, value in summary.items():
        metrics[f"{prefix}_seq_{stat}"] = value
    metrics[f"{prefix}_seq_max_deviation"] = torch.where(rows, row_values.abs(), 0.0).max()
    metrics[f"{prefix}_seq_fraction_high"] = _fraction(row_values > upper, rows)
    if lower is not None:
        metrics[f"{prefix}_seq_fraction_low"] = _fraction(row_values < lower, rows)
    valid = response_mask.bool()
    metrics[f"{prefix}_masked_fraction"] = masked_mean((~kept).float(), response_mask)
    metrics[f"{prefix}_seq_masked_fraction"] = _fraction((~kept & valid).any(dim=-1), rows)
    return metrics


def rs_summary_metrics(keep: torch.Tensor, response_mask: torch.Tensor) -> Metrics:
    """``rollout_rs_masked_fraction``: share of valid tokens any option rejects;
    ``rollout_rs_seq_masked_fraction``: share of *all* rows (empty ones too, as verl) with one."""
    valid = response_mask.bool()
    rejected = ~(keep > 0.5) & valid
    return {
        "rollout_rs_masked_fraction": masked_mean(1 - keep, response_mask),
        "rollout_rs_seq_masked_fraction": rejected.any(dim=-1).float().mean(),
    }
