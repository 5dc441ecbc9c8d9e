"""The schema of ``python -m verl.trainer.rm_trainer`` (reward-model training on preference pairs).

The model, engine, optimizer, checkpoint and trainer sections are the SFT trainer's
(:mod:`verl.config.sft_trainer`), and so are their old spellings; only ``data`` differs: each
row is a preference pair. ``verl/trainer/config/rm_trainer.yaml`` is the embedded-default preset.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from verl.config.base import POSITIVE, BaseConfig, at_least, check, check_choice, check_ranges, ranged
from verl.config.hydra_schema import register_schema
from verl.config.megatron import MEGATRON
from verl.config.sft_trainer import SFT_INERT_KEYS, TRUNCATIONS, SFTTrainerConfig


@dataclass
class RMDataConfig(BaseConfig):
    train_files: Any = "${oc.env:VERL_CACHE_DIR,'~/.cache/verl'}/data/arith/pref_train.parquet"
    """Training parquet file(s): a path or a list; each row is a preference pair."""
    val_files: Any = None
    """Validation parquet file(s); null: no validation."""
    prompt_key: str = "prompt"
    """Column with the prompt (a string or chat messages). A file without it holds whole chats in
    chosen_key / rejected_key."""
    chosen_key: str = "chosen"
    """Column with the preferred response: a string (one assistant turn after the prompt) or chat messages."""
    rejected_key: str = "rejected"
    """Column with the other response, in the same form."""
    train_batch_size: int = ranged(256, POSITIVE)
    """Pairs per optimizer step, over all ranks."""
    micro_batch_size_per_gpu: int = ranged(4, POSITIVE)
    """Pairs per forward/backward on one rank (also the validation batch); ignored with use_dynamic_bsz."""
    micro_batch_size: int | None = ranged(None, POSITIVE)
    """Deprecated global micro batch size; converted to micro_batch_size_per_gpu = micro_batch_size // world size."""
    use_dynamic_bsz: bool = True
    """Fill micro-batches up to max_token_len_per_gpu tokens (both sides of each pair) instead of a row count."""
    max_token_len_per_gpu: int = ranged(8192, POSITIVE)
    """Token budget of one micro-batch with use_dynamic_bsz."""
    train_max_samples: int = ranged(-1, at_least(1, also=(-1,)))
    """Use only the first N training pairs (-1: all)."""
    val_max_samples: int = ranged(-1, at_least(1, also=(-1,)))
    """Use only the first N validation pairs (-1: all)."""
    max_length: int = ranged(1024, POSITIVE)
    """Longest tokenized conversation; longer ones follow truncation."""
    truncation: str = "error"
    """A conversation longer than max_length: error (names the file and row) | left (keep the end, which the
    score head reads) | right (keep the start)."""
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments of tokenizer.apply_chat_template."""
    shuffle: bool = True
    """Shuffle the training pairs every epoch (a seeded order: trainer.seed)."""

    def validate(self, path: str) -> None:
        check_ranges(self, path)
        check(
            not self.use_dynamic_bsz or self.max_token_len_per_gpu >= 2 * self.max_length,
            f"{path}.max_token_len_per_gpu",
            f"at least 2 x data.max_length ({2 * self.max_length}) with use_dynamic_bsz (a pair must fit)",
            self.max_token_len_per_gpu,
        )
        check_choice(self.truncation, TRUNCATIONS, f"{path}.truncation")
        for key in ("prompt_key", "chosen_key", "rejected_key"):
            check(bool(getattr(self, key)), f"{path}.{key}", "a column name", getattr(self, key))


@dataclass
class RMTrainerConfig(SFTTrainerConfig):
    data: RMDataConfig = field(default_factory=RMDataConfig)
    """Preference pairs, batch sizes and tokenization."""

    def validate(self) -> None:
        super().validate()
        check(
            self.engine.ulysses_sequence_parallel_size == 1,
            "engine.ulysses_sequence_parallel_size",
            "1 (the reward-model trainer runs its pairs padded, not as packed rows)",
            self.engine.ulysses_sequence_parallel_size,
        )
        check(
            self.engine.strategy != MEGATRON,
            "engine.strategy",
            "fsdp or fsdp2 (the reward-model trainer does not run the Megatron engine yet; the SFT trainer does)",
            self.engine.strategy,
        )

    def inert_keys(self) -> tuple[str, ...]:
        return (*SFT_INERT_KEYS, "model.use_remove_padding")  # pairs run padded


register_schema("rm_trainer", RMTrainerConfig)


def load_rm_config(overrides: list[str] | None = None, config_dir: str | None = None) -> RMTrainerConfig:
    """Compose the config as ``python -m verl.trainer.rm_trainer`` would (for scripts and tests)."""
    from verl.config.sft_trainer import load_sft_config

    return load_sft_config(overrides, config_dir, config_name="rm_trainer", schema=RMTrainerConfig)
