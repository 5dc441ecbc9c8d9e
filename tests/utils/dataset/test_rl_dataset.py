import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from tests.utils.dataset.char_tokenizer import CHAT_TEMPLATE, make_char_tokenizer
from verl.config.data import DataConfig
from verl.protocol import DataProto
from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn, create_rl_dataset, truncate_ids
from verl.utils.dataset.schema import DatasetError, make_row


def char_id(ch: str) -> int:
    """The test tokenizer's id of a printable character (0 pad, 1 eos, then ASCII 32..126)."""
    return 2 + ord(ch) - 32


def write_rows(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


@pytest.fixture
def tokenizer():
    return make_char_tokenizer()


@pytest.fixture
def arith_file(tmp_path):
    rows = [
        make_row("arith", "3+4=", "arithmetic", "7", "train", 0),
        make_row("arith", "12+30=", "arithmetic", "42", "train", 1),
    ]
    return write_rows(tmp_path / "arith.parquet", rows)


def test_item_is_left_padded_with_positions(arith_file, tokenizer):
    ds = RLHFDataset(arith_file, tokenizer, DataConfig(max_prompt_length=6))
    item = ds[0]
    ids = [char_id(c) for c in "3+4="]
    assert item["input_ids"].tolist() == [0, 0, *ids]
    assert item["attention_mask"].tolist() == [0, 0, 1, 1, 1, 1]
    assert item["position_ids"].tolist() == [0, 0, 0, 1, 2, 3]
    assert item["raw_prompt_ids"] == ids
    assert item["data_source"] == "arith"
    assert item["reward_model"] == {"style": "rule", "ground_truth": "7"}
    assert item["extra_info"] == {"split": "train", "index": 0}
    assert item["ability"] == "arithmetic"
    assert item["index"] == 0
    assert "raw_prompt" not in item and "prompt" not in item


def test_chat_template_and_raw_outputs(arith_file):
    tokenizer = make_char_tokenizer(CHAT_TEMPLATE)
    config = DataConfig(max_prompt_length=40, return_raw_chat=True, return_full_prompt=True)
    item = RLHFDataset(arith_file, tokenizer, config)[0]
    text = "<user>3+4=\n<assistant>"
    assert item["full_prompts"] == text
    assert tokenizer.decode(item["raw_prompt_ids"]) == text
    assert item["raw_prompt"] == [{"role": "user", "content": "3+4="}]
    assert int(item["attention_mask"].sum()) == len(text)


def test_without_template_messages_are_joined(tmp_path, tokenizer):
    row = make_row(
        "arith", [{"role": "system", "content": "s"}, {"role": "user", "content": "1+1="}], "a", "2", "t", 0
    )
    ds = RLHFDataset(write_rows(tmp_path / "f.parquet", [row]), tokenizer, DataConfig(max_prompt_length=8))
    assert tokenizer.decode(ds[0]["raw_prompt_ids"]) == "s\n1+1="


@pytest.mark.parametrize(
    ("mode", "expected"),
    [("left", [3, 4, 5, 6]), ("right", [1, 2, 3, 4]), ("middle", [1, 2, 5, 6])],
)
def test_truncate_ids(mode, expected):
    assert truncate_ids([1, 2, 3, 4, 5, 6], 4, mode, "loc") == expected
    assert truncate_ids([1, 2], 4, mode, "loc") == [1, 2]


def test_truncate_middle_odd_length():
    assert truncate_ids([1, 2, 3, 4, 5, 6], 3, "middle", "loc") == [1, 5, 6]


def test_truncation_applies_in_items(arith_file, tokenizer):
    ds = RLHFDataset(arith_file, tokenizer, DataConfig(max_prompt_length=4, truncation="left"))
    assert ds[1]["raw_prompt_ids"] == [char_id(c) for c in "+30="]
    assert ds[1]["attention_mask"].tolist() == [1, 1, 1, 1]


def test_overlong_prompt_fails_at_load_time(arith_file, tokenizer):
    with pytest.raises(DatasetError) as err:
        RLHFDataset(arith_file, tokenizer, DataConfig(max_prompt_length=5))
    assert f"{arith_file}, row 1, column 'prompt'" in str(err.value)
    assert "6 tokens" in str(err.value) and "filter_overlong_prompts" in str(err.value)


def test_filter_overlong_prompts(arith_file, tokenizer):
    ds = RLHFDataset(arith_file, tokenizer, DataConfig(max_prompt_length=5, filter_overlong_prompts=True))
    assert len(ds) == 1 and ds[0]["reward_model"]["ground_truth"] == "7"
    with pytest.raises(DatasetError, match="every prompt is longer"):
        RLHFDataset(arith_file, tokenizer, DataConfig(max_prompt_length=2, filter_overlong_prompts=True))


def test_remembered_prompt_lengths_follow_the_file_and_the_template(tmp_path, arith_file, tokenizer):
    """The load-time length check remembers counts per file and tokenizer; a rewritten file or
    another chat template is measured again."""
    fits = DataConfig(max_prompt_length=6)
    RLHFDataset(arith_file, tokenizer, fits)
    RLHFDataset(arith_file, tokenizer, fits)  # remembered
    with pytest.raises(DatasetError, match="row 0"):  # the template adds tokens: measured again
        RLHFDataset(arith_file, make_char_tokenizer(CHAT_TEMPLATE), fits)
    rows = [make_row("arith", "3+4=", "arithmetic", "7", "train", 0)]
    rows.append(make_row("arith", "123+4567=", "arithmetic", "4690", "train", 1))
    write_rows(arith_file, rows)  # the same path, rewritten
    with pytest.raises(DatasetError, match="9 tokens"):
        RLHFDataset(arith_file, tokenizer, fits)


def test_several_files_and_max_samples(tmp_path, arith_file, tokenizer):
    other = write_rows(tmp_path / "b.parquet", [make_row("openai/gsm8k", "1+1=", "math", "2", "test", 5)])
    ds = RLHFDataset([arith_file, other], tokenizer, DataConfig(max_prompt_length=8))
    assert len(ds) == 3
    assert [ds[i]["data_source"] for i in range(3)] == ["arith", "arith", "openai/gsm8k"]
    assert ds[2]["index"] == 5
    assert ds.data_source_locations() == {"arith": f"{arith_file}, row 0", "openai/gsm8k": f"{other}, row 0"}
    assert (
        len(RLHFDataset([arith_file, other], tokenizer, DataConfig(max_prompt_length=8), max_samples=2)) == 2
    )


def test_files_with_different_optional_columns_collate(tmp_path, arith_file, tokenizer):
    bare = {
        "data_source": "arith",
        "prompt": [{"role": "user", "content": "1+1="}],
        "reward_model": {"ground_truth": "2"},
    }
    other = write_rows(tmp_path / "bare.parquet", [bare])
    ds = RLHFDataset([arith_file, other], tokenizer, DataConfig(max_prompt_length=8))
    batch = collate_fn([ds[0], ds[2]])
    assert batch["extra_info"][1] is None and batch["ability"][1] is None
    assert batch["index"].tolist() == [0, 0]  # no extra_info.index: the row number


def test_collate_makes_a_dataproto(arith_file, tokenizer):
    ds = RLHFDataset(arith_file, tokenizer, DataConfig(max_prompt_length=8, return_raw_chat=True))
    batch = collate_fn([ds[0], ds[1]])
    assert batch["input_ids"].shape == (2, 8) and batch["input_ids"].dtype == torch.long
    assert batch["raw_prompt_ids"].dtype == object and batch["raw_prompt_ids"].shape == (2,)
    assert batch["raw_prompt_ids"][1] == [char_id(c) for c in "12+30="]
    data = DataProto.from_single_dict(batch)
    assert len(data) == 2
    assert data.non_tensor_batch["raw_prompt"][0] == [{"role": "user", "content": "3+4="}]
    assert isinstance(data.non_tensor_batch["reward_model"], np.ndarray)


def test_collate_rejects_mismatched_items():
    with pytest.raises(ValueError, match="item 1 has keys"):
        collate_fn([{"a": 1}, {"b": 2}])


def test_custom_dataset_class(tmp_path, arith_file, tokenizer):
    (tmp_path / "my_ds.py").write_text(
        "class MyDataset(list):\n"
        "    def __init__(self, data_files, tokenizer, config, processor=None, max_samples=-1):\n"
        "        super().__init__([data_files, max_samples])\n"
    )
    config = DataConfig(max_prompt_length=8)
    config.custom_cls.path, config.custom_cls.name = str(tmp_path / "my_ds.py"), "MyDataset"
    assert create_rl_dataset(arith_file, config, tokenizer, max_samples=3) == [arith_file, 3]
    assert isinstance(create_rl_dataset(arith_file, DataConfig(max_prompt_length=8), tokenizer), RLHFDataset)


# ---------------------------------------------------------------------- bad input at load time
def test_missing_file(tmp_path, tokenizer):
    with pytest.raises(DatasetError, match=r"nope.parquet: no such file"):
        RLHFDataset(str(tmp_path / "nope.parquet"), tokenizer, DataConfig())


def test_a_directory_is_reported_as_one(tmp_path, arith_file, tokenizer):
    # arith_file lives in tmp_path: the message names the directory and suggests the file in it
    with pytest.raises(DatasetError, match=r"is a directory; .*expect a parquet file.*arith.parquet"):
        RLHFDataset(str(tmp_path), tokenizer, DataConfig())


def test_empty_file(tmp_path, tokenizer):
    (tmp_path / "empty.parquet").write_bytes(b"")
    with pytest.raises(DatasetError, match=r"empty.parquet: the file is empty"):
        RLHFDataset(str(tmp_path / "empty.parquet"), tokenizer, DataConfig())


def test_not_parquet(tmp_path, tokenizer):
    (tmp_path / "data.parquet").write_text('{"prompt": "json, not parquet"}')
    with pytest.raises(DatasetError, match=r"data.parquet: not a readable parquet file"):
        RLHFDataset(str(tmp_path / "data.parquet"), tokenizer, DataConfig())


def test_parquet_without_rows(tmp_path, tokenizer):
    schema = pa.schema([("data_source", pa.string()), ("prompt", pa.string()), ("reward_model", pa.string())])
    pq.write_table(schema.empty_table(), tmp_path / "none.parquet")
    with pytest.raises(DatasetError, match=r"none.parquet: the file has no rows"):
        RLHFDataset(str(tmp_path / "none.parquet"), tokenizer, DataConfig())


def test_misnamed_column(tmp_path, tokenizer):
    row = make_row("arith", "1+1=", "a", "2", "train", 0)
    row["prompts"] = row.pop("prompt")
    path = write_rows(tmp_path / "f.parquet", [row])
    with pytest.raises(
        DatasetError, match=r"f.parquet, column 'prompt': missing column.*did you mean 'prompts'"
    ):
        RLHFDataset(path, tokenizer, DataConfig())


def test_prompt_key_is_configurable(tmp_path, tokenizer):
    row = make_row("arith", "1+1=", "a", "2", "train", 0)
    row["question"] = row.pop("prompt")
    path = write_rows(tmp_path / "f.parquet", [row])
    assert len(RLHFDataset(path, tokenizer, DataConfig(prompt_key="question"))) == 1


@pytest.mark.parametrize(
    ("field", "value", "column", "message"),
    [
        ("prompt", "1+1=", "prompt", "list of chat messages"),
        ("reward_model", {"style": "rule", "ground_truth": None}, "reward_model", "missing ground truth"),
        ("data_source", "", "data_source", "non-empty string"),
    ],
)
def test_bad_row_names_file_row_column(tmp_path, tokenizer, field, value, column, message):
    good = make_row("arith", "1+1=", "a", "2", "train", 0)
    bad = dict(good, **{field: value})
    # pyarrow needs one type per column, so the bad row gets its own file, placed second
    path = write_rows(tmp_path / "bad.parquet", [dict(bad), dict(bad)])
    with pytest.raises(DatasetError) as err:
        RLHFDataset([write_rows(tmp_path / "good.parquet", [good]), path], tokenizer, DataConfig())
    assert str(err.value).startswith(f"{path}, row 0, column '{column}'")
    assert message in str(err.value)


def test_wrong_type_in_a_later_row(tmp_path, tokenizer):
    rows = [make_row("arith", "1+1=", "a", "2", "train", i) for i in range(3)]
    rows[2]["prompt"] = [{"role": "user", "content": None}]
    path = write_rows(tmp_path / "f.parquet", rows)
    with pytest.raises(
        DatasetError, match=r"f.parquet, row 2, column 'prompt': message 0 needs a string 'content'"
    ):
        RLHFDataset(path, tokenizer, DataConfig())
