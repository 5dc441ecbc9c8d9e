"""Loading tokenizers, policy models and value models from a Hugging Face directory (writing one:
:mod:`verl.utils.hf_files`).

A path that is not a usable model directory fails before ``transformers`` sees it, with a message
that names the path: a local path that does not exist, a directory without ``config.json`` or
tokenizer files, a truncated safetensors file (naming the file and, inside a checkpoint, the step
to resume from instead). A name like ``Qwen/Qwen2.5-0.5B-Instruct`` that is not a local directory
is passed on as a hub id.
"""

from __future__ import annotations

import importlib
import os
import re
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from verl.utils.checkpoint_io import find_unreadable_safetensors, read_error
from verl.utils.errors import UserInputError
from verl.utils.hf_files import save_hf_files as save_hf_files  # its old home
from verl.utils.weightless import real_head, weightless

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")  # "name" or "org/name"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "spiece.model")


class ModelPathError(UserInputError, FileNotFoundError):
    """A model or tokenizer path is not a usable Hugging Face directory; the message says why."""

    kind = "model"


def _path(path: str, need: str = "model", key: str = "actor_rollout_ref.model.path") -> str:
    """The local directory for ``path``, checked to hold what ``need`` asks (``model``: config.json;
    ``tokenizer``: tokenizer files; ``dir``: anything, e.g. a GGUF file), or ``path`` itself when
    it can only be a hub id."""
    expanded = os.path.expanduser(path)
    if not os.path.exists(expanded):
        if HUB_ID.match(path) and not path.startswith("."):
            return path  # a hub id (needs network or the local hub cache)
        raise ModelPathError(
            f"{key}={path!r}: the directory {expanded} does not exist (expected a Hugging Face model "
            "directory, or a hub id such as Qwen/Qwen2.5-0.5B-Instruct)"
        )
    if not os.path.isdir(expanded):
        raise ModelPathError(f"{key}={path!r}: {expanded} is a file; expected a Hugging Face model directory")
    files = set(os.listdir(expanded))
    if need == "model" and "config.json" not in files:
        raise ModelPathError(
            f"{key}={path!r}: {expanded} has no config.json; expected a Hugging Face model directory "
            f"(written by save_pretrained), found {sorted(files)[:10] or 'an empty directory'}"
        )
    if need == "tokenizer" and not files & set(TOKENIZER_FILES):
        raise ModelPathError(
            f"{key}={path!r}: {expanded} has no tokenizer files (one of {', '.join(TOKENIZER_FILES)}); "
            f"found {sorted(files)[:10] or 'an empty directory'}"
        )
    return expanded


def check_model_dir(path: str, key: str) -> str:
    """``path`` checked as the workers will load it, before any starts: the local Hugging Face model
    directory, or ``path`` itself when it can only be a hub id; a :class:`ModelPathError` naming
    ``key`` (the config key that gave it) otherwise."""
    return _path(path, "model", key)


def vocab_size(path: str, key: str, trust_remote_code: bool = False) -> int:
    """The rows of the embedding of the model at ``path`` (its text model's, for a vision-language
    model), read from its ``config.json``."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(_path(path, "model", key), trust_remote_code=trust_remote_code)
    return int(config.get_text_config().vocab_size)


def _from_pretrained(load: Any, path: str, key: str, override: dict[str, Any], **kwargs: Any) -> nn.Module:
    """``load(path, **kwargs)``; a truncated safetensors file is reported by name (and step), and an
    attention implementation transformers refuses by the ``override_config`` key that asked for it
    (``key``: the model's ``...path`` key)."""
    try:
        return load(path, **kwargs)
    except Exception as error:
        attention = override.get("attn_implementation")
        about_attention = any(word in str(error).lower() for word in ("attn", "attention"))
        if attention is not None and isinstance(error, (ImportError, ValueError)) and about_attention:
            setting = f"{key.removesuffix('.path')}.override_config.attn_implementation={attention!r}"
            kind = ImportError if isinstance(error, ImportError) else ValueError
            raise kind(f"{setting}: {error}") from error
        broken = find_unreadable_safetensors(path) if os.path.isdir(path) else None
        if broken is None:
            raise
        raise read_error(broken, error) from error


_EXTERNAL_IMPORTED: set[str] = set()


def import_external_lib(lib: str | None) -> None:
    """Import ``model.external_lib`` (a module that registers architectures, losses or backends)."""
    if lib:
        importlib.import_module(lib)
        _EXTERNAL_IMPORTED.add(lib)


def external_code_loaded() -> bool:
    """Whether this process imported code from outside verl for a model (``model.external_lib``, or
    ``trust_remote_code`` modules): such code may have patched anything, so the process is not
    handed to another run (see ``VERL_REUSE_WORKER_PROCESSES``)."""
    import sys

    return bool(_EXTERNAL_IMPORTED) or "transformers_modules" in sys.modules


def load_tokenizer(
    path: str,
    trust_remote_code: bool = False,
    gguf_file: str | None = None,
    chat_template: str | None = None,
    key: str = "actor_rollout_ref.model.path",
):
    """The tokenizer at ``path`` (``key`` names the config key it came from, for errors); a missing
    pad token falls back to EOS (as verl does)."""
    from transformers import AutoTokenizer

    kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code}
    if gguf_file:
        kwargs["gguf_file"] = gguf_file
    tokenizer = AutoTokenizer.from_pretrained(_path(path, "dir" if gguf_file else "tokenizer", key), **kwargs)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if chat_template:
        tokenizer.chat_template = chat_template
    tokenizer.padding_side = "left"
    return tokenizer


@dataclass(frozen=True)
class TokenizerSource:
    """Where the policy's tokenizer is loaded from, resolved once by the driver and handed to the
    workers, so that both tokenize with the same vocabulary and the same pad and EOS ids."""

    path: str
    trust_remote_code: bool = False
    gguf_file: str | None = None
    chat_template: str | None = None
    key: str = "actor_rollout_ref.model.path"
    """The config key ``path`` came from (named in errors)."""


def resolve_tokenizer_source(
    model_config,
    data_tokenizer: str | None = None,
    data_trust_remote_code: bool = False,
    section: str = "actor_rollout_ref.model",
) -> TokenizerSource:
    """``data.tokenizer``, else ``model.tokenizer_path``, else ``model.path``; remote code is
    allowed when ``model.trust_remote_code`` or ``data.trust_remote_code`` allows it. The model's
    ``gguf_file`` applies unless ``data.tokenizer`` names a tokenizer of its own."""
    if data_tokenizer:
        path, key, gguf_file = data_tokenizer, "data.tokenizer", None
    elif model_config.tokenizer_path:
        path, key = model_config.tokenizer_path, f"{section}.tokenizer_path"
        gguf_file = model_config.gguf_file
    else:
        path, key, gguf_file = model_config.path, f"{section}.path", model_config.gguf_file
    return TokenizerSource(
        path=path,
        trust_remote_code=model_config.trust_remote_code or data_trust_remote_code,
        gguf_file=gguf_file,
        chat_template=model_config.custom_chat_template,
        key=key,
    )


def load_tokenizer_from(source: TokenizerSource):
    """:func:`load_tokenizer` with the settings of ``source``."""
    return load_tokenizer(
        source.path, source.trust_remote_code, source.gguf_file, source.chat_template, key=source.key
    )


def _hf_config(
    path: str,
    override: dict[str, Any],
    trust_remote_code: bool,
    gguf_file: str | None,
    key: str,
    attention: str | None = None,
):
    """The model's HF config with ``override_config`` applied. ``attn_implementation`` (there, or
    else ``attention``) goes where transformers reads it: the config's private field, since a
    plain attribute of that name is ignored."""
    from transformers import AutoConfig

    kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code}
    if gguf_file:
        kwargs["gguf_file"] = gguf_file
    config = AutoConfig.from_pretrained(_path(path, "dir" if gguf_file else "model", key), **kwargs)
    for name, value in override.items():
        if name != "attn_implementation":
            setattr(config, name, value)
    attention = override.get("attn_implementation", attention)
    if attention is not None:
        config._attn_implementation = attention
    return config


def load_hf_config(model_config, section: str = "actor_rollout_ref.model"):
    """The model's HF config (``override_config`` applied) without its weights: what a check of the
    parallel layout reads before anything is built (``section``: named in errors)."""
    import_external_lib(model_config.external_lib)
    return _hf_config(
        model_config.path,
        model_config.override_config,
        model_config.trust_remote_code,
        model_config.gguf_file,
        f"{section}.path",
    )


def load_causal_lm(
    model_config,
    dtype: torch.dtype = torch.float32,
    section: str = "actor_rollout_ref.model",
    attention: str | None = None,
    weights: bool = True,
) -> nn.Module:
    """The policy: ``AutoModelForCausalLM`` with ``model.override_config`` applied (``section``: the
    config section ``model_config`` came from, named in errors; ``attention``: the attention
    implementation unless ``override_config.attn_implementation`` names one, None for
    transformers' default). ``weights=False``: its weights on the meta device, none read
    (:mod:`verl.utils.weightless`)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    import_external_lib(model_config.external_lib)
    key = f"{section}.path"
    config = _hf_config(
        model_config.path,
        model_config.override_config,
        model_config.trust_remote_code,
        model_config.gguf_file,
        key,
        attention,
    )
    kwargs: dict[str, Any] = {
        "config": config,
        "dtype": dtype,
        "trust_remote_code": model_config.trust_remote_code,
    }
    if model_config.gguf_file:
        kwargs["gguf_file"] = model_config.gguf_file
    path = _path(model_config.path, "dir", key)
    auto = AutoModelForImageTextToText if is_vision_language(config) else AutoModelForCausalLM
    if not weights:
        return weightless(auto, config, dtype, model_config.trust_remote_code)
    return _from_pretrained(auto.from_pretrained, path, key, model_config.override_config, **kwargs)


def is_vision_language(config) -> bool:
    """Whether the HF ``config`` is of a vision-language model (images go into its forward)."""
    return (
        getattr(config, "vision_config", None) is not None
        and getattr(config, "image_token_id", None) is not None
    )


def apply_liger(module: nn.Module, key: str) -> nn.Module:
    """``use_liger``: liger-kernel's Triton kernels (RMSNorm, SwiGLU, RoPE) in place of the model's
    own, as verl applies them. The forward stays the model's (no fused loss: the policy's log-probs
    come from the LM head's outputs). GPU only: the kernels are Triton's."""
    try:
        from liger_kernel.transformers import _apply_liger_kernel_to_instance
    except ImportError as error:
        raise ImportError(
            f"{key}=True needs the liger-kernel package (pip install liger-kernel), which is not "
            f"installed: {error}"
        ) from error
    _apply_liger_kernel_to_instance(model=module, fused_linear_cross_entropy=False)
    return module


def load_value_model(
    model_config, dtype: torch.dtype = torch.float32, attention: str | None = None, weights: bool = True
) -> nn.Module:
    """The critic: ``AutoModelForTokenClassification`` with one output (the value head), or for a
    vision-language model its trunk with that head (:mod:`verl.utils.vision_classifier`); ``attention``
    as in :func:`load_causal_lm`. ``weights=False``: the trunk on the meta device, none of it read,
    the head real (:func:`verl.utils.weightless.real_head`)."""
    return _load_token_classifier(
        model_config, "critic.model.path", dtype, attention=attention, weights=weights
    )


def load_reward_model(
    model_config,
    dtype: torch.dtype = torch.float32,
    key: str = "reward_model.model.path",
    require_trained_head: bool = True,
) -> nn.Module:
    """A reward model as a one-output token classifier (its score at every position; the reward is
    the score at the last token). A sequence-classification checkpoint loads into the same head
    (a ``score`` layer without bias); so does a causal LM, with a fresh head, when
    ``require_trained_head`` is False (reward-model training). Otherwise a checkpoint without a
    trained head is an error: a freshly drawn one would score at random."""
    model, info = _load_token_classifier(model_config, key, dtype, head_bias_from_checkpoint=True)
    untrained = [name for name in info["missing_keys"] if not name.startswith(model.base_model_prefix + ".")]
    if untrained and require_trained_head:
        raise ModelPathError(
            f"{key}={model_config.path!r}: the checkpoint has no trained score head (missing "
            f"{', '.join(sorted(untrained))}); expected a sequence- or token-classification model with one label "
            "(e.g. one trained with python -m verl.trainer.rm_trainer); for a generative judge set "
            "reward_model.rollout.name and a custom_reward_function that asks it"
        )
    return model


def _load_token_classifier(
    model_config,
    key: str,
    dtype: torch.dtype,
    head_bias_from_checkpoint: bool = False,
    attention: str | None = None,
    weights: bool = True,
) -> Any:
    """``AutoModelForTokenClassification`` with one label and no dropout; with
    ``head_bias_from_checkpoint`` also the loading info, and a head with a bias only when the
    checkpoint is a token classifier (sequence classifiers have none, nor does a fresh head)."""
    from verl.utils.vision_classifier import token_classifier_class

    import_external_lib(model_config.external_lib)
    gguf_file = getattr(model_config, "gguf_file", None)  # the reward model's section has none
    config = _hf_config(
        model_config.path,
        model_config.override_config,
        model_config.trust_remote_code,
        gguf_file,
        key,
        attention,
    )
    if head_bias_from_checkpoint:
        architectures = getattr(config, "architectures", None) or []
        classifier = any(
            a.endswith(("ForSequenceClassification", "ForTokenClassification")) for a in architectures
        )
        if classifier and config.num_labels != 1:
            raise ModelPathError(
                f"{key}={model_config.path!r}: the model has {config.num_labels} labels; a reward model has one "
                "(its score)"
            )
        config.token_classification_bias = any(a.endswith("ForTokenClassification") for a in architectures)
    config.num_labels = 1
    config.classifier_dropout = 0.0
    kwargs: dict[str, Any] = {
        "config": config,
        "dtype": dtype,
        "trust_remote_code": model_config.trust_remote_code,
    }
    if gguf_file:
        kwargs["gguf_file"] = gguf_file
    if head_bias_from_checkpoint:
        kwargs["output_loading_info"] = True
    path = _path(model_config.path, "dir", key)
    if not weights:
        return real_head(
            weightless(token_classifier_class(config), config, dtype, model_config.trust_remote_code), path
        )
    load = token_classifier_class(config).from_pretrained  # a vision-language trunk too (its images)
    return _from_pretrained(load, path, key, model_config.override_config, **kwargs)


def eos_token_ids(tokenizer, model_path: str | None = None) -> list[int]:
    """Every id that ends a response: the generation config's EOS list, else the tokenizer's."""
    ids: list[int] = []
    if model_path is not None:
        try:
            from transformers import GenerationConfig

            gen = GenerationConfig.from_pretrained(_path(model_path, "dir"))
            eos = gen.eos_token_id
            ids = list(eos) if isinstance(eos, list | tuple) else ([eos] if eos is not None else [])
        except (OSError, ValueError):
            ids = []
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids
