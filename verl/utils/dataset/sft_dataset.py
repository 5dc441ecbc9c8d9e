"""``SFTDataset``: chats from parquet files as token ids and a loss mask on the assistant's tokens.

A row is either a chat (the ``data.messages_key`` column: a list of ``{role, content}`` messages,
assistant messages possibly with ``tool_calls``, plus optional tool schemas in ``data.tools_key``)
or a prompt/response pair (``data.prompt_key``, ``data.response_key``), which is read as the chat
``prompt + [assistant: response]``. One code path serves both.

The chat is rendered once with the tokenizer's chat template and tokenized once, so the training
sequence is exactly what the template produces for the whole conversation. The assistant's
tokens are found by rendering prefixes: assistant turn ``i`` spans the characters between the
rendering of ``messages[:i]`` with the generation prompt and the rendering of ``messages[:i+1]``
(its content and the template's end-of-turn marker), and a token is trained on when it starts
inside such a span. A template that renders a prefix of the chat differently from the start of
the whole chat (some drop earlier reasoning) is an error that names the row: the assistant tokens
could not be located exactly.

``dataset[i]`` is ``{"input_ids": [...], "loss_mask": [...]}``; :func:`sft_collate` right-pads a
list of them into tensors.

Images (verl's multimodal chat rows): with a vision-language model (``processor``, a
:class:`~verl.utils.dataset.vision.VisionProcessor`), each ``<image>`` of the messages is the next
image of the ``data.image_key`` column; the chat is rendered with image parts, each image block
is expanded to one token per merged patch (in the whole chat and in every prefix, so the
assistant's spans are found as for text), and the item also holds ``position_ids`` ``[3, n]``
(M-RoPE) and ``multi_modal_inputs`` (empty for a row without images). A row with images is never
truncated (a cut image block no longer matches its image): longer than ``data.max_length`` is an
error. A text-only model refuses rows with images, naming the file, row and column.
"""

from __future__ import annotations

import json
from typing import Any

import torch

from verl.config.sft_trainer import SFTDataConfig
from verl.utils.dataset.rl_dataset import _file_list, _read_parquet
from verl.utils.dataset.schema import DatasetError, where
from verl.utils.dataset.vision import check_media, image_messages

__all__ = ["SFTDataset", "create_sft_dataset", "sft_collate"]


def _plain(value: Any) -> Any:
    """Parquet structs come back with every field of the column (absent ones as None): drop those,
    so a template's ``message.tool_calls`` test sees what the row said."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _json_or_value(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


class SFTDataset(torch.utils.data.Dataset):
    def __init__(
        self,
        data_files: Any,
        tokenizer: Any,
        config: SFTDataConfig,
        max_samples: int = -1,
        processor: Any = None,
    ) -> None:
        self.tokenizer, self.config = tokenizer, config
        self.processor = processor  # a VisionProcessor for a vision-language model, else None
        if not getattr(tokenizer, "is_fast", False):
            raise DatasetError(
                f"{type(tokenizer).__name__} is not a fast tokenizer: SFT locates the assistant tokens by "
                "character offsets, which only fast (Rust) tokenizers report"
            )
        self.rows: list[dict[str, Any]] = []
        self.locations: list[tuple[str, int]] = []
        media = (config.image_key, config.video_key)
        for file in _file_list(data_files):
            table = _read_parquet(file)
            self._check_columns(file, table.column_names)
            for row, record in enumerate(table.to_pylist()):
                check_media(record, file, row, media, "model.path", self.processor)
                self.rows.append(record)
                self.locations.append((file, row))
        if max_samples is not None and max_samples > 0:
            self.rows, self.locations = self.rows[:max_samples], self.locations[:max_samples]

    def _check_columns(self, file: str, columns: list[str]) -> None:
        cfg = self.config
        if cfg.messages_key in columns:
            return
        if cfg.multiturn.enable:
            raise DatasetError(
                f"{file}: no {cfg.messages_key!r} column (data.messages_key) although data.multiturn.enable=True; "
                f"it has {columns}"
            )
        missing = [key for key in (cfg.prompt_key, cfg.response_key) if key not in columns]
        if missing:
            raise DatasetError(
                f"{file}: expected a chat column {cfg.messages_key!r} (data.messages_key) or the pair columns "
                f"{cfg.prompt_key!r} and {cfg.response_key!r} (data.prompt_key, data.response_key); "
                f"it lacks {missing} and has {columns}"
            )

    def __len__(self) -> int:
        return len(self.rows)

    def messages(self, index: int) -> tuple[list[dict[str, Any]], Any]:
        """The row's chat and tool schemas (None without tools)."""
        cfg, record = self.config, self.rows[index]
        file, row = self.locations[index]
        if cfg.messages_key in record:
            messages = _plain(_json_or_value(record[cfg.messages_key]))
            column = cfg.messages_key
        else:
            prompt = _plain(record[cfg.prompt_key])
            if isinstance(prompt, str):
                prompt = [{"role": "user", "content": prompt}]
            messages = [*prompt, {"role": "assistant", "content": record[cfg.response_key]}]
            column = cfg.prompt_key
        if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
            raise DatasetError(f"{where(file, row, column)}: expected a list of {{role, content}} messages")
        if not any(m["role"] == "assistant" for m in messages):
            raise DatasetError(f"{where(file, row, column)}: the chat has no assistant message to train on")
        tools = _plain(_json_or_value(record.get(cfg.tools_key))) or None
        return messages, tools

    def _template_kwargs(self, index: int, tools: Any) -> dict[str, Any]:
        cfg = self.config
        kwargs = dict(cfg.apply_chat_template_kwargs)
        if tools:
            kwargs["tools"] = tools
        thinking = self.rows[index].get(cfg.enable_thinking_key)
        thinking = cfg.enable_thinking_default if thinking is None else thinking
        if thinking is not None:
            kwargs["enable_thinking"] = bool(thinking)
        return kwargs

    def __getitem__(self, index: int) -> dict[str, Any]:
        messages, tools = self.messages(index)
        file, row = self.locations[index]
        messages, vision = self._images(index, messages)
        kwargs = self._template_kwargs(index, tools)

        def render(prefix: list[dict[str, Any]], generation_prompt: bool) -> str:
            if not prefix:
                return ""
            text = self.tokenizer.apply_chat_template(
                prefix, tokenize=False, add_generation_prompt=generation_prompt, **kwargs
            )
            whole = len(prefix) == len(messages)  # the whole chat must hold a block for every image
            return self._expand(text, vision, whole, where(file, row, self.config.image_key))

        text = render(messages, False)
        spans = []
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            before, through = render(messages[:i], True), render(messages[: i + 1], False)
            if not (text.startswith(through) and through.startswith(before)):
                raise DatasetError(
                    f"{where(file, row, self.config.messages_key)}: the chat template renders the first {i + 1} "
                    "messages differently from the start of the whole chat, so the assistant's tokens cannot be "
                    "located exactly (templates that drop earlier reasoning do this); fix the template "
                    "(model.custom_chat_template) or the row"
                )
            spans.append((len(before), len(through)))
        encoded = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        input_ids = list(encoded["input_ids"])
        loss_mask = [int(any(lo <= start < hi for lo, hi in spans)) for start, _ in encoded["offset_mapping"]]
        item: dict[str, Any] = self._truncate(input_ids, loss_mask, file, row, images=bool(vision))
        if self.processor is not None:  # every row of a vision-language model's batch: [3, n] positions
            ids = torch.tensor(item["input_ids"], dtype=torch.long)
            item["position_ids"] = self.processor.position_ids(ids, torch.ones_like(ids), vision)
            item["multi_modal_inputs"] = vision
        return item

    def _images(
        self, index: int, messages: list[dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], dict[str, torch.Tensor]]:
        """A vision-language model's row: its messages with image parts (one per ``<image>``) and the
        inputs of its images (``pixel_values``, ``image_grid_thw``; empty without images)."""
        if self.processor is None:
            return messages, {}
        cfg, record = self.config, self.rows[index]
        file, row = self.locations[index]
        images = record.get(cfg.image_key) or []
        column = cfg.messages_key if cfg.messages_key in record else cfg.prompt_key
        messages = image_messages(messages, len(images), where(file, row, column))
        if not images:
            return messages, {}
        loaded = [self.processor.load(image, where(file, row, cfg.image_key)) for image in images]
        return messages, self.processor.images(loaded, where(file, row, cfg.image_key))

    def _expand(self, text: str, vision: dict[str, torch.Tensor], whole: bool, location: str) -> str:
        """``text`` (the ``whole`` chat, or a prefix of it) with each of its image tokens repeated once
        per merged patch of its image: the images of a prefix are the first ones of the row."""
        if not vision:
            return text
        grids = vision["image_grid_thw"]
        if not whole:
            grids = grids[: text.count(self.processor.image_token)]
        try:
            return self.processor.expand(text, grids)
        except ValueError as err:
            raise DatasetError(f"{location}: {err}") from err

    def _truncate(
        self, input_ids: list[int], loss_mask: list[int], file: str, row: int, images: bool = False
    ) -> dict[str, list[int]]:
        cfg = self.config
        if len(input_ids) > cfg.max_length:
            if cfg.truncation == "error" or images:
                cut = (
                    " (a row with images is never cut: its image blocks must match its images)"
                    if images
                    else ""
                )
                raise DatasetError(
                    f"{where(file, row)}: the chat is {len(input_ids)} tokens, longer than data.max_length="
                    f"{cfg.max_length}; raise it or set data.truncation to left or right{cut}"
                )
            keep = slice(-cfg.max_length, None) if cfg.truncation == "left" else slice(0, cfg.max_length)
            input_ids, loss_mask = input_ids[keep], loss_mask[keep]
        return {"input_ids": input_ids, "loss_mask": loss_mask}


def sft_collate(items: list[dict[str, Any]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask``, ``position_ids`` and ``loss_mask`` tensors.

    ``loss_mask[t]`` marks the token at position ``t`` as a target: the model's prediction of it
    comes from position ``t - 1``. Items with ``position_ids`` of their own (a vision-language
    model's ``[3, n]`` M-RoPE positions) give ``[B, 3, L]`` positions, pads at 0 on every axis, as
    the model's own M-RoPE puts them (pads are masked out of attention and of the loss).
    """
    width = max(len(item["input_ids"]) for item in items)
    shape = (len(items), width)
    input_ids = torch.full(shape, pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros(shape, dtype=torch.long)
    loss_mask = torch.zeros(shape, dtype=torch.long)
    for i, item in enumerate(items):
        n = len(item["input_ids"])
        input_ids[i, :n] = torch.tensor(item["input_ids"], dtype=torch.long)
        attention_mask[i, :n] = 1
        loss_mask[i, :n] = torch.tensor(item["loss_mask"], dtype=torch.long)
    if "position_ids" in items[0]:
        position_ids = torch.zeros(len(items), 3, width, dtype=torch.long)
        for i, item in enumerate(items):
            position_ids[i, :, : item["position_ids"].shape[-1]] = item["position_ids"]
    else:
        position_ids = torch.arange(width).expand(shape).clone()
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "loss_mask": loss_mask,
    }


def create_sft_dataset(
    data_files: Any, config: SFTDataConfig, tokenizer: Any, max_samples: int = -1, processor: Any = None
) -> Any:
    """``SFTDataset``, or the class named by ``data.custom_cls``; a vision-language model's
    ``processor`` (:class:`~verl.utils.dataset.vision.VisionProcessor`) is passed on as ``processor=``
    (to a custom class only when there is one, so text-only classes need not take it)."""
    extra = {"processor": processor} if processor is not None else {}
    if config.custom_cls.path:
        from verl.utils.reward_score.scorer_process import load_function_from_file

        cls = load_function_from_file(config.custom_cls.path, config.custom_cls.name, key="data.custom_cls")
        return cls(
            data_files=data_files, tokenizer=tokenizer, config=config, max_samples=max_samples, **extra
        )
    return SFTDataset(data_files, tokenizer, config, max_samples=max_samples, **extra)
