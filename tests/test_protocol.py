"""DataProto: round trips and clear errors."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from verl.protocol import DataProto, DataProtoError, pad_dataproto_to_divisor, unpad_dataproto


def make(n: int = 5) -> DataProto:
    return DataProto.from_dict(
        {"ids": torch.arange(n * 3).view(n, 3), "lp": torch.randn(n, 3).bfloat16()},
        {"uid": np.array([f"u{i}" for i in range(n)], dtype=object), "gt": [{"a": i} for i in range(n)]},
        {"temperature": 1.0},
    )


def assert_same(a: DataProto, b: DataProto) -> None:
    assert a.batch.keys() == b.batch.keys()
    for key in a.batch.keys():
        assert torch.equal(a.batch[key], b.batch[key]), key
    assert a.non_tensor_batch.keys() == b.non_tensor_batch.keys()
    for key in a.non_tensor_batch:
        assert list(a.non_tensor_batch[key]) == list(b.non_tensor_batch[key]), key
    assert a.meta_info == b.meta_info


def test_chunk_concat_round_trip():
    data = make(6)
    parts = data.chunk(3)
    assert [len(p) for p in parts] == [2, 2, 2]
    assert_same(DataProto.concat(parts), data)


def test_pad_chunk_concat_unpad_round_trip():
    data = make(5)
    padded, pad = pad_dataproto_to_divisor(data, 4)
    assert (len(padded), pad) == (8, 3)
    assert padded.non_tensor_batch["uid"][5:].tolist() == ["u0", "u1", "u2"]  # padding copies the first rows
    assert_same(unpad_dataproto(DataProto.concat(padded.chunk(4)), pad), data)


def test_repeat_interleave_and_tile():
    data = make(2)
    inter = data.repeat(3, interleave=True)
    assert inter.non_tensor_batch["uid"].tolist() == ["u0", "u0", "u0", "u1", "u1", "u1"]
    assert torch.equal(inter.batch["ids"][:3], data.batch["ids"][:1].expand(3, 3))
    tiled = data.repeat(2, interleave=False)
    assert tiled.non_tensor_batch["uid"].tolist() == ["u0", "u1", "u0", "u1"]
    # undoing the interleave recovers the original rows
    assert_same(inter[[0, 3]], data)


def test_reorder_is_a_permutation():
    data = make(4)
    data.reorder(torch.tensor([3, 1, 0, 2]))
    assert data.non_tensor_batch["uid"].tolist() == ["u3", "u1", "u0", "u2"]
    assert data.batch["ids"][0].tolist() == [9, 10, 11]


def test_select_pop_union():
    data = make(3)
    sel = data.select(["ids"], ["uid"])
    assert list(sel.batch.keys()) == ["ids"] and list(sel.non_tensor_batch) == ["uid"]
    popped = data.pop(batch_keys=["lp"], non_tensor_batch_keys=["gt"])
    assert "lp" not in data.batch.keys() and "gt" not in data.non_tensor_batch
    data.union(popped)
    assert set(data.batch.keys()) == {"ids", "lp"}
    with pytest.raises(KeyError, match=r"no key\(s\) \['nope'\]"):
        data.select(["nope"])


def test_union_key_clash_is_an_error():
    a, b = make(3), make(3)
    b.batch["ids"] = b.batch["ids"] + 1
    with pytest.raises(DataProtoError, match="'ids' exists in both with different values"):
        a.union(b)
    with pytest.raises(DataProtoError, match="equal batch sizes"):
        make(3).union(make(4))


def test_mismatched_sizes_are_errors():
    with pytest.raises(DataProtoError, match="share a non-empty first dimension"):
        DataProto.from_dict({"a": torch.zeros(3), "b": torch.zeros(4)})
    with pytest.raises(DataProtoError, match=r"non_tensor_batch\['uid'\] has 2 rows but the batch has 3"):
        DataProto.from_dict({"a": torch.zeros(3)}, {"uid": ["x", "y"]})
    with pytest.raises(DataProtoError, match="cannot chunk a batch of 5 rows into 2"):
        make(5).chunk(2)
    with pytest.raises(DataProtoError, match="part 1 has non-tensor keys"):
        DataProto.concat([make(2), make(2).select(non_tensor_batch_keys=["uid"])])


def test_pickle_and_disk_round_trip(tmp_path):
    data = make(4)
    assert_same(pickle.loads(pickle.dumps(data, protocol=5)), data)
    path = tmp_path / "sub" / "batch.pkl"
    data.save_to_disk(path)
    assert_same(DataProto.load_from_disk(path), data)
    assert [p.name for p in path.parent.iterdir()] == ["batch.pkl"]  # no temporary file left


def test_indexing_forms():
    data = make(5)
    row = data[2]  # one row, as verl gives it: the row's tensors and values, no batch dimension
    assert row.non_tensor_batch["uid"] == "u2" and row.batch["ids"].tolist() == [6, 7, 8]
    assert data[[2]].non_tensor_batch["uid"].tolist() == ["u2"]
    assert data[1:3].non_tensor_batch["uid"].tolist() == ["u1", "u2"]
    mask = torch.tensor([True, False, True, False, False])
    assert data[mask].non_tensor_batch["uid"].tolist() == ["u0", "u2"]
    assert len(data.split(2)) == 3
