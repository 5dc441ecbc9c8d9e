"""``PreferenceDataset``: preference pairs from parquet files as two token-id lists per row.

A row has a prompt (``data.prompt_key``: a string or chat messages) and two responses
(``data.chosen_key``, ``data.rejected_key``), each a string (one assistant turn) or a list of
messages that continue the prompt. A file without the prompt column holds whole chats in the two
response columns. Each side is rendered as one conversation with the reward model's chat
template, exactly as the reward-model worker renders a rollout (:mod:`verl.utils.reward_inputs`).

``dataset[i]`` is ``{"chosen": [...], "rejected": [...]}`` (token ids).
"""

from __future__ import annotations

from typing import Any

import torch

from verl.config.rm_trainer import RMDataConfig
from verl.utils.dataset.rl_dataset import _file_list, _read_parquet, truncate_ids
from verl.utils.dataset.schema import DatasetError, where
from verl.utils.dataset.sft_dataset import _json_or_value, _plain
from verl.utils.reward_inputs import render_chat

__all__ = ["PreferenceDataset"]


class PreferenceDataset(torch.utils.data.Dataset):
    def __init__(self, data_files: Any, tokenizer: Any, config: RMDataConfig, max_samples: int = -1) -> None:
        self.tokenizer, self.config = tokenizer, config
        self.rows: list[dict[str, Any]] = []
        self.locations: list[tuple[str, int]] = []
        for file in _file_list(data_files):
            table = _read_parquet(file)
            missing = [k for k in (config.chosen_key, config.rejected_key) if k not in table.column_names]
            if missing:
                raise DatasetError(
                    f"{file}: expected the preference columns {config.chosen_key!r} and {config.rejected_key!r} "
                    f"(data.chosen_key, data.rejected_key); it lacks {missing} and has {table.column_names}"
                )
            for row, record in enumerate(table.to_pylist()):
                self.rows.append(record)
                self.locations.append((file, row))
        if max_samples is not None and max_samples > 0:
            self.rows, self.locations = self.rows[:max_samples], self.locations[:max_samples]

    def __len__(self) -> int:
        return len(self.rows)

    def chat(self, index: int, side: str) -> list[dict[str, Any]]:
        """The conversation of one side (``chosen`` or ``rejected``) of row ``index``."""
        cfg, record = self.config, self.rows[index]
        file, row = self.locations[index]
        key = cfg.chosen_key if side == "chosen" else cfg.rejected_key
        prompt = _plain(_json_or_value(record.get(cfg.prompt_key))) if cfg.prompt_key in record else []
        if isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        response = _plain(record[key])
        if isinstance(response, str):
            response = [{"role": "assistant", "content": response}]
        chat = [*(prompt or []), *(response or [])]
        if not chat or not all(isinstance(m, dict) and "role" in m for m in chat):
            raise DatasetError(
                f"{where(file, row, key)}: expected a string or a list of {{role, content}} messages "
                f"(after the prompt column {cfg.prompt_key!r}, if any)"
            )
        return chat

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        cfg = self.config
        file, row = self.locations[index]
        out = {}
        for side in ("chosen", "rejected"):
            text = render_chat(self.tokenizer, self.chat(index, side), **cfg.apply_chat_template_kwargs)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            if len(ids) > cfg.max_length and cfg.truncation == "error":
                raise DatasetError(
                    f"{where(file, row, side)}: the conversation is {len(ids)} tokens, longer than data.max_length="
                    f"{cfg.max_length}; raise it or set data.truncation to left or right"
                )
            out[side] = truncate_ids(ids, cfg.max_length, cfg.truncation, where(file, row, side))
        return out
