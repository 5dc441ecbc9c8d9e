"""Metrics of a PPO step, under the names verl users know (pure functions over a ``DataProto``).

* :func:`compute_data_metrics`: ``critic/score|rewards|advantages|returns|values/*``,
  ``critic/vf_explained_var``, ``response_length/*``, ``prompt_length/*``.
* :func:`compute_timing_metrics`: ``timing_s/<phase>`` and ``timing_per_token_ms/<phase>``.
* :func:`compute_throughput_metrics`: ``perf/total_num_tokens``, ``perf/time_per_step``, ``perf/throughput``.
* :func:`compute_perf_metrics`, :func:`estimate_flops`, :func:`compute_mfu`: re-exported from
  :mod:`verl.utils.perf`, where the workers import them.
* :func:`reduce_metrics`: the mean of each metric over micro-batches / ranks.

Validation metrics (``val-core/...``) live in :mod:`verl.trainer.ppo.val_metrics`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from verl.protocol import DataProto
from verl.trainer.ppo.val_metrics import flatten_validation_metrics, process_validation_metrics
from verl.utils.perf import compute_mfu, compute_perf_metrics, device_peak_flops, estimate_flops

__all__ = [
    "compute_data_metrics",
    "compute_mfu",
    "compute_perf_metrics",
    "compute_throughout_metrics",
    "compute_throughput_metrics",
    "compute_timing_metrics",
    "device_peak_flops",
    "estimate_flops",
    "flatten_validation_metrics",
    "process_validation_metrics",
    "reduce_metrics",
]

_GB = 1024**3
# phases timed per response token (generation) or per token of the whole sequence
_PER_TOKEN_PHASES = ("gen", "ref", "values", "adv", "update_critic", "update_actor")


def _stats(name: str, values: torch.Tensor) -> dict[str, float]:
    values = values.float()
    return {
        f"{name}/mean": values.mean().item(),
        f"{name}/max": values.max().item(),
        f"{name}/min": values.min().item(),
    }


def _lengths(batch: DataProto) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """Per-row prompt and response lengths from ``attention_mask``, and their padded sizes."""
    max_response_length = batch.batch["responses"].shape[-1]
    attention_mask = batch.batch["attention_mask"]
    prompt_mask = attention_mask[:, :-max_response_length]
    response_mask = attention_mask[:, -max_response_length:]
    max_prompt_length = prompt_mask.shape[-1]
    return prompt_mask.sum(-1).float(), response_mask.sum(-1).float(), max_prompt_length, max_response_length


def _length_metrics(batch: DataProto) -> dict[str, float]:
    """``response_length/*`` and ``prompt_length/*``; ``clip_ratio`` = fraction at the max length.

    Aborted rows (empty responses) are counted in ``response_length/*`` and excluded from
    ``response_length_non_aborted/*``; ``response/aborted_ratio`` is their fraction, as in verl.
    """
    prompt_length, response_length, max_prompt, max_response = _lengths(batch)
    kept = response_length[response_length > 0]
    metrics = {
        **_stats("response_length", response_length),
        "response_length/clip_ratio": (response_length == max_response).float().mean().item(),
        "response/aborted_ratio": (response_length == 0).float().mean().item(),
        **_stats("prompt_length", prompt_length),
        "prompt_length/clip_ratio": (prompt_length == max_prompt).float().mean().item(),
    }
    if kept.numel() > 0:
        metrics.update(_stats("response_length_non_aborted", kept))
        metrics["response_length_non_aborted/clip_ratio"] = (kept == max_response).float().mean().item()
    return metrics


def compute_data_metrics(batch: DataProto, use_critic: bool = True) -> dict[str, float]:
    """Statistics of the scored, advantage-annotated batch (verl's definitions).

    * ``critic/score/*``: per-sequence score = sum over tokens of ``token_level_scores``;
      ``critic/rewards/*`` the same over ``token_level_rewards`` (scores minus in-reward KL).
      Both skip aborted rows (empty responses) unless every row is aborted.
    * ``critic/advantages|returns|values/*``: over valid response tokens (``response_mask``).
    * ``critic/vf_explained_var`` = 1 - Var[returns - values] / (Var[returns] + 1e-5),
      unbiased variances over valid tokens (only with a critic).
    * ``response_length/*``, ``prompt_length/*``: see :func:`_length_metrics`.
    """
    tensors = batch.batch
    response_mask = tensors["response_mask"].bool()
    _, response_length, _, _ = _lengths(batch)
    kept = response_length > 0
    if not kept.any():
        kept = torch.ones_like(kept)
    metrics = {
        **_stats("critic/score", tensors["token_level_scores"].sum(-1)[kept]),
        **_stats("critic/rewards", tensors["token_level_rewards"].sum(-1)[kept]),
    }
    valid_returns = torch.masked_select(tensors["returns"], response_mask)
    metrics.update(_stats("critic/advantages", torch.masked_select(tensors["advantages"], response_mask)))
    metrics.update(_stats("critic/returns", valid_returns))
    if use_critic:
        valid_values = torch.masked_select(tensors["values"], response_mask)
        metrics.update(_stats("critic/values", valid_values))
        explained = 1.0 - torch.var(valid_returns - valid_values) / (torch.var(valid_returns) + 1e-5)
        metrics["critic/vf_explained_var"] = explained.item()
    metrics.update(_length_metrics(batch))
    return metrics


def compute_timing_metrics(batch: DataProto, timing_raw: Mapping[str, float]) -> dict[str, float]:
    """``timing_s/<phase>`` for every timed phase, and ``timing_per_token_ms/<phase>``.

    Per-token time divides by the response tokens for ``gen`` and by all (prompt + response)
    tokens for ``ref``, ``values``, ``adv``, ``update_critic``, ``update_actor``, as in verl.
    """
    prompt_length, response_length, _, _ = _lengths(batch)
    n_response = response_length.sum().item()
    n_all = prompt_length.sum().item() + n_response
    metrics = {f"timing_s/{name}": float(seconds) for name, seconds in timing_raw.items()}
    for name in _PER_TOKEN_PHASES:
        n_tokens = n_response if name == "gen" else n_all
        if name in timing_raw and n_tokens > 0:
            metrics[f"timing_per_token_ms/{name}"] = float(timing_raw[name]) * 1000.0 / n_tokens
    return metrics


def compute_throughput_metrics(
    batch: DataProto, timing_raw: Mapping[str, float], n_workers: int
) -> dict[str, float]:
    """Tokens of the step (prompt + response, no padding) and tokens/s per worker.

    ``perf/throughput`` = total_num_tokens / (timing_s/step x n_workers), verl's per-GPU
    throughput. Token counts come from ``meta_info["global_token_num"]`` when the trainer set
    it, else from ``attention_mask`` (the same numbers).
    """
    if "global_token_num" in batch.meta_info:
        total = int(sum(batch.meta_info["global_token_num"]))
    else:
        total = int(batch.batch["attention_mask"].sum().item())
    seconds = float(timing_raw["step"])
    return {
        "perf/total_num_tokens": total,
        "perf/time_per_step": seconds,
        "perf/throughput": total / (seconds * n_workers),
    }


compute_throughout_metrics = compute_throughput_metrics  # verl's spelling, for recipes written against verl


# ---------------------------------------------------------------------------- reduction
def reduce_metrics(metrics: Sequence[Mapping[str, Any]] | Mapping[str, Sequence[Any]]) -> dict[str, float]:
    """Mean of each metric.

    Accepts a list of per-micro-batch dicts (``[{"actor/pg_loss": 0.1}, ...]``; a key missing
    from some dicts is averaged over those that have it) or verl's dict of lists
    (``{"actor/pg_loss": [0.1, 0.3]}``).
    """
    if isinstance(metrics, Mapping):
        columns = {key: list(np.ravel(values)) for key, values in metrics.items()}
    else:
        columns = defaultdict(list)
        for row in metrics:
            for key, value in row.items():
                columns[key].extend(np.ravel(value))
    return {
        key: float(np.mean([float(v) for v in values])) for key, values in columns.items() if len(values) > 0
    }
