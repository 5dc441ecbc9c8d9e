"""The verl-style launch lines (tests/trainer/config/verl_scripts/*.sh, one per algorithm family)
train for real: each script's own arguments, with the model, the data and the sizes swapped for
the built-in ones, run 2 steps of main_ppo's entry on CPU. The keys those scripts use (the
``reward.*`` block, ``+key=`` additions, global micro-batch sizes, ``use_remove_padding``, the
rollout and validation dumps, GPU-only keys) are exercised end to end, not only resolved."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from verl.config.ppo_trainer import load_config
from verl.trainer.main_ppo import run_ppo

SCRIPTS = sorted((Path(__file__).resolve().parent / "config" / "verl_scripts").glob("*.sh"))
# the built-in task's sizes: 8-token prompts, 4-token answers, a small batch
SIZES = [
    "data.max_prompt_length=8",
    "data.max_response_length=4",
    "data.train_batch_size=8",
    "data.val_max_samples=16",
    "trainer.total_training_steps=2",
    "trainer.test_freq=2",
]


def launch_arguments(script: Path, model: str, data: str, out: Path, *extra: str) -> list[str]:
    """The key=value arguments ``script`` passes to main_ppo (its python replaced by printf)."""
    env = {**os.environ, "PYTHON": "printf %s\\n", "MODEL": model, "DATA": data, "OUT": str(out)}
    done = subprocess.run(["bash", str(script), *extra], env=env, capture_output=True, text=True, check=True)
    lines = done.stdout.splitlines()
    assert lines[:2] == ["-m", "verl.trainer.main_ppo"], lines[:3]
    return lines[2:]


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_verl_style_script_trains_two_steps_on_cpu(script, builtin_assets, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data = str(Path(builtin_assets["train"]).parent)
    overrides = launch_arguments(script, builtin_assets["model"], data, tmp_path, *SIZES)
    config = load_config(overrides)
    assert config.actor_rollout_ref.model.path == builtin_assets["model"]
    metrics = run_ppo(config, overrides)
    assert metrics["training/global_step"] == 2
    assert "timing_s/update_weights" in metrics  # the weight sync is its own timed phase
    assert any(key.startswith("val-core/") for key in metrics), sorted(metrics)
    if config.trainer.rollout_data_dir:
        assert sorted(p.name for p in Path(config.trainer.rollout_data_dir).iterdir()) == [
            "1.jsonl",
            "2.jsonl",
        ]
    if config.trainer.validation_data_dir:
        assert any(Path(config.trainer.validation_data_dir).iterdir())
    if config.use_critic:
        assert "critic/vf_loss" in metrics
