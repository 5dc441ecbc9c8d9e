"""Per-image size limits, as verl reads them: keys of an image's entry in the row's image column.

verl passes each image of a row to ``qwen_vl_utils.fetch_image``, which reads the limits from the
image's own entry: ``{"bytes": ..., "min_pixels": N, "max_pixels": M}`` bounds the image's area, and
``{"resized_height": H, "resized_width": W}`` asks for a size. The image is resized (never refused)
to sides that are multiples of one merged patch (``patch_size * merge_size`` pixels, 28 for
Qwen2-VL), keeping its aspect ratio as closely as possible, with the area within the limits; the
model's image processor then works on that picture (its own ``min_pixels``/``max_pixels`` from
``preprocessor_config.json`` still apply). verl's defaults for a key the entry leaves out:
``4`` and ``16384`` merged patches.

Where verl stops with an exception, this module raises a :class:`DatasetError` naming the file, row
and column: limits that are not positive numbers or with ``max_pixels < min_pixels``, an aspect
ratio over 200, and an image that ``max_pixels`` would shrink below one merged patch on a side (verl's
resize fails on a zero side). Images whose entry has none of these keys are left as they are.
"""

from __future__ import annotations

import math
from typing import Any

from verl.utils.dataset.schema import DatasetError

SIZE_KEYS = ("min_pixels", "max_pixels", "resized_height", "resized_width")
"""The keys of an image entry that set its size."""
MIN_BLOCKS, MAX_BLOCKS = 4, 16384
"""verl's (qwen_vl_utils') default area limits, in merged patches."""
MAX_ASPECT_RATIO = 200


def size_limits(entry: Any, location: str) -> dict[str, float]:
    """The size keys an image entry sets (none for an entry that is not a dict; a key that is None,
    as parquet fills a field other entries have, is not set); each must be a positive number."""
    if not isinstance(entry, dict):
        return {}
    limits = {key: entry[key] for key in SIZE_KEYS if entry.get(key) is not None}
    for key, value in limits.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise DatasetError(f"{location}: {key} must be a positive number of pixels, got {value!r}")
    return limits


def apply_size_limits(image, limits: dict[str, float], block: int, location: str):
    """``image`` (PIL) resized as verl resizes it for these ``limits`` (:func:`size_limits`);
    ``block``: the side of one merged patch in pixels. Unchanged when ``limits`` is empty."""
    if not limits:
        return image
    from PIL import Image

    if "resized_height" in limits and "resized_width" in limits:
        # the requested size, itself fitted to the blocks within the default limits
        height, width = limits["resized_height"], limits["resized_width"]
        lower, upper = MIN_BLOCKS * block**2, MAX_BLOCKS * block**2
    else:
        height, width = image.height, image.width
        lower = limits.get("min_pixels", MIN_BLOCKS * block**2)
        upper = limits.get("max_pixels", MAX_BLOCKS * block**2)
    target = fitted_size(height, width, block, lower, upper, location)
    if target == (image.height, image.width):
        return image
    return image.resize((target[1], target[0]), Image.Resampling.BICUBIC)  # PIL's default, as verl's


def fitted_size(height: int, width: int, block: int, min_pixels: int, max_pixels: int, location: str):
    """``(height, width)`` rounded to multiples of ``block``, then scaled (keeping the aspect ratio)
    into ``[min_pixels, max_pixels]``: down with sides rounded down, up with sides rounded up."""
    if max_pixels < min_pixels:
        raise DatasetError(
            f"{location}: max_pixels={max_pixels} is below min_pixels={min_pixels}; verl refuses such limits"
        )
    ratio = max(height, width) / min(height, width)
    if ratio > MAX_ASPECT_RATIO:
        raise DatasetError(
            f"{location}: the image is {width}x{height}, an aspect ratio of {ratio:.0f}; the Qwen-VL models "
            f"take at most {MAX_ASPECT_RATIO} (crop or pad it)"
        )
    h, w = max(block, round(height / block) * block), max(block, round(width / block) * block)
    if h * w > max_pixels:
        scale = math.sqrt(height * width / max_pixels)
        low, wide = math.floor(height / scale / block) * block, math.floor(width / scale / block) * block
        if low == 0 or wide == 0:
            raise DatasetError(
                f"{location}: the image is {width}x{height}; within max_pixels={max_pixels} it would be "
                f"{math.floor(width / scale)}x{math.floor(height / scale)}, less than one {block}x{block} "
                f"block (patch x merge) on a side, which verl cannot resize to; raise max_pixels to at "
                f"least {min(h * w, _least_max_pixels(height, width, block))} or crop the image"
            )
        h, w = low, wide
    elif h * w < min_pixels:
        scale = math.sqrt(min_pixels / (height * width))
        h, w = math.ceil(height * scale / block) * block, math.ceil(width * scale / block) * block
    return h, w


def _least_max_pixels(height: int, width: int, block: int) -> int:
    """The smallest ``max_pixels`` at which scaling down leaves at least one block on the shorter side
    (a ``max_pixels`` at or above the image's area rounded to blocks needs no scaling at all)."""
    short = min(height, width)
    least = math.ceil(block * block * height * width / (short * short))
    while math.floor(short / math.sqrt(height * width / least) / block) == 0:  # float rounding at the edge
        least += 1
    return least
