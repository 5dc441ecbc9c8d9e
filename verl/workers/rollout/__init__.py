"""Rollout backends behind one interface (:class:`verl.workers.rollout.base.Rollout`)."""

from __future__ import annotations

import os

import torch

from verl.config.rollout import RolloutConfig
from verl.utils.model import eos_token_ids, load_causal_lm
from verl.workers.engine.lora import peft_settings, uses_lora
from verl.workers.rollout.base import Rollout, WeightSyncError, engine_dtype, verify_weight_sync


def syncs_lora_adapter(config: RolloutConfig, model_config) -> bool:
    """Whether weight updates carry the LoRA adapter alone: a LoRA policy with a vLLM rollout
    (vLLM serves adapters) whose engine loads the base model itself. With a ``dummy``
    ``load_format`` the engine has no base weights, so it gets merged weights, as ``hf`` and
    ``sglang`` always do."""
    return uses_lora(model_config) and config.name == "vllm" and not config.load_format.startswith("dummy")


def build_rollout(config: RolloutConfig, model_config, tokenizer, device: torch.device, seed: int) -> Rollout:
    """The backend named by ``rollout.name`` for the model of ``model_config``; engines are imported
    lazily (vLLM is an optional dependency)."""
    pad, eos = tokenizer.pad_token_id, eos_token_ids(tokenizer, model_config.path)
    if config.name == "hf":
        from verl.workers.rollout.hf_rollout import HFRollout

        dtype = getattr(torch, engine_dtype(config, device.type))
        return HFRollout(load_causal_lm(model_config, dtype=dtype), config, pad, eos, device, seed)
    if config.name in ("vllm", "sglang"):
        if model_config.gguf_file:
            raise ValueError(
                f"actor_rollout_ref.model.gguf_file: the {config.name} rollout loads a Hugging Face model "
                "directory; convert the GGUF file once (python -m verl.utils.smollm --target_dir DIR) and "
                "pass that DIR"
            )
        path = os.path.expanduser(model_config.path)
        if config.name == "sglang":
            from verl.workers.rollout.sglang_rollout import SGLangRollout

            return SGLangRollout(path, config, pad, eos, device, seed, model_config.trust_remote_code)
        from verl.workers.rollout.vllm_rollout import VLLMRollout

        lora = peft_settings(model_config) if syncs_lora_adapter(config, model_config) else None
        return VLLMRollout(path, config, pad, eos, device, seed, model_config.trust_remote_code, lora)
    raise NotImplementedError(
        f"actor_rollout_ref.rollout.name={config.name} is not available yet; use hf, vllm or sglang"
    )


def build_server(rollout: Rollout, config: RolloutConfig, tokenizer, model_name: str):
    """Server mode (``rollout.mode=async``): the engine of ``rollout`` driven by a
    :class:`~verl.workers.rollout.server.RolloutServer` (continuous batching, weight updates
    between two steps) behind an OpenAI-compatible HTTP front on loopback."""
    from verl.workers.rollout.http_front import HTTPFront
    from verl.workers.rollout.server import RolloutServer

    if config.name == "vllm":
        from verl.workers.rollout.vllm_engine import VLLMStepEngine

        engine = VLLMStepEngine(rollout)
    elif config.name == "sglang":
        from verl.workers.rollout.sglang_engine import SGLangStepEngine

        engine = SGLangStepEngine(rollout)
    else:
        from verl.workers.rollout.hf_engine import HFStepEngine

        engine = HFStepEngine(rollout, config.max_num_seqs)
    server = RolloutServer(engine)
    return server, HTTPFront(server, tokenizer, config, model_name, config.server.timeout_s)


__all__ = ["Rollout", "WeightSyncError", "build_rollout", "build_server", "verify_weight_sync"]
