"""A mistake in the config, the data or the model is one line on stderr, not a traceback; the
traceback is still there with ``HYDRA_FULL_ERROR=1``, and in-process callers get the exception."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.trainer.config import main_ppo_in_process
from verl.config.base import ConfigError
from verl.config.cli import user_errors_as_one_line
from verl.utils.dataset.schema import DatasetError
from verl.utils.model import ModelPathError

REPO_ROOT = Path(__file__).resolve().parents[3]


def run(module: str, *args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """``python -m module args`` from an empty folder (Hydra writes its log there)."""
    pythonpath = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": pythonpath, "HYDRA_FULL_ERROR": "0"},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    ("module", "override", "line"),
    [
        (
            "verl.trainer.main_ppo",
            "actor_rollout_ref.model.lora_rank=-8",
            "Error in the config: actor_rollout_ref.model.lora_rank: expected at least 0, got -8",
        ),
        (
            "verl.trainer.sft_trainer",
            "optim.weight_decay=-1",
            "Error in the config: optim.weight_decay: expected at least 0, got -1.0",
        ),
        (
            "verl.trainer.rm_trainer",
            "data.train_batch_size=0",
            "Error in the config: data.train_batch_size: expected a positive integer, got 0",
        ),
        (
            "recipe.dapo.main_dapo",
            "algorithm.gamma=2",
            "Error in the config: algorithm.gamma: expected a value in [0, 1], got 2.0",
        ),
    ],
    ids=["ppo", "sft", "rm", "dapo"],
)
def test_a_bad_value_is_one_line_and_a_failed_exit(module, override, line, tmp_path):
    out = run(module, override, tmp_path=tmp_path)
    assert out.returncode != 0
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    assert out.stderr.strip().splitlines()[-1] == line, out.stderr[-3000:]
    assert out.stderr.count("Error in the") == 1


# More of main_ppo's mistakes, run in this process: the same calls as the command line above.
@pytest.mark.parametrize(
    ("override", "line"),
    [
        (
            "trainer.total_training_steps=-3",
            "Error in the config: trainer.total_training_steps: expected null or at least 1, got -3",
        ),
        (  # refused by Hydra itself, before the job starts
            "trainer.no_such_key=1",
            "Error in the config: trainer.no_such_key: unknown key; this project does not read it "
            "(--cfg job prints the keys it knows)",
        ),
    ],
    ids=["ppo-steps", "ppo-unknown-key"],
)
def test_main_ppos_other_bad_values_are_one_line_and_a_failed_exit(override, line, monkeypatch, capsys):
    monkeypatch.setenv("HYDRA_FULL_ERROR", "0")
    with pytest.raises(SystemExit) as exit_:
        main_ppo_in_process.run_job(override)
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1] == line, err[-3000:]
    assert err.count("Error in the") == 1


def test_hydra_full_error_raises_the_error_for_its_traceback(monkeypatch):
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    with pytest.raises(
        ConfigError, match=r"^actor_rollout_ref\.model\.lora_rank: expected at least 0, got -8$"
    ):
        main_ppo_in_process.run_job("actor_rollout_ref.model.lora_rank=-8")


@pytest.mark.parametrize(
    ("error", "line"),
    [
        (ConfigError("data.train_batch_size: expected a positive integer, got 0"), "Error in the config: "),
        (DatasetError("train.parquet: expected the columns 'prompt'"), "Error in the data: "),
        (
            ModelPathError("actor_rollout_ref.model.path='/x': the directory /x does not exist"),
            "Error in the model: ",
        ),
    ],
)
def test_each_kind_of_user_error_is_one_line(error, line, capsys):
    with pytest.raises(SystemExit) as exit_, user_errors_as_one_line():
        raise error
    assert exit_.value.code == 1
    assert capsys.readouterr().err == f"{line}{error}\n"


def test_other_errors_pass_through():
    with pytest.raises(RuntimeError, match="a bug"), user_errors_as_one_line():
        raise RuntimeError("a bug")
