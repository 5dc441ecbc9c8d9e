"""The built-in arithmetic task of the embedded default (``data_source="arith"``).

Each prompt is a single user message ``"a+b="`` with ``a, b`` drawn uniformly from
``[low, high]`` (single digits by default) and the ground truth is the decimal sum, e.g.
``"3+4="`` -> ``"7"``. The prompt has no instruction text on purpose: the embedded tiny model's
vocabulary is only digits, ``+``, ``=``, padding and EOS. The scorer is
:func:`verl.utils.reward_score.arith.compute_score` (exact match after stripping whitespace).
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

from verl.utils.dataset.schema import make_row, write_splits

__all__ = [
    "ARITH_DATA_SOURCE",
    "make_arith_rows",
    "write_arith_parquet",
    "write_arith_preference_parquet",
    "write_arith_sft_parquet",
]

ARITH_DATA_SOURCE = "arith"


def make_arith_rows(
    num_rows: int, seed: int, split: str, low: int = 0, high: int = 9
) -> list[dict[str, Any]]:
    """``num_rows`` schema rows of ``a+b=`` with operands in ``[low, high]``; deterministic in
    ``(seed, split)`` so train and test draw different streams from one seed."""
    if num_rows < 0:
        raise ValueError(f"num_rows must be >= 0, got {num_rows}")
    if not 0 <= low <= high:
        raise ValueError(f"operand range must satisfy 0 <= low <= high, got low={low}, high={high}")
    # A string seed is hashed with SHA-512 by `random`, so the stream is stable across processes.
    rng = random.Random(f"arith:{seed}:{split}")
    rows = []
    for index in range(num_rows):
        a, b = rng.randint(low, high), rng.randint(low, high)
        rows.append(make_row(ARITH_DATA_SOURCE, f"{a}+{b}=", "arithmetic", str(a + b), split, index))
    return rows


def write_arith_parquet(
    local_dir: str | os.PathLike,
    train_size: int,
    test_size: int,
    seed: int,
    low: int = 0,
    high: int = 9,
) -> tuple[Path, Path]:
    """Write ``train.parquet`` and ``test.parquet`` under ``local_dir`` (each atomically: a temporary
    file, then a rename); returns ``(train_path, test_path)``."""
    paths = write_splits(
        {
            "train": make_arith_rows(train_size, seed, "train", low, high),
            "test": make_arith_rows(test_size, seed, "test", low, high),
        },
        local_dir,
    )
    return paths["train"], paths["test"]


def write_arith_sft_parquet(
    local_dir: str | os.PathLike, train_size: int, test_size: int, seed: int
) -> tuple[Path, Path]:
    """Write ``sft_train.parquet`` and ``sft_test.parquet``: chats ``[user: "a+b=", assistant: "s"]``
    (the ``messages`` column of the SFT trainer) drawn from streams of their own (split ``sft_*``)."""
    paths = [
        _write_chats(local_dir, size, seed, split)
        for split, size in (("sft_train", train_size), ("sft_test", test_size))
    ]
    return paths[0], paths[1]


def write_arith_warmup_parquet(local_dir: str | os.PathLike, size: int, seed: int) -> Path:
    """Write ``sft.parquet``: the chats of the built-in model's warm-up (split ``sft``; the same
    ``messages`` column as :func:`write_arith_sft_parquet`, from a stream of its own)."""
    return _write_chats(local_dir, size, seed, "sft")


def _write_chats(local_dir: str | os.PathLike, size: int, seed: int, split: str) -> Path:
    from verl.utils.dataset.schema import write_parquet

    rows = [
        {
            "messages": [
                {"role": "user", "content": row["prompt"][0]["content"]},
                {"role": "assistant", "content": row["reward_model"]["ground_truth"]},
            ]
        }
        for row in make_arith_rows(size, seed, split)
    ]
    return write_parquet(rows, Path(local_dir).expanduser() / f"{split}.parquet")


def write_arith_preference_parquet(
    local_dir: str | os.PathLike, train_size: int, test_size: int, seed: int
) -> tuple[Path, Path]:
    """Write ``pref_train.parquet`` and ``pref_test.parquet``: preference pairs for reward-model
    training, ``prompt`` ``[user: "a+b="]``, ``chosen`` the sum, ``rejected`` a near miss (the sum
    off by 1 to 3, or its digits swapped), drawn from streams of their own (split ``pref_*``)."""
    from verl.utils.dataset.schema import write_parquet

    paths = []
    for split, size in (("pref_train", train_size), ("pref_test", test_size)):
        rng = random.Random(f"arith-pref:{seed}:{split}")
        rows = []
        for row in make_arith_rows(size, seed, split):
            answer = int(row["reward_model"]["ground_truth"])
            rows.append(
                {
                    "prompt": [{"role": "user", "content": row["prompt"][0]["content"]}],
                    "chosen": str(answer),
                    "rejected": str(_near_miss(answer, rng)),
                }
            )
        paths.append(write_parquet(rows, Path(local_dir).expanduser() / f"{split}.parquet"))
    return paths[0], paths[1]


def _near_miss(answer: int, rng: random.Random) -> int:
    """A wrong answer close to ``answer``: its two digits swapped (when that differs), else off by 1 to 3."""
    swapped = int(str(answer)[::-1]) if answer >= 10 else answer
    if swapped != answer and rng.random() < 0.25:
        return swapped
    offset = rng.choice([-3, -2, -1, 1, 2, 3])
    return answer + offset if answer + offset >= 0 else answer - offset
