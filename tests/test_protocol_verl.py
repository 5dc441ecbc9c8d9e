"""DataProto behaves as verl's does: metrics merged on concat, mini-batch iteration, per-row repeats,
TensorDict round trips, auto-padding, one-row indexing, and ``DataProtoFuture`` over Ray refs."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.distributed as dist
from tensordict import TensorDict
from torch.utils.data import DataLoader

from verl.protocol import (
    DataProto,
    DataProtoConfig,
    DataProtoError,
    DataProtoFuture,
    DataProtoItem,
    all_gather_data_proto,
    fold_batch_dim,
    list_of_dict_to_dict_of_list,
    unfold_batch_dim,
)


def make(n: int = 4, meta: dict | None = None, **kwargs) -> DataProto:
    return DataProto.from_dict(
        {"ids": torch.arange(n * 2).view(n, 2), "score": torch.arange(n, dtype=torch.float32) / 10},
        {"uid": [f"u{i}" for i in range(n)]},
        meta,
        **kwargs,
    )


def uids(data: DataProto) -> list[str]:
    return data.non_tensor_batch["uid"].tolist()


# ---------------------------------------------------------------------- concat and meta_info
def test_concat_gathers_the_parts_metrics_into_one_list_per_key():
    parts = [
        make(2, {"metrics": {"loss": 1.0, "grad_norm": 10.0}, "temperature": 0.7}),
        make(2, {"metrics": {"loss": 3.0, "grad_norm": 30.0}, "temperature": 0.7}),
        make(2, {"metrics": [{"loss": 5.0}, {"loss": 6.0}], "temperature": 0.7}),  # a list of dicts extends
    ]
    joined = DataProto.concat(parts)
    assert joined.meta_info == {
        "metrics": {"loss": [1.0, 3.0, 5.0, 6.0], "grad_norm": [10.0, 30.0]},
        "temperature": 0.7,
    }
    assert uids(joined) == ["u0", "u1"] * 3


def test_concat_keeps_a_metric_that_only_a_later_part_reports():
    joined = DataProto.concat(
        [make(1, {"metrics": {"a": 1}}), make(1, {"metrics": {"a": 2, "tool_calls": 4}})]
    )
    assert joined.meta_info["metrics"] == {"a": [1, 2], "tool_calls": [4]}
    assert list_of_dict_to_dict_of_list([]) == {}


def test_concat_without_metrics_adds_no_metrics_key_and_empty_metrics_stay_empty():
    assert "metrics" not in DataProto.concat([make(1), make(1)]).meta_info
    assert DataProto.concat([make(1, {"metrics": {}}), make(1, {"metrics": {}})]).meta_info == {"metrics": {}}


def test_concat_refuses_meta_info_that_differs_between_parts_naming_the_key_and_values():
    with pytest.raises(DataProtoError, match=r"meta_info\['temperature'\] differs .*\(1\.0 and 0\.5\)"):
        DataProto.concat([make(2, {"temperature": 1.0}), make(2, {"temperature": 0.5})])
    # equal values (arrays included) and NaN on both sides agree
    same = {"weights": np.array([1.0, 2.0]), "gap": float("nan")}
    assert DataProto.concat([make(1, dict(same)), make(1, dict(same))]).meta_info["weights"].tolist() == [
        1.0,
        2.0,
    ]


def test_concat_of_a_subclass_stays_that_subclass():
    class Batch(DataProto):
        pass

    part = Batch.from_dict({"x": torch.zeros(2)})
    assert type(DataProto.concat([part, part])) is Batch


# ---------------------------------------------------------------------- cutting and joining
def test_chunk_split_select_and_union_round_trip():
    data = make(6, {"temperature": 1.0})
    joined = DataProto.concat(data.chunk(3))
    assert torch.equal(joined.batch["ids"], data.batch["ids"]) and uids(joined) == uids(data)
    assert [len(p) for p in data.split(4)] == [4, 2]
    left = data.select(batch_keys=["ids"], non_tensor_batch_keys=[])
    right = data.select(batch_keys=["score"], non_tensor_batch_keys=["uid"], meta_info_keys=[])
    assert left.union(right) is left  # union works in place and returns self
    assert set(left.batch.keys()) == {"ids", "score"} and uids(left) == uids(data)
    assert left.meta_info == {"temperature": 1.0}


def test_an_int_index_gives_one_row_as_a_dataproto_item():
    data = make(3, {"step": 1})
    row = data[1]
    assert isinstance(row, DataProtoItem)
    assert row.batch["ids"].tolist() == [2, 3] and row.non_tensor_batch == {"uid": "u1"}
    assert row.meta_info == {"step": 1}
    assert data[np.int64(-1)].non_tensor_batch["uid"] == "u2"
    assert uids(data[[2, 0]]) == ["u2", "u0"] and uids(data[1:]) == ["u1", "u2"]


def test_sample_level_repeat_repeats_each_row_its_own_number_of_times():
    data = make(3)
    for counts in ([2, 0, 3], (2, 0, 3), np.array([2, 0, 3]), torch.tensor([2, 0, 3])):
        out = data.sample_level_repeat(counts)
        assert uids(out) == ["u0", "u0", "u2", "u2", "u2"]
        assert out.batch["ids"][:, 0].tolist() == [0, 0, 4, 4, 4]
    with pytest.raises(DataProtoError, match="one count per row"):
        data.sample_level_repeat([1, 2])


def test_padding_appends_copies_of_the_last_row_or_of_the_first():
    data = make(3)
    data.padding(2)
    assert uids(data) == ["u0", "u1", "u2", "u2", "u2"]
    data.padding(1, padding_candidate="first")
    assert uids(data)[-1] == "u0" and len(data) == 6


def test_fold_and_unfold_batch_dim_round_trip():
    data = make(6)
    folded = fold_batch_dim(data, 2)
    assert folded.batch["ids"].shape == (2, 3, 2) and folded.non_tensor_batch["uid"].shape == (2, 3)
    assert folded.non_tensor_batch["uid"][1].tolist() == ["u3", "u4", "u5"]
    back = unfold_batch_dim(folded, batch_dims=2)
    assert torch.equal(back.batch["ids"], data.batch["ids"]) and uids(back) == uids(data)


def test_unfold_column_chunks_cuts_split_keys_and_repeats_the_others():
    data = DataProto.from_dict(
        {"pair": torch.tensor([[1, 2], [3, 4]]), "id": torch.tensor([7, 8])}, {"uid": ["a", "b"]}
    )
    out = data.unfold_column_chunks(2, split_keys=["pair"])
    assert out.batch["pair"].tolist() == [[1], [2], [3], [4]]
    assert out.batch["id"].tolist() == [7, 7, 8, 8] and uids(out) == ["a", "a", "b", "b"]


# ---------------------------------------------------------------------- make_iterator
def verls_loader_order(
    n: int, mini_batch_size: int, epochs: int, seed: int, shuffle: bool
) -> list[list[int]]:
    """The rows verl's ``make_iterator`` yields: one DataLoader over the rows themselves (a row per
    index, as ``DataProto.__getitem__`` gives it), with a generator seeded by ``seed``, iterated
    ``epochs`` times."""

    class Rows(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return n

        def __getitem__(self, i: int) -> dict:
            return {"row": i}

    generator = torch.Generator()
    generator.manual_seed(seed)
    loader = DataLoader(
        Rows(),
        batch_size=mini_batch_size,
        collate_fn=lambda items: [it["row"] for it in items],
        generator=generator,
        shuffle=shuffle,
    )
    return [rows for _ in range(epochs) for rows in loader]


def test_make_iterator_yields_the_mini_batches_verls_loader_gives():
    data = make(8, {"temperature": 0.9})
    got = [
        (p.batch["ids"][:, 0] // 2).tolist()
        for p in data.make_iterator(2, epochs=3, seed=7, dataloader_kwargs={"shuffle": True})
    ]
    assert got == verls_loader_order(8, 2, 3, seed=7, shuffle=True)
    epochs = [sorted(row for rows in got[e * 4 : e * 4 + 4] for row in rows) for e in range(3)]
    assert len(got) == 3 * 8 // 2 and epochs == [list(range(8))] * 3
    assert got[:4] != got[4:8]  # each epoch draws its own permutation


def test_make_iterator_in_order_without_shuffle_and_reproducible_with_a_seed():
    data = make(4, {"temperature": 0.9})
    parts = list(data.make_iterator(2, epochs=2))
    assert [uids(p) for p in parts] == [["u0", "u1"], ["u2", "u3"]] * 2
    assert all(p.meta_info == {"temperature": 0.9} for p in parts)

    def order(seed: int) -> list[list[str]]:
        return [uids(p) for p in data.make_iterator(1, 2, seed=seed, dataloader_kwargs={"shuffle": True})]

    assert order(3) == order(3)
    with pytest.raises(DataProtoError, match="4 rows do not divide into mini-batches of 3"):
        next(data.make_iterator(3, 1))


# ---------------------------------------------------------------------- building and converting
def test_the_constructor_and_from_dict_take_verls_arguments():
    data = DataProto(
        batch=TensorDict({"x": torch.zeros(2)}, batch_size=[2]), non_tensor_batch=None, meta_info=None
    )
    assert data.non_tensor_batch == {} and data.meta_info == {} and len(data) == 2
    built = DataProto.from_dict(
        tensors={"x": torch.zeros(3)}, non_tensors=None, meta_info=None, num_batch_dims=1
    )
    assert len(built) == 3 and built.meta_info == {}
    with pytest.raises(DataProtoError, match="num_batch_dims=2"):
        DataProto.from_dict({"x": torch.zeros(3, 2)}, num_batch_dims=2)


def test_from_dict_with_auto_padding_lets_the_batch_chunk_unevenly(monkeypatch):
    padded = make(5, auto_padding=True)
    assert padded.is_padding_enabled()
    assert [uids(p) for p in padded.chunk(2)] == [["u0", "u1", "u2"], ["u3", "u4"]]  # as torch.chunk cuts
    plain = make(5)
    assert not plain.is_padding_enabled()
    with pytest.raises(DataProtoError, match="cannot chunk a batch of 5 rows into 2"):
        plain.chunk(2)
    monkeypatch.setenv("VERL_AUTO_PADDING", "1")
    assert plain.is_padding_enabled()
    monkeypatch.delenv("VERL_AUTO_PADDING")
    monkeypatch.setattr(DataProtoConfig, "_enabled", False)
    DataProtoConfig.auto_padding = True
    assert plain.is_padding_enabled() and [len(p) for p in plain.chunk(2)] == [3, 2]
    with pytest.raises(TypeError):
        DataProtoConfig.auto_padding = "yes"


def test_to_tensordict_and_back_keeps_tensors_columns_and_meta_info():
    data = make(3, {"temperature": 0.5, "tags": ["a"]})
    data.non_tensor_batch["extra"] = np.array([{"k": 1}, [1, 2], "s"], dtype=object)
    td = data.to_tensordict()
    assert td.batch_size == torch.Size([3])
    back = DataProto.from_tensordict(td)
    assert torch.equal(back.batch["ids"], data.batch["ids"]) and torch.equal(
        back.batch["score"], data.batch["score"]
    )
    assert uids(back) == ["u0", "u1", "u2"] and back.non_tensor_batch["extra"].tolist() == [
        {"k": 1},
        [1, 2],
        "s",
    ]
    assert back.meta_info == {"temperature": 0.5, "tags": ["a"]}
    data.meta_info["uid"] = "clash"
    with pytest.raises(DataProtoError, match=r"\['uid'\] appear in two parts"):
        data.to_tensordict()


def test_get_data_info_and_print_size_describe_the_batch(capsys):
    data = make(2, {"temperature": 0.5, "metrics": {"loss": [1.0]}})
    info = data.get_data_info().splitlines()
    assert "  ids: (2, 2) (torch.int64) cpu" in info and "  uid: ndarray(2,) (object)" in info
    assert "  metrics: dict[str: list[float]]" in info and "  temperature: float" in info
    data.print_size(prefix="rollout")
    assert capsys.readouterr().out.startswith("rollout, Size of tensordict: ")


def test_all_gather_data_proto_in_a_group_of_one_keeps_the_rows():
    if dist.is_initialized():
        pytest.skip("a process group is already set up in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        data = make(3, {"step": 2})
        all_gather_data_proto(data, None)
        assert uids(data) == ["u0", "u1", "u2"] and data.meta_info == {"step": 2}
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------------- the package surface
def test_verl_exports_dataproto_lazily_and_its_version():
    from verl import DataProto as Exported
    from verl import DataProtoFuture as ExportedFuture
    from verl import __version__

    assert Exported is DataProto and ExportedFuture is DataProtoFuture and __version__ == "0.9.1"
    probe = "import sys, verl, verl.config; print(verl.__version__, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["0.9.1", "False"]  # `import verl` and the config do not load torch


@pytest.mark.usefixtures("ray_session")
def test_data_proto_future_concat_get_fetches_and_joins_ray_refs():
    import ray

    parts = [make(2, {"metrics": {"loss": float(i)}}) for i in range(2)]
    parts[1].batch["ids"] += 100
    future = DataProtoFuture.concat([ray.put(p) for p in parts])
    whole = future.get()
    assert uids(whole) == ["u0", "u1", "u0", "u1"] and whole.meta_info == {"metrics": {"loss": [0.0, 1.0]}}
    halves = future.chunk(2)
    assert [h.get().batch["ids"].tolist() for h in halves] == [[[0, 1], [2, 3]], [[100, 101], [102, 103]]]
