"""The embedded default: a built-in arithmetic task and a tiny model, created on first use.

``python -m verl.trainer.main_ppo`` with no arguments trains on these. Both live in the
cache dir ``$VERL_CACHE_DIR`` (default ``~/.cache/verl``) and are written atomically (a
temporary dir, then a rename), so an interrupted first run leaves nothing half-written.

The model is a Qwen2-architecture transformer (about 0.8M parameters) over a character
vocabulary of the digits, ``+``, ``=`` and three special tokens. Its warm-up, a short SFT run
on the task through the SFT trainer, lives with the trainers (:mod:`verl.trainer.builtin_model`);
the result is a normal Hugging Face model directory (config, safetensors, tokenizer).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)

CACHE_DIR_EXPR = "${oc.env:VERL_CACHE_DIR,'~/.cache/verl'}"
BUILTIN_MODEL_NAME = "tiny-qwen2-arith-v2"
"""The built-in model's folder under the cache's ``models/``. The suffix changes whenever the warm-up's
numbers do (v2: the engine's AdamW became torch's fused kernel on CPU), so a cache built by older
code is not taken for the current model."""
BUILTIN_MODEL_PATH = f"{CACHE_DIR_EXPR}/models/{BUILTIN_MODEL_NAME}"
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


def cache_dir() -> Path:
    return Path(os.environ.get("VERL_CACHE_DIR", "~/.cache/verl")).expanduser()


def builtin_model_dir() -> Path:
    return cache_dir() / "models" / BUILTIN_MODEL_NAME


def builtin_data_dir() -> Path:
    return cache_dir() / "data" / "arith"


def is_builtin_model(path: str) -> bool:
    """The embedded default's model, or the tool task's (:mod:`verl.utils.builtin_tool_task`)."""
    from verl.utils.builtin_tool_task import tool_model_dir

    resolved = Path(path).expanduser().resolve()
    return resolved in (builtin_model_dir().resolve(), tool_model_dir().resolve())


def ensure_builtin_data(*paths: str) -> None:
    """Write the arithmetic task's parquet files if ``paths`` point at them and they are missing."""
    from verl.utils.dataset.arith import write_arith_parquet

    write_task_once(
        builtin_data_dir(),
        paths,
        lambda folder: write_arith_parquet(folder, train_size=10_000, test_size=200, seed=0),
        "the built-in arithmetic task",
    )


def ensure_builtin_sft_data(*paths: str) -> None:
    """Write the arithmetic task's SFT chats if ``paths`` point at them and they are missing."""
    from verl.utils.dataset.arith import write_arith_sft_parquet

    _write_prefixed_files(paths, "sft_", write_arith_sft_parquet, "the built-in arithmetic task's SFT chats")


def ensure_builtin_preference_data(*paths: str) -> None:
    """Write the arithmetic task's preference pairs if ``paths`` point at them and they are missing."""
    from verl.utils.dataset.arith import write_arith_preference_parquet

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


def write_task_once(data_dir: Path, paths: tuple[str, ...], write: Callable[[str], None], what: str) -> None:
    """``write(folder)`` when one of ``paths`` is a missing file of ``data_dir``."""
    data_dir = data_dir.resolve()
    wanted = [Path(p).expanduser().resolve() for p in paths]
    if any(p.parent == data_dir and not p.exists() for p in wanted):
        logger.info("writing %s to %s", what, data_dir)
        write(str(data_dir))


def build_model_once(target: Path, path: str, build: Callable[[Path], None], what: str) -> None:
    """``build(folder)`` into a temporary folder, renamed to ``target`` (never half-written), when
    ``path`` is ``target`` and it holds no model yet; a model another process finished first wins."""
    if Path(path).expanduser().resolve() != target.resolve() or (target / "config.json").exists():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    logger.info("building %s in %s (one-time SFT warm-up)", what, target)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tmp-model-"))
    try:
        build(tmp)
        if target.exists():  # another process finished first
            shutil.rmtree(tmp)
            return
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


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
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(CHAR_VOCAB),
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
        attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)
