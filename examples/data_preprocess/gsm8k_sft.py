"""GSM8K to parquet chats for supervised fine-tuning (``python -m verl.trainer.sft_trainer``).

Each row has a ``messages`` column: the question with the same instruction as the RL data
(gsm8k.py), then the reference solution as the assistant's answer, which ends with
"#### <number>", so a model fine-tuned on it answers in the format the RL reward reads.

Offline, from a folder with train*.jsonl / test*.jsonl (or .parquet) files that have
`question` and `answer` fields (e.g. the `grade_school_math/data` folder of openai's repository):

    python examples/data_preprocess/gsm8k_sft.py --local_dir ~/data/gsm8k_sft --local_dataset_path path/to/data

From the Hugging Face hub (needs network and `pip install datasets`): leave out --local_dataset_path.
Then: python -m verl.trainer.sft_trainer data.train_files=~/data/gsm8k_sft/train.parquet
data.val_files=~/data/gsm8k_sft/test.parquet model.path=... (see the README's SFT section).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from gsm8k import DATA_SOURCE, INSTRUCTION, final_answer

from verl.utils.dataset.records import LocalRecord, convert_splits, require_fields


def to_chat(record: LocalRecord, split: str, index: int) -> dict:
    require_fields(record.data, ("question", "answer"), record.file, record.row)
    question, answer = record.data["question"], record.data["answer"]
    return {
        "messages": [
            {"role": "user", "content": f"{question} {INSTRUCTION}"},
            {"role": "assistant", "content": answer},
        ],
        "data_source": DATA_SOURCE,
        "ground_truth": final_answer(answer, record),  # checks the '#### <number>' ending
        "extra_info": {"split": split, "index": index},
    }


def main(argv: list[str] | None = None) -> dict[str, Path]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--local_dir", default="~/data/gsm8k_sft", help="folder to write train/test.parquet to"
    )
    parser.add_argument(
        "--local_dataset_path", default=None, help="read this folder (or file) instead of the hub"
    )
    args = parser.parse_args(argv)
    return convert_splits(
        to_chat, args.local_dir, args.local_dataset_path, (DATA_SOURCE, "main"), what="chats"
    )


if __name__ == "__main__":
    main()
