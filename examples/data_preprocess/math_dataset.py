"""MATH / MATH-500 competition problems to parquet in the RL row schema.

From the Hugging Face hub (needs network and `pip install datasets`):

    python examples/data_preprocess/math_dataset.py --local_dir ~/data/math
    python examples/data_preprocess/math_dataset.py --local_dir ~/data/math500 \
        --dataset HuggingFaceH4/MATH-500 --splits test

Offline, from a folder with train*/test* .jsonl or .parquet files that have `problem` and
`solution` fields (and optionally `answer`, as MATH-500 has):

    python examples/data_preprocess/math_dataset.py --local_dir ~/data/math --local_dataset_path path/to/math

Writes <local_dir>/<split>.parquet for each split. Each prompt asks for the final answer in
\\boxed{}; the ground truth is `answer` when present, else the last \\boxed{} of `solution`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from verl.utils.dataset.records import LocalRecord, convert_splits, require_fields
from verl.utils.dataset.schema import DatasetError, make_row, where
from verl.utils.reward_score.math import extract_boxed_answer

DEFAULT_DATASET = "DigitalLearningGmbH/MATH-lighteval"
INSTRUCTION = "Think step by step, then put the final answer in \\boxed{}."


def ground_truth(record: LocalRecord) -> str:
    """`answer` if the record has one, else the content of the solution's last \\boxed{}."""
    answer = record.data.get("answer")
    if isinstance(answer, str) and answer.strip():
        return answer.strip()
    boxed = extract_boxed_answer(record.data["solution"])
    if boxed is None:
        raise DatasetError(
            f"{where(record.file, record.row, 'solution')}: no \\boxed{{}} answer and no 'answer' field"
        )
    return boxed


def to_row(record: LocalRecord, split: str, index: int, data_source: str) -> dict:
    require_fields(record.data, ("problem", "solution"), record.file, record.row)
    extra = {
        k: record.data[k] for k in ("level", "type", "subject", "unique_id") if record.data.get(k) is not None
    }
    return make_row(
        data_source,
        f"{record.data['problem']} {INSTRUCTION}",
        "math",
        ground_truth(record),
        split,
        index,
        extra_info={"problem": record.data["problem"], **extra},
    )


def main(argv: list[str] | None = None) -> dict[str, Path]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--local_dir", default="~/data/math", help="folder to write the parquet files to")
    parser.add_argument(
        "--local_dataset_path", default=None, help="read this folder (or file) instead of the hub"
    )
    parser.add_argument(
        "--dataset", default=DEFAULT_DATASET, help="hub dataset name; also the rows' data_source"
    )
    parser.add_argument("--splits", nargs="+", default=["train", "test"], help="splits to convert")
    args = parser.parse_args(argv)

    def row(record: LocalRecord, split: str, index: int) -> dict:
        return to_row(record, split, index, args.dataset)

    return convert_splits(row, args.local_dir, args.local_dataset_path, (args.dataset, None), args.splits)


if __name__ == "__main__":
    main()
