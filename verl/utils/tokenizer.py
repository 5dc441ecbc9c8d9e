"""verl's ``hf_tokenizer`` / ``hf_processor``: a Hugging Face tokenizer with a pad token, and a
multimodal processor (or None for a text-only model).

The trainer itself loads its tokenizer with :func:`verl.utils.model.load_tokenizer` (path checks,
left padding, a custom chat template); these two are the plain loaders verl's scripts call.
``transformers`` is imported inside the functions: ``verl.utils`` is imported by every scorer
process, which should not pay for it.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

__all__ = ["hf_processor", "hf_tokenizer", "set_pad_token_id"]

GEMMA2_EOS = ("<end_of_turn>", 107)
"""gemma-2-2b-it's EOS for chat: its configured EOS never ends a turn, which hurts RL."""


def set_pad_token_id(tokenizer: Any) -> None:
    """Use the EOS token as the pad token where the tokenizer has none (with a warning)."""
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token_id = tokenizer.eos_token_id
        warnings.warn(
            f"tokenizer.pad_token_id is None; set to eos_token_id {tokenizer.eos_token_id}", stacklevel=2
        )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
        warnings.warn(f"tokenizer.pad_token is None; set to eos_token {tokenizer.eos_token!r}", stacklevel=2)


def hf_tokenizer(
    name_or_path: str, correct_pad_token: bool = True, correct_gemma2: bool = True, **kwargs: Any
):
    """``AutoTokenizer.from_pretrained(name_or_path, **kwargs)``, with the pad token set to EOS where
    missing (``correct_pad_token``) and gemma-2-2b-it's EOS set to ``<end_of_turn>`` (``correct_gemma2``)."""
    from transformers import AutoTokenizer

    if correct_gemma2 and isinstance(name_or_path, str) and "gemma-2-2b-it" in name_or_path:
        warnings.warn("gemma-2-2b-it: eos_token set to <end_of_turn> (id 107)", stacklevel=2)
        kwargs["eos_token"], kwargs["eos_token_id"] = GEMMA2_EOS
    tokenizer = AutoTokenizer.from_pretrained(_expand(name_or_path), **kwargs)
    if correct_pad_token:
        set_pad_token_id(tokenizer)
    return tokenizer


def hf_processor(name_or_path: str, **kwargs: Any):
    """``AutoProcessor.from_pretrained(name_or_path, **kwargs)`` for a multimodal model; None (with a
    warning when loading failed) where the folder has no processor, i.e. a text-only model, for
    which transformers would hand back the tokenizer."""
    from transformers import AutoProcessor

    try:
        processor = AutoProcessor.from_pretrained(_expand(name_or_path), **kwargs)
    except Exception as error:  # transformers raises many kinds for a folder without a processor
        warnings.warn(f"no processor loaded from {name_or_path!r}: {error}", stacklevel=2)
        return None
    return processor if "Processor" in type(processor).__name__ else None


def _expand(name_or_path: str) -> str:
    """``~`` expanded for a local path; a hub id unchanged."""
    expanded = os.path.expanduser(name_or_path) if isinstance(name_or_path, str) else name_or_path
    return expanded if os.path.exists(expanded) else name_or_path
