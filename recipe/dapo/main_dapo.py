"""Train with DAPO: ``python -m recipe.dapo.main_dapo [key=value ...]`` from the repository root.

The whole recipe is this script, ``config/dapo_trainer.yaml`` (DAPO's keys over the standard
config) and ``dapo_ray_trainer.py`` (the driver with dynamic sampling). The core never imports
it; ``run_ppo`` takes the recipe's trainer class (synchronous, or with ``trainer.mode=async`` the
asynchronous trainer with the same rollout phase).
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from recipe.dapo.dapo_ray_trainer import dapo_trainer_class
from verl.config.cli import prepare_argv, user_errors_as_one_line
from verl.config.ppo_trainer import to_typed_config
from verl.trainer.main_ppo import run_ppo


@hydra.main(config_path="config", config_name="dapo_trainer", version_base=None)
def main(cfg: DictConfig) -> None:
    with user_errors_as_one_line():
        config = to_typed_config(cfg)
        run_ppo(config, list(HydraConfig.get().overrides.task), trainer_cls=dapo_trainer_class(config))


if __name__ == "__main__":
    sys.argv[1:] = prepare_argv(sys.argv[1:], "dapo_trainer", str(Path(__file__).parent / "config"))
    main()
