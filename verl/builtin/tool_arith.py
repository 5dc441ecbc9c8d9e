"""The built-in tool task (``data_source="tool_arith"``): multiply two 3-digit numbers.

Each prompt is a single user message ``"a*b="`` with ``a, b`` drawn uniformly from ``[317, 999]``
(so that every product has six digits: a fixed layout the tiny model copies more easily); the
ground truth is the decimal product, e.g. ``"417*356="`` -> ``"148452"``. The built-in tiny
model cannot multiply in its head; it succeeds by calling the calculator tool and copying the
answer (see :mod:`verl.builtin.tool_task`). The scorer is
:func:`verl.utils.reward_score.tool_arith.compute_score`.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

from verl.utils.dataset.schema import make_row, write_splits

__all__ = ["TOOL_ARITH_DATA_SOURCE", "make_tool_arith_rows", "write_tool_arith_parquet"]

TOOL_ARITH_DATA_SOURCE = "tool_arith"
LOW, HIGH = 317, 999


def make_tool_arith_rows(num_rows: int, seed: int, split: str) -> list[dict[str, Any]]:
    """``num_rows`` schema rows of ``a*b=``; deterministic in ``(seed, split)``."""
    if num_rows < 0:
        raise ValueError(f"num_rows must be >= 0, got {num_rows}")
    # A string seed is hashed with SHA-512 by `random`, so the stream is stable across processes.
    rng = random.Random(f"tool_arith:{seed}:{split}")
    rows = []
    for index in range(num_rows):
        a, b = rng.randint(LOW, HIGH), rng.randint(LOW, HIGH)
        rows.append(make_row(TOOL_ARITH_DATA_SOURCE, f"{a}*{b}=", "tool_use", str(a * b), split, index))
    return rows


def write_tool_arith_parquet(
    local_dir: str | os.PathLike, train_size: int, test_size: int, seed: int
) -> tuple[Path, Path]:
    """Write ``train.parquet`` and ``test.parquet`` under ``local_dir`` (atomically); returns the paths."""
    paths = write_splits(
        {
            "train": make_tool_arith_rows(train_size, seed, "train"),
            "test": make_tool_arith_rows(test_size, seed, "test"),
        },
        local_dir,
    )
    return paths["train"], paths["test"]
