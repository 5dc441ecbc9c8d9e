import re

import pyarrow.parquet as pq
import pytest

from verl.builtin.arith import make_arith_rows, write_arith_parquet


def test_rows_follow_the_task_contract():
    rows = make_arith_rows(200, seed=0, split="train")
    assert len(rows) == 200
    for index, row in enumerate(rows):
        content = row["prompt"][0]["content"]
        match = re.fullmatch(r"(\d)\+(\d)=", content)
        assert match, content
        assert row["reward_model"]["ground_truth"] == str(int(match[1]) + int(match[2]))
        assert row["data_source"] == "arith"
        assert row["prompt"] == [{"role": "user", "content": content}]
        assert row["extra_info"] == {"split": "train", "index": index}
    # only digits, '+' and '=' appear in prompts (the embedded model's vocabulary)
    assert set("".join(r["prompt"][0]["content"] for r in rows)) <= set("0123456789+=")


def test_rows_are_deterministic_and_splits_differ():
    assert make_arith_rows(50, 3, "train") == make_arith_rows(50, 3, "train")
    assert make_arith_rows(50, 3, "train") != make_arith_rows(50, 4, "train")
    assert make_arith_rows(50, 3, "train") != make_arith_rows(50, 3, "test")


def test_operand_range_is_configurable():
    rows = make_arith_rows(100, 0, "train", low=10, high=12)
    for row in rows:
        a, b = row["prompt"][0]["content"].rstrip("=").split("+")
        assert 10 <= int(a) <= 12 and 10 <= int(b) <= 12
    with pytest.raises(ValueError, match="low <= high"):
        make_arith_rows(1, 0, "train", low=5, high=2)


def test_write_arith_parquet(tmp_path):
    train, test = write_arith_parquet(tmp_path / "arith", train_size=30, test_size=7, seed=1)
    assert (train.name, test.name) == ("train.parquet", "test.parquet")
    assert pq.read_table(train).num_rows == 30 and pq.read_table(test).num_rows == 7
    assert pq.read_table(train).to_pylist() == make_arith_rows(30, 1, "train")
    assert not [p for p in (tmp_path / "arith").iterdir() if p.name.startswith(".tmp")]
