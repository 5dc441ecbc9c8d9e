"""The one row schema of an RL prompt dataset, shared by every preprocessing script and the loader.

A row (one prompt) is a dict with these columns::

    data_source   str        which dataset the row comes from; picks the reward scorer
    prompt        list       chat messages: [{"role": "user", "content": "..."}, ...]
    ability       str        task category ("math", "arithmetic", ...)
    reward_model  dict       {"style": "rule", "ground_truth": <str | number | dict | list>}
    extra_info    dict       {"split": "train" | "test", "index": int, ...any extra fields}

Preprocessing scripts build rows with :func:`make_row` and write them with :func:`write_splits`;
:class:`verl.utils.dataset.rl_dataset.RLHFDataset` checks every row with :func:`validate_row`
when it loads a file, so a malformed dataset fails before the first training step with an
error that names the file, the row and the column.
"""

from __future__ import annotations

import difflib
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from verl.utils.errors import UserInputError

__all__ = [
    "REQUIRED_COLUMNS",
    "DatasetError",
    "make_row",
    "normalize_value",
    "validate_columns",
    "validate_row",
    "where",
    "write_parquet",
    "write_splits",
]

REQUIRED_COLUMNS = ("data_source", "prompt", "reward_model")
"""Columns every row must have (``prompt`` and ``data_source`` follow data.prompt_key/reward_fn_key)."""

OPTIONAL_COLUMNS = ("ability", "extra_info")
"""Columns the schema defines but the loader does not insist on (older datasets may lack them)."""


class DatasetError(UserInputError, ValueError):
    """A dataset file is unreadable or a row breaks the schema; the message names file, row, column."""

    kind = "data"


def where(file: str, row: int | None = None, column: str | None = None) -> str:
    """Location prefix for error messages: ``file, row 3, column 'prompt'``."""
    parts = [str(file)]
    if row is not None:
        parts.append(f"row {row}")
    if column is not None:
        parts.append(f"column {column!r}")
    return ", ".join(parts)


def make_row(
    data_source: str,
    prompt: str | list[dict[str, str]],
    ability: str,
    ground_truth: Any,
    split: str,
    index: int,
    *,
    style: str = "rule",
    extra_info: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One dataset row in the schema; a plain string prompt becomes a single user message."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    info = {"split": split, "index": int(index)}
    info.update(extra_info or {})
    record = {
        "data_source": data_source,
        "prompt": messages,
        "ability": ability,
        "reward_model": {"style": style, "ground_truth": ground_truth},
        "extra_info": info,
    }
    validate_row(record, file="<make_row>", row=int(index))
    return record


def normalize_value(value: Any) -> Any:
    """Turn numpy arrays/scalars that parquet readers produce into plain lists/dicts/scalars."""
    if isinstance(value, np.ndarray):
        return [normalize_value(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return {k: normalize_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [normalize_value(v) for v in value]
    return value


def validate_columns(columns: Iterable[str], file: str, required: Iterable[str]) -> None:
    """Raise ``DatasetError`` naming each missing column, with close matches for misnamed ones."""
    have = list(columns)
    for column in required:
        if column in have:
            continue
        close = difflib.get_close_matches(column, have, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise DatasetError(f"{where(file, column=column)}: missing column; the file has {sorted(have)}{hint}")


def _check_messages(messages: Any, loc: str) -> None:
    if not isinstance(messages, list) or not messages:
        raise DatasetError(
            f"{loc}: expected a non-empty list of chat messages like "
            f"[{{'role': 'user', 'content': '...'}}], got {type(messages).__name__} {_short(messages)}"
        )
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise DatasetError(
                f"{loc}: message {i} must be a dict with 'role' and 'content', got {_short(message)}"
            )
        for key in ("role", "content"):
            if not isinstance(message.get(key), str):
                raise DatasetError(
                    f"{loc}: message {i} needs a string {key!r}, got {_short(message.get(key))}"
                )


def _check_reward_model(reward_model: Any, loc: str) -> None:
    if not isinstance(reward_model, Mapping):
        raise DatasetError(
            f"{loc}: expected a dict {{'style': ..., 'ground_truth': ...}}, got {_short(reward_model)}"
        )
    if reward_model.get("ground_truth") is None:
        raise DatasetError(f"{loc}: missing ground truth (reward_model['ground_truth'] is absent or null)")


def validate_row(
    record: Mapping[str, Any],
    file: str,
    row: int,
    prompt_key: str = "prompt",
    data_source_key: str = "data_source",
) -> None:
    """Raise ``DatasetError`` (file, row, column) unless ``record`` follows the schema."""
    _check_messages(record.get(prompt_key), where(file, row, prompt_key))
    source = record.get(data_source_key)
    if not isinstance(source, str) or not source:
        raise DatasetError(
            f"{where(file, row, data_source_key)}: expected a non-empty string, got {_short(source)}"
        )
    _check_reward_model(record.get("reward_model"), where(file, row, "reward_model"))
    extra = record.get("extra_info")
    if extra is not None and not isinstance(extra, Mapping):
        raise DatasetError(f"{where(file, row, 'extra_info')}: expected a dict or null, got {_short(extra)}")
    ability = record.get("ability")
    if ability is not None and not isinstance(ability, str):
        raise DatasetError(f"{where(file, row, 'ability')}: expected a string, got {_short(ability)}")


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def write_parquet(rows: list[dict[str, Any]], path: str | os.PathLike) -> Path:
    """Write ``rows`` to ``path`` atomically (a temporary file in the same folder, then a rename)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(rows)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".tmp-{path.name}-")
    os.close(fd)
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def write_splits(splits: Mapping[str, list[dict[str, Any]]], local_dir: str | os.PathLike) -> dict[str, Path]:
    """Write ``{split: rows}`` as ``<local_dir>/<split>.parquet``; returns the paths by split."""
    out = {}
    for split, rows in splits.items():
        if not rows:
            raise DatasetError(f"split {split!r} has no rows; nothing to write to {local_dir}")
        out[split] = write_parquet(rows, Path(local_dir).expanduser() / f"{split}.parquet")
    return out


def generated_splits_main(
    argv: list[str] | None,
    description: str,
    local_dir: str,
    test_size: int,
    make_rows: Callable[[int, int, str], list[dict[str, Any]]],
) -> dict[str, Path]:
    """The command line of a preprocessing script whose problems are generated from a seed:
    ``--local_dir``, ``--train_size``, ``--test_size``, ``--seed``; ``make_rows(size, seed, split)``
    builds a split (the test split from ``seed + 1``: a problem stream of its own). Writes both
    splits and returns their paths."""
    import argparse

    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--local_dir", default=local_dir, help="folder to write train/test.parquet to")
    parser.add_argument("--train_size", type=int, default=5000, help="training problems")
    parser.add_argument("--test_size", type=int, default=test_size, help="test problems")
    parser.add_argument("--seed", type=int, default=0, help="seed of the training split (test uses seed + 1)")
    args = parser.parse_args(argv)
    rows = {
        "train": make_rows(args.train_size, args.seed, "train"),
        "test": make_rows(args.test_size, args.seed + 1, "test"),
    }
    paths = write_splits(rows, args.local_dir)
    for split, path in paths.items():
        print(f"wrote {len(rows[split])} {split} rows to {path}")
    return paths
