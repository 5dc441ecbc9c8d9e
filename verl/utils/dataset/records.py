"""Read raw records (jsonl or parquet) for the preprocessing scripts' ``--local_dataset_path``.

A local dataset is either one file or a folder. In a folder, the files of a split are those
whose name starts with the split's name (``train.jsonl``, ``test-00000-of-00001.parquet``),
searched recursively, so both the GSM8K GitHub layout (``data/train.jsonl``) and a Hugging
Face parquet export (``main/train-00000-of-00001.parquet``) work unchanged.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple

from verl.utils.dataset.schema import DatasetError, normalize_value, where, write_splits

__all__ = [
    "LocalRecord",
    "convert_splits",
    "find_split_files",
    "load_hub_splits",
    "load_local_splits",
    "read_records",
    "require_fields",
]

SUFFIXES = (".jsonl", ".json", ".parquet")


class LocalRecord(NamedTuple):
    """One raw record and where it came from (for error messages)."""

    file: str
    row: int
    data: dict[str, Any]


def read_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    """All rows of a ``.jsonl`` / ``.json`` (a list, or one object per line) or ``.parquet`` file."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise DatasetError(f"{path}: no such file")
    if path.stat().st_size == 0:
        raise DatasetError(f"{path}: the file is empty")
    if path.suffix == ".parquet":
        return _read_parquet_records(path)
    if path.suffix in (".jsonl", ".json"):
        return _read_json_records(path)
    raise DatasetError(f"{path}: unsupported file type {path.suffix!r}; expected one of {list(SUFFIXES)}")


def _read_parquet_records(path: Path) -> list[dict[str, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as err:
        raise DatasetError(f"{path}: not a readable parquet file ({err})") from err
    return [normalize_value(r) for r in table.to_pylist()]


def _read_json_records(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            records = json.loads(text)
        except json.JSONDecodeError as err:
            raise DatasetError(f"{path}: invalid JSON ({err})") from err
        return [_as_record(r, path, i) for i, r in enumerate(records)]
    records = []
    for i, line in enumerate(text.splitlines()):
        if not line.strip():
            continue
        try:
            records.append(_as_record(json.loads(line), path, len(records)))
        except json.JSONDecodeError as err:
            raise DatasetError(f"{path}, line {i + 1}: invalid JSON ({err.msg})") from err
    return records


def _as_record(value: Any, path: Path, row: int) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise DatasetError(f"{where(str(path), row)}: expected a JSON object, got {type(value).__name__}")
    return value


def find_split_files(folder: str | os.PathLike, split: str) -> list[Path]:
    """Files under ``folder`` (recursively) whose name starts with ``split`` and has a known suffix."""
    folder = Path(folder).expanduser()
    found = [
        p
        for p in sorted(folder.rglob(f"{split}*"))
        if p.is_file() and p.suffix in SUFFIXES and not p.name.startswith(".")
    ]
    return found


def load_local_splits(path: str | os.PathLike, splits: Iterable[str]) -> dict[str, list[LocalRecord]]:
    """Records by split from a folder (files named after each split) or from a single file,
    which can only give one split."""
    path = Path(path).expanduser()
    splits = list(splits)
    if path.is_file():
        if len(splits) != 1:
            raise DatasetError(f"{path}: a single file gives one split; pass a folder with {splits} files")
        files_by_split = {splits[0]: [path]}
    elif path.is_dir():
        files_by_split = {split: find_split_files(path, split) for split in splits}
    else:
        raise DatasetError(f"{path}: no such file or folder")
    out: dict[str, list[LocalRecord]] = {}
    for split, files in files_by_split.items():
        if not files:
            raise DatasetError(f"{path}: no {split}*.jsonl or {split}*.parquet file for split {split!r}")
        out[split] = [LocalRecord(str(f), i, r) for f in files for i, r in enumerate(read_records(f))]
    return out


def load_hub_splits(name: str, config: str | None, splits: Iterable[str]) -> dict[str, list[LocalRecord]]:
    """Records by split from the Hugging Face hub (needs network and ``pip install datasets``)."""
    try:
        import datasets
    except ImportError as err:
        raise ImportError(
            "reading from the hub needs the 'datasets' package: pip install datasets "
            "(or pass --local_dataset_path to read local files)"
        ) from err
    loaded = datasets.load_dataset(name, config) if config else datasets.load_dataset(name)
    out = {}
    for split in splits:
        if split not in loaded:
            raise DatasetError(f"hub dataset {name!r} has no split {split!r}; it has {sorted(loaded)}")
        out[split] = [LocalRecord(f"{name}[{split}]", i, dict(r)) for i, r in enumerate(loaded[split])]
    return out


def require_fields(record: dict[str, Any], fields: Iterable[str], file: str, row: int) -> None:
    """Raise ``DatasetError`` naming the first field that is missing or not a non-empty string."""
    for name in fields:
        value = record.get(name)
        if name not in record:
            raise DatasetError(f"{where(file, row, name)}: missing field; the row has {sorted(record)}")
        if not isinstance(value, str) or not value.strip():
            raise DatasetError(f"{where(file, row, name)}: expected a non-empty string, got {value!r:.80}")


def convert_splits(
    to_row: Callable[[LocalRecord, str, int], dict[str, Any]],
    local_dir: str,
    local_dataset_path: str | None,
    hub: tuple[str, str | None],
    splits: Iterable[str] = ("train", "test"),
    what: str = "rows",
) -> dict[str, Path]:
    """What a preprocessing script does: read ``splits`` from ``local_dataset_path`` (else the hub
    dataset ``hub`` = (name, config)), turn each record into a row with ``to_row(record, split,
    index)``, write ``<local_dir>/<split>.parquet`` and say how many ``what`` each holds."""
    if local_dataset_path:
        raw = load_local_splits(local_dataset_path, splits)
    else:
        raw = load_hub_splits(*hub, splits)
    rows = {split: [to_row(r, split, i) for i, r in enumerate(records)] for split, records in raw.items()}
    paths = write_splits(rows, local_dir)
    for split, path in paths.items():
        print(f"wrote {len(rows[split])} {split} {what} to {path}")
    return paths
