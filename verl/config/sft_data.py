"""The ``data.*`` section of ``python -m verl.trainer.sft_trainer`` (supervised fine-tuning): which
files, how rows are read (chats or prompt/response pairs), batched and truncated; the rest of the
schema is :mod:`verl.config.sft_trainer`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from verl.config.base import (
    NON_NEGATIVE,
    POSITIVE,
    BaseConfig,
    at_least,
    check,
    check_choice,
    check_ranges,
    ranged,
)
from verl.config.data import CustomDatasetClassConfig

TRUNCATIONS = ("error", "left", "right")
PAD_MODES = ("no_padding", "right")


@dataclass
class MultiturnConfig(BaseConfig):
    enable: bool = False
    """fsdp_sft_trainer's switch to the messages column; with it the file must have one (without it, a file
    with the messages column is read as chats anyway, one with prompt/response columns as pairs)."""
    messages_key: str | None = None
    """fsdp_sft_trainer's spelling of data.messages_key (converted onto it when set)."""
    tools_key: str | None = None
    """fsdp_sft_trainer's spelling of data.tools_key (converted onto it when set)."""


@dataclass
class SFTDataConfig(BaseConfig):
    train_files: Any = "${oc.env:VERL_CACHE_DIR,'~/.cache/verl'}/data/arith/sft_train.parquet"
    """Training parquet file(s): a path or a list; each row is a chat (messages_key) or a prompt/response pair."""
    val_files: Any = None
    """Validation parquet file(s); null: no validation loss."""
    train_batch_size: int = ranged(256, POSITIVE)
    """Rows per optimizer step, over all ranks."""
    micro_batch_size_per_gpu: int = ranged(4, POSITIVE)
    """Rows per forward/backward on one rank (also the validation batch); ignored with use_dynamic_bsz."""
    micro_batch_size: int | None = ranged(None, POSITIVE)
    """Deprecated global micro batch size (fsdp_sft_trainer); converted to micro_batch_size_per_gpu =
    micro_batch_size // world size at start-up."""
    use_dynamic_bsz: bool = True
    """Fill micro-batches up to max_token_len_per_gpu tokens instead of a fixed row count."""
    max_token_len_per_gpu: int = ranged(8192, POSITIVE)
    """Token budget of one micro-batch with use_dynamic_bsz."""
    train_max_samples: int = ranged(-1, at_least(1, also=(-1,)))
    """Use only the first N training rows (-1: all)."""
    val_max_samples: int = ranged(-1, at_least(1, also=(-1,)))
    """Use only the first N validation rows (-1: all)."""
    messages_key: str = "messages"
    """Column with the chat: a list of {role, content[, tool_calls]} (or its JSON text)."""
    tools_key: str = "tools"
    """Column with the row's tool schemas (OpenAI function format; list or JSON text), passed to the chat
    template; a missing column means no tools."""
    enable_thinking_key: str = "enable_thinking"
    """Column with a per-row enable_thinking flag for the chat template (missing column: enable_thinking_default)."""
    enable_thinking_default: Any = None
    """enable_thinking passed to the chat template when the row has none (null: not passed)."""
    prompt_key: str = "prompt"
    """Pair mode: the prompt column (a string, or a list of chat messages)."""
    response_key: str = "response"
    """Pair mode: the response column (a string), trained on as one assistant turn."""
    image_key: str = "images"
    """Column with a row's images (a list of {"bytes": ...}, {"path": ...} or paths), one per <image> placeholder
    of its messages, in order; read with a vision-language model.path (docs/sft.md), refused with a text-only one."""
    video_key: str = "videos"
    """Column with a row's videos: a row with videos is refused (videos are not supported yet)."""
    multiturn: MultiturnConfig = field(default_factory=MultiturnConfig)
    """fsdp_sft_trainer's multi-turn keys."""
    max_length: int = ranged(1024, POSITIVE)
    """Longest tokenized row; longer rows follow truncation."""
    truncation: str = "error"
    """A row longer than max_length: error (names the file and row) | left (keep the end) | right (keep the start)."""
    pad_mode: str = "no_padding"
    """verl: no_padding (packed) or right. Here micro-batches are right-padded to their own longest row either
    way, so both values train identically."""
    balance_dp_token: bool = False
    """verl: not implemented there either; use trainer.balance_batch (no effect here)."""
    custom_cls: CustomDatasetClassConfig = field(default_factory=CustomDatasetClassConfig)
    """A dataset class of your own (path: a .py file, name: the class), built as cls(data_files=...,
    tokenizer=..., config=..., max_samples=...); its items are dicts with input_ids and loss_mask (int lists)."""
    use_shm: bool = False
    """verl: copy the data to /dev/shm first. No effect here (read in place)."""
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments of tokenizer.apply_chat_template."""
    num_workers: int = ranged(8, NON_NEGATIVE)
    """verl: data-loader worker processes. No effect here: rows are tokenized in the training process, which
    keeps the loader's position exact for resume."""
    ignore_input_ids_mismatch: bool = False
    """verl: accept rows whose chat template renders a prefix of the chat differently from the whole chat. Only
    False is supported: such a row is an error naming it (the assistant tokens could not be located exactly)."""
    shuffle: bool = True
    """Shuffle the training rows every epoch (a seeded order: trainer.seed)."""

    def validate(self, path: str) -> None:
        check_ranges(self, path)
        check(
            not self.use_dynamic_bsz or self.max_token_len_per_gpu >= self.max_length,
            f"{path}.max_token_len_per_gpu",
            f"at least data.max_length ({self.max_length}) with use_dynamic_bsz (a row must fit a micro-batch)",
            self.max_token_len_per_gpu,
        )
        check_choice(self.truncation, TRUNCATIONS, f"{path}.truncation")
        check_choice(self.pad_mode, PAD_MODES, f"{path}.pad_mode")
        check(
            not self.ignore_input_ids_mismatch,
            f"{path}.ignore_input_ids_mismatch",
            "False (a row whose chat prefix renders differently is an error naming it)",
            self.ignore_input_ids_mismatch,
        )
        self.custom_cls.validate(f"{path}.custom_cls")
