"""The functions :class:`~verl.protocol.DataProto` is built from, and verl's module-level ones.

Two kinds, both importable from :mod:`verl.protocol` as well:

* functions of a batch's parts, which know nothing of ``DataProto``: the rule that merges the parts'
  ``meta_info`` on concatenation (:func:`merge_meta_info`), the unions that refuse a key held with two
  different values, equality of columns, and the encoding of tensors for pickling;
* functions of whole batches, verl's public module functions (:func:`pad_dataproto_to_divisor`,
  :func:`fold_batch_dim`, :func:`all_gather_data_proto`, ...). They reach a batch through its
  attributes and build new ones with ``type(data)``, so this module need not import the class (which
  imports this module).
"""

from __future__ import annotations

import math
import os
import pickle
import tempfile
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist
from tensordict import NonTensorData, NonTensorStack, TensorDict
from torch.utils.data import DataLoader

if TYPE_CHECKING:
    from verl.protocol import DataProto

__all__ = [
    "DataProtoConfig",
    "DataProtoError",
    "all_gather_data_proto",
    "fold_batch_dim",
    "list_of_dict_to_dict_of_list",
    "merge_meta_info",
    "pad_dataproto_to_divisor",
    "unfold_batch_dim",
    "unfold_column_chunks",
    "union_numpy_dict",
    "union_tensor_dict",
    "unpad_dataproto",
]

METRICS = "metrics"
"""The ``meta_info`` key whose values are gathered, not compared, when batches are concatenated."""


class DataProtoError(ValueError):
    """A batch operation got inputs it cannot combine (sizes, keys, types)."""


class _AutoPadding(type):
    """Makes ``DataProtoConfig.auto_padding`` a class-level switch that also reads the environment."""

    _enabled = False

    @property
    def auto_padding(cls) -> bool:
        return cls._enabled or os.getenv("VERL_AUTO_PADDING", "FALSE").upper() in ("TRUE", "1")

    @auto_padding.setter
    def auto_padding(cls, enabled: bool) -> None:
        if not isinstance(enabled, bool):
            raise TypeError(f"DataProtoConfig.auto_padding must be a bool, got {enabled!r}")
        cls._enabled = enabled


class DataProtoConfig(metaclass=_AutoPadding):
    """Process-wide switch: with ``DataProtoConfig.auto_padding = True`` (or ``VERL_AUTO_PADDING=1``)
    every batch may be chunked into parts of unequal size; one batch alone asks for it with
    ``DataProto.from_dict(..., auto_padding=True)``, which sets ``meta_info[auto_padding_key]``."""

    auto_padding_key = "_verl_auto_padding"


# ---------------------------------------------------------------------- columns and values
def as_column(values: Any, key: str) -> np.ndarray:
    """``values`` as a column of ``non_tensor_batch``: an array whose first dimension is the rows (a
    list becomes a 1-D object array, whatever its items are)."""
    if isinstance(values, np.ndarray):
        if values.ndim == 0:
            raise DataProtoError(f"non_tensor_batch[{key!r}] must have a row dimension, got a 0-d array")
        return values
    out = np.empty(len(values), dtype=object)
    out[:] = list(values)
    return out


def values_equal(a: Any, b: Any) -> bool:
    """``a == b`` reduced to one bool (arrays and tensors compared element-wise); NaN equals NaN."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return columns_equal(a, b)
    try:
        result = a == b
        if isinstance(result, np.ndarray | torch.Tensor):
            return bool(result.all())
        return bool(result)
    except Exception:  # values that cannot be compared (e.g. tensors of different shapes)
        return a is b


def columns_equal(a: np.ndarray, b: np.ndarray) -> bool:
    if a.shape != b.shape:
        return False
    if a.dtype != object and b.dtype != object:
        return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc" and b.dtype.kind in "fc"))
    return all(values_equal(x, y) for x, y in zip(a.flat, b.flat))


def list_of_dict_to_dict_of_list(list_of_dict: Iterable[dict]) -> dict[str, list]:
    """``[{"a": 1}, {"a": 2, "b": 3}]`` -> ``{"a": [1, 2], "b": [3]}``: each key's values in order.

    verl takes the keys of the first dict and refuses others; here a key first seen in a later dict
    is added (ranks may report different metrics, e.g. an agent loop's tool counts)."""
    out: dict[str, list] = {}
    for item in list_of_dict:
        for key, value in item.items():
            out.setdefault(key, []).append(value)
    return out


def merge_meta_info(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``meta_info`` of concatenated batches. Each part's ``"metrics"`` (a dict, or a list of
    dicts) is gathered into one dict of lists, one entry per reporting part (verl's rule); any other
    key must hold the same value in every part that has it."""
    merged: dict[str, Any] = {}
    reported: list[dict] = []
    for part in parts:
        for key, value in part.items():
            if key == METRICS:
                if value is not None:
                    reported.extend(value if isinstance(value, list) else [value])
            elif key not in merged:
                merged[key] = value
            elif not values_equal(merged[key], value):
                raise DataProtoError(
                    f"concat: meta_info[{key!r}] differs between the parts ({merged[key]!r} and {value!r}); "
                    f"make it equal, drop it, or report it under meta_info[{METRICS!r}]"
                )
    if reported:
        merged[METRICS] = list_of_dict_to_dict_of_list(reported)
    return merged


# ---------------------------------------------------------------------- unions (in place)
def union_tensor_dict(tensor_dict1: TensorDict, tensor_dict2: TensorDict) -> TensorDict:
    """``tensor_dict1`` with the keys of ``tensor_dict2`` added; a key both hold must be equal."""
    if tensor_dict1.batch_size != tensor_dict2.batch_size:
        raise DataProtoError(
            f"union needs equal batch sizes, got {tuple(tensor_dict1.batch_size)} and "
            f"{tuple(tensor_dict2.batch_size)}"
        )
    for key, value in tensor_dict2.items():
        if key in tensor_dict1.keys() and not torch.equal(tensor_dict1[key], value):
            raise DataProtoError(f"union: batch key {key!r} exists in both with different values")
        tensor_dict1[key] = value
    return tensor_dict1


def union_numpy_dict(dict1: dict[str, np.ndarray], dict2: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``dict1`` with the columns of ``dict2`` added; a key both hold must be equal (NaN equals NaN)."""
    return _union_into(dict1, dict2, "non_tensor_batch")


def union_meta_info(dict1: dict[str, Any], dict2: dict[str, Any]) -> dict[str, Any]:
    return _union_into(dict1, dict2, "meta_info")


def _union_into(mine: dict, theirs: dict, part: str) -> dict:
    for key, value in theirs.items():
        if key in mine and not values_equal(mine[key], value):
            raise DataProtoError(f"union: {part} key {key!r} exists in both with different values")
        mine[key] = value
    return mine


# ---------------------------------------------------------------------- whole batches
def pad_dataproto_to_divisor(data: DataProto, size_divisor: int) -> tuple[DataProto, int]:
    """``data`` with copies of its first rows appended so its length divides by ``size_divisor``,
    and how many were appended."""
    return data.pad_to_divisor(size_divisor)


def unpad_dataproto(data: DataProto, pad_size: int) -> DataProto:
    """``data`` without its last ``pad_size`` rows (undoes :func:`pad_dataproto_to_divisor`)."""
    return data.unpad(pad_size)


def fold_batch_dim(data: DataProto, new_batch_size: int) -> DataProto:
    """Rows ``[B, ...]`` regrouped as ``[new_batch_size, B // new_batch_size, ...]``: consecutive rows
    become one row (tensors and columns alike)."""
    n = len(data)
    if new_batch_size <= 0 or n % new_batch_size:
        raise DataProtoError(f"cannot fold {n} rows into {new_batch_size} rows")
    batch = data.batch.reshape(new_batch_size, -1) if data.batch is not None else None
    if batch is not None:
        batch.auto_batch_size_(batch_dims=1)
    columns = {k: v.reshape(new_batch_size, -1, *v.shape[1:]) for k, v in data.non_tensor_batch.items()}
    return type(data)(batch=batch, non_tensor_batch=columns, meta_info=data.meta_info)


def unfold_batch_dim(data: DataProto, batch_dims: int = 2) -> DataProto:
    """The inverse of :func:`fold_batch_dim`: the first ``batch_dims`` dimensions become the rows."""
    batch = data.batch
    if batch is not None:
        batch = batch.copy()  # shallow: the batch size is set below, not on the caller's batch
        batch.auto_batch_size_(batch_dims=batch_dims)
        batch = batch.reshape(-1)
    columns = {k: v.reshape(-1, *v.shape[batch_dims:]) for k, v in data.non_tensor_batch.items()}
    return type(data)(batch=batch, non_tensor_batch=columns, meta_info=data.meta_info)


def unfold_column_chunks(data: DataProto, n_split: int, split_keys: Iterable[str] | None = None) -> DataProto:
    """Each row becomes ``n_split`` rows: a key in ``split_keys`` has its second dimension cut into
    ``n_split`` pieces, one per new row; every other key is repeated (interleaved)."""
    split_keys = set(split_keys or ())

    def unfold(key: str, value: Any, repeat: Any) -> Any:
        if key in split_keys:
            return value.reshape(value.shape[0] * n_split, value.shape[1] // n_split, *value.shape[2:])
        return repeat(value)

    batch = None
    if data.batch is not None:
        tensors = {
            k: unfold(k, v, lambda t: t.repeat_interleave(n_split, dim=0)) for k, v in data.batch.items()
        }
        batch = TensorDict(tensors, batch_size=[len(data) * n_split], device=data.batch.device)
    columns = {
        k: unfold(k, v, lambda a: np.repeat(a, n_split, axis=0)) for k, v in data.non_tensor_batch.items()
    }
    return type(data)(batch=batch, non_tensor_batch=columns, meta_info=dict(data.meta_info))


def mini_batches(
    data: DataProto, mini_batch_size: int, epochs: int, seed: int | None, dataloader_kwargs: dict | None
) -> Iterator[DataProto]:
    """:meth:`DataProto.make_iterator`: a torch ``DataLoader`` over the row indices with verl's
    arguments, so the (seeded) order is the one verl's loader over the rows gives."""
    if mini_batch_size <= 0 or len(data) % mini_batch_size:
        raise DataProtoError(
            f"make_iterator: {len(data)} rows do not divide into mini-batches of {mini_batch_size}"
        )
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    kwargs = dataloader_kwargs or {}
    loader = DataLoader(
        range(len(data)), batch_size=mini_batch_size, collate_fn=list, generator=generator, **kwargs
    )
    for _ in range(epochs):
        for rows in loader:
            part = data.select_idxs(rows)
            part.meta_info = data.meta_info
            yield part


def all_gather_data_proto(data: DataProto, process_group: dist.ProcessGroup | None) -> None:
    """Replace ``data``'s rows, in place, by every rank's rows of ``process_group`` in rank order
    (``meta_info`` stays this rank's). Sent as Python objects, so any backend and device works; verl
    gathers the tensors with a collective on the device instead."""
    device = data.batch.device if data.batch is not None else None
    own = type(data)(batch=data.batch, non_tensor_batch=data.non_tensor_batch)
    shares: list = [None] * dist.get_world_size(group=process_group)
    dist.all_gather_object(shares, own, group=process_group)  # pickled through CPU numpy arrays
    gathered = type(data).concat(shares)
    data.batch, data.non_tensor_batch = gathered.batch, gathered.non_tensor_batch
    if device is not None:
        data.to(device)


# ---------------------------------------------------------------------- other forms of a batch
def to_tensordict(data: DataProto) -> TensorDict:
    """:meth:`DataProto.to_tensordict`: tensors as they are, each column as a ``NonTensorStack``,
    each ``meta_info`` entry as ``NonTensorData``."""
    entries: dict[str, Any] = dict(data.batch.items()) if data.batch is not None else {}
    parts = [set(entries), set(data.non_tensor_batch), set(data.meta_info)]
    clash = (parts[0] & parts[1]) | (parts[0] & parts[2]) | (parts[1] & parts[2])
    if clash:
        raise DataProtoError(f"to_tensordict: key(s) {sorted(clash)} appear in two parts of the batch")
    for key, column in data.non_tensor_batch.items():
        entries[key] = NonTensorStack.from_list([NonTensorData(item) for item in column])  # items as they are
    for key, value in data.meta_info.items():
        entries[key] = NonTensorData(value)
    return TensorDict(entries, batch_size=[len(data)])


def tensordict_parts(
    tensor_dict: TensorDict,
) -> tuple[dict[str, torch.Tensor], dict[str, list], dict[str, Any]]:
    """The inverse of :func:`to_tensordict`: (tensors, columns, meta_info entries)."""
    tensors, columns, meta = {}, {}, {}
    for key, value in tensor_dict.items():
        if isinstance(value, NonTensorStack):
            columns[key] = value.tolist()
        elif isinstance(value, NonTensorData):
            meta[key] = value.data
        else:
            tensors[key] = value
    return tensors, columns, meta


def save_atomically(data: Any, path: str | os.PathLike) -> None:
    """Pickle ``data`` to ``path`` through a temporary file in the same folder and a rename, so a
    reader never sees half a file."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-dataproto-")
    try:
        with os.fdopen(fd, "wb") as f:
            pickle.dump(data, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def load_pickled(path: str | os.PathLike, expected: type) -> Any:
    """The object pickled at ``path``, which must be an ``expected``."""
    with open(path, "rb") as f:
        data = pickle.load(f)
    if not isinstance(data, expected):
        raise DataProtoError(f"{path} does not hold a {expected.__name__} (found {type(data).__name__})")
    return data


def size_message(data: DataProto) -> str:
    """The memory the tensors and the columns take, in GB (verl's wording)."""
    tensors = sum(t.element_size() * t.numel() for t in data.batch.values()) if data.batch is not None else 0
    columns = sum(a.nbytes for a in data.non_tensor_batch.values())
    return f"Size of tensordict: {tensors / 1024**3} GB, size of non_tensor_batch: {columns / 1024**3} GB"


def data_info(data: DataProto) -> str:
    """One line per key: each tensor's shape, dtype and device, each column's shape and dtype, each
    ``meta_info`` value's type (nested types spelled out)."""
    lines = ["batch"]
    for key, t in data.batch.items() if data.batch is not None else []:
        lines.append(f"  {key}: {tuple(t.shape)} ({t.dtype}) {t.device}")
    lines.append("non_tensor_batch")
    lines += [f"  {key}: ndarray{a.shape} ({a.dtype})" for key, a in data.non_tensor_batch.items()]
    lines.append("meta_info")
    lines += [f"  {key}: {_type_info(v)}" for key, v in data.meta_info.items()]
    return "\n".join(lines)


def _type_info(value: Any) -> str:
    """``list[int|str]``, ``dict[str: float]``, ``ndarray(3,) (int64)``: a value's type, nested."""
    if isinstance(value, list):
        return f"list[{'|'.join(sorted({_type_info(v) for v in value[:3]})) or '...'}]"
    if isinstance(value, tuple):
        return f"tuple({', '.join(_type_info(v) for v in value)})"
    if isinstance(value, dict):
        if not value:
            return "dict"
        key, item = next(iter(value.items()))
        return f"dict[{_type_info(key)}: {_type_info(item)}]"
    if isinstance(value, np.ndarray):
        return f"ndarray{value.shape} ({value.dtype})"
    return type(value).__name__


# ---------------------------------------------------------------------- tensors through pickle
# Dtypes numpy cannot hold are moved bit-for-bit as integers of the same width.
_BITCAST = {torch.bfloat16: torch.int16, torch.float8_e4m3fn: torch.uint8, torch.float8_e5m2: torch.uint8}


def encode_tensor(t: torch.Tensor) -> tuple[np.ndarray, str | None]:
    """A CPU numpy array (pickled out of band by Ray) and the dtype to view it as, if numpy has none."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    if t.dtype in _BITCAST:
        return t.view(_BITCAST[t.dtype]).numpy(), str(t.dtype).removeprefix("torch.")
    return t.numpy(), None


def decode_tensor(packed: tuple[np.ndarray, str | None]) -> torch.Tensor:
    array, bitcast_dtype = packed
    if not array.flags.writeable:
        # Arrays read zero-copy from Ray's shared memory are read-only; torch tensors must own
        # writable memory, so copy once here (a memcpy, far cheaper than in-band pickling).
        array = array.copy()
    tensor = torch.from_numpy(array)
    if bitcast_dtype is not None:
        tensor = tensor.view(getattr(torch, bitcast_dtype))
    return tensor
