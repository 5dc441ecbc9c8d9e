"""verl's image rows through RLHFDataset: what each item holds, and clear errors naming the row and
the column for a corrupt image, a placeholder count that does not match, and images for a text model."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.vision.conftest import random_png
from verl.builtin import task as text_task
from verl.builtin import vision_task
from verl.config.data import DataConfig
from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn
from verl.utils.dataset.schema import DatasetError, make_row, write_parquet


def image_row(prompt: str, images: list, index: int) -> dict:
    row = make_row("vision_digits", prompt, "vision", "3", "train", index)
    row["images"] = images
    return row


@pytest.fixture(scope="module")
def tokenizer():
    return vision_task.build_vision_tokenizer()


@pytest.fixture(scope="module")
def processor(tiny_vlm):
    return tiny_vlm[2]


def config(**change) -> DataConfig:
    return dataclasses.replace(DataConfig(), max_prompt_length=64, **change)


def test_items_carry_token_blocks_positions_and_image_inputs(tmp_path, tokenizer, processor):
    rows = [
        image_row("<image>=", [{"bytes": random_png(56, 56, 0)}], 0),
        image_row("<image><image>=", [{"bytes": random_png(84, 56, 1)}, {"bytes": random_png(56, 56, 2)}], 1),
        image_row("1+2=", [], 2),
    ]
    path = write_parquet(rows, tmp_path / "rows.parquet")
    dataset = RLHFDataset(str(path), tokenizer, config(), processor=processor)
    items = [dataset[i] for i in range(3)]
    pad_id = processor.image_token_id
    assert [int((item["input_ids"] == pad_id).sum()) for item in items] == [4, 6 + 4, 0]  # merged patches
    assert [len(item["multi_modal_inputs"].get("image_grid_thw", [])) for item in items] == [1, 2, 0]
    batch = collate_fn(items)
    assert batch["position_ids"].shape == (3, 3, 64)
    assert "images" not in batch  # the pictures travel as model inputs, not as raw bytes
    text_positions = batch["position_ids"][2]
    assert torch.equal(text_positions[0], text_positions[1])  # text only: the same on every axis


@pytest.mark.parametrize(
    ("prompt", "images", "expected"),
    [
        ("<image>=", [{"bytes": b"not an image"}], "row 0, column 'images'.*not a readable image"),
        ("<image>=", [{"bytes": random_png(1000, 4, 0)}], "image processor refused the images \\(1000x4\\)"),
    ],
)
def test_bad_image_rows_name_the_row_when_loaded(tmp_path, tokenizer, processor, prompt, images, expected):
    path = write_parquet([image_row(prompt, images, 0)], tmp_path / "bad.parquet")
    with pytest.raises(DatasetError, match=expected):  # every prompt is measured at load (truncation=error)
        RLHFDataset(str(path), tokenizer, config(), processor=processor)
    dataset = RLHFDataset(str(path), tokenizer, config(truncation="left"), processor=processor)
    with pytest.raises(DatasetError, match=expected):  # not measured at load: then when the row is read
        dataset[0]


@pytest.mark.parametrize(
    ("prompt", "images", "expected"),
    [
        (
            "<image><image>=",
            [{"bytes": random_png(56, 56, 0)}],
            r"2 <image> placeholder\(s\) but the row has 1",
        ),
        ("=", [{"path": "/no/such/picture.png"}], r"0 <image> placeholder\(s\) but the row has 1"),
        ("<image>=", [], r"1 <image> placeholder\(s\) but the row has 0 image"),  # once trained on the text
    ],
    ids=["more-placeholders", "no-placeholder", "no-image"],
)
def test_a_row_whose_placeholders_do_not_match_its_images_is_refused_at_load_whatever_the_truncation(
    tmp_path, tokenizer, processor, prompt, images, expected
):
    rows = [image_row("<image>=", [{"bytes": random_png(56, 56, 0)}], 0), image_row(prompt, images, 1)]
    path = write_parquet(rows, tmp_path / "bad.parquet")
    for truncation in ("error", "left"):
        with pytest.raises(DatasetError, match=f"bad.parquet, row 1, column 'prompt'.*{expected}"):
            RLHFDataset(str(path), tokenizer, config(truncation=truncation), processor=processor)


def test_a_missing_image_column_is_refused_at_load_naming_the_key_the_file_and_its_columns(
    tmp_path, tokenizer, processor
):
    """verl's ``data.image_key=pictures`` on a file whose images are in ``images``: without the check the
    model trained on the literal text ``<image>``, with no pixels."""
    path = write_parquet(
        [image_row("<image>=", [{"bytes": random_png(56, 56, 0)}], 0)], tmp_path / "v.parquet"
    )
    with pytest.raises(DatasetError) as refused:
        RLHFDataset(str(path), tokenizer, config(image_key="pictures"), processor=processor)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"data.image_key='pictures': {path} has no such column")
    assert "'images'" in message and "'prompt'" in message  # the columns it has


def test_a_text_only_file_without_the_image_column_still_loads_for_a_vision_model(
    tmp_path, tokenizer, processor
):
    path = write_parquet([image_row("1+2=", [], 0)], tmp_path / "text.parquet")
    dataset = RLHFDataset(str(path), tokenizer, config(image_key="pictures"), processor=processor)
    assert dataset[0]["multi_modal_inputs"] == {}


def test_an_image_column_on_a_text_model_is_refused_at_load(tmp_path):
    path = write_parquet(
        [image_row("<image>=", [{"bytes": random_png(56, 56, 0)}], 0)], tmp_path / "img.parquet"
    )
    with pytest.raises(DatasetError, match=r"row 0, column 'images'.*text-only"):
        RLHFDataset(str(path), text_task.build_char_tokenizer(), config())
