"""``RLHFDataset``: prompts from parquet files, rendered with the chat template and left-padded.

Loading checks everything it can before training starts: each file exists and is parquet, has
rows and the schema's columns (:mod:`verl.utils.dataset.schema`), every row's prompt is a list of
chat messages and has a ground truth; for a vision-language model, a file whose prompts hold
``<image>`` has the ``data.image_key`` column and each row one image per placeholder. With ``data.truncation=error`` (or
``data.filter_overlong_prompts``) every prompt is also measured, so an overlong prompt fails at
load time (or is dropped) rather than at step 1000 (the counts are remembered in the process for
the same files and tokenizer). Errors name the file, the row and the column.

``dataset[i]`` returns ``input_ids``, ``attention_mask``, ``position_ids`` (tensors of length
``data.max_prompt_length``, left-padded with the tokenizer's pad id; positions are
``cumsum(mask) - 1`` clipped at 0) plus the row's other columns (``data_source``,
``reward_model``, ``extra_info``, ``ability``, ...), ``raw_prompt_ids`` (unpadded ids), ``index``
and, when asked for, ``raw_prompt`` (the messages) and ``full_prompts`` (the rendered text).
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf.errors import OmegaConfBaseException

from verl.config.data import DataConfig
from verl.utils.config import omega_conf_to_dataclass
from verl.utils.dataset.schema import DatasetError, validate_columns, validate_row, where
from verl.utils.dataset.vision import check_image_rows, check_media, image_messages

__all__ = ["RLHFDataset", "as_data_config", "collate_fn", "create_rl_dataset", "truncate_ids"]

logger = logging.getLogger(__name__)


_PROMPT_LENGTHS: dict[tuple, list[int]] = {}  # see RLHFDataset._prompt_lengths


def _tokenizer_fingerprint(tokenizer: Any) -> tuple | None:
    """What a prompt's token count depends on in ``tokenizer``: its class, its whole fast-tokenizer
    definition (hashed) and its chat template; None for a tokenizer without a fast backend."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    digest = hashlib.sha256(backend.to_str().encode()).hexdigest()
    return (type(tokenizer).__name__, digest, getattr(tokenizer, "chat_template", None))


def _file_list(data_files: Any) -> list[str]:
    files = [data_files] if isinstance(data_files, (str, os.PathLike)) else list(data_files)
    if not files:
        raise DatasetError("no data files given (data.train_files / data.val_files is empty)")
    return [os.path.expanduser(os.fspath(f)) for f in files]


def _read_parquet(file: str) -> Any:  # a pyarrow.Table
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(file)
    if path.is_dir():
        inside = sorted(p.name for p in path.glob("*.parquet"))
        hint = f"; it holds {', '.join(inside[:5])}: pass one of them (or a list)" if inside else ""
        raise DatasetError(
            f"{file}: is a directory; data.train_files / data.val_files expect a parquet file or a list "
            f"of parquet files{hint}"
        )
    if not path.is_file():
        raise DatasetError(f"{file}: no such file")
    if path.stat().st_size == 0:
        raise DatasetError(f"{file}: the file is empty (0 bytes); expected parquet")
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as err:
        raise DatasetError(f"{file}: not a readable parquet file ({err})") from err
    if table.num_rows == 0:
        raise DatasetError(f"{file}: the file has no rows")
    return table


def truncate_ids(ids: list[int], max_length: int, mode: str, location: str) -> list[int]:
    """Cut ``ids`` to ``max_length``: ``left`` keeps the end, ``right`` the start, ``middle`` both
    ends (``max_length // 2`` from the start); ``error`` raises ``DatasetError``."""
    if len(ids) <= max_length:
        return ids
    if mode == "left":
        return ids[-max_length:]
    if mode == "right":
        return ids[:max_length]
    if mode == "middle":
        head = max_length // 2
        return ids[:head] + ids[len(ids) - (max_length - head) :]
    raise DatasetError(
        f"{location}: the prompt is {len(ids)} tokens, longer than data.max_prompt_length={max_length}; "
        "raise it, set data.filter_overlong_prompts=True, or set data.truncation to left, right or middle"
    )


def as_data_config(config: Any) -> DataConfig:
    """``config`` as a :class:`DataConfig`: verl passes its ``data`` section as an OmegaConf
    ``DictConfig`` (or a dict); missing keys take the schema's defaults, an unknown key is an error."""
    if isinstance(config, DataConfig):
        return config
    if config is None:
        return DataConfig()
    if not isinstance(config, Mapping) and not type(config).__module__.startswith("omegaconf"):
        raise TypeError(
            f"RLHFDataset config: expected a DataConfig, a dict or a DictConfig, got {type(config).__name__}"
        )
    try:
        typed = omega_conf_to_dataclass(config, DataConfig)
    except OmegaConfBaseException as err:
        raise DatasetError(f"RLHFDataset config: {err}".splitlines()[0]) from err
    typed.validate("data")
    return typed


class RLHFDataset(torch.utils.data.Dataset):
    """Prompt rows of one or more parquet files (concatenated in order).

    verl's constructor: ``RLHFDataset(data_files, tokenizer, config, processor=None)``, where
    ``config`` is the ``data`` section (a :class:`DataConfig`, or a dict / DictConfig of its keys)."""

    def __init__(
        self,
        data_files: str | Sequence[str],
        tokenizer: Any,
        config: DataConfig | Mapping[str, Any],
        processor: Any = None,
        max_samples: int = -1,
    ) -> None:
        self.processor = processor  # a VisionProcessor for a vision-language model, else None
        self.files = _file_list(data_files)
        self.tokenizer = tokenizer
        self.config = config = as_data_config(config)
        self.pad_token_id = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        )
        if self.pad_token_id is None:
            raise DatasetError("the tokenizer has neither a pad token nor an EOS token to pad prompts with")
        self.rows: list[dict[str, Any]] = []
        self.locations: list[tuple[str, int]] = []
        for file in self.files:
            self._load_file(file)
        self._fill_missing_columns()
        if max_samples > 0:
            self.rows, self.locations = self.rows[:max_samples], self.locations[:max_samples]
        if config.filter_overlong_prompts or config.truncation == "error":
            self._check_lengths()

    # ------------------------------------------------------------------ loading
    def _load_file(self, file: str) -> None:
        table = _read_parquet(file)
        cfg = self.config
        validate_columns(table.column_names, file, [cfg.prompt_key, cfg.reward_fn_key, "reward_model"])
        records = table.to_pylist()
        for row, record in enumerate(records):
            validate_row(record, file, row, prompt_key=cfg.prompt_key, data_source_key=cfg.reward_fn_key)
            keys = (cfg.image_key, cfg.video_key)
            check_media(record, file, row, keys, "actor_rollout_ref.model.path", self.processor)
        if self.processor is not None:
            check_image_rows(records, file, table.column_names, cfg.image_key, cfg.prompt_key)
        self.rows.extend(records)
        self.locations.extend((file, row) for row in range(len(records)))

    def _fill_missing_columns(self) -> None:
        # Files may differ in optional columns; every item must have the same keys to be collated.
        columns = dict.fromkeys(["ability", "extra_info"])
        for record in self.rows:
            columns.update(dict.fromkeys(record))
        for record in self.rows:
            for column in columns:
                record.setdefault(column, None)

    def _prompt_lengths(self) -> list[int]:
        """Token counts of the rows' rendered prompts, remembered in this process for the same
        files (path, size, modification time), rows, tokenizer and template settings."""
        cfg = self.config
        tokenizer = _tokenizer_fingerprint(self.tokenizer)
        key = None
        if tokenizer is not None:
            files = tuple(
                (os.path.abspath(f), os.stat(f).st_mtime_ns, os.stat(f).st_size) for f in self.files
            )
            key = (files, len(self.rows), cfg.prompt_key, repr(cfg.apply_chat_template_kwargs), tokenizer)
            if key in _PROMPT_LENGTHS:
                return _PROMPT_LENGTHS[key]
        if self.processor is not None:  # image blocks: the length depends on each image's size
            return [len(self._prompt(dict(r), self.locations[i])[0]) for i, r in enumerate(self.rows)]
        texts = [self.render(r[cfg.prompt_key], self.locations[i]) for i, r in enumerate(self.rows)]
        lengths = [len(ids) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]
        if key is not None:
            _PROMPT_LENGTHS[key] = lengths
        return lengths

    def _check_lengths(self) -> None:
        lengths = self._prompt_lengths()
        limit = self.config.max_prompt_length
        if not self.config.filter_overlong_prompts:
            for i, n in enumerate(lengths):
                if n > limit:
                    truncate_ids([0] * n, limit, "error", where(*self.locations[i], self.config.prompt_key))
            return
        keep = [i for i, n in enumerate(lengths) if n <= limit]
        logger.info(
            "filter_overlong_prompts: kept %d of %d prompts (<= %d tokens)", len(keep), len(lengths), limit
        )
        if not keep:
            raise DatasetError(f"{self.files}: every prompt is longer than data.max_prompt_length={limit}")
        self.rows = [self.rows[i] for i in keep]
        self.locations = [self.locations[i] for i in keep]

    # ------------------------------------------------------------------ access
    def render(self, messages: list[dict[str, str]], location: tuple[str, int] | None = None) -> str:
        """Prompt text: the tokenizer's chat template (with a generation prompt), or the message
        contents joined by newlines when the tokenizer has no template."""
        if not getattr(self.tokenizer, "chat_template", None):
            return "\n".join(m["content"] for m in messages)
        try:
            return self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False, **self.config.apply_chat_template_kwargs
            )
        except Exception as err:
            loc = where(*location, self.config.prompt_key) if location else "prompt"
            raise DatasetError(f"{loc}: the chat template failed on these messages ({err})") from err

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, item: int) -> dict[str, Any]:
        cfg = self.config
        record = dict(self.rows[item])
        messages = record[cfg.prompt_key]
        ids, text, vision = self._prompt(record, self.locations[item])
        mode = "error" if vision else cfg.truncation  # a cut image block would no longer match its image
        ids = truncate_ids(ids, cfg.max_prompt_length, mode, where(*self.locations[item], cfg.prompt_key))
        pad = cfg.max_prompt_length - len(ids)
        attention_mask = torch.tensor([0] * pad + [1] * len(ids), dtype=torch.long)
        record["input_ids"] = torch.tensor([self.pad_token_id] * pad + ids, dtype=torch.long)
        record["attention_mask"] = attention_mask
        record["position_ids"] = torch.clamp(torch.cumsum(attention_mask, dim=0) - 1, min=0)
        if self.processor is not None:  # every row of a vision-language model's batch: [3, L] positions
            record["position_ids"] = self.processor.position_ids(record["input_ids"], attention_mask, vision)
            record["multi_modal_inputs"] = vision
        record["raw_prompt_ids"] = list(ids)
        extra = record.get("extra_info") or {}
        record["index"] = extra.get("index", self.locations[item][1])
        if cfg.return_raw_chat:
            record["raw_prompt"] = messages
        if cfg.return_full_prompt:
            record["full_prompts"] = text
        return record

    def _prompt(self, record: dict[str, Any], location: tuple[str, int]) -> tuple[list[int], str, dict]:
        """The prompt's token ids, its text, and the inputs of its images (``record``'s prompt and image
        columns are taken out of it)."""
        cfg = self.config
        messages, images = record.pop(cfg.prompt_key), record.pop(cfg.image_key, None) or []
        vision: dict[str, torch.Tensor] = {}
        if self.processor is not None and images:
            messages = image_messages(messages, len(images), where(*location, cfg.prompt_key))
            loaded = [self.processor.load(image, where(*location, cfg.image_key)) for image in images]
            vision = self.processor.images(loaded, where(*location, cfg.image_key))
        text = self.render(messages, location)
        if vision:
            text = self.processor.expand(text, vision["image_grid_thw"])
        return self.tokenizer(text, add_special_tokens=False)["input_ids"], text, vision

    def data_source_locations(self) -> dict[str, str]:
        """Each distinct data source and where it first appears (``"file, row N"``)."""
        out: dict[str, str] = {}
        for record, location in zip(self.rows, self.locations):
            out.setdefault(record[self.config.reward_fn_key], where(*location))
        return out


def collate_fn(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Stack tensors; put every other value in a 1-D numpy object array (for DataProto)."""
    if not items:
        raise ValueError("collate_fn got an empty list")
    keys = list(items[0])
    for i, item in enumerate(items):
        if set(item) != set(keys):
            raise ValueError(f"collate_fn: item {i} has keys {sorted(item)}, item 0 has {sorted(keys)}")
    out: dict[str, Any] = {}
    for key in keys:
        values = [item[key] for item in items]
        if isinstance(values[0], torch.Tensor):
            out[key] = torch.stack(values)
            continue
        column = np.empty(len(values), dtype=object)
        for i, value in enumerate(values):  # element-wise, so lists stay lists (no 2-D array)
            column[i] = value
        out[key] = column
    return out


def create_rl_dataset(
    data_files: str | Sequence[str],
    config: DataConfig,
    tokenizer: Any,
    max_samples: int = -1,
    processor: Any = None,
) -> Any:
    """``RLHFDataset``, or the class named by ``data.custom_cls`` (called with verl's keyword
    arguments ``data_files, tokenizer, config, processor, max_samples``)."""
    if config.custom_cls.path:
        from verl.utils.reward_score.scorer_process import load_function_from_file

        cls = load_function_from_file(config.custom_cls.path, config.custom_cls.name, key="data.custom_cls")
        return cls(
            data_files=data_files,
            tokenizer=tokenizer,
            config=config,
            processor=processor,
            max_samples=max_samples,
        )
    return RLHFDataset(data_files, tokenizer, config, processor=processor, max_samples=max_samples)
