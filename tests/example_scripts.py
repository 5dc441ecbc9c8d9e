"""The example scripts (examples/*/run_*.sh, recipe/*/run_*.sh) as commands the tests can load."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from verl.config.ppo_trainer import load_config

REPO = Path(__file__).resolve().parents[1]
# Scripts that train a real model on their own data (not the common.sh GPU/CPU contract) and are
# measured by a benchmark instead: benchmarks/real_model_learns.py.
STANDALONE = {REPO / "examples" / "grpo_trainer" / "run_smollm2_basic_arithmetic_cpu.sh"}
SCRIPTS = sorted(
    s for s in [*REPO.glob("examples/*/run_*.sh"), *REPO.glob("recipe/*/run_*.sh")] if s not in STANDALONE
)
# entry module -> (config name, config dir); None: the core's ppo_trainer.yaml
ENTRIES = {
    "verl.trainer.main_ppo": ("ppo_trainer", None),
    "recipe.dapo.main_dapo": ("dapo_trainer", str(REPO / "recipe" / "dapo" / "config")),
}


def script_command(script: Path, *args: str) -> tuple[str, list[str]]:
    """(entry module, overrides) that ``script`` would run, read with VERL_DRY_RUN=1."""
    env = {**os.environ, "VERL_DRY_RUN": "1", "PYTHON": "python"}
    out = subprocess.run(
        ["bash", str(script), *args], env=env, capture_output=True, text=True, check=True, cwd=REPO
    ).stdout.splitlines()
    assert out[:2] == ["python", "-m"], f"{script}: expected 'python -m <entry> ...', got {out[:3]}"
    return out[2], out[3:]


def load_script_config(script: Path, *args: str):
    entry, overrides = script_command(script, *args)
    assert entry in ENTRIES, f"{script}: unknown entry point {entry}"
    name, config_dir = ENTRIES[entry]
    return load_config(overrides, config_name=name, config_dir=config_dir), overrides


def trainer_class(entry: str) -> type | None:
    """The driver class an entry point passes to ``run_ppo`` (None: the core's choice)."""
    if entry == "recipe.dapo.main_dapo":
        from recipe.dapo.dapo_ray_trainer import RayDAPOTrainer

        return RayDAPOTrainer
    return None
