"""Mistakes that ``main_ppo`` refuses at start-up, in one line naming what to change, before Ray starts
(``verl/trainer/preflight.py``): a distillation teacher folder that does not exist, once reported by
the teacher's worker 84 s later as ``actor_rollout_ref.model.path``."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from verl.builtin.task import build_char_tokenizer, tiny_qwen2
from verl.config.ppo_trainer import load_config
from verl.trainer.preflight import check_teachers
from verl.utils.model import ModelPathError

REPO_ROOT = Path(__file__).resolve().parents[2]
HANG = 120  # seconds: only a hang fails it (a refusal before Ray takes the imports' time, ~5-25 s)
TEACHER = "distillation.teacher_models.teacher_model.model_path"


def main_ppo(*overrides: str, cwd: Path) -> tuple[subprocess.CompletedProcess, float]:
    """``python -m verl.trainer.main_ppo`` with ``overrides``, and the seconds it took."""
    pythonpath = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    start = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "verl.trainer.main_ppo", *overrides, "trainer.logger=[console]"],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": pythonpath, "HYDRA_FULL_ERROR": "0"},
        capture_output=True,
        text=True,
        timeout=HANG * 2,
    )
    return run, time.monotonic() - start


def refusal(run: subprocess.CompletedProcess) -> str:
    """The one line a refused run prints last; Ray never started."""
    assert run.returncode == 1, run.stdout + run.stderr
    assert "Started a local Ray instance" not in run.stdout + run.stderr
    return run.stderr.strip().splitlines()[-1]


def write_teacher(folder: Path, rows: int) -> str:
    """A tiny Qwen2 over the student's tokenizer with ``rows`` embedding rows."""
    tokenizer = build_char_tokenizer()
    shape = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
    model = tiny_qwen2(tokenizer, 1, vocab_size=rows, num_key_value_heads=1, **shape)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def distillation(*overrides: str):
    return load_config(list(overrides), config_name="distillation_trainer")


@pytest.mark.usefixtures("builtin_assets")
def test_a_teacher_folder_that_does_not_exist_is_refused_before_ray_starts_naming_its_key(tmp_path):
    """It was reported after 84 s from inside the teacher's worker, as actor_rollout_ref.model.path."""
    run, seconds = main_ppo(
        "--config-name", "distillation_trainer", f"{TEACHER}=/no/such/teacher", cwd=tmp_path
    )
    assert refusal(run) == (
        f"Error in the model: {TEACHER}='/no/such/teacher': the directory /no/such/teacher does not exist "
        "(expected a Hugging Face model directory, or a hub id such as Qwen/Qwen2.5-0.5B-Instruct)"
    )
    assert seconds < HANG


@pytest.mark.usefixtures("builtin_assets")
def test_each_of_several_teachers_is_checked_under_its_own_entry_name(tmp_path):
    teacher = write_teacher(tmp_path / "teacher", rows=15)
    entries = []
    for name, path in (("math", teacher), ("code", "/no/such/code_teacher")):
        entry = f"+distillation.teacher_models.{name}"
        entries += [f"{entry}.key={name}", f"{entry}.model_path={path}", f"{entry}.num_replicas=1"]
        entries += [f"{entry}.inference.tensor_model_parallel_size=1"]
    config = distillation(*entries, "distillation.n_gpus_per_node=2")
    with pytest.raises(ModelPathError, match=r"^distillation\.teacher_models\.code\.model_path="):
        check_teachers(config)
