"""``DataProto``: the batch that flows between the driver and every role.

A ``DataProto`` holds three things with one common batch dimension:

* ``batch``: a ``tensordict.TensorDict`` of tensors (token ids, masks, log-probs, ...);
* ``non_tensor_batch``: a dict of numpy arrays, one row per sample (``uid``, ``data_source``, ...);
* ``meta_info``: a plain dict that is not split along the batch (temperature, step, ...). Its
  ``"metrics"`` entry is special: :meth:`DataProto.concat` gathers the parts' metrics into one list per
  key (a worker group's ranks each report theirs), where other keys must agree.

The keys that travel through the PPO dataflow are listed in :mod:`verl.keys`. The functions this
class is built from, and verl's module-level ones, are in :mod:`verl.protocol_ops`;
:class:`DataProtoFuture` is in :mod:`verl.protocol_future`. All are importable from here.

Transfer through Ray is cheap: tensors are pickled as numpy buffers, which Ray's
pickle-5 serializer moves out of band through the shared-memory object store instead
of copying them into the pickle stream.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from verl.protocol_future import DataProtoFuture
from verl.protocol_ops import (
    DataProtoConfig,
    DataProtoError,
    all_gather_data_proto,
    as_column,
    data_info,
    decode_tensor,
    encode_tensor,
    fold_batch_dim,
    list_of_dict_to_dict_of_list,
    load_pickled,
    merge_meta_info,
    mini_batches,
    pad_dataproto_to_divisor,
    save_atomically,
    size_message,
    tensordict_parts,
    to_tensordict,
    unfold_batch_dim,
    unfold_column_chunks,
    union_meta_info,
    union_numpy_dict,
    union_tensor_dict,
    unpad_dataproto,
)

__all__ = [
    "DataProto",
    "DataProtoConfig",
    "DataProtoError",
    "DataProtoFuture",
    "DataProtoItem",
    "all_gather_data_proto",
    "fold_batch_dim",
    "list_of_dict_to_dict_of_list",
    "pad_dataproto_to_divisor",
    "unfold_batch_dim",
    "unfold_column_chunks",
    "union_numpy_dict",
    "union_tensor_dict",
    "unpad_dataproto",
]


@dataclass
class DataProtoItem:
    """One row of a ``DataProto`` (``data[i]``): its tensors, its column values and the batch's meta."""

    batch: TensorDict | None = None
    non_tensor_batch: dict[str, Any] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)


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
    non_tensor_batch: dict[str, np.ndarray] | None = field(default_factory=dict)
    meta_info: dict[str, Any] | None = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.non_tensor_batch = {k: as_column(v, k) for k, v in (self.non_tensor_batch or {}).items()}
        self.meta_info = {} if self.meta_info is None else self.meta_info
        self.check_consistency()

    # ------------------------------------------------------------------ building
    @classmethod
    def from_dict(
        cls,
        tensors: dict[str, torch.Tensor] | None = None,
        non_tensors: dict[str, Any] | None = None,
        meta_info: dict[str, Any] | None = None,
        num_batch_dims: int = 1,
        auto_padding: bool = False,
    ) -> DataProto:
        """Build from plain dicts; all tensors and columns must share their first dimension (the one
        batch dimension: ``num_batch_dims`` is verl's argument and must be 1). ``auto_padding``
        lets this batch be chunked into parts of unequal size."""
        if num_batch_dims != 1:
            raise DataProtoError(f"a DataProto has one batch dimension, got num_batch_dims={num_batch_dims}")
        tensors = tensors or {}
        batch = None
        if tensors:
            sizes = {k: (v.shape[0] if v.dim() > 0 else None) for k, v in tensors.items()}
            distinct = set(sizes.values())
            if len(distinct) != 1 or None in distinct:
                raise DataProtoError(f"tensors must share a non-empty first dimension, got sizes {sizes}")
            batch = TensorDict(dict(tensors), batch_size=[distinct.pop()])
        meta_info = dict(meta_info or {})
        if auto_padding:
            meta_info[DataProtoConfig.auto_padding_key] = True
        return cls(batch=batch, non_tensor_batch=dict(non_tensors or {}), meta_info=meta_info)

    @classmethod
    def from_single_dict(
        cls, data: dict[str, Any], meta_info: dict[str, Any] | None = None, auto_padding: bool = False
    ) -> DataProto:
        """Build from one dict, sending tensors to ``batch`` and everything else to ``non_tensor_batch``."""
        tensors = {k: v for k, v in data.items() if isinstance(v, torch.Tensor)}
        non_tensors = {k: v for k, v in data.items() if not isinstance(v, torch.Tensor)}
        return cls.from_dict(tensors, non_tensors, meta_info, auto_padding=auto_padding)

    @classmethod
    def from_tensordict(
        cls, tensor_dict: TensorDict, meta_info: dict[str, Any] | None = None, num_batch_dims: int = 1
    ) -> DataProto:
        """The inverse of :meth:`to_tensordict`: tensors to ``batch``, stacked non-tensor entries to
        ``non_tensor_batch``, single non-tensor entries to ``meta_info`` (after ``meta_info``'s)."""
        tensors, columns, meta = tensordict_parts(tensor_dict)
        return cls.from_dict(tensors, columns, {**(meta_info or {}), **meta}, num_batch_dims)

    def to_tensordict(self) -> TensorDict:
        """One ``TensorDict`` (verl's layout for its newer workers): the tensors, each column as a
        ``NonTensorStack``, each ``meta_info`` entry as ``NonTensorData``; a key may be in one part only."""
        return to_tensordict(self)

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

    def __getitem__(
        self, item: int | slice | Sequence[int] | np.ndarray | torch.Tensor
    ) -> DataProto | DataProtoItem:
        """One row (an int) as a :class:`DataProtoItem`, as in verl; rows by slice, index list, array,
        tensor or boolean mask as a ``DataProto``."""
        if isinstance(item, int | np.integer):
            batch = self.batch[int(item)] if self.batch is not None else None
            row = {k: v[item] for k, v in self.non_tensor_batch.items()}
            return DataProtoItem(batch=batch, non_tensor_batch=row, meta_info=self.meta_info)
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
        return type(self)(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(self.meta_info))

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
            non_tensor = {
                k: non_tensor[k] for k in self._require(non_tensor_batch_keys, non_tensor, "non_tensor_batch")
            }
        meta = self.meta_info
        if meta_info_keys is not None:
            meta = {k: meta[k] for k in self._require(meta_info_keys, meta.keys(), "meta_info")}
        out = type(self)(batch=batch, non_tensor_batch=dict(non_tensor), meta_info=dict(meta))
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
        return type(self)(batch=batch, non_tensor_batch=non_tensors, meta_info=meta)

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
        """Merge ``other`` into ``self`` in place and return ``self``; a key present in both must
        hold equal values."""
        if len(self) != len(other) and len(self) and len(other):
            raise DataProtoError(f"union needs equal batch sizes, got {len(self)} and {len(other)}")
        if other.batch is not None:
            self.batch = other.batch if self.batch is None else union_tensor_dict(self.batch, other.batch)
        union_numpy_dict(self.non_tensor_batch, other.non_tensor_batch)
        union_meta_info(self.meta_info, other.meta_info)
        return self

    def is_padding_enabled(self) -> bool:
        """Whether this batch may be chunked unevenly (its ``from_dict(auto_padding=True)`` or
        :class:`DataProtoConfig`)."""
        return (
            bool(self.meta_info.get(DataProtoConfig.auto_padding_key, False)) or DataProtoConfig.auto_padding
        )

    def padding(self, padding_size: int, padding_candidate: str = "") -> None:
        """Append ``padding_size`` copies of the first row (``padding_candidate="first"``) or of the
        last row (anything else), in place."""
        if padding_size == 0:
            return
        row = 0 if padding_candidate == "first" else len(self) - 1
        padded = self.select_idxs(torch.cat([torch.arange(len(self)), torch.full((padding_size,), row)]))
        self.batch, self.non_tensor_batch = padded.batch, padded.non_tensor_batch

    def chunk(self, chunks: int) -> list[DataProto]:
        """Split into ``chunks`` equal parts. The length must be divisible (pad first) unless padding is
        enabled (:meth:`is_padding_enabled`): then every part has ``ceil(len / chunks)`` rows but the
        last, as ``torch.chunk`` cuts."""
        n = len(self)
        if chunks <= 0 or (n % chunks != 0 and not self.is_padding_enabled()):
            raise DataProtoError(
                f"cannot chunk a batch of {n} rows into {chunks} equal parts; use pad_to_divisor() first"
            )
        parts = self.split(-(-n // chunks)) if n else [self.slice(0, 0) for _ in range(chunks)]
        if len(parts) != chunks:
            raise DataProtoError(
                f"a batch of {n} rows cut as torch.chunk cuts gives {len(parts)} parts, not {chunks}"
            )
        return parts

    def split(self, split_size: int) -> list[DataProto]:
        """Consecutive parts of ``split_size`` rows (the last one may be shorter)."""
        if split_size <= 0:
            raise DataProtoError(f"split_size must be positive, got {split_size}")
        return [self.slice(i, i + split_size) for i in range(0, len(self), split_size)]

    @staticmethod
    def concat(data: Sequence[DataProto]) -> DataProto:
        """Concatenate along the batch. ``meta_info`` is merged by :func:`~verl.protocol_ops.merge_meta_info`:
        the parts' ``"metrics"`` become one dict of lists, other keys must agree."""
        if not data:
            raise DataProtoError("concat needs at least one DataProto")
        batches = [d.batch for d in data]
        if any(b is None for b in batches) and not all(b is None for b in batches):
            raise DataProtoError("concat: some parts have tensors and some do not")
        batch = None if batches[0] is None else torch.cat(batches, dim=0)
        keys = list(data[0].non_tensor_batch)
        for i, d in enumerate(data):
            if set(d.non_tensor_batch) != set(keys):
                raise DataProtoError(
                    f"concat: part {i} has non-tensor keys {sorted(d.non_tensor_batch)}, part 0 has {sorted(keys)}"
                )
        non_tensor = {k: np.concatenate([d.non_tensor_batch[k] for d in data]) for k in keys}
        meta = merge_meta_info([d.meta_info for d in data])
        return type(data[0])(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)

    def repeat(self, repeat_times: int = 2, interleave: bool = True) -> DataProto:
        """Repeat every row; interleaved gives ``a a b b``, otherwise ``a b a b``."""
        base = torch.arange(len(self))
        return self.select_idxs(
            base.repeat_interleave(repeat_times) if interleave else base.repeat(repeat_times)
        )

    def sample_level_repeat(self, repeat_times: Sequence[int] | np.ndarray | torch.Tensor) -> DataProto:
        """Row ``i`` repeated ``repeat_times[i]`` times (0 drops it), the copies next to each other."""
        counts = torch.as_tensor(np.asarray(repeat_times)).long()
        if counts.shape != (len(self),):
            raise DataProtoError(
                f"sample_level_repeat needs one count per row ({len(self)}), got {counts.shape}"
            )
        return self.select_idxs(torch.arange(len(self)).repeat_interleave(counts))

    def unfold_column_chunks(self, n_split: int, split_keys: list[str] | None = None) -> DataProto:
        """Each row becomes ``n_split`` rows: a key in ``split_keys`` has its second dimension cut into
        ``n_split`` pieces, one per new row; every other key is repeated (interleaved)."""
        return unfold_column_chunks(self, n_split, split_keys)

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

    def make_iterator(
        self,
        mini_batch_size: int,
        epochs: int,
        seed: int | None = None,
        dataloader_kwargs: dict | None = None,
    ) -> Iterator[DataProto]:
        """``epochs`` passes over the rows in mini-batches of ``mini_batch_size`` rows (which must divide
        the length), each with this batch's ``meta_info``. Rows come in order unless
        ``dataloader_kwargs={"shuffle": True}``; then each epoch draws a new permutation from a generator
        seeded with ``seed``, the same as verl's torch ``DataLoader`` draws for these arguments."""
        return mini_batches(self, mini_batch_size, epochs, seed, dataloader_kwargs)

    # ------------------------------------------------------------------ devices, disk and size
    def to(self, device: str | torch.device) -> DataProto:
        if self.batch is not None:
            self.batch = self.batch.to(device)
        return self

    def save_to_disk(self, path: str | os.PathLike) -> None:
        """Write atomically: a temporary file in the same folder, then a rename."""
        save_atomically(self, path)

    @staticmethod
    def load_from_disk(path: str | os.PathLike) -> DataProto:
        return load_pickled(path, DataProto)

    def print_size(self, prefix: str = "") -> None:
        """Print the memory the tensors and the columns take, in GB."""
        print(f"{prefix}, {size_message(self)}" if prefix else size_message(self))

    def get_data_info(self) -> str:
        """One line per key: tensors' shapes, dtypes and devices, columns', and ``meta_info`` value types."""
        return data_info(self)

    # ------------------------------------------------------------------ pickling
    def __getstate__(self) -> dict[str, Any]:
        tensors = {k: encode_tensor(v) for k, v in self.batch.items()} if self.batch is not None else {}
        return {
            "tensors": tensors,
            "batch_size": len(self) if self.batch is not None else None,
            "non_tensor_batch": self.non_tensor_batch,
            "meta_info": self.meta_info,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        batch = None
        if state["batch_size"] is not None:
            tensors = {k: decode_tensor(v) for k, v in state["tensors"].items()}
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
