"""examples/data_preprocess/code_offline.py: run it for real, load what it wrote, and check that
every reference solution passes its own test cases in the sandbox (and not another problem's)."""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor

import pyarrow.parquet as pq
import pytest

from tests.examples.test_data_preprocess import load, run_script
from verl.tools.sandbox import run_python
from verl.utils.reward_score import code


def write(tmp_path, *args):
    result = run_script("code_offline.py", "--local_dir", tmp_path, *args)
    assert result.returncode == 0, result.stderr
    return load(tmp_path / "train.parquet").rows, load(tmp_path / "test.parquet").rows


def test_rows_cover_both_styles_and_the_split_is_seeded(tmp_path):
    train, test = write(tmp_path / "a", "--test_size", 6)
    assert (len(train), len(test)) == (38, 6)
    truths = [json.loads(r["reward_model"]["ground_truth"]) for r in train + test]
    assert {"fn_name" in t for t in truths} == {True, False}
    assert all(r["data_source"] == "code_offline" and r["ability"] == "code" for r in train + test)
    prompts = {r["prompt"][0]["content"] for r in train + test}
    assert len(prompts) == 44 and all("```python" in p for p in prompts)
    write(tmp_path / "b", "--test_size", 6)
    assert pq.read_table(tmp_path / "a" / "test.parquet").equals(
        pq.read_table(tmp_path / "b" / "test.parquet")
    )
    _, other = write(tmp_path / "c", "--test_size", 6, "--seed", 1)
    assert {r["prompt"][0]["content"] for r in other} != {r["prompt"][0]["content"] for r in test}


def test_a_bad_test_size_is_refused(tmp_path):
    result = run_script("code_offline.py", "--local_dir", tmp_path, "--test_size", 44)
    assert result.returncode != 0 and "--test_size must be between 1 and 43" in result.stderr


def test_every_reference_solution_passes_its_cases_in_the_sandbox(tmp_path):
    if not sys.platform.startswith("linux") or run_python("pass", timeout_s=60).status == "error":
        pytest.skip("no usable sandbox on this machine (docs/sandbox.md)")
    train, test = write(tmp_path)
    rows = train + test

    def score(row, truth_row, timeout_s: float = 60.0):
        """The reward of ``row``'s solution on ``truth_row``'s cases. The time limit only catches a
        hang: the scorer's own 3 s per case was once too short for a Python start-up on a busy
        machine (the suite's other worker training beside these four threads)."""
        response = f"```python\n{row['extra_info']['solution']}\n```"
        return code.compute_score(response, truth_row["reward_model"]["ground_truth"], timeout_s=timeout_s)

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(score, rows, rows))
    failing = [r["prompt"][0]["content"][:60] for r, s in zip(rows, results) if s["score"] != 1.0]
    assert not failing
    # a solution to another problem fails: the cases discriminate
    assert score(rows[0], rows[1])["score"] < 1.0
