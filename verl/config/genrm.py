"""``reward_model.rollout`` / ``reward.reward_model.rollout``: verl's inference engine of a
generative reward model.

Accepted so that verl scripts run unchanged; a reward-model worker is not implemented yet
(``reward_model.enable=True`` is refused), so every key here is listed as inert at start-up.
Keys and defaults are verl's (0.8 ``reward_model.rollout`` and 0.9 ``reward.reward_model.rollout``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class DisaggregationConfig:
    enabled: bool = False
    """Separate prefill and decode replicas."""
    prefill_replicas: int = 1
    """Prefill replicas."""
    decode_replicas: int = 1
    """Decode replicas."""
    decode_tensor_model_parallel_size: int | None = None
    """Tensor parallel size of the decode replicas."""
    transfer_backend: str = "nixl"
    """KV-cache transfer backend."""
    bootstrap_port: int | None = None
    """Port of the disaggregation bootstrap server."""
    ib_device: str | None = None
    """InfiniBand device for KV transfer."""


@dataclass
class GenRMRolloutConfig:
    name: str | None = None
    """Inference engine of the reward model: vllm | sglang."""
    dtype: str = "bfloat16"
    """Engine dtype."""
    gpu_memory_utilization: float = 0.5
    """Fraction of GPU memory for the engine's KV cache."""
    enforce_eager: bool = True
    """Disable CUDA graphs."""
    cudagraph_capture_sizes: Any = None
    """Batch sizes captured as CUDA graphs."""
    free_cache_engine: bool = True
    """Free the KV cache between calls."""
    data_parallel_size: int = 1
    """Data parallel size of the engine."""
    expert_parallel_size: int = 1
    """Expert parallel size of the engine."""
    tensor_model_parallel_size: int = 2
    """Tensor parallel size of the engine."""
    pipeline_model_parallel_size: int = 1
    """Pipeline parallel size of the engine."""
    max_num_batched_tokens: int = 8192
    """Token budget of one engine step."""
    max_model_len: int | None = None
    """Maximum context of the engine."""
    max_num_seqs: int = 1024
    """Concurrent sequences of the engine."""
    load_format: str = "auto"
    """How the engine loads weights."""
    layered_summon: bool = False
    """Gather weights layer by layer."""
    scheduling_policy: str = "fcfs"
    """Request scheduling policy of the engine."""
    full_determinism: bool = False
    """Deterministic engine kernels."""
    seed: int = 42
    """Engine sampling seed."""
    multi_stage_wake_up: bool = False
    """Wake the engine up in stages (weights, then KV cache)."""
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra engine arguments."""
    limit_images: int | None = None
    """Images per prompt (multi-modal reward models)."""
    enable_chunked_prefill: bool = True
    """Chunked prefill."""
    enable_prefix_caching: bool = True
    """Prefix caching."""
    disable_log_stats: bool = True
    """Silence the engine's statistics."""
    skip_tokenizer_init: bool = False
    """Start the engine without a tokenizer."""
    ignore_eos: bool = False
    """Keep generating after EOS."""
    temperature: float = 1.0
    """Sampling temperature of the judge."""
    top_k: int = -1
    """Top-k of the judge."""
    top_p: float = 1.0
    """Nucleus sampling mass of the judge."""
    do_sample: bool = True
    """Sample (False: greedy) in the judge."""
    n: int = 1
    """Judgements per response."""
    prompt_length: int = 2048
    """Prompt length of the judge."""
    response_length: int = 2048
    """Maximum judgement length."""
    quantization: str | None = None
    """Weight quantization of the engine."""
    quantization_config_file: str | None = None
    """Quantization settings file."""
    mtp: Any = None
    """Multi-token prediction settings."""
    disaggregation: DisaggregationConfig = field(default_factory=DisaggregationConfig)
    """Prefill/decode disaggregation."""
