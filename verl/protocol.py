"""``DataProto``: the batch that flows between the driver and every role.

A ``DataProto`` holds three things with one common batch dimension:

* ``batch``: a ``tensordict.TensorDict`` of tensors (token ids, masks, log-probs, ...);
* ``non_tensor_batch``: a dict of 1-D numpy object arrays (``uid``, ``data_source``, ...);
* ``meta_info``: a plain dict that is not split along the batch (temperature, step, ...).

The keys that travel through the PPO dataflow are listed in :mod:`verl.keys`.

Transfer through Ray is cheap: tensors are pickled as numpy buffers, which Ray's
pickle-5 serializer moves out of band through the shared-memory object store instead
of copying them into the pickle stream.
"""

from __future__ import annotations

import copy
import os
import pickle
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

__all__ = ["DataProto", "DataProtoError", "pad_dataproto_to_divisor", "unpad_dataproto"]


class DataProtoError(ValueError):
    """A batch operation got inputs it cannot combine (sizes, keys, types)."""


def _as_object_array(values: Any, key: str) -> np.ndarray:
    if isinstance(values, np.ndarray) and values.ndim == 1:
        return values
    if isinstance(values, np.ndarray):
        raise DataProtoError(f"non_tensor_batch[{key!r}] must be 1-D, got shape {values.shape}")
    out = np.empty(len(values), dtype=object)
    out[:] = list(values)
    return out


def _batch_len(batch: TensorDict | None, non_tensor: dict[str, np.ndarray]) -> int:
    if batch is not None and batch.batch_size:
        return int(batch.batch_size[0])
    for value in non_tensor.values():
        return len(value)
    return 0


@dataclass
class DataProto:
    """A batch of samples: tensors, non-tensor columns and un-split meta information."""

    batch: TensorDict | None = None
    non_tensor_batch: dict[str, np.ndarray] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.non_tensor_batch = {k: _as_object_array(v, k) for k, v in self.non_tensor_batch.items()}
        self.check_consistency()

    # ------------------------------------------------------------------ building
    @classmethod
    def from_dict(
        cls,
        tensors: dict[str, torch.Tensor] | None = None,
        non_tensors: dict[str, Any] | None = None,
        meta_info: dict[str, Any] | None = None,
    ) -> DataProto:
        """Build from plain dicts; all tensors and columns must share their first dimension."""
        tensors = tensors or {}
        batch = None
        if tensors:
            sizes = {k: (v.shape[0] if v.dim() > 0 else None) for k, v in tensors.items()}
            distinct = set(sizes.values())
            if len(distinct) != 1 or None in distinct:
                raise DataProtoError(f"tensors must share a non-empty first dimension, got sizes {sizes}")
            batch = TensorDict(dict(tensors), batch_size=[distinct.pop()])
        return cls(batch=batch, non_tensor_batch=dict(non_tensors or {}), meta_info=dict(meta_info or {}))

    @classmethod
    def from_single_dict(cls, data: dict[str, Any], meta_info: dict[str, Any] | None = None) -> DataProto:
        """Build from one dict, sending tensors to ``batch`` and everything else to ``non_tensor_batch``."""
        tensors = {k: v for k, v in data.items() if isinstance(v, torch.Tensor)}
        non_tensors = {k: v for k, v in data.items() if not isinstance(v, torch.Tensor)}
        return cls.from_dict(tensors, non_tensors, meta_info)

    def check_consistency(self) -> None:
        """Raise ``DataProtoError`` naming the first column whose length differs from the batch."""
        if self.batch is not None and len(self.batch.batch_size) != 1:
            raise DataProtoError(f"batch must have exactly one batch dimension, got {self.batch.batch_size}")
        n = _batch_len(self.batch, self.non_tensor_batch)
        for key, value in self.non_tensor_batch.items():
            if len(value) != n:
                raise DataProtoError(f"non_tensor_batch[{key!r}] has {len(value)} rows but the batch has {n}")

    # ------------------------------------------------------------------ access
    def __len__(self) -> int:
        return _batch_len(self.batch, self.non_tensor_batch)

    def __getitem__(self, item: int | slice | Sequence[int] | np.ndarray | torch.Tensor) -> DataProto:
        """Rows by int, slice, index list/array/tensor or boolean mask; always a ``DataProto``."""
        if isinstance(item, int):
            item = slice(item, item + 1) if item != -1 else slice(-1, None)
        return self.select_idxs(item)

    def select_idxs(self, idxs: slice | Sequence[int] | np.ndarray | torch.Tensor) -> DataProto:
        if isinstance(idxs, slice):
            np_idx: slice | np.ndarray = idxs
            t_idx: slice | torch.Tensor = idxs
        else:
            t_idx = torch.as_tensor(np.asarray(idxs) if not isinstance(idxs, torch.Tensor) else idxs)
            if t_idx.dtype == torch.bool:
                t_idx = t_idx.nonzero(as_tuple=True)[0]
            t_idx = t_idx.long()
            np_idx = t_idx.numpy()
        batch = self.batch[t_idx] if self.batch is not None else None
        non_tensor = {k: v[np_idx] for k, v in self.non_tensor_batch.items()}
        return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(self.meta_info))

    def slice(self, start: int | None = None, end: int | None = None, step: int | None = None) -> DataProto:
        return self.select_idxs(slice(start, end, step))

    def keys(self) -> list[str]:
        """Tensor keys followed by non-tensor keys."""
        tensor_keys = list(self.batch.keys()) if self.batch is not None else []
        return tensor_keys + list(self.non_tensor_batch.keys())

    def select(
        self,
        batch_keys: Iterable[str] | None = None,
        non_tensor_batch_keys: Iterable[str] | None = None,
        meta_info_keys: Iterable[str] | None = None,
        deepcopy: bool = False,
    ) -> DataProto:
        """A view with only the named keys (``None`` keeps all of that part)."""
        batch = self.batch
        if batch is not None and batch_keys is not None:
            batch = batch.select(*self._require(batch_keys, batch.keys(), "batch"))
        non_tensor = self.non_tensor_batch
        if non_tensor_batch_keys is not None:
            keys = self._require(non_tensor_batch_keys, non_tensor.keys(), "non_tensor_batch")
            non_tensor = {k: non_tensor[k] for k in keys}
        else:
            non_tensor = dict(non_tensor)
        meta = self.meta_info
        if meta_info_keys is not None:
            meta = {k: meta[k] for k in self._require(meta_info_keys, meta.keys(), "meta_info")}
        else:
            meta = dict(meta)
        out = DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)
        return copy.deepcopy(out) if deepcopy else out

    def pop(
        self,
        batch_keys: Iterable[str] | None = None,
        non_tensor_batch_keys: Iterable[str] | None = None,
        meta_info_keys: Iterable[str] | None = None,
    ) -> DataProto:
        """Remove the named keys from ``self`` and return them as a new ``DataProto``."""
        tensors = {}
        if batch_keys:
            have = self.batch.keys() if self.batch is not None else []
            tensors = {k: self.batch.pop(k) for k in self._require(batch_keys, have, "batch")}
        non_tensors = {}
        if non_tensor_batch_keys:
            keys = self._require(non_tensor_batch_keys, self.non_tensor_batch.keys(), "non_tensor_batch")
            non_tensors = {k: self.non_tensor_batch.pop(k) for k in keys}
        meta = {}
        if meta_info_keys:
            keys = self._require(meta_info_keys, self.meta_info.keys(), "meta_info")
            meta = {k: self.meta_info.pop(k) for k in keys}
        batch = TensorDict(tensors, batch_size=[len(self)]) if tensors else None
        return DataProto(batch=batch, non_tensor_batch=non_tensors, meta_info=meta)

    @staticmethod
    def _require(wanted: Iterable[str], have: Iterable[str], part: str) -> list[str]:
        wanted, have = list(wanted), list(have)
        missing = [k for k in wanted if k not in have]
        if missing:
            raise KeyError(f"{part} has no key(s) {missing}; available: {sorted(have)}")
        return wanted

    def rename(self, old_keys: str | list[str], new_keys: str | list[str]) -> DataProto:
        old = [old_keys] if isinstance(old_keys, str) else list(old_keys)
        new = [new_keys] if isinstance(new_keys, str) else list(new_keys)
        if len(old) != len(new):
            raise DataProtoError(f"rename needs as many new keys as old ones, got {old} -> {new}")
        for old_key, new_key in zip(old, new):
            self.batch.rename_key_(old_key, new_key)
        return self

    # ------------------------------------------------------------------ combining
    def union(self, other: DataProto) -> DataProto:
        """Merge ``other`` into ``self`` in place; a key present in both must hold equal values."""
        if len(self) != len(other) and len(self) and len(other):
            raise DataProtoError(f"union needs equal batch sizes, got {len(self)} and {len(other)}")
        if other.batch is not None:
            if self.batch is None:
                self.batch = other.batch
            else:
                for key, value in other.batch.items():
                    if key in self.batch and not torch.equal(self.batch[key], value):
                        raise DataProtoError(f"union: batch key {key!r} exists in both with different values")
                    self.batch[key] = value
        for key, value in other.non_tensor_batch.items():
            mine = self.non_tensor_batch.get(key)
            if mine is not None and not _object_arrays_equal(mine, value):
                raise DataProtoError(
                    f"union: non_tensor_batch key {key!r} exists in both with different values"
                )
            self.non_tensor_batch[key] = value
        for key, value in other.meta_info.items():
            if key in self.meta_info and not _values_equal(self.meta_info[key], value):
                raise DataProtoError(f"union: meta_info key {key!r} exists in both with different values")
            self.meta_info[key] = value
        return self

    def chunk(self, chunks: int) -> list[DataProto]:
        """Split into ``chunks`` equal parts; the length must be divisible (pad first if not)."""
        n = len(self)
        if chunks <= 0 or n % chunks != 0:
            raise DataProtoError(
                f"cannot chunk a batch of {n} rows into {chunks} equal parts; use pad_to_divisor() first"
            )
        return self.split(n // chunks)

    def split(self, split_size: int) -> list[DataProto]:
        """Consecutive parts of ``split_size`` rows (the last one may be shorter)."""
        if split_size <= 0:
            raise DataProtoError(f"split_size must be positive, got {split_size}")
        return [self.slice(i, i + split_size) for i in range(0, len(self), split_size)]

    @staticmethod
    def concat(data: Sequence[DataProto]) -> DataProto:
        """Concatenate along the batch; meta_info is taken from the parts (must agree)."""
        if not data:
            raise DataProtoError("concat needs at least one DataProto")
        batches = [d.batch for d in data]
        if any(b is None for b in batches) and not all(b is None for b in batches):
            raise DataProtoError("concat: some parts have tensors and some do not")
        batch = None if batches[0] is None else torch.cat(batches, dim=0)
        keys = set(data[0].non_tensor_batch)
        for i, d in enumerate(data):
            if set(d.non_tensor_batch) != keys:
                raise DataProtoError(
                    f"concat: part {i} has non-tensor keys {sorted(d.non_tensor_batch)}, part 0 has {sorted(keys)}"
                )
        non_tensor = {k: np.concatenate([d.non_tensor_batch[k] for d in data]) for k in keys}
        meta: dict[str, Any] = {}
        for d in data:
            for key, value in d.meta_info.items():
                meta.setdefault(key, value)
        return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)

    def repeat(self, repeat_times: int = 2, interleave: bool = True) -> DataProto:
        """Repeat every row; interleaved gives ``a a b b``, otherwise ``a b a b``."""
        n = len(self)
        base = torch.arange(n)
        idx = base.repeat_interleave(repeat_times) if interleave else base.repeat(repeat_times)
        out = self.select_idxs(idx)
        return out

    def reorder(self, indices: torch.Tensor | np.ndarray | Sequence[int]) -> None:
        """Permute rows in place: row ``i`` becomes old row ``indices[i]``."""
        reordered = self.select_idxs(indices)
        self.batch, self.non_tensor_batch = reordered.batch, reordered.non_tensor_batch

    def pad_to_divisor(self, divisor: int) -> tuple[DataProto, int]:
        """Append copies of the first rows so the length divides by ``divisor``; returns the pad size."""
        if divisor <= 0:
            raise DataProtoError(f"divisor must be positive, got {divisor}")
        n = len(self)
        pad = (-n) % divisor
        if pad == 0 or n == 0:
            return self, 0
        idx = torch.arange(n + pad) % n
        return self.select_idxs(idx), pad

    def unpad(self, pad_size: int) -> DataProto:
        return self if pad_size == 0 else self.slice(0, len(self) - pad_size)

    # ------------------------------------------------------------------ devices and disk
    def to(self, device: str | torch.device) -> DataProto:
        if self.batch is not None:
            self.batch = self.batch.to(device)
        return self

    def save_to_disk(self, path: str | os.PathLike) -> None:
        """Write atomically: a temporary file in the same folder, then a rename."""
        path = os.fspath(path)
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-dataproto-")
        try:
            with os.fdopen(fd, "wb") as f:
                pickle.dump(self, f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.remove(tmp)
            raise

    @staticmethod
    def load_from_disk(path: str | os.PathLike) -> DataProto:
        with open(path, "rb") as f:
            data = pickle.load(f)
        if not isinstance(data, DataProto):
            raise DataProtoError(f"{path} does not hold a DataProto (found {type(data).__name__})")
        return data

    # ------------------------------------------------------------------ pickling
    def __getstate__(self) -> dict[str, Any]:
        tensors = {}
        if self.batch is not None:
            for key, value in self.batch.items():
                tensors[key] = _tensor_to_numpy(value)
        return {
            "tensors": tensors,
            "batch_size": len(self) if self.batch is not None else None,
            "non_tensor_batch": self.non_tensor_batch,
            "meta_info": self.meta_info,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        batch = None
        if state["batch_size"] is not None:
            tensors = {k: _numpy_to_tensor(v) for k, v in state["tensors"].items()}
            batch = TensorDict(tensors, batch_size=[state["batch_size"]])
        self.batch = batch
        self.non_tensor_batch = state["non_tensor_batch"]
        self.meta_info = state["meta_info"]

    def __repr__(self) -> str:
        tensors = {k: tuple(v.shape) for k, v in self.batch.items()} if self.batch is not None else {}
        return (
            f"DataProto(len={len(self)}, batch={tensors}, non_tensor_batch={list(self.non_tensor_batch)}, "
            f"meta_info={list(self.meta_info)})"
        )


# Dtypes numpy cannot hold are moved bit-for-bit as integers of the same width.
_BITCAST = {torch.bfloat16: torch.int16, torch.float8_e4m3fn: torch.uint8, torch.float8_e5m2: torch.uint8}


def _tensor_to_numpy(t: torch.Tensor) -> tuple[np.ndarray, str | None]:
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    if t.dtype in _BITCAST:
        return t.view(_BITCAST[t.dtype]).numpy(), str(t.dtype).removeprefix("torch.")
    return t.numpy(), None


def _numpy_to_tensor(packed: tuple[np.ndarray, str | None]) -> torch.Tensor:
    array, bitcast_dtype = packed
    if not array.flags.writeable:
        # Arrays read zero-copy from Ray's shared memory are read-only; torch tensors must own
        # writable memory, so copy once here (a memcpy, far cheaper than in-band pickling).
        array = array.copy()
    tensor = torch.from_numpy(array)
    if bitcast_dtype is not None:
        tensor = tensor.view(getattr(torch, bitcast_dtype))
    return tensor


def _object_arrays_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return len(a) == len(b) and all(_values_equal(x, y) for x, y in zip(a, b))


def _values_equal(a: Any, b: Any) -> bool:
    try:
        result = a == b
        if isinstance(result, np.ndarray):
            return bool(result.all())
        if isinstance(result, torch.Tensor):
            return bool(result.all())
        return bool(result)
    except Exception:
        return a is b


def pad_dataproto_to_divisor(data: DataProto, size_divisor: int) -> tuple[DataProto, int]:
    """Functional form of :meth:`DataProto.pad_to_divisor` (the name verl users know)."""
    return data.pad_to_divisor(size_divisor)


def unpad_dataproto(data: DataProto, pad_size: int) -> DataProto:
    """Functional form of :meth:`DataProto.unpad`."""
    return data.unpad(pad_size)
