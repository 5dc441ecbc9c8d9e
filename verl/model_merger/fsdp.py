"""Merge the sharded (DCP) model of an FSDP checkpoint into one safetensors Hugging Face directory.

Every rank of the run wrote its shard of ``{"model": ..., "optimizer": ...}`` with
``torch.distributed.checkpoint``; the checkpoint's ``huggingface/`` folder holds the model
config and tokenizer (written by rank 0). DCP reads any number of shards into one process,
so this works for checkpoints from any rank count, with no process group and no GPU.
"""

from __future__ import annotations

import os

import torch
import torch.distributed.checkpoint as dcp

from verl.utils.model import is_vision_language, save_hf_files
from verl.workers.engine.lora import ADAPTER_DIR, adapter_items, is_trained

HF_SUBDIR = "huggingface"


def checkpoint_folders(local_dir: str) -> tuple[str, str]:
    """``(local_dir, its huggingface/ folder)`` as absolute paths; an error unless the latter holds a config."""
    local_dir = os.path.abspath(os.path.expanduser(local_dir))
    hf_dir = os.path.join(local_dir, HF_SUBDIR)
    if not os.path.isfile(os.path.join(hf_dir, "config.json")):
        raise FileNotFoundError(
            f"{hf_dir}/config.json is missing: --local_dir must be the actor (or critic; model for SFT) folder of a "
            "checkpoint, e.g. checkpoints/<project>/<experiment>/global_step_N/actor"
        )
    return local_dir, hf_dir


def export_dtype(dtype: str) -> torch.dtype:
    """``--dtype`` as a torch dtype; an error naming the value otherwise."""
    torch_dtype = getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype):
        raise ValueError(f"--dtype must be a torch dtype name such as float32 or bfloat16, got {dtype!r}")
    return torch_dtype


def merge_fsdp_checkpoint(local_dir: str, target_dir: str, dtype: str = "float32") -> str:
    """Write ``target_dir`` (config, tokenizer, ``model.safetensors``); returns its path."""
    from transformers import AutoConfig, AutoTokenizer

    local_dir, hf_dir = checkpoint_folders(local_dir)
    if not os.path.isfile(os.path.join(local_dir, ".metadata")):
        if os.path.isfile(os.path.join(local_dir, "megatron_rank_0.pt")):
            raise FileNotFoundError(f"{local_dir} holds a Megatron checkpoint: use --backend megatron")
        raise FileNotFoundError(
            f"{local_dir}/.metadata is missing: no sharded model in this folder (was it saved with "
            "checkpoint.save_contents including 'model'?)"
        )
    torch_dtype = export_dtype(dtype)
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    adapter_dir = os.path.join(hf_dir, ADAPTER_DIR)
    if os.path.isfile(os.path.join(adapter_dir, "adapter_config.json")):
        model, adapter = _merge_lora(local_dir, adapter_dir, AutoConfig.from_pretrained(hf_dir))
    else:
        config = AutoConfig.from_pretrained(hf_dir)
        model = _auto_class(config).from_config(config, dtype=torch.float32)
        state = {"model": model.state_dict()}
        dcp.load(state, checkpoint_id=local_dir)  # fills the model's tensors in place
        model.load_state_dict(state["model"])
        adapter = None
    model.to(torch_dtype)
    save_hf_files(model, tokenizer, target_dir, model.state_dict(), adapter, processor_from=hf_dir)
    return os.path.abspath(target_dir)


def _auto_class(config):
    """The Auto class of the checkpoint's architecture: a causal LM (actor, SFT), or a one-label
    classifier (critic: token classifier; reward model: sequence classifier)."""
    import transformers

    architectures = getattr(config, "architectures", None) or []
    for suffix in ("ForSequenceClassification", "ForTokenClassification"):
        if any(a.endswith(suffix) for a in architectures):
            return getattr(transformers, f"AutoModel{suffix}")
    if is_vision_language(config):
        return transformers.AutoModelForImageTextToText
    return transformers.AutoModelForCausalLM


def _merge_lora(local_dir: str, adapter_dir: str, exported):
    """A LoRA checkpoint holds the adapters (and a classifier's trained head) only: the base model is
    read from the adapter config's ``base_model_name_or_path`` (the run's ``model.path``) as the
    ``exported`` config's class, the adapters from the shards; returns the merged model and (peft
    config, adapter tensors) to write next to it."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig.from_pretrained(adapter_dir)
    base_path = config.base_model_name_or_path
    if not base_path or not os.path.isfile(os.path.join(os.path.expanduser(base_path), "config.json")):
        raise FileNotFoundError(
            f"{adapter_dir}/adapter_config.json names the base model {base_path!r}, which is not a model folder "
            "here; the merger needs the base weights the adapters were trained on"
        )
    auto = _auto_class(exported)
    labels = {} if auto.__name__.endswith("CausalLM") else {"num_labels": exported.num_labels}
    base = auto.from_pretrained(os.path.expanduser(base_path), dtype=torch.float32, **labels)
    model = get_peft_model(base, config)
    state = {"model": {k: v for k, v in model.state_dict().items() if is_trained(k)}}
    dcp.load(state, checkpoint_id=local_dir)
    missing = model.load_state_dict(state["model"], strict=False).unexpected_keys
    if missing:
        raise ValueError(f"{local_dir}: adapter tensors the model does not have: {missing[:3]}")
    adapter = adapter_items(state["model"].items())
    return model.merge_and_unload(), (config, adapter)
