"""The image inputs of a vision-language model's forward, per micro-batch.

Each row of a batch with images carries ``multi_modal_inputs`` (``DataProto.non_tensor_batch``): its
``pixel_values`` ``[patches, C]`` and ``image_grid_thw`` ``[images, 3]``, empty for a row without
images. A micro-batch's forward takes the rows' tensors concatenated in row order, which is the
order of the image tokens in its flattened ``input_ids`` (see :mod:`verl.utils.dataset.vision`).
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

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


def encode_images(vision: dict[str, torch.Tensor]) -> dict[str, dict]:
    """A request's image inputs as JSON (the agent loop -> rollout server ``/generate``): each tensor's
    dtype, shape and raw bytes in base64, so the server computes with exactly the pixels the trainer
    will see."""
    return {
        key: {
            "dtype": str(tensor.dtype).removeprefix("torch."),
            "shape": list(tensor.shape),
            "data": base64.b64encode(tensor.detach().cpu().contiguous().view(torch.uint8).numpy()).decode(),
        }
        for key, tensor in vision.items()
    }


def decode_images(payload: Any, field: str = "multi_modal_inputs") -> dict[str, torch.Tensor]:
    """:func:`encode_images` read back; a malformed payload is a ``ValueError`` naming ``field``."""
    if not isinstance(payload, dict) or set(payload) != set(VISION_KEYS):
        raise ValueError(f"{field}: expected an object with exactly {list(VISION_KEYS)}")
    out = {}
    for key, entry in payload.items():
        try:
            dtype = getattr(torch, entry["dtype"])
            raw = bytearray(base64.b64decode(entry["data"], validate=True))
            out[key] = torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(entry["shape"])
        except (KeyError, TypeError, ValueError, AttributeError, RuntimeError) as error:
            raise ValueError(f"{field}.{key}: expected {{dtype, shape, data (base64)}}: {error}") from error
    if out["image_grid_thw"].dim() != 2 or out["image_grid_thw"].shape[-1] != 3:
        raise ValueError(
            f"{field}.image_grid_thw: expected shape [images, 3], got {list(out['image_grid_thw'].shape)}"
        )
    return out


def mrope_spec(config) -> tuple[int, int] | None:
    """(image token id, spatial merge size) of a Qwen2-VL-style model, whose positions are M-RoPE;
    None for a text model."""
    token = getattr(config, "image_token_id", None)
    merge = getattr(getattr(config, "vision_config", None), "spatial_merge_size", None)
    return None if token is None or merge is None else (int(token), int(merge))


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
