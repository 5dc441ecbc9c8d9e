import pyarrow.parquet as pq
import pytest

from verl.utils.dataset.schema import DatasetError, make_row, validate_columns, validate_row, write_splits


def good_row(**overrides):
    row = {
        "data_source": "arith",
        "prompt": [{"role": "user", "content": "1+1="}],
        "ability": "arithmetic",
        "reward_model": {"style": "rule", "ground_truth": "2"},
        "extra_info": {"split": "train", "index": 0},
    }
    row.update(overrides)
    return row


def test_make_row_builds_the_schema():
    row = make_row("openai/gsm8k", "What is 2+2?", "math", "4", "test", 3, extra_info={"question": "q"})
    assert row == {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": "What is 2+2?"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "4"},
        "extra_info": {"split": "test", "index": 3, "question": "q"},
    }


def test_make_row_rejects_a_missing_ground_truth():
    with pytest.raises(DatasetError, match="ground truth"):
        make_row("x", "p", "math", None, "train", 0)


@pytest.mark.parametrize(
    ("overrides", "column", "message"),
    [
        ({"prompt": "just text"}, "prompt", "list of chat messages"),
        ({"prompt": []}, "prompt", "non-empty list"),
        ({"prompt": [{"content": "hi"}]}, "prompt", "message 0 needs a string 'role'"),
        ({"prompt": [{"role": "user", "content": 5}]}, "prompt", "message 0 needs a string 'content'"),
        ({"prompt": ["hi"]}, "prompt", "message 0 must be a dict"),
        ({"data_source": 7}, "data_source", "non-empty string"),
        ({"reward_model": "2"}, "reward_model", "expected a dict"),
        ({"reward_model": {"style": "rule"}}, "reward_model", "missing ground truth"),
        ({"reward_model": {"style": "rule", "ground_truth": None}}, "reward_model", "missing ground truth"),
        ({"extra_info": [1]}, "extra_info", "dict or null"),
        ({"ability": 3}, "ability", "expected a string"),
    ],
)
def test_validate_row_names_file_row_and_column(overrides, column, message):
    with pytest.raises(DatasetError) as err:
        validate_row(good_row(**overrides), "data.parquet", 12)
    text = str(err.value)
    assert text.startswith(f"data.parquet, row 12, column '{column}'")
    assert message in text


def test_validate_row_accepts_structured_ground_truth_and_custom_keys():
    row = good_row(reward_model={"ground_truth": {"target": 3, "numbers": [1, 2]}})
    row["question"] = row.pop("prompt")
    validate_row(row, "f", 0, prompt_key="question")


def test_validate_columns_suggests_a_close_name():
    with pytest.raises(
        DatasetError, match=r"f.parquet, column 'prompt': missing column.*did you mean 'prompts'"
    ):
        validate_columns(["prompts", "data_source"], "f.parquet", ["data_source", "prompt"])
    validate_columns(["prompt", "data_source"], "f.parquet", ["data_source", "prompt"])


def test_write_splits_is_atomic_and_round_trips(tmp_path):
    rows = [make_row("arith", "1+1=", "arithmetic", "2", "train", 0)]
    paths = write_splits({"train": rows, "test": rows}, tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["test.parquet", "train.parquet"]
    assert pq.read_table(paths["train"]).to_pylist() == rows


def test_write_splits_refuses_an_empty_split(tmp_path):
    with pytest.raises(DatasetError, match="'test' has no rows"):
        write_splits({"test": []}, tmp_path)
