"""``python -m verl.trainer.main_eval``: verl's ``test_score/<data_source>`` (the mean over rows of each
row's mean score) of hand-made files with known right and wrong answers, with the built-in scorers
or a custom function file, and the errors a user can make."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from verl.config.cli import check_argv, compose_config
from verl.config.compat import strip_schema_plus
from verl.config.ppo_trainer import CONFIG_DIR
from verl.trainer import main_eval
from verl.trainer.main_eval import EvalConfig, load_eval_config, run_eval
from verl.utils.errors import UserInputError

REPO_ROOT = Path(__file__).resolve().parents[2]
# (data_source, responses, ground truth): arith rows score 1, 1/2, 0; gsm8k rows 2/3, 0
ROWS = [
    ("arith", ["7", " 7 "], "7"),
    ("arith", ["4", "5"], "4"),
    ("arith", ["x"], "2"),
    ("openai/gsm8k", ["so #### 12", "#### 12", "#### 3"], "12"),
    ("openai/gsm8k", ["12"], "12"),  # no "#### n": the strict scorer finds no answer
]
EXPECTED = {"test_score/arith": (1 + 0.5 + 0) / 3, "test_score/openai/gsm8k": (2 / 3 + 0) / 2}
CUSTOM = """
def compute_score(data_source, solution_str, ground_truth):
    if solution_str == "boom":
        raise ValueError("cannot score this")
    return {"score": 1.0 if solution_str.startswith(ground_truth) else 0.25}
"""


def write_rows(path: Path, rows: list[tuple[str, list[str], str]]) -> str:
    frame = pd.DataFrame(
        {
            "data_source": [source for source, _, _ in rows],
            "prompt": [[{"role": "user", "content": "q"}] for _ in rows],
            "responses": [responses for _, responses, _ in rows],
            "reward_model": [{"style": "rule", "ground_truth": truth} for _, _, truth in rows],
        }
    )
    frame.to_parquet(path)
    return str(path)


@pytest.fixture
def scored_file(tmp_path) -> str:
    return write_rows(tmp_path / "gen.parquet", ROWS)


@pytest.fixture
def custom_file(tmp_path) -> str:
    path = tmp_path / "my_reward.py"
    path.write_text(CUSTOM)
    return str(path)


def evaluate(*overrides: str) -> dict[str, float]:
    return run_eval(load_eval_config(["ray_kwargs.ray_init.num_cpus=1", *overrides]))


def test_the_built_in_scorers_give_the_mean_of_row_means_per_data_source(scored_file):
    assert evaluate(f"data.path={scored_file}") == EXPECTED


def test_a_custom_function_scores_every_response_and_a_failing_call_scores_0(tmp_path, custom_file, caplog):
    rows = [("my_task", ["12 apples", "11", "boom"], "12"), ("my_task", ["3"], "3"), ("other", ["no"], "1")]
    path = write_rows(tmp_path / "custom.parquet", rows)
    with caplog.at_level(logging.WARNING, logger="verl.trainer.main_eval"):
        metrics = evaluate(f"data.path={path}", f"custom_reward_function.path={custom_file}")
    assert metrics == {"test_score/my_task": ((1 + 0.25 + 0) / 3 + 1) / 2, "test_score/other": 0.25}
    assert "row 0: scorer call error, scored 0: ValueError: cannot score this" in caplog.text


def test_other_column_names_are_read(tmp_path):
    frame = pd.read_parquet(write_rows(tmp_path / "gen.parquet", ROWS[:2]))
    frame = frame.rename(columns={"responses": "gen", "data_source": "src", "reward_model": "rm"})
    frame.to_parquet(tmp_path / "renamed.parquet")
    metrics = evaluate(
        f"data.path={tmp_path / 'renamed.parquet'}",
        "data.response_key=gen",
        "data.data_source_key=src",
        "data.reward_model_key=rm",
    )
    assert metrics == {"test_score/arith": 0.75}


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["data.response_key=answers"],
            r"data\.response_key=answers: .*gen\.parquet, column 'answers': missing",
        ),
        (["data.path=/no/such.parquet"], r"data\.path: /no/such\.parquet: no such file"),
        (["custom_reward_function.path=/no/such.py"], r"custom_reward_function\.path: expected an existing"),
        (["custom_reward_function.name=nope", "CUSTOM"], r"custom_reward_function\.name: .* has no function"),
    ],
)
def test_bad_input_is_an_error_naming_the_key(scored_file, custom_file, overrides, message):
    overrides = [f"custom_reward_function.path={custom_file}" if o == "CUSTOM" else o for o in overrides]
    with pytest.raises(UserInputError, match=message):
        evaluate(f"data.path={scored_file}", *overrides)


def test_a_data_source_without_a_built_in_scorer_asks_for_a_custom_function(tmp_path):
    path = write_rows(tmp_path / "gen.parquet", [("my_task", ["1"], "1")])
    with pytest.raises(
        UserInputError,
        match=r"no built-in scorer for data source\(s\) \['my_task'\].*custom_reward_function\.path",
    ):
        evaluate(f"data.path={path}")


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    pythonpath = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return subprocess.run(
        [sys.executable, "-m", "verl.trainer.main_eval", *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": pythonpath, "HYDRA_FULL_ERROR": "0"},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_command_line_prints_the_scores(scored_file, capsys):
    """The calls of the module's ``__main__`` block, in this process (the test below runs the process)."""
    argv = [f"data.path={scored_file}", "ray_kwargs.ray_init.num_cpus=2"]
    argv = check_argv(strip_schema_plus(argv, EvalConfig), "evaluation", CONFIG_DIR, main_eval._load_for_cfg)
    main_eval.main(compose_config(argv, "evaluation", CONFIG_DIR))
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(EXPECTED)


def test_the_command_line_reports_an_unknown_key_in_one_line(tmp_path):
    run = run_cli("data.responses_key=x", cwd=tmp_path)
    assert run.returncode == 1
    assert run.stderr.strip().splitlines() == [
        "Error in the config: data.responses_key: unknown key; this project does not read it "
        "(--cfg job prints the keys it knows)"
    ]
