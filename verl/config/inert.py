"""Which keys a run ignores: the tables of keys that take effect only on some devices, backends or
modes, and :func:`inert_keys`, which lists those the user set and this run ignores (the start-up
notes say so, key by key: a key never does nothing silently)."""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING

from verl.config.async_training import units_per_step
from verl.config.compat import get_key
from verl.config.distillation import distillation_inert_keys
from verl.config.fully_async import INERT_KEYS as FULLY_ASYNC_INERT_KEYS
from verl.config.genrm import JUDGE_ROLLOUT_KEYS, GenRMRolloutConfig
from verl.config.megatron import INERT_KEYS as MEGATRON_INERT_KEYS
from verl.config.megatron import strategy_inert_keys
from verl.config.verl_extras import noted_extra_keys

if TYPE_CHECKING:
    from verl.config.ppo_trainer import PPOTrainerConfig

_FSDP_SECTIONS = (
    "actor_rollout_ref.actor.fsdp_config",
    "actor_rollout_ref.ref.fsdp_config",
    "critic.model.fsdp_config",
    "reward_model.model.fsdp_config",
)
GPU_ONLY_KEYS = (  # take effect on cuda only
    "actor_rollout_ref.rollout.offload_weights",
    "actor_rollout_ref.model.use_liger",
    *(f"{section}.{key}" for section in _FSDP_SECTIONS for key in ("param_offload", "optimizer_offload")),
    *(
        f"{section}.mixed_precision.{key}"
        for section in _FSDP_SECTIONS
        for key in ("reduce_dtype", "buffer_dtype")
    ),
)
CPU_ONLY_KEYS = (
    *(f"{section}.mixed_precision.cpu_autocast" for section in _FSDP_SECTIONS),
    "actor_rollout_ref.rollout.use_dtype_on_cpu",
    # memory knobs of the eager entropy; on CUDA the fused kernel (verl.utils.fused_log_probs) keeps
    # no per-vocabulary intermediates to chunk or recompute
    "actor_rollout_ref.actor.entropy_from_logits_with_chunking",
    "actor_rollout_ref.actor.entropy_from_logits_chunk_size",
    "actor_rollout_ref.actor.entropy_checkpointing",
)


def _cpu_dtype_keys(config: PPOTrainerConfig) -> list[str]:
    """The dtype keys CPU ignores here: ``mixed_precision.param_dtype`` of the sections without
    ``cpu_autocast``, ``rollout.dtype`` without ``rollout.use_dtype_on_cpu``."""
    keys = [
        f"{section}.mixed_precision.param_dtype"
        for section in _FSDP_SECTIONS
        if not get_key(config, f"{section}.mixed_precision.cpu_autocast")
    ]
    if not config.actor_rollout_ref.rollout.use_dtype_on_cpu:
        keys.append("actor_rollout_ref.rollout.dtype")
    return keys


ENGINE_ONLY_KEYS = (  # read by vllm/sglang only
    "actor_rollout_ref.rollout.gpu_memory_utilization",
    "actor_rollout_ref.rollout.enforce_eager",
    "actor_rollout_ref.rollout.free_cache_engine",
    "actor_rollout_ref.rollout.load_format",
    "actor_rollout_ref.rollout.layered_summon",
    "actor_rollout_ref.rollout.tensor_model_parallel_size",
    "actor_rollout_ref.rollout.max_num_batched_tokens",
    "actor_rollout_ref.rollout.max_model_len",
    "actor_rollout_ref.rollout.disable_log_stats",
    "actor_rollout_ref.rollout.enable_chunked_prefill",
    "actor_rollout_ref.rollout.engine_kwargs",
    "actor_rollout_ref.rollout.enable_prefix_caching",
    "actor_rollout_ref.rollout.prompt_length",  # sizes the engine's max_model_len
)
VLLM_INERT_KEYS = (  # with rollout.name=vllm, on every device
    "actor_rollout_ref.rollout.layered_summon",  # weights go over in one in-memory pass
    "actor_rollout_ref.rollout.offload_weights",  # hf rollout only; vllm frees memory by sleep()
    "actor_rollout_ref.rollout.engine_kwargs.sglang",  # another engine's arguments
    "actor_rollout_ref.rollout.engine_kwargs.trtllm",
)
SGLANG_INERT_KEYS = (  # with rollout.name=sglang
    "actor_rollout_ref.rollout.layered_summon",  # weights go over in buckets of update_weights_bucket_megabytes
    "actor_rollout_ref.rollout.offload_weights",  # hf rollout only; sglang frees memory by sleep()
    "actor_rollout_ref.rollout.disable_log_stats",  # set engine_kwargs.sglang.log_level instead
    "actor_rollout_ref.rollout.engine_kwargs.vllm",  # another engine's arguments
    "actor_rollout_ref.rollout.engine_kwargs.trtllm",
)
SGLANG_ONLY_KEYS = ("actor_rollout_ref.rollout.update_weights_bucket_megabytes",)
VLLM_GPU_ONLY_KEYS = (  # vLLM's CPU build sizes its KV cache in bytes and has no sleep mode
    "actor_rollout_ref.rollout.gpu_memory_utilization",
    "actor_rollout_ref.rollout.free_cache_engine",
)
_FSDP_INERT = (
    "offload_policy",
    "fsdp_size",
    "forward_prefetch",
    "use_orig_params",  # an FSDP1 option: FSDP2 always trains the original parameters
)
_OPTIM_INERT = (  # verl's Megatron optimizer keys with nothing to do here (each one's doc says why)
    "weight_decay_incr_style",  # only constant, which is weight_decay itself
    "lr_wsd_decay_style",
    "lr_wsd_decay_steps",
    "use_checkpoint_opt_param_scheduler",
)
LORA_ONLY_KEYS = tuple(
    f"actor_rollout_ref.model.{key}" for key in ("lora_alpha", "target_modules", "exclude_modules")
)
ALWAYS_INERT_KEYS = (  # accepted from verl scripts; no effect on any device (a prefix covers its section)
    "data.use_shm",
    "data.dataloader_num_workers",
    "data.filter_overlong_prompts_workers",
    "data.return_raw_input_ids",
    "data.return_multi_modal_inputs",
    "actor_rollout_ref.model.enable_activation_offload",
    "actor_rollout_ref.model.use_fused_kernels",
    "actor_rollout_ref.model.use_shm",
    "actor_rollout_ref.model.torch_dtype",
    "actor_rollout_ref.actor.use_torch_compile",
    "actor_rollout_ref.actor.checkpoint.strict",  # Megatron's mbridge export check
    *(f"actor_rollout_ref.actor.fsdp_config.{k}" for k in _FSDP_INERT),
    *(f"{role}.optim.{k}" for role in ("actor_rollout_ref.actor", "critic") for k in _OPTIM_INERT),
    "actor_rollout_ref.ref.use_torch_compile",
    "actor_rollout_ref.ref.entropy_from_logits_with_chunking",  # the reference computes no entropy
    "actor_rollout_ref.ref.entropy_from_logits_chunk_size",
    "actor_rollout_ref.ref.entropy_checkpointing",
    *(f"actor_rollout_ref.ref.fsdp_config.{k}" for k in _FSDP_INERT),
    "actor_rollout_ref.rollout.multi_turn.max_turns",
    "actor_rollout_ref.rollout.multi_turn.use_inference_chat_template",
    "actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode",
    "actor_rollout_ref.rollout.agent.num_workers",
    "critic.checkpoint.strict",
    *(f"critic.model.fsdp_config.{k}" for k in _FSDP_INERT),
    # the reward model runs in its own worker (no generative engine) and verl's reward loop
    "reward_model.strategy",
    "reward_model.model.use_shm",
    "reward_model.model.use_remove_padding",
    "reward_model.model.use_fused_kernels",
    *(f"reward_model.model.fsdp_config.{k}" for k in _FSDP_INERT),
    "reward_model.use_reward_loop",
    "reward_model.reward_loop_module_path",
    "reward_model.reward_loop_class_name",
    "reward_model.launch_reward_fn_async",
    "reward_model.sandbox_fusion",
    "reward.reward_manager.module",
    "reward.reward_model.rollout",
    "reward.sandbox_fusion",
    "trainer.use_legacy_worker_impl",
    "trainer.profile_steps",
)
SCORE_HEAD_KEYS = (
    "reward_model.micro_batch_size",
    "reward_model.micro_batch_size_per_gpu",
    "reward_model.max_length",
    "reward_model.use_dynamic_bsz",
    "reward_model.forward_max_token_len_per_gpu",
    "reward_model.model.input_tokenizer",
    "reward_model.model.fsdp_config",
)  # read by the score-head worker only, not by a generative judge
JUDGE_INERT_KEYS = tuple(
    f"reward_model.rollout.{f.name}" for f in fields(GenRMRolloutConfig) if f.name not in JUDGE_ROLLOUT_KEYS
)  # engine keys a generative reward model does not read (parallelism, quantization, ...)
REWARD_MODEL_KEYS = (
    "reward_model.model",
    "reward_model.micro_batch_size",
    "reward_model.micro_batch_size_per_gpu",
    "reward_model.max_length",
    "reward_model.use_dynamic_bsz",
    "reward_model.forward_max_token_len_per_gpu",
    "reward_model.enable_resource_pool",
    "reward_model.n_gpus_per_node",
    "reward_model.nnodes",
)  # read by the reward-model worker (reward_model.enable=True)
AGENT_LOOP_KEYS = (
    "actor_rollout_ref.rollout.multi_turn",
    "actor_rollout_ref.rollout.agent",
)  # agent loops only
SERVER_ONLY_KEYS = ("actor_rollout_ref.rollout.server.timeout_s",)  # read in server mode (rollout.mode=async)


def inert_keys(config: PPOTrainerConfig, device: str, overrides: list[str]) -> list[str]:
    """Keys the user set (on the command line) that have no effect with this backend and device."""
    inert = set(ALWAYS_INERT_KEYS + MEGATRON_INERT_KEYS)
    inert.update(strategy_inert_keys(config))
    inert.update(distillation_inert_keys(config.distillation) + list(FULLY_ASYNC_INERT_KEYS))
    if device == "cpu":
        inert.update(GPU_ONLY_KEYS + tuple(_cpu_dtype_keys(config)))
    else:
        inert.update(CPU_ONLY_KEYS)
    if config.actor_rollout_ref.rollout.name == "hf":
        inert.update(ENGINE_ONLY_KEYS)
    if config.actor_rollout_ref.rollout.name == "vllm":
        inert.update(VLLM_INERT_KEYS + (VLLM_GPU_ONLY_KEYS if device == "cpu" else ()))
    if config.actor_rollout_ref.rollout.name == "sglang":
        inert.update(SGLANG_INERT_KEYS)
    else:
        inert.update(SGLANG_ONLY_KEYS)
    if config.actor_rollout_ref.rollout.mode != "async":
        inert.update(SERVER_ONLY_KEYS)
    if not config.actor_rollout_ref.rollout.uses_agent_loop:
        inert.update(AGENT_LOOP_KEYS)
    if not config.reward_model.enable:
        inert.update(REWARD_MODEL_KEYS)
    if config.uses_judge:  # a judge served by an engine: no score-head worker
        inert.update(SCORE_HEAD_KEYS + JUDGE_INERT_KEYS)
    else:
        inert.add("reward_model.rollout")
    if units_per_step(config) == 1:  # no streaming: one request per step batch
        inert.add("data.gen_batch_size")
    model = config.actor_rollout_ref.model
    if model.lora_rank == 0 and not model.lora_adapter_path:
        inert.update(LORA_ONLY_KEYS)
    given = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
    found = set(noted_extra_keys(config))
    for key in inert:
        found.update(g for g in given if g == key or g.startswith(key + "."))  # a key in an inert section
        if any(key.startswith(g + ".") for g in given):  # a whole section given at once
            found.add(key)
    return sorted(found)
