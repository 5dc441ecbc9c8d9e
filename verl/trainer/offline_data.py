"""The parquet files of the offline entry points (``main_generation_server``, ``main_eval``).

Both read whole files into one ``pandas`` frame, as verl does, and fail with a
:class:`~verl.utils.dataset.schema.DatasetError` that names the config key, the file, and the row or
column at fault (the entry points print it as one line). The generation entry writes its result
with :func:`write_parquet_atomically`: a reader never sees a half-written file, and a failed run
leaves the previous file in place.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from verl.utils.dataset.schema import DatasetError, validate_columns

__all__ = [
    "as_list",
    "check_sequence",
    "file_list",
    "read_parquet_files",
    "require_column",
    "row_location",
    "write_parquet_atomically",
]


def file_list(files: Any) -> list[str]:
    """``files`` (one path or a list of paths, as ``data.train_files`` takes) as a list."""
    return [str(files)] if isinstance(files, str | os.PathLike) else [str(f) for f in files]


def read_parquet_files(files: Any, key: str) -> pd.DataFrame:
    """The rows of every file of ``files``, in order, as one frame with a fresh index.

    ``key`` is the config key that named the files; every error message starts with it."""
    frames = []
    for file in file_list(files):
        path = Path(file).expanduser()
        if not path.exists():
            raise DatasetError(f"{key}: {file}: no such file")
        try:
            frames.append(pd.read_parquet(path))
        except (OSError, ValueError) as error:  # pyarrow's ArrowInvalid is a ValueError
            raise DatasetError(f"{key}: {file}: not a readable parquet file ({error})") from None
    frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if frame.empty:
        raise DatasetError(f"{key}: {', '.join(file_list(files)) or 'no file'}: no rows to read")
    return frame


def require_column(frame: pd.DataFrame, column: str, key: str, files: Any) -> None:
    """Fail unless ``frame`` has ``column`` (the value of config key ``key``), naming the files."""
    try:
        validate_columns(frame.columns, ", ".join(file_list(files)), [column])
    except DatasetError as error:
        raise DatasetError(f"{key}={column}: {error}") from None


def write_parquet_atomically(frame: pd.DataFrame, path: str | os.PathLike) -> Path:
    """Write ``frame`` to ``path`` (its folder is created): a temporary file next to it, then a rename."""
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".tmp-{path.name}-")
    os.close(fd)
    try:
        frame.to_parquet(tmp, index=False)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def as_list(value: Any) -> list[Any]:
    """A parquet list cell (a numpy array) as a plain list; other values unchanged."""
    return value.tolist() if hasattr(value, "tolist") and not isinstance(value, str) else value


def row_location(key: str, row: int, column: str) -> str:
    """``data.path row 3, column 'responses'``: where a bad cell is, for error messages."""
    return f"{key} row {row}, column {column!r}"


def check_sequence(value: Any, location: str, what: str) -> Sequence[Any]:
    """``value`` as a non-empty list, or a :class:`DatasetError` saying ``what`` was expected at ``location``."""
    value = as_list(value)
    if not isinstance(value, list) or not value:
        raise DatasetError(f"{location}: expected {what}, got {value!r:.80}")
    return value
