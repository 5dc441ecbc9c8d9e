"""``reward_model.rollout`` / ``reward.reward_model.rollout``: the inference engine of a
generative reward model (a judge).

With ``reward_model.enable=True``, ``name`` set and a ``custom_reward_function`` (verl's rule: the
function scores), ``reward_model.model.path`` is a judge served by that engine (hf | vllm |
sglang), one replica per rank of its pool, with the OpenAI-compatible HTTP front of the policy's
server mode; the custom function receives its address as ``reward_router_address``. Without a
custom function the reward model is a score head and these keys are inert. The keys in
:data:`JUDGE_ROLLOUT_KEYS` set the judge's engine and default sampling; the others are inert
(noted at start-up). Keys and defaults are verl's (0.8 ``reward_model.rollout`` and 0.9
``reward.reward_model.rollout``), except ``tensor_model_parallel_size`` (1: one engine per rank).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from verl.config.base import NON_NEGATIVE, POSITIVE, BaseConfig, at_least, between, ranged


@dataclass
class DisaggregationConfig(BaseConfig):
    enabled: bool = False
    """Separate prefill and decode replicas."""
    prefill_replicas: int = ranged(1, at_least(1))
    """Prefill replicas."""
    decode_replicas: int = ranged(1, at_least(1))
    """Decode replicas."""
    decode_tensor_model_parallel_size: int | None = ranged(None, at_least(1))
    """Tensor parallel size of the decode replicas."""
    transfer_backend: str = "nixl"
    """KV-cache transfer backend."""
    bootstrap_port: int | None = ranged(None, between(0, 65535))
    """Port of the disaggregation bootstrap server."""
    ib_device: str | None = None
    """InfiniBand device for KV transfer."""


@dataclass
class GenRMRolloutConfig(BaseConfig):
    name: str | None = None
    """Inference engine of a generative reward model: hf | vllm | sglang (null: the reward model is a
    score head, run by the reward-model worker)."""
    dtype: str = "bfloat16"
    """Engine dtype."""
    gpu_memory_utilization: float = ranged(0.5, between(0, 1, low_open=True))
    """Fraction of GPU memory for the engine's KV cache."""
    enforce_eager: bool = True
    """Disable CUDA graphs."""
    cudagraph_capture_sizes: Any = None
    """Batch sizes captured as CUDA graphs."""
    free_cache_engine: bool = True
    """Free the KV cache between calls."""
    data_parallel_size: int = ranged(1, at_least(1))
    """Data parallel size of the engine."""
    expert_parallel_size: int = ranged(1, at_least(1))
    """Expert parallel size of the engine."""
    tensor_model_parallel_size: int = ranged(1, at_least(1))
    """Tensor parallel size of the engine (only 1 for now: one engine per rank; verl's default is 2)."""
    pipeline_model_parallel_size: int = ranged(1, at_least(1))
    """Pipeline parallel size of the engine."""
    max_num_batched_tokens: int = ranged(8192, POSITIVE)
    """Token budget of one engine step."""
    max_model_len: int | None = ranged(None, POSITIVE)
    """Maximum context of the engine."""
    max_num_seqs: int = ranged(1024, POSITIVE)
    """Concurrent sequences of the engine."""
    load_format: str = "auto"
    """How the engine loads weights."""
    layered_summon: bool = False
    """Gather weights layer by layer."""
    scheduling_policy: str = "fcfs"
    """Request scheduling policy of the engine."""
    full_determinism: bool = False
    """Deterministic engine kernels."""
    seed: int = ranged(42, NON_NEGATIVE)
    """Engine sampling seed."""
    multi_stage_wake_up: bool = False
    """Wake the engine up in stages (weights, then KV cache)."""
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra engine arguments."""
    limit_images: int | None = ranged(None, NON_NEGATIVE)
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
    temperature: float = ranged(1.0, NON_NEGATIVE)
    """Sampling temperature of the judge."""
    top_k: int = ranged(-1, at_least(0, also=(-1,)))
    """Top-k of the judge."""
    top_p: float = ranged(1.0, between(0, 1, low_open=True))
    """Nucleus sampling mass of the judge."""
    do_sample: bool = True
    """Sample (False: greedy) in the judge."""
    n: int = ranged(1, at_least(1))
    """Judgements per response."""
    prompt_length: int = ranged(2048, POSITIVE)
    """Prompt length of the judge."""
    response_length: int = ranged(2048, POSITIVE)
    """Maximum judgement length."""
    quantization: str | None = None
    """Weight quantization of the engine."""
    quantization_config_file: str | None = None
    """Quantization settings file."""
    mtp: Any = None
    """Multi-token prediction settings."""
    disaggregation: DisaggregationConfig = field(default_factory=DisaggregationConfig)
    """Prefill/decode disaggregation."""


# the keys that set the judge's engine and default sampling (copied onto its rollout config); the rest are inert
JUDGE_ROLLOUT_KEYS = (
    "name",
    "dtype",
    "gpu_memory_utilization",
    "enforce_eager",
    "free_cache_engine",
    "tensor_model_parallel_size",
    "max_num_batched_tokens",
    "max_model_len",
    "max_num_seqs",
    "load_format",
    "enable_chunked_prefill",
    "enable_prefix_caching",
    "seed",
    "temperature",
    "top_k",
    "top_p",
    "do_sample",
    "prompt_length",
    "response_length",
)
