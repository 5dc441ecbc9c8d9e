"""The ``data.*`` section: which parquet files to train on and how prompts become token ids.

Keys and defaults are verl's (``verl/trainer/config/data/legacy_data.yaml``). Keys that only
matter for verl's worker-process data loader are accepted so that existing launch scripts keep
working; their doc strings say they have no effect here.
"""

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

__all__ = ["CustomDatasetClassConfig", "DataConfig"]

TRUNCATION_MODES = ("error", "left", "right", "middle")


@dataclass
class CustomDatasetClassConfig(BaseConfig):
    path: str | None = None
    """File that defines a dataset class to use instead of RLHFDataset (None: the built-in one)."""
    name: str | None = None
    """Name of that class in the file; it is built as cls(data_files, tokenizer, config)."""

    def validate(self, path: str) -> None:
        check(
            self.path is None or bool(self.name), f"{path}.name", "a class name when path is set", self.name
        )


@dataclass
class DataConfig(BaseConfig):
    tokenizer: str | None = None
    """Tokenizer name or path; None uses the model's (actor_rollout_ref.model.path)."""
    use_shm: bool = False
    """Accepted for compatibility; no effect (files are read from the local filesystem)."""
    train_files: Any = "~/data/rlhf/gsm8k/train.parquet"
    """Training parquet file, or a list of files that are concatenated in order."""
    val_files: Any = "~/data/rlhf/gsm8k/test.parquet"
    """Validation parquet file, or a list of files."""
    train_max_samples: int = ranged(-1, at_least(1, also=(-1,)))
    """Use only the first N training rows (-1: all rows)."""
    val_max_samples: int = ranged(-1, at_least(1, also=(-1,)))
    """Use only the first N validation rows (-1: all rows)."""
    prompt_key: str = "prompt"
    """Column that holds the chat messages of each prompt."""
    reward_fn_key: str = "data_source"
    """Column whose value picks the reward scorer for each row."""
    max_prompt_length: int = ranged(512, POSITIVE)
    """Prompts are left-padded to this many tokens; longer ones follow data.truncation."""
    max_response_length: int = ranged(512, POSITIVE)
    """Maximum number of generated tokens per response."""
    train_batch_size: int = ranged(1024, POSITIVE)
    """Prompts per training step (before rollout.n responses are sampled for each)."""
    gen_batch_size: int | None = ranged(None, POSITIVE)
    """Prompts per generation request of the asynchronous trainer (verl's fully-async ``1``): below
    train_batch_size (and dividing it) the rollout streams units of this many prompts and a step trains
    the first ones to finish (needs rollout.mode=async; docs/async.md). Null or train_batch_size: one
    request per step batch. Elsewhere it has no effect (listed in the start-up log)."""
    val_batch_size: int | None = ranged(None, POSITIVE)
    """Prompts per validation batch; None puts the whole validation set in one batch."""
    return_raw_input_ids: bool = False
    """Accepted for compatibility; raw_prompt_ids (unpadded prompt ids) are always returned."""
    return_raw_chat: bool = False
    """Also return the chat messages of each prompt as raw_prompt (for server rollouts, tools)."""
    return_full_prompt: bool = False
    """Also return the prompt text after the chat template as full_prompts."""
    shuffle: bool = True
    """Shuffle the training set each epoch (a permutation derived from data.seed and the epoch)."""
    seed: int | None = ranged(None, NON_NEGATIVE)
    """Seed of the shuffle; None uses 1, as verl does."""
    dataloader_num_workers: int = ranged(8, NON_NEGATIVE)
    """Accepted for compatibility; no effect (the loader runs in-process so its position can be restored exactly)."""
    validation_shuffle: bool = False
    """Shuffle the validation set."""
    filter_overlong_prompts: bool = False
    """Drop prompts longer than max_prompt_length when the dataset is loaded."""
    filter_overlong_prompts_workers: int = ranged(1, NON_NEGATIVE)
    """Accepted for compatibility; no effect (lengths are computed in one batched tokenizer call)."""
    truncation: str = "error"
    """What to do with a prompt longer than max_prompt_length: error | left | right | middle."""
    image_key: str = "images"
    """The column of a row's images (a list of {"bytes": ...}, {"path": ...} or paths), one per <image>
    placeholder of its prompt; read when the model is a vision-language model (docs/vlm.md)."""
    video_key: str = "videos"
    """The column of a row's videos: a row with videos is refused (videos are not supported yet)."""
    trust_remote_code: bool = False
    """Allow a tokenizer that ships Python code."""
    return_multi_modal_inputs: bool = True
    """Accepted for compatibility; no effect (text-only datasets)."""
    custom_cls: CustomDatasetClassConfig = field(default_factory=CustomDatasetClassConfig)
    """A user dataset class that replaces RLHFDataset."""
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments for tokenizer.apply_chat_template (e.g. enable_thinking)."""
    output_path: str | None = None
    """main_generation_server: the parquet file it writes (the rows of train_files plus a responses column);
    verl's scripts add it with +data.output_path=... The trainers do not read it."""

    def validate(self, path: str) -> None:
        check_ranges(self, path)
        check_choice(self.truncation, TRUNCATION_MODES, f"{path}.truncation")
        check(bool(self.prompt_key), f"{path}.prompt_key", "a column name", self.prompt_key)
        check(bool(self.reward_fn_key), f"{path}.reward_fn_key", "a column name", self.reward_fn_key)
        check(
            _is_file_list(self.train_files),
            f"{path}.train_files",
            "a file path or a non-empty list of paths",
            self.train_files,
        )
        self.custom_cls.validate(f"{path}.custom_cls")


def _is_file_list(value: Any) -> bool:
    if isinstance(value, str):
        return bool(value)
    try:
        items = list(value)
    except TypeError:
        return False
    return bool(items) and all(isinstance(item, str) and item for item in items)
