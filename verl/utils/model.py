"""Loading tokenizers, policy models and value models from a Hugging Face directory."""

from __future__ import annotations

import importlib
import os
from typing import Any

import torch
from torch import nn


def _path(path: str) -> str:
    expanded = os.path.expanduser(path)
    return expanded if os.path.exists(expanded) else path  # else a hub id (needs network)


def _import_external(lib: str | None) -> None:
    if lib:
        importlib.import_module(lib)


def load_tokenizer(
    path: str, trust_remote_code: bool = False, gguf_file: str | None = None, chat_template: str | None = None
):
    """The tokenizer at ``path``; a missing pad token falls back to EOS (as verl does)."""
    from transformers import AutoTokenizer

    kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code}
    if gguf_file:
        kwargs["gguf_file"] = gguf_file
    tokenizer = AutoTokenizer.from_pretrained(_path(path), **kwargs)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if chat_template:
        tokenizer.chat_template = chat_template
    tokenizer.padding_side = "left"
    return tokenizer


def _hf_config(path: str, override: dict[str, Any], trust_remote_code: bool, gguf_file: str | None):
    from transformers import AutoConfig

    kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code}
    if gguf_file:
        kwargs["gguf_file"] = gguf_file
    config = AutoConfig.from_pretrained(_path(path), **kwargs)
    for key, value in override.items():
        setattr(config, key, value)
    return config


def load_causal_lm(model_config, dtype: torch.dtype = torch.float32) -> nn.Module:
    """The policy: ``AutoModelForCausalLM`` with ``model.override_config`` applied."""
    from transformers import AutoModelForCausalLM

    _import_external(model_config.external_lib)
    config = _hf_config(
        model_config.path,
        model_config.override_config,
        model_config.trust_remote_code,
        model_config.gguf_file,
    )
    kwargs: dict[str, Any] = {
        "config": config,
        "dtype": dtype,
        "trust_remote_code": model_config.trust_remote_code,
    }
    if model_config.gguf_file:
        kwargs["gguf_file"] = model_config.gguf_file
    return AutoModelForCausalLM.from_pretrained(_path(model_config.path), **kwargs)


def load_value_model(model_config, dtype: torch.dtype = torch.float32) -> nn.Module:
    """The critic: ``AutoModelForTokenClassification`` with one output (the value head)."""
    from transformers import AutoModelForTokenClassification

    _import_external(model_config.external_lib)
    config = _hf_config(
        model_config.path,
        model_config.override_config,
        model_config.trust_remote_code,
        model_config.gguf_file,
    )
    config.num_labels = 1
    config.classifier_dropout = 0.0
    kwargs: dict[str, Any] = {
        "config": config,
        "dtype": dtype,
        "trust_remote_code": model_config.trust_remote_code,
    }
    if model_config.gguf_file:
        kwargs["gguf_file"] = model_config.gguf_file
    return AutoModelForTokenClassification.from_pretrained(_path(model_config.path), **kwargs)


def eos_token_ids(tokenizer, model_path: str | None = None) -> list[int]:
    """Every id that ends a response: the generation config's EOS list, else the tokenizer's."""
    ids: list[int] = []
    if model_path is not None:
        try:
            from transformers import GenerationConfig

            gen = GenerationConfig.from_pretrained(_path(model_path))
            eos = gen.eos_token_id
            ids = list(eos) if isinstance(eos, list | tuple) else ([eos] if eos is not None else [])
        except (OSError, ValueError):
            ids = []
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


def save_hf_files(module: nn.Module, tokenizer, target: str, state_dict: dict | None = None) -> None:
    """``target``: the model's config, generation config and tokenizer, plus its weights as
    safetensors when ``state_dict`` (full, on CPU) is given. Written to a temporary sibling and
    renamed into place, so a reader never sees half a directory."""
    import shutil
    import tempfile

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
        if os.path.exists(target):
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
