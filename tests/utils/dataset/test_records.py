import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from verl.utils.dataset.records import find_split_files, load_local_splits, read_records, require_fields
from verl.utils.dataset.schema import DatasetError


def test_read_jsonl_json_and_parquet(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"q": 1}\n\n{"q": 2}\n')
    (tmp_path / "b.json").write_text(json.dumps([{"q": 3}]))
    pq.write_table(pa.Table.from_pylist([{"q": 4}]), tmp_path / "c.parquet")
    assert read_records(tmp_path / "a.jsonl") == [{"q": 1}, {"q": 2}]
    assert read_records(tmp_path / "b.json") == [{"q": 3}]
    assert read_records(tmp_path / "c.parquet") == [{"q": 4}]


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("bad.jsonl", '{"q": 1}\n{oops\n', "line 2: invalid JSON"),
        ("list.jsonl", "[1, 2]", "row 0: expected a JSON object"),
        ("empty.jsonl", "", "the file is empty"),
        ("x.csv", "q\n1\n", "unsupported file type"),
        ("fake.parquet", "not parquet", "not a readable parquet file"),
    ],
)
def test_read_records_errors_name_the_file(tmp_path, name, content, message):
    (tmp_path / name).write_text(content)
    with pytest.raises(DatasetError, match=message) as err:
        read_records(tmp_path / name)
    assert name in str(err.value)


def test_split_files_are_found_recursively(tmp_path):
    (tmp_path / "main").mkdir()
    pq.write_table(pa.Table.from_pylist([{"q": 1}]), tmp_path / "main" / "train-00000-of-00001.parquet")
    (tmp_path / "test.jsonl").write_text('{"q": 2}\n')
    assert [p.name for p in find_split_files(tmp_path, "train")] == ["train-00000-of-00001.parquet"]
    splits = load_local_splits(tmp_path, ["train", "test"])
    assert [r.data for r in splits["train"]] == [{"q": 1}]
    assert splits["test"][0].file.endswith("test.jsonl") and splits["test"][0].row == 0


def test_missing_split_and_missing_path(tmp_path):
    (tmp_path / "train.jsonl").write_text('{"q": 1}\n')
    with pytest.raises(DatasetError, match="split 'test'"):
        load_local_splits(tmp_path, ["train", "test"])
    with pytest.raises(DatasetError, match="no such file or folder"):
        load_local_splits(tmp_path / "nope", ["train"])
    with pytest.raises(DatasetError, match="a single file gives one split"):
        load_local_splits(tmp_path / "train.jsonl", ["train", "test"])


def test_require_fields():
    require_fields({"question": "q"}, ["question"], "f", 0)
    with pytest.raises(DatasetError, match="f, row 3, column 'answer': missing field"):
        require_fields({"question": "q"}, ["question", "answer"], "f", 3)
    with pytest.raises(DatasetError, match="column 'question': expected a non-empty string"):
        require_fields({"question": 5}, ["question"], "f", 0)
