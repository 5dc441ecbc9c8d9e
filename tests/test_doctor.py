"""``python -m verl.doctor``: reports the environment and fails, naming the fix, when a config
cannot run here."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from verl.config.ppo_trainer import load_config
from verl.doctor import FAIL, diagnose, main


def test_the_embedded_default_can_run_here(builtin_assets):
    out = subprocess.run(
        [sys.executable, "-m", "verl.doctor"], capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"torch: {torch.__version__}" in out.stdout and "python: 3." in out.stdout
    assert "no problems found" in out.stdout


def test_each_problem_is_named_with_its_fix(capsys, tmp_path):
    code = main(
        [
            f"actor_rollout_ref.model.path={tmp_path}/missing-model",
            f"data.train_files={tmp_path}/train.parquet",
            "ray_init.address=auto",
            "trainer.device=cpu",
            "trainer.n_gpus_per_node=64",
            "trainer.logger=[console]",
        ]
    )
    out = capsys.readouterr().out
    assert code == 1
    failed = [line for line in out.splitlines() if line.startswith(FAIL)]
    expected = ["actor_rollout_ref.model.path", "data.train_files", "trainer.n_gpus_per_node"]
    for key in expected:
        assert any(line.startswith(f"{FAIL}  {key}:") for line in failed), (key, out)
    assert out.count("fix: ") >= len(failed)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the check is about machines without CUDA")
def test_cuda_without_a_gpu_fails():
    findings = diagnose(load_config(["trainer.device=cuda", "trainer.logger=[console]"]))
    assert [f.item for f in findings if f.level == FAIL] == ["trainer.device"]


def test_an_invalid_config_exits_2_naming_the_key(capsys):
    assert main(["trainer.nope=1"]) == 2
    assert "trainer.nope" in capsys.readouterr().out
