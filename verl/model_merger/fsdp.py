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

from verl.utils.model import save_hf_files

HF_SUBDIR = "huggingface"


def merge_fsdp_checkpoint(local_dir: str, target_dir: str, dtype: str = "float32") -> str:
    """Write ``target_dir`` (config, tokenizer, ``model.safetensors``); returns its path."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    local_dir = os.path.abspath(os.path.expanduser(local_dir))
    hf_dir = os.path.join(local_dir, HF_SUBDIR)
    if not os.path.isfile(os.path.join(hf_dir, "config.json")):
        raise FileNotFoundError(
            f"{hf_dir}/config.json is missing: --local_dir must be the actor (or critic; model for SFT) folder of a "
            "checkpoint, e.g. checkpoints/<project>/<experiment>/global_step_N/actor"
        )
    if not os.path.isfile(os.path.join(local_dir, ".metadata")):
        raise FileNotFoundError(
            f"{local_dir}/.metadata is missing: no sharded model in this folder (was it saved with "
            "checkpoint.save_contents including 'model'?)"
        )
    torch_dtype = getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype):
        raise ValueError(f"--dtype must be a torch dtype name such as float32 or bfloat16, got {dtype!r}")
    config = AutoConfig.from_pretrained(hf_dir)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=local_dir)  # fills the model's tensors in place
    model.load_state_dict(state["model"])
    model.to(torch_dtype)
    save_hf_files(model, AutoTokenizer.from_pretrained(hf_dir), target_dir, model.state_dict())
    return os.path.abspath(target_dir)
