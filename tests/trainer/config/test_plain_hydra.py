"""verl's recipes load the presets with plain Hydra: their own YAML lists ``ppo_trainer`` in its
defaults and their ``@hydra.main`` often runs before anything of verl is imported, so the schema is
not registered. The presets compose then too, and the typed config is the one the schema gives;
an unknown key still fails, naming it. Each recipe runs in a fresh interpreter, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from verl.config.base import ConfigError
from verl.config.hydra_schema import GENERATED_GROUP, generated_yaml, on_schema
from verl.config.ppo_trainer import CONFIG_DIR, PPOTrainerConfig

REPO_ROOT = Path(CONFIG_DIR).parents[2]

RECIPE_YAML = """\
hydra:
  searchpath:
    - file://verl/trainer/config

defaults:
  - ppo_trainer
  - _self_

trainer:
  experiment_name: plain_hydra_recipe
"""

# {import_line} is empty for the plain case; the report is written before anything else can fail
RECIPE_MAIN = """\
import json
import sys

import hydra
from omegaconf import OmegaConf
{import_line}

@hydra.main(config_path="config", config_name="x_trainer", version_base=None)
def main(cfg):
    verl_before_main = sorted(m for m in sys.modules if m == "verl" or m.startswith("verl."))
    composed_type = OmegaConf.get_type(cfg).__name__
    from verl.config.ppo_trainer import to_typed_config

    typed = to_typed_config(cfg)
    print("REPORT " + json.dumps({{
        "verl_before_main": verl_before_main,
        "composed_type": composed_type,
        "composed_experiment_name": cfg.trainer.experiment_name,
        "experiment_name": typed.trainer.experiment_name,
        "train_batch_size": typed.data.train_batch_size,
        "total_epochs": typed.trainer.total_epochs,
        "clip_ratio": typed.actor_rollout_ref.actor.clip_ratio,
    }}))


if __name__ == "__main__":
    main()
"""


def run_recipe(tmp_path: Path, *args: str, import_line: str = "") -> subprocess.CompletedProcess:
    """``python <tmp>/recipe/main_x.py <args>`` from the repository root (where verl's recipes run
    and ``file://verl/trainer/config`` points), in a fresh interpreter."""
    recipe = tmp_path / "recipe"
    (recipe / "config").mkdir(parents=True, exist_ok=True)
    (recipe / "config" / "x_trainer.yaml").write_text(RECIPE_YAML)
    (recipe / "main_x.py").write_text(RECIPE_MAIN.format(import_line=import_line))
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(
        [sys.executable, str(recipe / "main_x.py"), *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def report(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("REPORT "))
    return json.loads(line.removeprefix("REPORT "))


def test_a_recipe_composes_ppo_trainer_with_plain_hydra_before_importing_verl(tmp_path):
    out = report(
        run_recipe(
            tmp_path,
            "data.train_batch_size=2048",
            "trainer.total_epochs=3",
            "actor_rollout_ref.actor.clip_ratio=0.25",
        )
    )
    assert out["verl_before_main"] == []
    assert out["composed_type"] == "dict"  # the YAML alone: the schema was not registered
    assert out["composed_experiment_name"] == out["experiment_name"] == "plain_hydra_recipe"
    # every key of the schema is in the plain composition (generated/ppo_trainer.yaml), so each is set
    # without + as on verl's YAML
    assert out["train_batch_size"] == 2048 and out["total_epochs"] == 3
    assert out["clip_ratio"] == 0.25


def test_the_schemas_defaults_as_yaml_are_current():
    """``generated/ppo_trainer.yaml`` is what ``python -m verl.config.write_generated`` writes from the
    schema; after changing a default, run that."""
    path = Path(CONFIG_DIR) / GENERATED_GROUP / "ppo_trainer.yaml"
    assert path.read_text() == generated_yaml(PPOTrainerConfig)
    assert OmegaConf.structured(PPOTrainerConfig) == OmegaConf.merge(
        OmegaConf.structured(PPOTrainerConfig), OmegaConf.load(path)
    )


def test_a_recipe_that_imports_verl_first_composes_on_the_schema(tmp_path):
    out = report(
        run_recipe(
            tmp_path, "trainer.total_epochs=3", import_line="import verl.config.ppo_trainer  # noqa: F401"
        )
    )
    assert out["composed_type"] == "PPOTrainerConfig"  # struct mode from the start
    assert out["experiment_name"] == "plain_hydra_recipe"
    assert out["total_epochs"] == 3  # every schema key can be set without ++


@pytest.mark.parametrize(
    "override, key",
    [
        ("trainer.no_such_key=1", "trainer.no_such_key"),  # refused by Hydra while composing
        ("++trainer.no_such_key=1", "trainer.no_such_key"),  # added, then refused when typed
    ],
)
def test_an_unknown_key_on_a_plain_hydra_recipe_command_line_fails_naming_it(tmp_path, override, key):
    proc = run_recipe(tmp_path, override)
    assert proc.returncode != 0
    assert key in proc.stderr
    assert "REPORT" not in proc.stdout


COMPOSE_EVERY_PRESET = """\
import json
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

composed = {}
for directory, names in json.loads(sys.argv[1]).items():
    for name in names:
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=directory, version_base=None):
            composed[(directory, name)] = compose(config_name=name)
plain = all(OmegaConf.get_type(cfg) is dict for cfg in composed.values())
registered = [m for m in sys.modules if m.startswith("verl.config.") and m.endswith("_trainer")]

from verl.config.ppo_trainer import load_config, to_typed_config
from verl.config.rm_trainer import RMTrainerConfig, load_rm_config
from verl.config.sft_trainer import load_sft_config, to_typed_sft_config
from verl.trainer.main_eval import load_eval_config, to_eval_config

def typed_pair(directory, name, cfg):
    if name == "sft_trainer":
        return to_typed_sft_config(cfg), load_sft_config()
    if name == "rm_trainer":
        return to_typed_sft_config(cfg, RMTrainerConfig), load_rm_config()
    if name == "evaluation":
        return to_eval_config(cfg), load_eval_config()
    # plain Hydra composes verl's defaults: the entry points' preset rule is theirs
    return to_typed_config(cfg), load_config(["preset=verl"], config_name=name, config_dir=directory)

differ = []
for (directory, name), cfg in composed.items():
    plain_typed, reference = typed_pair(directory, name, cfg)
    if plain_typed != reference:
        differ.append(name)
print("REPORT " + json.dumps({"plain": plain, "registered": registered, "differ": differ}))
"""


def shipped_presets() -> dict[str, list[str]]:
    """Every preset this project ships: verl/trainer/config/*.yaml and recipe/*/config/*.yaml."""
    directories = [Path(CONFIG_DIR), *sorted((REPO_ROOT / "recipe").glob("*/config"))]
    return {str(d): sorted(p.stem for p in d.glob("*.yaml")) for d in directories}


def test_every_shipped_preset_composes_with_plain_hydra_to_the_config_the_schema_gives(tmp_path):
    presets = shipped_presets()
    assert "ppo_trainer" in presets[CONFIG_DIR] and len(presets) > 1  # the recipes' presets too
    script = tmp_path / "compose_every_preset.py"
    script.write_text(COMPOSE_EVERY_PRESET)
    proc = subprocess.run(
        [sys.executable, str(script), json.dumps(presets)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = report(proc)
    assert out == {"plain": True, "registered": [], "differ": []}


def test_on_schema_merges_a_plain_config_onto_the_schema_and_names_an_unknown_key():
    merged = on_schema(OmegaConf.create({"trainer": {"total_epochs": 2}}), PPOTrainerConfig)
    assert OmegaConf.get_type(merged) is PPOTrainerConfig
    assert merged.trainer.total_epochs == 2
    assert merged.data.train_batch_size == PPOTrainerConfig().data.train_batch_size
    typed = OmegaConf.structured(PPOTrainerConfig)
    assert on_schema(typed, PPOTrainerConfig) is typed
    with pytest.raises(ConfigError, match=r"^data\.no_such_key: unknown key"):
        on_schema(OmegaConf.create({"data": {"no_such_key": 1}}), PPOTrainerConfig)
    with pytest.raises(ConfigError, match=r"^data\.train_batch_size: Value 'abc'"):
        on_schema(OmegaConf.create({"data": {"train_batch_size": "abc"}}), PPOTrainerConfig)
