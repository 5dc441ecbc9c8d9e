"""Geometry3K (geometry problems with a diagram each) to parquet in verl's VLM row schema.

From the Hugging Face hub (needs network and `pip install datasets`):

    python examples/data_preprocess/geo3k.py --local_dir ~/data/geo3k

Offline, from a folder with train*/test* parquet (or jsonl) files of the dataset's columns
`problem` (with an `<image>` placeholder), `answer` and `images` (a list of {"bytes": ...}):

    python examples/data_preprocess/geo3k.py --local_dir ~/data/geo3k --local_dataset_path path/to/geometry3k

Writes <local_dir>/train.parquet and <local_dir>/test.parquet: the prompt asks for reasoning in
<think></think> and the answer in \\boxed{}; the images go in the `images` column as encoded bytes
(data.image_key=images); `data_source` is `hiyouga/geometry3k` (scored by verl.utils.reward_score.geo3k).
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path
from typing import Any

from verl.utils.dataset.records import LocalRecord, convert_splits, require_fields
from verl.utils.dataset.schema import DatasetError, make_row, where

DATA_SOURCE = "hiyouga/geometry3k"
INSTRUCTION = (
    "You FIRST think about the reasoning process as an internal monologue and then provide the final "
    "answer. The reasoning process MUST BE enclosed within <think> </think> tags. The final answer MUST "
    "BE put in \\boxed{}."
)


def image_bytes(image: Any, record: LocalRecord) -> dict[str, bytes]:
    """An image of the dataset (a PIL image from the hub, {"bytes": ...} from parquet) as {"bytes": ...}."""
    if isinstance(image, dict) and image.get("bytes"):
        return {"bytes": image["bytes"]}
    if hasattr(image, "save"):
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        return {"bytes": buffer.getvalue()}
    raise DatasetError(
        f"{where(record.file, record.row, 'images')}: expected an image, got {type(image).__name__}"
    )


def to_row(record: LocalRecord, split: str, index: int) -> dict:
    require_fields(record.data, ("problem", "answer"), record.file, record.row)
    images = record.data.get("images")
    if not isinstance(images, (list, tuple)) or not images:
        raise DatasetError(f"{where(record.file, record.row, 'images')}: expected a non-empty list of images")
    problem, answer = record.data["problem"], record.data["answer"]
    row = make_row(
        DATA_SOURCE,
        f"{problem} {INSTRUCTION}",
        "math",
        answer,
        split,
        index,
        extra_info={"question": problem, "answer": answer},
    )
    row["images"] = [image_bytes(image, record) for image in images]
    return row


def main(argv: list[str] | None = None) -> dict[str, Path]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--local_dir", default="~/data/geo3k", help="folder to write train/test.parquet to")
    parser.add_argument(
        "--local_dataset_path", default=None, help="read this folder (or file) instead of the hub"
    )
    args = parser.parse_args(argv)
    return convert_splits(to_row, args.local_dir, args.local_dataset_path, (DATA_SOURCE, None))


if __name__ == "__main__":
    main()
