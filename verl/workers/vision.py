"""The image inputs of a vision-language model's forward, per micro-batch.

Each row of a batch with images carries ``multi_modal_inputs`` (``DataProto.non_tensor_batch``): its
``pixel_values`` ``[patches, C]`` and ``image_grid_thw`` ``[images, 3]``, empty for a row without
images. A micro-batch's forward takes the rows' tensors concatenated in row order, which is the
order of the image tokens in its flattened ``input_ids`` (see :mod:`verl.utils.dataset.vision`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

VISION_KEYS = ("pixel_values", "image_grid_thw")
MULTI_MODAL_INPUTS = "multi_modal_inputs"


def image_columns(non_tensor_batch: dict) -> list[str]:
    """The non-tensor columns a forward of these rows needs (their images), for ``DataProto.select``."""
    return [MULTI_MODAL_INPUTS] if MULTI_MODAL_INPUTS in non_tensor_batch else []


def micro_batch_vision(rows: Sequence[dict]) -> dict[str, torch.Tensor]:
    """The rows' image inputs concatenated in order; empty when no row has an image."""
    present = [row for row in rows if row and "pixel_values" in row]
    if not present:
        return {}
    return {key: torch.cat([row[key] for row in present]) for key in VISION_KEYS}


def vision_kwargs(micro: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The image inputs of a micro-batch, as the model's forward takes them (none for text)."""
    return {key: micro[key] for key in VISION_KEYS if key in micro}


def placeholder_token_ids(config) -> list[int]:
    """The token ids of a vision-language model that stand for image or video features (none for a
    text model): a rollout never samples them, as no features could back them in the next forward."""
    names = ("image_token_id", "video_token_id")
    return [int(i) for i in (getattr(config, name, None) for name in names) if i is not None]


VISION_TOWERS = ("visual", "vision_tower", "vision_model")
"""Attribute names under which transformers' vision-language models keep their image encoder."""


def freeze_vision_tower(module: torch.nn.Module) -> None:
    """``actor.freeze_vision_tower``: the image encoder keeps its weights (no gradient, not in the
    optimizer); an error for a model without one."""
    for name, child in module.named_modules():
        if name.rsplit(".", 1)[-1] in VISION_TOWERS:
            child.requires_grad_(False)
            return
    raise ValueError(
        f"actor_rollout_ref.actor.freeze_vision_tower=True: {type(module).__name__} has no vision tower "
        f"(no submodule named one of {VISION_TOWERS}); it applies to vision-language models"
    )
