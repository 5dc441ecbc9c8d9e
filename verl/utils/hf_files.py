"""Writing a model's Hugging Face folder: config, generation config, tokenizer, and as asked its
weights, its LoRA adapter and a vision-language model's processor files, all or nothing."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Any

import torch
from torch import nn

PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json")
"""What a vision-language model's folder holds besides its weights, config and tokenizer."""


def save_hf_files(
    module: nn.Module,
    tokenizer,
    target: str,
    state_dict: dict | None = None,
    adapter: tuple[Any, dict[str, torch.Tensor]] | None = None,
    architecture: str | None = None,
    processor_from: str | None = None,
) -> None:
    """``target``: the model's config, generation config and tokenizer, plus its weights as
    safetensors when ``state_dict`` (full, on CPU) is given, plus ``lora_adapter/`` (peft's
    ``adapter_config.json`` and ``adapter_model.safetensors``) when ``adapter`` = (peft config,
    adapter tensors) is given; ``architecture`` replaces the class named in ``config.json`` (one
    with the same weight names), plus the image processor's files of ``processor_from`` (a
    vision-language model's folder). Written to a temporary sibling and renamed into place, so a
    reader never sees half a directory."""
    parent = os.path.dirname(os.path.abspath(target))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=parent, prefix=".hf-")
    try:
        if state_dict is not None:
            module.save_pretrained(tmp, state_dict=state_dict)
        else:
            module.config.save_pretrained(tmp)
            if getattr(module, "generation_config", None) is not None:
                module.generation_config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if processor_from:
            _copy_processor_files(processor_from, tmp)
        if architecture is not None:
            _rename_architecture(tmp, architecture)
        if adapter is not None:
            _save_adapter(*adapter, os.path.join(tmp, "lora_adapter"))
        if os.path.exists(target):
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _copy_processor_files(source_dir: str, folder: str) -> None:
    """The :data:`PROCESSOR_FILES` that ``source_dir`` has, copied into ``folder``."""
    for name in PROCESSOR_FILES:
        source = os.path.join(os.path.expanduser(source_dir), name)
        if os.path.isfile(source):
            shutil.copyfile(source, os.path.join(folder, name))


def _rename_architecture(folder: str, architecture: str) -> None:
    """``config.json`` of ``folder`` naming ``architecture`` as the model's class."""
    config_file = os.path.join(folder, "config.json")
    with open(config_file) as f:
        saved = json.load(f)
    saved["architectures"] = [architecture]
    with open(config_file, "w") as f:
        json.dump(saved, f, indent=2, sort_keys=True)


def _save_adapter(peft_config: Any, tensors: dict[str, torch.Tensor], adapter_dir: str) -> None:
    """peft's ``adapter_config.json`` and ``adapter_model.safetensors`` in ``adapter_dir``."""
    from safetensors.torch import save_file

    peft_config.save_pretrained(adapter_dir)
    save_file(
        {k: v.contiguous() for k, v in tensors.items()},
        os.path.join(adapter_dir, "adapter_model.safetensors"),
    )
