"""The embedded default: a built-in arithmetic task and a tiny model, created on first use.

``python -m verl.trainer.main_ppo`` with no arguments trains on these. Both live in the
cache dir ``$VERL_CACHE_DIR`` (default ``~/.cache/verl``) and are written atomically (a
temporary dir, then a rename), so an interrupted first run leaves nothing half-written.

The model is a Qwen2-architecture transformer (about 0.8M parameters) over a character
vocabulary of the digits, ``+``, ``=`` and three special tokens. Its warm-up, a short SFT run
on the task through the SFT trainer, is :mod:`verl.builtin.warmup`;
the result is a normal Hugging Face model directory (config, safetensors, tokenizer).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from verl.config.actor import DEFAULT_MODEL_PATH
from verl.utils.cache import CACHE_DIR_EXPR, cache_dir, resolve_cache_path, write_task_once

BUILTIN_MODEL_NAME = Path(DEFAULT_MODEL_PATH).name
"""The built-in model's folder under the cache's ``models/``: the config's default model path
(``actor_rollout_ref.model.path``) names it, and this package builds it there on first use."""
BUILTIN_TRAIN_FILE = f"{CACHE_DIR_EXPR}/data/arith/train.parquet"
BUILTIN_VAL_FILE = f"{CACHE_DIR_EXPR}/data/arith/test.parquet"
BUILTIN_SFT_TRAIN_FILE = f"{CACHE_DIR_EXPR}/data/arith/sft_train.parquet"
BUILTIN_SFT_VAL_FILE = f"{CACHE_DIR_EXPR}/data/arith/sft_test.parquet"
BUILTIN_PREF_TRAIN_FILE = f"{CACHE_DIR_EXPR}/data/arith/pref_train.parquet"
BUILTIN_PREF_VAL_FILE = f"{CACHE_DIR_EXPR}/data/arith/pref_test.parquet"

CHAR_VOCAB = ["<pad>", "<eos>", "<unk>", *"0123456789", "+", "="]
# the assistant's turn ends with EOS (what SFT trains the model to emit); a prompt renders as its text
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['content'] }}"
    "{% if message['role'] == 'assistant' %}<eos>{% endif %}{% endfor %}"
)


def builtin_model_dir() -> Path:
    return resolve_cache_path(DEFAULT_MODEL_PATH)


def builtin_data_dir() -> Path:
    return cache_dir() / "data" / "arith"


def ensure_builtin_data(*paths: str) -> None:
    """Write the arithmetic task's parquet files if ``paths`` point at them and they are missing."""
    from verl.builtin.arith import write_arith_parquet

    write_task_once(
        builtin_data_dir(),
        paths,
        lambda folder: write_arith_parquet(folder, train_size=10_000, test_size=200, seed=0),
        "the built-in arithmetic task",
    )


def ensure_builtin_sft_data(*paths: str) -> None:
    """Write the arithmetic task's SFT chats if ``paths`` point at them and they are missing."""
    from verl.builtin.arith import write_arith_sft_parquet

    _write_prefixed_files(paths, "sft_", write_arith_sft_parquet, "the built-in arithmetic task's SFT chats")


def ensure_builtin_preference_data(*paths: str) -> None:
    """Write the arithmetic task's preference pairs if ``paths`` point at them and they are missing."""
    from verl.builtin.arith import write_arith_preference_parquet

    _write_prefixed_files(
        paths, "pref_", write_arith_preference_parquet, "the built-in arithmetic task's preference pairs"
    )


def _write_prefixed_files(paths: tuple[str, ...], prefix: str, write: Callable[..., Any], what: str) -> None:
    """``write(folder, train_size=10_000, test_size=200, seed=0)`` when one of the built-in files
    named ``<prefix>*`` among ``paths`` is missing."""
    write_task_once(
        builtin_data_dir(),
        tuple(p for p in paths if Path(p).expanduser().name.startswith(prefix)),
        lambda folder: write(folder, train_size=10_000, test_size=200, seed=0),
        what,
    )


def build_char_tokenizer():
    """A fast tokenizer with one token per character of :data:`CHAR_VOCAB`."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(CHAR_VOCAB)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>", padding_side="left"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_qwen2(tokenizer, seed: int = 0):
    """The embedded default's model: a 4-layer Qwen2 (about 0.8M parameters) over :data:`CHAR_VOCAB`."""
    return tiny_qwen2(
        tokenizer,
        seed,
        vocab_size=len(CHAR_VOCAB),
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )


def tiny_qwen2(tokenizer, seed: int, **shape: Any):
    """A freshly initialised Qwen2 (seeded) with tied embeddings, ``tokenizer``'s pad and EOS ids
    (EOS also as BOS) and SDPA attention; ``shape``: the rest of its ``Qwen2Config``."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
        attn_implementation="sdpa",
        **shape,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)
