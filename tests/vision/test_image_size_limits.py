"""verl's per-image size keys (``min_pixels``, ``max_pixels``, ``resized_height``/``resized_width`` in an
image's entry) take effect: the image is resized as verl resizes it (sides in 28-pixel blocks, area
within the limits) before the model's image processor, which changes how many image tokens the prompt
gets; limits verl cannot follow are errors naming the file, row and column.

Sizes below are worked out by hand for the tiny Qwen2-VL (14-pixel patches merged 2x2: a block is 28
pixels; its processor keeps images within 56*56..4*56*56 pixels)."""

from __future__ import annotations

import dataclasses
import io

import pytest
import torch
from PIL import Image

from tests.vision.conftest import random_png
from verl.builtin import vision_task
from verl.config.data import DataConfig
from verl.utils.dataset.rl_dataset import RLHFDataset
from verl.utils.dataset.schema import DatasetError, make_row, write_parquet

BLOCK = 28


@pytest.fixture(scope="module")
def tokenizer():
    return vision_task.build_vision_tokenizer()


@pytest.fixture(scope="module")
def processor(tiny_vlm):
    return tiny_vlm[2]


def grid(processor, entry: dict) -> list[int]:
    """``image_grid_thw`` of one image entry, loaded as the datasets load it."""
    return processor.images([processor.load(entry, "test")])["image_grid_thw"][0].tolist()


@pytest.mark.parametrize(
    ("size", "limits", "fitted"),
    [
        # 400x100 within 8 blocks of area: scaled by 1/sqrt(40000/6272) to 158x40, sides rounded down
        ((400, 100), {"max_pixels": 8 * BLOCK**2}, (140, 28)),
        # 30x30 up to 9 blocks: scaled by sqrt(7056/900) = 2.8 to 84x84 (rounded up)
        ((30, 30), {"min_pixels": 9 * BLOCK**2}, (84, 84)),
        # a requested size, fitted to whole blocks
        ((90, 70), {"resized_height": 56, "resized_width": 110}, (112, 56)),
        # within the limits already: only rounded to whole blocks
        ((60, 50), {"min_pixels": 4, "max_pixels": 10**6}, (56, 56)),
    ],
)
def test_size_keys_of_an_image_entry_resize_it_as_verl_does(processor, size, limits, fitted):
    png = random_png(*size, seed=1)
    with Image.open(io.BytesIO(png)) as image:  # verl: the fitted size by PIL's bicubic resize
        expected = processor.images([image.convert("RGB").resize(fitted, Image.Resampling.BICUBIC)])
    got = processor.images([processor.load({"bytes": png, **limits}, "test")])
    assert got["image_grid_thw"].tolist() == [[1, fitted[1] // 14, fitted[0] // 14]]
    assert torch.equal(got["pixel_values"], expected["pixel_values"])


def test_max_pixels_lowers_the_image_token_count(processor):
    png = random_png(400, 100, seed=2)
    # the processor alone fits 400x100 into 4*56*56 pixels: 224x56, 16x4 patches = 16 image tokens
    assert grid(processor, {"bytes": png}) == [1, 4, 16]
    # max_pixels=8 blocks: 140x28, 10x2 patches = 5 image tokens
    assert grid(processor, {"bytes": png, "max_pixels": 8 * BLOCK**2}) == [1, 2, 10]


def image_row(images: list, index: int) -> dict:
    row = make_row("vision_digits", "<image>=", "vision", "3", "train", index)
    row["images"] = images
    return row


def test_the_rl_dataset_applies_each_images_own_limits(tmp_path, tokenizer, processor):
    png = random_png(400, 100, seed=3)
    rows = [image_row([{"bytes": png}], 0), image_row([{"bytes": png, "max_pixels": 8 * BLOCK**2}], 1)]
    path = write_parquet(rows, tmp_path / "rows.parquet")  # parquet fills the first entry's max_pixels: None
    config = dataclasses.replace(DataConfig(), max_prompt_length=64)
    dataset = RLHFDataset(str(path), tokenizer, config, processor=processor)
    tokens = [int((dataset[i]["input_ids"] == processor.image_token_id).sum()) for i in range(2)]
    assert tokens == [16, 5]


@pytest.mark.parametrize(
    ("size", "limits", "expected"),
    [
        # 1000x20 within 8 blocks would be 177x3: no 28-pixel block fits its height (verl's resize fails)
        (
            (1000, 20),
            {"max_pixels": 8 * BLOCK**2},
            r"row 1, column 'images': the image is 1000x20; within max_pixels=6272 .* at least 28224",
        ),
        (
            (56, 56),
            {"min_pixels": 5000, "max_pixels": 4000},
            r"row 1, column 'images': max_pixels=4000 is below",
        ),
        ((56, 56), {"max_pixels": -1}, r"row 1, column 'images': max_pixels must be a positive number"),
        (
            (1000, 4),
            {"max_pixels": 10**6},
            r"row 1, column 'images': the image is 1000x4, an aspect ratio of 250",
        ),
    ],
)
def test_limits_verl_cannot_follow_name_the_row(tmp_path, tokenizer, processor, size, limits, expected):
    rows = [
        image_row([{"bytes": random_png(56, 56, 0), "max_pixels": None, "min_pixels": None}], 0),
        image_row(
            [{"bytes": random_png(*size, seed=4), "max_pixels": None, "min_pixels": None, **limits}], 1
        ),
    ]
    path = write_parquet(rows, tmp_path / "bad.parquet")
    config = dataclasses.replace(DataConfig(), max_prompt_length=64)
    with pytest.raises(DatasetError, match=expected):
        RLHFDataset(str(path), tokenizer, config, processor=processor)


@pytest.mark.parametrize(
    ("size", "least"),
    [
        ((1000, 20), 28224),  # 1008x28, its area in whole blocks: no scaling at all
        ((2000, 30), 52267),  # 28*28*2000*30/30**2, rounded up: scaled to 1848x28
    ],
)
def test_the_least_max_pixels_named_in_the_error_is_enough(processor, size, least):
    png = random_png(*size, seed=4)
    with pytest.raises(DatasetError, match=f"at least {least} "):
        processor.load({"bytes": png, "max_pixels": 8 * BLOCK**2}, "test")
    assert grid(processor, {"bytes": png, "max_pixels": least})[1] >= 1
    with pytest.raises(DatasetError, match=f"at least {least} "):
        processor.load({"bytes": png, "max_pixels": least - 1}, "test")
