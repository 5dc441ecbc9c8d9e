"""Multimodal rotary positions (M-RoPE) of Qwen2-VL-style models, built once per prompt.

Such a model rotates each token by three positions (temporal, height, width) instead of one. Text
tokens have the same number on the three axes and count up by one; the ``t x h x w`` grid of an
image's merged patches (``image_grid_thw / [1, merge, merge]``) starts at the position ``s`` that
follows the text before it: patch ``(i, j, k)`` sits at ``(s + i, s + j, s + k)``, and the next
text token at ``s + max(t, h, w)``. Pads are at 0 and attend to nothing.

``position_ids`` of a batch that holds images are ``[B, 3, L]`` (``[B, L]`` otherwise); a token
generated after the prompt is one further than the prompt's last position on every axis. The
model takes them as ``[3, B, L]`` (:func:`model_position_ids`).
"""

from __future__ import annotations

import torch


def mrope_position_ids(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    image_grid_thw: torch.Tensor,
    image_token_id: int,
    merge_size: int,
) -> torch.Tensor:
    """``[3, L]`` positions of one sequence (``input_ids`` ``[L]``, pads where ``attention_mask`` is 0)
    whose images, in order, have the patch grids ``image_grid_thw`` ``[n, 3]``."""
    real = attention_mask.bool()
    ids = input_ids[real].tolist()
    grids = [(int(t), int(h) // merge_size, int(w) // merge_size) for t, h, w in image_grid_thw.tolist()]
    parts: list[torch.Tensor] = []
    start, i, image = 0, 0, 0
    while i < len(ids):
        if ids[i] != image_token_id:
            run = _text_run(ids, i, image_token_id)
            parts.append(torch.arange(start, start + run).expand(3, run))
            start, i = start + run, i + run
            continue
        if image >= len(grids):
            raise ValueError(f"the sequence has more image blocks than the {len(grids)} image grids given")
        t, h, w = grids[image]
        grid = torch.stack(torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij"))
        parts.append(grid.reshape(3, -1) + start)
        start, i, image = start + max(t, h, w), i + t * h * w, image + 1
    positions = torch.zeros(3, input_ids.shape[-1], dtype=torch.long)
    if parts:
        positions[:, real] = torch.cat(parts, dim=1)
    return positions


def _text_run(ids: list[int], start: int, image_token_id: int) -> int:
    end = start
    while end < len(ids) and ids[end] != image_token_id:
        end += 1
    return end - start


def model_position_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """Positions as the model takes them: ``[B, L]`` unchanged, ``[B, 3, L]`` as ``[3, B, L]``."""
    return position_ids.transpose(0, 1) if position_ids.dim() == 3 else position_ids
