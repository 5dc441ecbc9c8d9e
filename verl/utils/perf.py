"""Memory and FLOP figures a process measures of itself (``perf/*`` metrics).

* :func:`compute_perf_metrics`: ``perf/cpu_memory_used_gb`` (+ ``perf/max_memory_*_gb`` on CUDA).
* :func:`estimate_flops` / :func:`compute_mfu`: ``perf/mfu/actor``.

Workers call these for their own numbers; :mod:`verl.trainer.ppo.metric_utils` re-exports them
under verl's import path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psutil
import torch

_GB = 1024**3


def _process_tree_rss() -> int:
    """Resident memory of this process and all its descendants, in bytes."""
    me = psutil.Process()
    total = me.memory_info().rss
    for child in me.children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.Error:  # a child that exited between listing and reading
            continue
    return total


def compute_perf_metrics() -> dict[str, float]:
    """Memory of the calling process: ``perf/cpu_memory_used_gb`` (RSS of this process tree);
    on CUDA also ``perf/max_memory_allocated_gb`` and ``perf/max_memory_reserved_gb``.

    Ray workers are not children of the driver: each worker calls this for its own numbers.
    """
    metrics = {"perf/cpu_memory_used_gb": _process_tree_rss() / _GB}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        metrics["perf/max_memory_allocated_gb"] = torch.cuda.max_memory_allocated() / _GB
        metrics["perf/max_memory_reserved_gb"] = torch.cuda.max_memory_reserved() / _GB
    return metrics


# ---------------------------------------------------------------------------- FLOPs / MFU
_DENSE_MODEL_TYPES = ("qwen2", "qwen3", "llama", "mistral")
# dense bf16 peak FLOP/s from vendor data sheets; the first name found in the device name wins
_PEAK_FLOPS = {
    "GB200": 2.5e15,
    "B200": 2.25e15,
    "MI300X": 1307.4e12,
    "H100": 989e12,
    "H200": 989e12,
    "H800": 989e12,
    "H20": 148e12,
    "A100": 312e12,
    "A800": 312e12,
    "L40S": 362e12,
    "L40": 181e12,
    "A40": 149.7e12,
    "L20": 119.5e12,
}


def estimate_flops(hf_config: Any, num_tokens_per_seq: Sequence[int], seconds: float) -> float:
    """Achieved FLOP/s of one training pass (forward + backward) over the given sequences.

    Dense decoder (Qwen2/Qwen3/Llama/Mistral, SwiGLU MLP, GQA attention), as in verl's
    FlopsCounter and Kaplan et al. 2020 (arXiv:2001.08361):
    ``6 N T + 12 sum_i(s_i^2) d_head n_heads n_layers``, where N counts the matmul weights
    (MLP 3 h i + attention h (q + k + v + o) per layer, embedding + LM head 2 V h), T is the
    total tokens and s_i the length of sequence i.
    """
    if hf_config.model_type not in _DENSE_MODEL_TYPES:
        raise ValueError(
            f"estimate_flops: model_type {hf_config.model_type!r} is not supported; "
            f"supported: {', '.join(_DENSE_MODEL_TYPES)}"
        )
    h, n_layers, n_heads = hf_config.hidden_size, hf_config.num_hidden_layers, hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None) or h // n_heads
    kv_size = hf_config.num_key_value_heads * head_dim
    per_layer = 3 * h * hf_config.intermediate_size + h * (2 * n_heads * head_dim + 2 * kv_size)
    n_params = per_layer * n_layers + 2 * hf_config.vocab_size * h
    tokens = int(sum(num_tokens_per_seq))
    attention = 12 * sum(int(s) ** 2 for s in num_tokens_per_seq) * head_dim * n_heads * n_layers
    return (6 * n_params * tokens + attention) / seconds


def device_peak_flops(device_name: str | None = None) -> float | None:
    """Dense bf16 peak FLOP/s of a CUDA device (the current one by default); None if unknown or no GPU."""
    if device_name is None:
        if not torch.cuda.is_available():
            return None
        device_name = torch.cuda.get_device_name()
    for key, flops in _PEAK_FLOPS.items():
        if key in device_name:
            return flops
    return None


def compute_mfu(
    hf_config: Any,
    num_tokens_per_seq: Sequence[int],
    seconds: float,
    n_devices: int,
    ppo_epochs: int = 1,
    device_name: str | None = None,
) -> dict[str, float]:
    """``{"perf/mfu/actor": achieved / peak}`` for an actor update over ``num_tokens_per_seq``
    (all ranks) that took ``seconds`` and ran ``ppo_epochs`` passes; empty on CPU, unknown
    devices and unsupported models.
    """
    peak = device_peak_flops(device_name)
    if peak is None or hf_config.model_type not in _DENSE_MODEL_TYPES:
        return {}
    achieved = estimate_flops(hf_config, num_tokens_per_seq, seconds) * ppo_epochs
    return {"perf/mfu/actor": achieved / (peak * n_devices)}
