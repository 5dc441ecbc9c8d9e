"""GSM8K (grade-school math word problems) to parquet in the RL row schema.

From the Hugging Face hub (needs network and `pip install datasets`):

    python examples/data_preprocess/gsm8k.py --local_dir ~/data/gsm8k

Offline, from a folder with train*.jsonl / test*.jsonl (or .parquet) files that have
`question` and `answer` fields, e.g. the `grade_school_math/data` folder of openai's repository:

    python examples/data_preprocess/gsm8k.py --local_dir ~/data/gsm8k --local_dataset_path path/to/data

Writes <local_dir>/train.parquet and <local_dir>/test.parquet. Each prompt asks for the final
answer after "####"; the ground truth is the number after "####" in the reference answer.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from verl.utils.dataset.records import LocalRecord, convert_splits, require_fields
from verl.utils.dataset.schema import DatasetError, make_row, where

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = 'Think step by step, then give the final answer as a number after "####".'
_FINAL = re.compile(r"#### (\-?[0-9\.\,]+)")


def final_answer(answer: str, record: LocalRecord) -> str:
    """The number after '####' in a GSM8K reference answer, without thousands separators."""
    found = _FINAL.search(answer)
    if found is None:
        raise DatasetError(
            f"{where(record.file, record.row, 'answer')}: no '#### <number>' final answer in {answer[-80:]!r}"
        )
    return found.group(1).replace(",", "").rstrip(".")


def to_row(record: LocalRecord, split: str, index: int) -> dict:
    require_fields(record.data, ("question", "answer"), record.file, record.row)
    question, answer = record.data["question"], record.data["answer"]
    return make_row(
        DATA_SOURCE,
        f"{question} {INSTRUCTION}",
        "math",
        final_answer(answer, record),
        split,
        index,
        extra_info={"question": question, "answer": answer},
    )


def main(argv: list[str] | None = None) -> dict[str, Path]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--local_dir", default="~/data/gsm8k", help="folder to write train/test.parquet to")
    parser.add_argument(
        "--local_dataset_path", default=None, help="read this folder (or file) instead of the hub"
    )
    args = parser.parse_args(argv)
    return convert_splits(to_row, args.local_dir, args.local_dataset_path, (DATA_SOURCE, "main"))


if __name__ == "__main__":
    main()
