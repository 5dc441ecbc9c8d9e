"""Run every offline preprocessing script for real and load what it wrote."""

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.utils.dataset.char_tokenizer import CHAT_TEMPLATE as CHAT
from tests.utils.dataset.char_tokenizer import make_char_tokenizer
from verl.config.data import DataConfig
from verl.utils.dataset.rl_dataset import RLHFDataset
from verl.utils.reward_score import default_compute_score

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "examples" / "data_preprocess"


def run_script(name, *args):
    result = subprocess.run(
        [sys.executable, str(SCRIPTS / name), *map(str, args)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return result


def load(path):
    return RLHFDataset(str(path), make_char_tokenizer(), DataConfig(max_prompt_length=1024))


def test_every_script_documents_its_command():
    for script in SCRIPTS.glob("*.py"):
        doc = script.read_text().split('"""')[1]
        assert f"python examples/data_preprocess/{script.name}" in doc, script.name


def test_arith(tmp_path):
    result = run_script(
        "arith.py", "--local_dir", tmp_path, "--train_size", 40, "--test_size", 8, "--seed", 3
    )
    assert result.returncode == 0, result.stderr
    train, test = load(tmp_path / "train.parquet"), load(tmp_path / "test.parquet")
    assert (len(train), len(test)) == (40, 8)
    row = train.rows[0]
    a, b = row["prompt"][0]["content"].rstrip("=").split("+")
    assert row["reward_model"]["ground_truth"] == str(int(a) + int(b))


def test_countdown_puzzles_are_solvable(tmp_path):
    result = run_script(
        "countdown.py", "--local_dir", tmp_path, "--train_size", 30, "--test_size", 5, "--num_operands", 4
    )
    assert result.returncode == 0, result.stderr
    train = load(tmp_path / "train.parquet")
    assert len(train) == 30
    for row in train.rows:
        truth = row["reward_model"]["ground_truth"]
        assert len(truth["numbers"]) == 4 and 1 <= truth["target"] <= 1000
        answer = f"<answer>{row['extra_info']['solution']}</answer>"
        assert default_compute_score("countdown", answer, truth) == 1.0
    again = tmp_path / "again"
    run_script(
        "countdown.py", "--local_dir", again, "--train_size", 30, "--test_size", 5, "--num_operands", 4
    )
    assert pq.read_table(again / "train.parquet").equals(pq.read_table(tmp_path / "train.parquet"))


def test_gsm8k_from_local_jsonl(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    train = [
        {"question": "Tom has 3 apples and buys 1,200 more. How many?", "answer": "3+1200=1203\n#### 1,203"}
    ]
    test = [{"question": "What is 2+2?", "answer": "2+2=4\n#### 4"}] * 2
    (src / "train.jsonl").write_text("\n".join(json.dumps(r) for r in train))
    (src / "test.jsonl").write_text("\n".join(json.dumps(r) for r in test))
    result = run_script("gsm8k.py", "--local_dir", tmp_path / "out", "--local_dataset_path", src)
    assert result.returncode == 0, result.stderr
    ds = load(tmp_path / "out" / "train.parquet")
    row = ds.rows[0]
    assert row["data_source"] == "openai/gsm8k" and row["ability"] == "math"
    assert row["reward_model"]["ground_truth"] == "1203"
    assert '"####"' in row["prompt"][0]["content"] and row["prompt"][0]["content"].startswith("Tom has 3")
    assert (
        default_compute_score(row["data_source"], "... #### 1203", row["reward_model"]["ground_truth"]) == 1.0
    )
    assert len(load(tmp_path / "out" / "test.parquet")) == 2


def test_gsm8k_sft_chats_train_on_the_reference_solution(tmp_path):
    from verl.config.sft_trainer import SFTDataConfig
    from verl.utils.dataset.sft_dataset import SFTDataset

    src = tmp_path / "src"
    src.mkdir()
    rows = [{"question": "What is 2+2?", "answer": "2+2=4\n#### 4"}]
    for split in ("train", "test"):
        (src / f"{split}.jsonl").write_text(json.dumps(rows[0]))
    result = run_script("gsm8k_sft.py", "--local_dir", tmp_path / "out", "--local_dataset_path", src)
    assert result.returncode == 0, result.stderr
    data = SFTDataset(str(tmp_path / "out" / "train.parquet"), make_char_tokenizer(CHAT), SFTDataConfig())
    item = data[0]
    trained = [t for t, on in zip(item["input_ids"], item["loss_mask"]) if on]
    assert (
        data.tokenizer.decode(trained) == "2+2=4\n#### 4\n"
    )  # the solution and the turn's end, nothing else
    assert data.rows[0]["ground_truth"] == "4" and '"####"' in data.messages(0)[0][0]["content"]


def test_gsm8k_bad_local_file_names_file_row_and_column(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.jsonl").write_text(json.dumps({"question": "q", "answer": "no marker"}))
    (src / "test.jsonl").write_text(json.dumps({"question": "q"}))
    result = run_script("gsm8k.py", "--local_dir", tmp_path / "out", "--local_dataset_path", src)
    assert result.returncode != 0
    assert "train.jsonl, row 0, column 'answer'" in result.stderr and "####" in result.stderr
    assert not (tmp_path / "out").exists()


def test_math_from_local_parquet(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    rows = [
        {"problem": "Compute 1/2 + 1/4.", "solution": "It is $\\boxed{\\frac{3}{4}}$.", "level": "Level 1"},
        {"problem": "What is 2+3?", "solution": "So \\boxed{5}.", "level": "Level 1"},
    ]
    pq.write_table(pa.Table.from_pylist(rows), src / "train-00000.parquet")
    pq.write_table(
        pa.Table.from_pylist([{"problem": "p", "solution": "s", "answer": "7"}]), src / "test.parquet"
    )
    result = run_script("math_dataset.py", "--local_dir", tmp_path / "out", "--local_dataset_path", src)
    assert result.returncode == 0, result.stderr
    train = load(tmp_path / "out" / "train.parquet")
    assert [r["reward_model"]["ground_truth"] for r in train.rows] == ["\\frac{3}{4}", "5"]
    assert "\\boxed{}" in train.rows[0]["prompt"][0]["content"]
    assert train.rows[0]["extra_info"]["level"] == "Level 1"
    test = load(tmp_path / "out" / "test.parquet")
    assert test.rows[0]["reward_model"]["ground_truth"] == "7"
    source = train.rows[0]["data_source"]
    assert default_compute_score(source, "\\boxed{0.75}", "\\frac{3}{4}") == 1.0


def test_math_missing_box_is_an_error(tmp_path):
    (tmp_path / "test.jsonl").write_text(json.dumps({"problem": "p", "solution": "no box"}))
    result = run_script(
        "math_dataset.py",
        "--local_dir",
        tmp_path / "out",
        "--local_dataset_path",
        tmp_path / "test.jsonl",
        "--splits",
        "test",
    )
    assert result.returncode != 0
    assert "test.jsonl, row 0, column 'solution'" in result.stderr


def test_gsm_symbolic(tmp_path):
    pytest.importorskip("reasoning_gym")
    result = run_script("gsm_symbolic.py", "--local_dir", tmp_path, "--train_size", 12, "--test_size", 3)
    assert result.returncode == 0, result.stderr
    train = load(tmp_path / "train.parquet")
    assert len(train) == 12
    row = train.rows[0]
    assert row["data_source"] == "reasoning_gym/gsm_symbolic"
    assert row["reward_model"]["ground_truth"].lstrip("-").isdigit()
    answer = f"... #### {row['reward_model']['ground_truth']}"
    assert default_compute_score(row["data_source"], answer, row["reward_model"]["ground_truth"]) == 1.0
