"""verl's example lines made small: the same arguments with the built-in model, data, sizes and two
CPU ranks swapped in (tests/trainer/test_verl_tp_examples.py, test_verl_megatron_examples.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def script_args(script: Path, entry: str = "verl.trainer.main_ppo") -> list[str]:
    """Every argument ``script`` passes to ``python -m entry`` (its python replaced by printf)."""
    lines = _printed(script)
    assert lines[:2] == ["-m", entry], lines[:3]
    return lines[2:]


def script_steps(script: Path, entry: str = "verl.trainer.main_ppo") -> tuple[list[str], list[str]]:
    """A script that runs a python tool before ``python -m entry`` (verl's checkpoint conversion):
    the tool's arguments (its script path first) and the entry's."""
    lines = _printed(script)
    at = lines.index("-m")
    assert lines[at + 1] == entry, lines[at : at + 2]
    return lines[:at], lines[at + 2 :]


def _printed(script: Path) -> list[str]:
    """What ``script`` hands its python, one argument per line (python replaced by printf)."""
    env = {**os.environ, "PYTHON": "printf %s\\n", "MODEL": "/models/m", "DATA": "/data"}
    out = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def swapped(lines: str, model: str, data: str) -> list[str]:
    """verl's arguments (quotes the shell would strip, stripped) with the built-in model and data,
    the built-in task's sizes and two CPU ranks (later values of a key win)."""
    args = [line.strip().replace("'", "").replace('"', "") for line in lines.strip().splitlines()]
    return [
        *args,
        f"data.train_files={data}/train.parquet",
        f"data.val_files={data}/test.parquet",
        f"actor_rollout_ref.model.path={model}",
        f"critic.model.path={model}",
        "data.train_batch_size=4",
        "data.max_prompt_length=8",
        "data.max_response_length=4",
        "data.val_max_samples=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.n=2",
        "trainer.n_gpus_per_node=2",
        "trainer.cpus_per_worker=1",
        "trainer.logger=console",
        "trainer.total_training_steps=1",
        "trainer.test_freq=1",
        "trainer.save_freq=-1",
        "trainer.val_before_train=False",
    ]
