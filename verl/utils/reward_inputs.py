"""What a scalar reward model reads and how it scores, shared by the reward-model worker (RL) and
the reward-model trainer, so a trained model scores in RL exactly as it was trained.

A conversation is the chat's messages plus the response as a final assistant turn, rendered with
the reward model's own chat template. Rows are left-padded, so the last position of every row is
its last token, where the one-label head's output is the score.
"""

from __future__ import annotations

from typing import Any

import torch

RM_INPUT_KEYS = ["input_ids", "attention_mask", "position_ids"]


def render_chat(tokenizer: Any, chat: list[dict[str, Any]], **template_kwargs: Any) -> str:
    """``chat`` in ``tokenizer``'s template (no generation prompt); the contents joined by newlines
    when it has none."""
    if not getattr(tokenizer, "chat_template", None):
        return "\n".join(str(m.get("content", "")) for m in chat)
    return tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=False, **template_kwargs)


def render_conversation(tokenizer: Any, messages: list[dict[str, Any]], response: str) -> str:
    """The chat with the response as its last (assistant) turn (see :func:`render_chat`)."""
    return render_chat(tokenizer, [*messages, {"role": "assistant", "content": response}])


def left_padded(rows: list[list[int]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """``input_ids`` / ``attention_mask`` / ``position_ids`` of the rows, left-padded to the longest."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            ids[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
            mask[i, width - len(row) :] = 1
    return {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}


def last_token_scores(module: torch.nn.Module, micro: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The head's output at each row's last position (rows are left-padded); the columns that are
    padding in every row are dropped first."""
    used = micro["attention_mask"].sum(0) > 0
    start = int(used.nonzero()[0]) if bool(used.any()) else 0
    out = module(**{k: micro[k][:, start:] for k in RM_INPUT_KEYS}, use_cache=False)
    return {"scores": out.logits[:, -1, 0].float()}
