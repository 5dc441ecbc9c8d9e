"""Images in prompts: verl's row schema, read and turned into the inputs of a Qwen2-VL-style model.

A row holds its images in the ``data.image_key`` column (default ``images``): a list of
``{"bytes": <encoded image>}``, ``{"path": <file>}``, a path string, or a PIL image. Each ``<image>``
in the prompt's messages marks where one image goes, in order; the messages become content parts
(``{"type": "image"}``, ``{"type": "text", ...}``) for the chat template, which writes the model's
image block (``<|vision_start|><|image_pad|><|vision_end|>`` for Qwen2-VL).

:class:`VisionProcessor` is the model's image processor (from its ``preprocessor_config.json``)
plus the one rule the Qwen2-VL family shares: an image's ``<|image_pad|>`` stands for
``t * h * w / merge**2`` tokens, one per merged patch. It gives each prompt its token ids and
``multi_modal_inputs`` (``pixel_values`` ``[patches, C]`` and ``image_grid_thw`` ``[images, 3]``),
which travel with the row (``DataProto.non_tensor_batch``) to every forward.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from verl.utils.dataset.image_size import apply_size_limits, size_limits
from verl.utils.dataset.schema import DatasetError, where
from verl.utils.mrope import mrope_position_ids

IMAGE_PLACEHOLDER = "<image>"
VISION_KEYS = ("pixel_values", "image_grid_thw")
"""The per-row ``multi_modal_inputs`` tensors a forward of a vision-language model takes."""


def load_image(value: Any, location: str):
    """One image of a row as an RGB PIL image; anything unreadable is a :class:`DatasetError` at ``location``."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(value, Image.Image):
        return value.convert("RGB")
    if isinstance(value, (bytes, bytearray)):  # encoded bytes, as a tool may return them
        source: Any = io.BytesIO(value)
    elif isinstance(value, dict) and value.get("bytes") is not None:
        source = io.BytesIO(value["bytes"])
    elif isinstance(value, dict) and value.get("path"):
        source = os.path.expanduser(value["path"])
    elif isinstance(value, (str, os.PathLike)):
        source = os.path.expanduser(os.fspath(value))
    else:
        raise DatasetError(
            f"{location}: an image must be a PIL image, encoded bytes, {{'bytes': ...}}, {{'path': ...}} or a "
            f"path, got {type(value).__name__}"
        )
    try:
        with Image.open(source) as image:
            return image.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError) as err:
        raise DatasetError(f"{location}: not a readable image ({err})") from err


def check_media(
    record: dict[str, Any], file: str, row: int, keys: tuple[str, str], model_key: str, processor: Any
):
    """Refuse a row with videos (``keys``: the image and video columns), or with images when the model
    (``model_key``) is text-only (``processor`` is None)."""
    image_key, video_key = keys
    if record.get(video_key):
        raise DatasetError(f"{where(file, row, video_key)}: videos are not supported; drop the column")
    if record.get(image_key) and processor is None:
        raise DatasetError(
            f"{where(file, row, image_key)}: the row has images but the model ({model_key}) is text-only "
            "(its folder has no image processor and its config no image token); use a vision-language "
            "model or drop the column"
        )


def count_placeholders(messages: list[dict[str, Any]]) -> int:
    """The ``<image>`` placeholders in the text of ``messages``."""
    return sum(m["content"].count(IMAGE_PLACEHOLDER) for m in messages if isinstance(m.get("content"), str))


def check_placeholders(messages: list[dict[str, Any]], num_images: int, location: str) -> None:
    """Each of the row's ``num_images`` images needs one ``<image>`` in ``messages``, and no more."""
    found = count_placeholders(messages)
    if found != num_images:
        raise DatasetError(
            f"{location}: the prompt has {found} {IMAGE_PLACEHOLDER} placeholder(s) but the row has "
            f"{num_images} image(s); each image needs one {IMAGE_PLACEHOLDER} where it goes"
        )


def check_image_rows(
    records: list[dict[str, Any]], file: str, columns: list[str], image_key: str, prompt_key: str
) -> None:
    """The rows of one file for a vision-language model: a file whose prompts hold ``<image>`` must have
    the ``data.image_key`` column (without it the placeholders would reach the model as text, with no
    pixels), and each row as many placeholders as images. A file without placeholders or images is
    text-only, which a vision-language model trains on as verl's does."""
    with_placeholder = (i for i, r in enumerate(records) if count_placeholders(r[prompt_key]))
    first = next(with_placeholder, None)
    if image_key not in columns and first is not None:
        raise DatasetError(
            f"data.image_key={image_key!r}: {file} has no such column, but its prompts hold "
            f"{IMAGE_PLACEHOLDER} placeholders (row {first} first); its columns are {columns}: set "
            "data.image_key to the one that holds the images"
        )
    for row, record in enumerate(records):
        images = record.get(image_key) or []
        check_placeholders(record[prompt_key], len(images), where(file, row, prompt_key))


def image_messages(messages: list[dict[str, Any]], num_images: int, location: str) -> list[dict[str, Any]]:
    """``messages`` with each ``<image>`` turned into an image content part; the number of
    placeholders must equal the row's number of images."""
    check_placeholders(messages, num_images, location)
    return [{**m, "content": _content_parts(m["content"])} for m in messages]


def _content_parts(content: Any) -> Any:
    if not isinstance(content, str) or IMAGE_PLACEHOLDER not in content:
        return content
    parts: list[dict[str, str]] = []
    for i, text in enumerate(content.split(IMAGE_PLACEHOLDER)):
        if i:
            parts.append({"type": "image"})
        if text:
            parts.append({"type": "text", "text": text})
    return parts


@dataclass
class VisionProcessor:
    """A Qwen2-VL-style model's image processor and image token (see the module doc)."""

    image_processor: Any
    image_token: str
    image_token_id: int
    merge_size: int

    def load(self, entry: Any, location: str):
        """One image of a row (:func:`load_image`), resized within the limits its entry sets
        (``min_pixels``/``max_pixels``, ``resized_height``/``resized_width``: verl's per-image keys,
        :mod:`verl.utils.dataset.image_size`)."""
        limits = size_limits(entry, location)
        block = int(getattr(self.image_processor, "patch_size", 14)) * self.merge_size
        return apply_size_limits(load_image(entry, location), limits, block, location)

    def images(self, images: list[Any], location: str = "prompt") -> dict[str, torch.Tensor]:
        """``pixel_values`` and ``image_grid_thw`` of a prompt's images; an image the processor
        refuses (e.g. Qwen2-VL's aspect ratio over 200) is a :class:`DatasetError` at ``location``."""
        try:
            out = self.image_processor(images=images, return_tensors="pt")
        except ValueError as err:
            sizes = ", ".join(f"{image.width}x{image.height}" for image in images)
            raise DatasetError(
                f"{location}: the model's image processor refused the images ({sizes}): {err}"
            ) from err
        return {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"].long()}

    def expand(self, text: str, image_grid_thw: torch.Tensor) -> str:
        """``text`` with each image token repeated once per merged patch of its image."""
        pieces = text.split(self.image_token)
        if len(pieces) - 1 != len(image_grid_thw):
            raise ValueError(
                f"the rendered prompt has {len(pieces) - 1} image tokens ({self.image_token}) for "
                f"{len(image_grid_thw)} images; does the chat template write one per image part?"
            )
        counts = (image_grid_thw.prod(-1) // self.merge_size**2).tolist()
        out = [pieces[0]]
        for count, piece in zip(counts, pieces[1:]):
            out.append(self.image_token * int(count) + piece)
        return "".join(out)

    def expand_ids(self, ids: list[int], image_grid_thw: torch.Tensor) -> list[int]:
        """Token ids with each image token repeated once per merged patch of its image (:meth:`expand`
        on ids: the image token is one special token, so both give the same sequence)."""
        counts = (image_grid_thw.prod(-1) // self.merge_size**2).tolist()
        found = ids.count(self.image_token_id)
        if found != len(counts):
            raise ValueError(
                f"the rendered messages have {found} image tokens ({self.image_token}) for {len(counts)} "
                "images; does the chat template write one per image part?"
            )
        out: list[int] = []
        images = iter(counts)
        for token in ids:
            out += [token] * int(next(images)) if token == self.image_token_id else [token]
        return out

    def position_ids(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, vision: dict
    ) -> torch.Tensor:
        """``[3, L]`` M-RoPE positions of one left-padded prompt (:mod:`verl.utils.mrope`)."""
        grid = vision.get("image_grid_thw", torch.zeros(0, 3, dtype=torch.long))
        return mrope_position_ids(input_ids, attention_mask, grid, self.image_token_id, self.merge_size)


def load_vision_processor(
    model_path: str, tokenizer: Any, min_pixels: int | None = None, max_pixels: int | None = None
) -> VisionProcessor | None:
    """The model's :class:`VisionProcessor`, or None for a text-only model (no image token in its
    config). ``min_pixels``/``max_pixels`` override the image processor's size limits."""
    from transformers import AutoConfig, AutoImageProcessor

    path = os.path.expanduser(model_path)
    if not Path(path, "preprocessor_config.json").is_file():
        return None
    config = AutoConfig.from_pretrained(path)
    token_id = getattr(config, "image_token_id", None)
    if token_id is None:
        return None
    kwargs = {k: v for k, v in (("min_pixels", min_pixels), ("max_pixels", max_pixels)) if v is not None}
    image_processor = AutoImageProcessor.from_pretrained(path, **kwargs)
    merge = getattr(image_processor, "merge_size", None) or config.vision_config.spatial_merge_size
    return VisionProcessor(image_processor, tokenizer.convert_ids_to_tokens(token_id), token_id, int(merge))
